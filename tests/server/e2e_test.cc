// End to end over loopback: a real cortiq server (in process, 127.0.0.1 port
// 0) and the generated gRPC stub. Every RPC, every error code of the
// service, cancellation, the gauges returning to baseline, and concurrent
// streams equal to the same requests alone.
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <future>
#include <thread>

#include "cortiq/v1/inference.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "tests/common/model_test_util.h"
#include "tests/common/prom_text.h"

namespace cortiq::server {
namespace {

using std::chrono::milliseconds;
namespace v1 = ::cortiq::v1;

struct Stream {
  grpc::Status status;
  std::vector<int32_t> ids;
  std::string text;
  std::optional<v1::GenerateSummary> summary;
  int summaries = 0;
};

class E2eTest : public ::testing::Test {
 protected:
  void StartServer(ServerConfig c = {}) {
    c.model_dir = testing::TempModel("tiny");
    c.listen = "127.0.0.1:0";
    c.metrics_listen = "127.0.0.1:0";
    c.threads = 1;
    c.grace = milliseconds(0);
    auto s = Server::Start(c);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(server_->port()),
                                   grpc::InsecureChannelCredentials());
    stub_ = v1::Inference::NewStub(channel_);
  }
  void TearDown() override {
    if (server_) server_->Shutdown(milliseconds(0));
  }

  static v1::GenerateRequest Greedy(std::string prompt, uint32_t max_tokens) {
    v1::GenerateRequest r;
    r.set_prompt(std::move(prompt));
    r.set_max_tokens(max_tokens);
    r.mutable_sampling()->set_temperature(0);
    r.set_ignore_eos(true);
    return r;
  }

  Stream Generate(const v1::GenerateRequest& req, grpc::ClientContext* ctx = nullptr,
                  const std::function<void(const v1::GeneratedToken&)>& on_token = nullptr) {
    grpc::ClientContext local;
    if (ctx == nullptr) ctx = &local;
    Stream s;
    auto reader = stub_->Generate(ctx, req);
    v1::GenerateResponse msg;
    while (reader->Read(&msg)) {
      if (msg.has_token()) {
        s.ids.push_back(msg.token().token_id());
        s.text += msg.token().text();
        if (on_token) on_token(msg.token());
      } else if (msg.has_summary()) {
        s.summary = msg.summary();
        ++s.summaries;
      }
    }
    s.status = reader->Finish();
    return s;
  }

  std::vector<v1::SessionInfo> Sessions() {
    grpc::ClientContext ctx;
    v1::ListSessionsResponse resp;
    EXPECT_TRUE(stub_->ListSessions(&ctx, {}, &resp).ok());
    return {resp.sessions().begin(), resp.sessions().end()};
  }

  testing::Exposition Scrape() { return testing::Scrape(server_->metrics_port()); }

  double MemoryGauge(const testing::Exposition& e) {
    double sum = 0;
    for (const char* kind : {"kv_f32", "kv_int8", "o1", "qsa"}) {
      sum += e.Get("cortiq_session_memory_bytes", {{"kind", kind}}).value_or(-1e18);
    }
    return sum;
  }

  // Waits (up to 5 s) until no session is left.
  bool WaitNoSessions() {
    for (int i = 0; i < 500; ++i) {
      if (server_->store().num_sessions() == 0) return true;
      std::this_thread::sleep_for(milliseconds(10));
    }
    return false;
  }

  // Scrapes until the server has counted `n` finished `rpc` calls, whatever
  // their code (up to 5 s), and returns that scrape. A call is counted when
  // its reactor is done, which can be after the client has its status and
  // after its session was freed.
  testing::Exposition ScrapeOnceCounted(const std::string& rpc, double n) {
    testing::Exposition e;
    for (int i = 0; i < 500; ++i) {
      e = Scrape();
      double total = 0;
      for (const auto* s : e.All("cortiq_requests_total", {{"rpc", rpc}})) total += s->value;
      if (total >= n) break;
      std::this_thread::sleep_for(milliseconds(10));
    }
    return e;
  }

  std::unique_ptr<Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Inference::Stub> stub_;
};

void ExpectCode(const grpc::Status& s, grpc::StatusCode code, std::string_view needle) {
  EXPECT_EQ(s.error_code(), code) << s.error_message();
  EXPECT_NE(s.error_message().find(needle), std::string::npos)
      << "'" << s.error_message() << "' does not name '" << needle << "'";
}

TEST_F(E2eTest, EveryUnaryRpcAndAKeptConversation) {
  StartServer();
  {
    grpc::ClientContext ctx;
    v1::ModelInfo info;
    ASSERT_TRUE(stub_->GetModelInfo(&ctx, {}, &info).ok());
    EXPECT_EQ(info.model_type(), "qwen3");
    EXPECT_EQ(info.vocab_size(), 259u);
    EXPECT_EQ(info.fingerprint().size(), 16u);
    EXPECT_EQ(info.max_context(), 4096u);
    EXPECT_EQ(info.default_session_config().attention(), v1::ATTENTION_MODE_EXACT);
  }
  {
    grpc::ClientContext ctx;
    v1::TokenizeRequest req;
    req.set_text("hi<|im_end|>");
    v1::TokenizeResponse resp;
    ASSERT_TRUE(stub_->Tokenize(&ctx, req, &resp).ok());
    ASSERT_EQ(resp.token_ids_size(), 3);
    EXPECT_EQ(resp.token_ids(0), 'h');
    EXPECT_EQ(resp.token_ids(2), 258);  // special token parsed
    EXPECT_EQ(resp.tokens(2), "<|im_end|>");
  }
  std::string id;
  {
    grpc::ClientContext ctx;
    v1::CreateSessionRequest req;
    req.mutable_config()->set_kv_dtype(v1::KV_DTYPE_INT8);
    v1::SessionInfo info;
    ASSERT_TRUE(stub_->CreateSession(&ctx, req, &info).ok());
    id = info.session_id();
    EXPECT_EQ(id.size(), 32u);
    EXPECT_EQ(info.config().kv_dtype(), v1::KV_DTYPE_INT8);
    EXPECT_EQ(info.tokens(), 0u);
  }
  v1::GenerateRequest req = Greedy("Call me Ishmael.", 6);
  req.set_session_id(id);
  Stream a = Generate(req);
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  ASSERT_EQ(a.summaries, 1);
  EXPECT_EQ(a.ids.size(), 6u);
  EXPECT_EQ(a.summary->finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(a.summary->session_id(), id);
  EXPECT_TRUE(a.summary->session_kept());
  EXPECT_EQ(a.summary->usage().prompt_tokens(), 16u);
  EXPECT_EQ(a.summary->usage().completion_tokens(), 6u);
  EXPECT_GT(a.summary->memory().kv_int8_bytes(), 0u);
  EXPECT_EQ(a.summary->memory().kv_f32_bytes(), 0u);
  EXPECT_GT(a.summary->timings().time_to_first_token_seconds(), 0.0);

  req.set_prompt(" Some years ago");
  Stream b = Generate(req);
  ASSERT_TRUE(b.status.ok());
  EXPECT_EQ(b.summary->usage().session_tokens(), 16u + 6 + 15 + 6);
  {
    grpc::ClientContext ctx;
    v1::GetSessionRequest g;
    g.set_session_id(id);
    v1::SessionInfo info;
    ASSERT_TRUE(stub_->GetSession(&ctx, g, &info).ok());
    EXPECT_EQ(info.tokens(), 43u);
    EXPECT_EQ(info.cached_tokens(), 42u);
    EXPECT_FALSE(info.busy());
    EXPECT_EQ(info.memory().total_bytes(), b.summary->memory().total_bytes());
  }
  ASSERT_EQ(Sessions().size(), 1u);
  for (bool expect_released : {true, false}) {
    grpc::ClientContext ctx;
    v1::ReleaseSessionRequest r;
    r.set_session_id(id);
    v1::ReleaseSessionResponse resp;
    ASSERT_TRUE(stub_->ReleaseSession(&ctx, r, &resp).ok());
    EXPECT_EQ(resp.released(), expect_released);
    EXPECT_EQ(resp.freed_bytes() > 0, expect_released);
  }
  EXPECT_TRUE(Sessions().empty());
  // The migration RPCs validate their input (tests/server/migration_test.cc
  // covers them fully).
  {
    grpc::ClientContext ctx;
    v1::MigrateSessionResponse resp;
    ExpectCode(stub_->MigrateSession(&ctx, {}, &resp), grpc::StatusCode::INVALID_ARGUMENT, "session_id");
  }
  {
    grpc::ClientContext ctx;
    auto reader = stub_->ExportSession(&ctx, {});
    v1::WireChunk chunk;
    while (reader->Read(&chunk)) {
    }
    ExpectCode(reader->Finish(), grpc::StatusCode::INVALID_ARGUMENT, "session_id");
  }
  {
    grpc::ClientContext ctx;
    v1::ImportSessionResponse resp;
    auto writer = stub_->ImportSession(&ctx, &resp);
    writer->WritesDone();
    ExpectCode(writer->Finish(), grpc::StatusCode::DATA_LOSS, "empty");
  }
}

TEST_F(E2eTest, BadInputGetsInvalidArgumentNamingTheFieldAndChangesNothing) {
  ServerConfig c;
  c.max_tokens_limit = 64;
  c.max_prompt_bytes = 1000;
  c.max_context = 1000;
  StartServer(c);
  // A kept session whose state must not change.
  v1::GenerateRequest keep = Greedy("steady", 3);
  keep.set_keep_session(true);
  Stream k = Generate(keep);
  ASSERT_TRUE(k.status.ok());
  const std::string id = k.summary->session_id();
  const auto before = Sessions();
  const double gauge_before = MemoryGauge(Scrape());

  struct Case {
    std::string what;
    std::function<void(v1::GenerateRequest&)> edit;
    std::string needle;
  };
  const float nan = std::nanf("");
  std::vector<Case> cases = {
      {"empty prompt", [](auto& r) { r.set_prompt(""); }, "prompt"},
      {"prompt and tokens", [](auto& r) { r.add_prompt_tokens(1); }, "not both"},
      {"max_tokens 0", [](auto& r) { r.set_max_tokens(0); }, "max_tokens"},
      {"max_tokens over", [](auto& r) { r.set_max_tokens(65); }, "[1, 64]"},
      {"temperature < 0", [](auto& r) { r.mutable_sampling()->set_temperature(-1); },
       "temperature"},
      {"temperature NaN", [nan](auto& r) { r.mutable_sampling()->set_temperature(nan); },
       "temperature"},
      {"top_p below 0", [](auto& r) { r.mutable_sampling()->set_top_p(-0.1f); }, "top_p"},
      {"top_p > 1", [](auto& r) { r.mutable_sampling()->set_top_p(1.5f); }, "top_p"},
      {"top_logprobs", [](auto& r) { r.set_top_logprobs(21); }, "top_logprobs"},
      {"unknown mode",
       [](auto& r) {
         r.mutable_session_config()->set_attention(static_cast<v1::AttentionMode>(7));
       },
       "session_config.attention"},
      {"unknown kv",
       [](auto& r) { r.mutable_session_config()->set_kv_dtype(static_cast<v1::KvDtype>(9)); },
       "session_config.kv_dtype"},
      {"o1 m",
       [](auto& r) {
         r.mutable_session_config()->set_attention(v1::ATTENTION_MODE_O1);
         r.mutable_session_config()->mutable_o1()->set_m(2);
       },
       "session_config.o1.m"},
      {"qsa budget beyond the context",
       [](auto& r) {
         r.mutable_session_config()->set_attention(v1::ATTENTION_MODE_QSA);
         r.mutable_session_config()->mutable_qsa()->set_budget(1u << 30);
       },
       "session_config.qsa.budget"},
      {"window 0",
       [](auto& r) {
         r.mutable_session_config()->set_attention(v1::ATTENTION_MODE_WINDOW);
         r.mutable_session_config()->mutable_window()->set_window(0);
       },
       "session_config.window"},
      {"window beyond the context",
       [](auto& r) {
         r.mutable_session_config()->set_attention(v1::ATTENTION_MODE_WINDOW);
         r.mutable_session_config()->mutable_window()->set_window(1u << 30);
       },
       "session_config.window.window"},
      {"window on int8 rows",
       [](auto& r) {
         r.mutable_session_config()->set_attention(v1::ATTENTION_MODE_WINDOW);
         r.mutable_session_config()->set_kv_dtype(v1::KV_DTYPE_INT8);
       },
       "session_config.window"},
      {"token id >= vocab",
       [](auto& r) {
         r.clear_prompt();
         r.add_prompt_tokens(3);
         r.add_prompt_tokens(259);
       },
       "prompt_tokens[1]"},
      {"oversize prompt", [](auto& r) { r.set_prompt(std::string(1001, 'a')); },
       "--max-prompt-bytes"},
      {"unknown priority", [](auto& r) { r.set_priority(static_cast<v1::Priority>(9)); },
       "priority: unknown value 9 (PRIORITY_UNSPECIFIED = 0 (normal) | PRIORITY_LOW = 1 | "
       "PRIORITY_NORMAL = 2 | PRIORITY_HIGH = 3)"},
      {"negative priority", [](auto& r) { r.set_priority(static_cast<v1::Priority>(-1)); },
       "priority: unknown value -1"},
      {"continued, unknown priority",
       [id](auto& r) {
         r.set_session_id(id);
         r.set_priority(static_cast<v1::Priority>(4));
       },
       "priority: unknown value 4"},
      {"stop too long", [](auto& r) { r.add_stop(std::string(300, 's')); }, "stop[0]"},
      {"continued, over context",
       [id](auto& r) {
         r.set_session_id(id);
         r.set_prompt(std::string(990, 'x'));
         r.set_max_tokens(64);
       },
       "context"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    v1::GenerateRequest r = Greedy("hello", 4);
    c.edit(r);
    Stream s = Generate(r);
    ExpectCode(s.status, grpc::StatusCode::INVALID_ARGUMENT, c.needle);
    EXPECT_TRUE(s.ids.empty());
  }
  // Prompt beyond the model's context: a server whose context is small.
  const auto after = Sessions();
  ASSERT_EQ(after.size(), before.size());
  EXPECT_EQ(after[0].tokens(), before[0].tokens());
  EXPECT_EQ(after[0].memory().total_bytes(), before[0].memory().total_bytes());
  EXPECT_EQ(MemoryGauge(Scrape()), gauge_before);
  // Unary validation.
  grpc::ClientContext ctx;
  v1::SessionInfo info;
  ExpectCode(stub_->GetSession(&ctx, {}, &info), grpc::StatusCode::INVALID_ARGUMENT, "session_id");
}

// Every priority level is accepted and generates; priority is scheduling
// only, so a greedy request gives the same tokens at every level, alone or
// with streams of other levels running beside it.
TEST_F(E2eTest, EveryPriorityLevelGeneratesTheSameTokens) {
  StartServer();
  const v1::GenerateRequest base = Greedy("priority", 8);
  const Stream plain = Generate(base);
  ASSERT_TRUE(plain.status.ok()) << plain.status.error_message();
  ASSERT_EQ(plain.ids.size(), 8u);
  const std::vector<v1::Priority> levels = {v1::PRIORITY_UNSPECIFIED, v1::PRIORITY_LOW,
                                            v1::PRIORITY_NORMAL, v1::PRIORITY_HIGH};
  for (v1::Priority p : levels) {
    SCOPED_TRACE(v1::Priority_Name(p));
    v1::GenerateRequest r = base;
    r.set_priority(p);
    const Stream s = Generate(r);
    ASSERT_TRUE(s.status.ok()) << s.status.error_message();
    EXPECT_EQ(s.ids, plain.ids);
    EXPECT_EQ(s.summary->finish_reason(), v1::FINISH_REASON_LENGTH);
  }
  // Concurrently: one stream per level, each with the lone answer.
  std::vector<std::future<Stream>> running;
  for (v1::Priority p : levels) {
    v1::GenerateRequest r = base;
    r.set_priority(p);
    running.push_back(std::async(std::launch::async, [this, r] { return Generate(r); }));
  }
  for (auto& f : running) {
    const Stream s = f.get();
    ASSERT_TRUE(s.status.ok()) << s.status.error_message();
    EXPECT_EQ(s.ids, plain.ids);
  }
  EXPECT_TRUE(WaitNoSessions());
}

TEST_F(E2eTest, PromptBeyondTheContextIsRefused) {
  ServerConfig c;
  c.max_context = 64;
  StartServer(c);
  Stream s = Generate(Greedy(std::string(60, 'a'), 10));
  ExpectCode(s.status, grpc::StatusCode::INVALID_ARGUMENT, "context of 64");
  EXPECT_TRUE(Sessions().empty());
}

TEST_F(E2eTest, NotFoundAbortedAndResourceExhausted) {
  ServerConfig c;
  c.max_sessions = 2;
  StartServer(c);
  v1::GenerateRequest r = Greedy("x", 2);
  r.set_session_id("00000000000000000000000000000000");
  ExpectCode(Generate(r).status, grpc::StatusCode::NOT_FOUND, "session_id");

  // Busy: a long generation holds the session's lease.
  v1::GenerateRequest keep = Greedy("a", 1);
  keep.set_keep_session(true);
  const std::string id = Generate(keep).summary->session_id();
  v1::GenerateRequest long_req = Greedy("b", 2000);
  long_req.set_session_id(id);
  grpc::ClientContext long_ctx;
  std::promise<void> first;
  bool signalled = false;
  auto long_run = std::async(std::launch::async, [&] {
    return Generate(long_req, &long_ctx, [&](const v1::GeneratedToken&) {
      if (!signalled) {
        signalled = true;
        first.set_value();
      }
    });
  });
  first.get_future().wait();
  v1::GenerateRequest second = Greedy("c", 2);
  second.set_session_id(id);
  ExpectCode(Generate(second).status, grpc::StatusCode::ABORTED, "busy");

  // Cap: one more session fits (2 total), the next is refused.
  v1::GenerateRequest k2 = Greedy("d", 1);
  k2.set_keep_session(true);
  ASSERT_TRUE(Generate(k2).status.ok());
  ExpectCode(Generate(Greedy("e", 1)).status, grpc::StatusCode::RESOURCE_EXHAUSTED,
             "--max-sessions 2");
  long_ctx.TryCancel();
  EXPECT_EQ(long_run.get().status.error_code(), grpc::StatusCode::CANCELLED);
}

TEST_F(E2eTest, MemoryBudgetRefusesWithTheNumbersAndAllocatesNothing) {
  ServerConfig c;
  c.memory_budget_bytes = 100'000;
  StartServer(c);
  // tiny: 2 layers × 2 kv heads × 16 dims × 2 (k, v) × 4 bytes = 512 B per position.
  Stream ok = Generate(Greedy("fits", 100));
  ASSERT_TRUE(ok.status.ok()) << ok.status.error_message();
  Stream no = Generate(Greedy("does not fit", 300));
  ExpectCode(no.status, grpc::StatusCode::RESOURCE_EXHAUSTED, "100000 byte budget");
  EXPECT_TRUE(Sessions().empty());
  EXPECT_EQ(MemoryGauge(Scrape()), 0.0);
}

TEST_F(E2eTest, CancelMidStreamFreesTheOneShotSessionAndTheGaugesReturnToBaseline) {
  StartServer();
  const auto base = Scrape();
  EXPECT_EQ(MemoryGauge(base), 0.0);
  grpc::ClientContext ctx;
  int seen = 0;
  Stream s = Generate(Greedy("cancel me", 3000), &ctx, [&](const v1::GeneratedToken&) {
    if (++seen == 3) ctx.TryCancel();
  });
  EXPECT_EQ(s.status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_LT(s.ids.size(), 3000u);
  ASSERT_TRUE(WaitNoSessions());
  const auto after = ScrapeOnceCounted("Generate", 1);
  EXPECT_EQ(MemoryGauge(after), 0.0);
  EXPECT_EQ(after.Get("cortiq_sessions_active"), 0.0);
  EXPECT_EQ(after.Get("cortiq_session_releases_total", {{"reason", "cancelled"}}), 1.0);
  EXPECT_GE(after.Get("cortiq_requests_total", {{"rpc", "Generate"}, {"code", "CANCELLED"}}).value_or(0),
            1.0);
}

TEST_F(E2eTest, DeadlineEndsTheStreamWithDeadlineExceeded) {
  StartServer();
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + milliseconds(200));
  Stream s = Generate(Greedy("slow", 4000), &ctx);
  EXPECT_EQ(s.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  ASSERT_TRUE(WaitNoSessions());
}

// The request counter tells a deadline from a client's cancel: gRPC's
// deadline timer runs on its own clock, slightly ahead of system_clock, and a
// cancel races the engine finishing the cancelled job.
TEST_F(E2eTest, DeadlinesAndClientCancelsAreCountedApart) {
  StartServer();
  constexpr int kDeadlineCalls = 8;
  for (int i = 0; i < kDeadlineCalls; ++i) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + milliseconds(200));
    EXPECT_EQ(Generate(Greedy("slow", 4000), &ctx).status.error_code(),
              grpc::StatusCode::DEADLINE_EXCEEDED);
  }
  grpc::ClientContext ctx;
  int seen = 0;
  Stream s = Generate(Greedy("cancel me", 3000), &ctx, [&](const v1::GeneratedToken&) {
    if (++seen == 3) ctx.TryCancel();
  });
  EXPECT_EQ(s.status.error_code(), grpc::StatusCode::CANCELLED);
  const auto e = ScrapeOnceCounted("Generate", kDeadlineCalls + 1);
  EXPECT_EQ(e.Get("cortiq_requests_total", {{"rpc", "Generate"}, {"code", "DEADLINE_EXCEEDED"}})
                .value_or(0),
            kDeadlineCalls);
  EXPECT_EQ(
      e.Get("cortiq_requests_total", {{"rpc", "Generate"}, {"code", "CANCELLED"}}).value_or(0),
      1.0);
  ASSERT_TRUE(WaitNoSessions());
}

TEST_F(E2eTest, ReleasingAGeneratingSessionEndsItsStreamAsCancelled) {
  StartServer();
  v1::GenerateRequest keep = Greedy("x", 1);
  keep.set_keep_session(true);
  const std::string id = Generate(keep).summary->session_id();
  v1::GenerateRequest r = Greedy("y", 4000);
  r.set_session_id(id);
  std::promise<void> first;
  bool signalled = false;
  auto run = std::async(std::launch::async, [&] {
    return Generate(r, nullptr, [&](const v1::GeneratedToken&) {
      if (!signalled) {
        signalled = true;
        first.set_value();
      }
    });
  });
  first.get_future().wait();
  grpc::ClientContext ctx;
  v1::ReleaseSessionRequest rel;
  rel.set_session_id(id);
  v1::ReleaseSessionResponse resp;
  ASSERT_TRUE(stub_->ReleaseSession(&ctx, rel, &resp).ok());
  EXPECT_TRUE(resp.released());
  // Released means freed: nothing is left when the call returns.
  EXPECT_EQ(server_->store().num_sessions(), 0u);
  EXPECT_EQ(MemoryGauge(Scrape()), 0.0);
  Stream s = run.get();
  ASSERT_TRUE(s.status.ok());
  ASSERT_TRUE(s.summary.has_value());
  EXPECT_EQ(s.summary->finish_reason(), v1::FINISH_REASON_CANCELLED);
  EXPECT_FALSE(s.summary->session_kept());
}

TEST_F(E2eTest, GaugesEqualTheSessionsBytesExactlyAcrossModes) {
  StartServer();
  uint64_t total = 0;
  for (int mode = 0; mode < 4; ++mode) {
    v1::GenerateRequest r = Greedy(std::string(150, 'a' + mode), 5);
    r.set_keep_session(true);
    auto* sc = r.mutable_session_config();
    if (mode == 1) sc->set_kv_dtype(v1::KV_DTYPE_INT8);
    if (mode == 2) {
      sc->set_attention(v1::ATTENTION_MODE_O1);
      sc->mutable_o1()->set_m(8);
      sc->mutable_o1()->set_window(16);
    }
    if (mode == 3) {
      sc->set_attention(v1::ATTENTION_MODE_QSA);
      sc->mutable_qsa()->set_ratio(16);
      sc->mutable_qsa()->set_budget(4);
    }
    Stream s = Generate(r);
    ASSERT_TRUE(s.status.ok()) << s.status.error_message();
    total += s.summary->memory().total_bytes();
  }
  const auto e = Scrape();
  EXPECT_EQ(MemoryGauge(e), static_cast<double>(total));
  EXPECT_GT(e.Get("cortiq_session_memory_bytes", {{"kind", "kv_int8"}}).value_or(0), 0);
  EXPECT_GT(e.Get("cortiq_session_memory_bytes", {{"kind", "o1"}}).value_or(0), 0);
  EXPECT_GT(e.Get("cortiq_session_memory_bytes", {{"kind", "qsa"}}).value_or(0), 0);
  grpc::ClientContext ctx;
  v1::ListSessionsResponse list;
  ASSERT_TRUE(stub_->ListSessions(&ctx, {}, &list).ok());
  EXPECT_EQ(list.total_memory().total_bytes(), total);
  for (const auto& s : list.sessions()) {
    grpc::ClientContext c2;
    v1::ReleaseSessionRequest rel;
    rel.set_session_id(s.session_id());
    v1::ReleaseSessionResponse resp;
    ASSERT_TRUE(stub_->ReleaseSession(&c2, rel, &resp).ok());
  }
  EXPECT_EQ(MemoryGauge(Scrape()), 0.0);
}

TEST_F(E2eTest, ThirtyTwoConcurrentGreedyStreamsEqualTheSameRequestsAlone) {
  ServerConfig c;
  c.max_batch = 32;
  StartServer(c);
  constexpr int kStreams = 32;
  std::vector<v1::GenerateRequest> reqs;
  for (int i = 0; i < kStreams; ++i) {
    reqs.push_back(Greedy("stream " + std::to_string(i) + std::string(i % 7, '!'), 12 + i % 5));
  }
  std::vector<Stream> alone;
  for (const auto& r : reqs) alone.push_back(Generate(r));
  std::vector<std::future<Stream>> together;
  for (const auto& r : reqs) {
    together.push_back(std::async(std::launch::async, [&, r] { return Generate(r); }));
  }
  for (int i = 0; i < kStreams; ++i) {
    Stream s = together[i].get();
    ASSERT_TRUE(s.status.ok()) << s.status.error_message();
    EXPECT_EQ(s.ids, alone[i].ids) << "stream " << i;
    EXPECT_EQ(s.text, alone[i].text) << "stream " << i;
  }
  ASSERT_TRUE(WaitNoSessions());
}

TEST_F(E2eTest, IdleSessionsExpireAfterTheTtl) {
  ServerConfig c;
  // Long enough for the Generate and the listing below to fit in it on a
  // slow (TSan-instrumented, loaded) process; WaitNoSessions waits 5 s.
  c.session_ttl = milliseconds(1000);
  StartServer(c);
  v1::GenerateRequest keep = Greedy("x", 1);
  keep.set_keep_session(true);
  ASSERT_TRUE(Generate(keep).status.ok());
  EXPECT_EQ(Sessions().size(), 1u);
  ASSERT_TRUE(WaitNoSessions());
  EXPECT_EQ(Scrape().Get("cortiq_session_releases_total", {{"reason", "ttl"}}), 1.0);
}

TEST_F(E2eTest, BearerTokenIsRequiredOnEveryRpc) {
  ServerConfig c;
  c.auth_token = "s3cret";
  StartServer(c);
  {
    grpc::ClientContext ctx;
    v1::ModelInfo info;
    ExpectCode(stub_->GetModelInfo(&ctx, {}, &info), grpc::StatusCode::UNAUTHENTICATED, "authorization");
  }
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer wrong");
    ExpectCode(Generate(Greedy("x", 1), &ctx).status, grpc::StatusCode::UNAUTHENTICATED, "invalid");
  }
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer s3cret");
    EXPECT_TRUE(Generate(Greedy("x", 1), &ctx).status.ok());
  }
}

TEST_F(E2eTest, ServesTlsWithTheGivenCertificate) {
  // A self-signed certificate for 127.0.0.1 / localhost, made here.
  const std::string dir = ::testing::TempDir() + "/cortiq_tls_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  const std::string cmd =
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost "
      "-addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout " + dir + "/key.pem -out " + dir +
      "/cert.pem >/dev/null 2>&1";
  if (std::system(cmd.c_str()) != 0) GTEST_SKIP() << "openssl could not make a certificate";
  ServerConfig c;
  c.tls_cert = dir + "/cert.pem";
  c.tls_key = dir + "/key.pem";
  StartServer(c);
  std::ifstream f(dir + "/cert.pem");
  std::stringstream pem;
  pem << f.rdbuf();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = pem.str();
  auto secure = v1::Inference::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(server_->port()), grpc::SslCredentials(ssl)));
  grpc::ClientContext ctx;
  v1::ModelInfo info;
  grpc::Status st = secure->GetModelInfo(&ctx, {}, &info);
  EXPECT_TRUE(st.ok()) << st.error_message();
  // A plaintext client cannot talk to it.
  grpc::ClientContext plain_ctx;
  plain_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  EXPECT_FALSE(stub_->GetModelInfo(&plain_ctx, {}, &info).ok());
}

TEST_F(E2eTest, DrainingRefusesNewWorkWithUnavailable) {
  ServerConfig c;
  StartServer(c);
  // A stream in flight keeps the drain in its grace period.
  grpc::ClientContext long_ctx;
  std::promise<void> first;
  bool signalled = false;
  auto long_run = std::async(std::launch::async, [&] {
    return Generate(Greedy("long", 3000), &long_ctx, [&](const v1::GeneratedToken&) {
      if (!signalled) {
        signalled = true;
        first.set_value();
      }
    });
  });
  first.get_future().wait();
  auto drain = std::async(std::launch::async, [&] { server_->Shutdown(milliseconds(3000)); });
  for (int i = 0; i < 200; ++i) {
    grpc::Status s = Generate(Greedy("new", 1)).status;
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
      ExpectCode(s, grpc::StatusCode::UNAVAILABLE, "draining");
      break;
    }
    std::this_thread::sleep_for(milliseconds(5));
    ASSERT_LT(i, 199) << "never refused";
  }
  long_ctx.TryCancel();
  long_run.get();
  drain.get();
}

}  // namespace
}  // namespace cortiq::server
