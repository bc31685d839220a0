// The relay (server/forward.h) between two servers on loopback: a real
// cortiq node B, and a gRPC server A written here whose service forwards
// every call it serves (Generate, ExportSession, GetSession, ReleaseSession)
// to B with the relay — what a node does for a session it does not hold.
// Through A: the same tokens, summary, export bytes and session info as
// direct to B, B's node name in the response metadata; B's errors unchanged;
// a client deadline or cancel ends B's call and job; a slow client holds
// the relay to one message in flight, and the owner waits. A peer that never
// answers (HangingPeer) shows what goes upstream: the caller's deadline, the
// relay's metadata, and a cancel of a call that has not answered.
#include "server/forward.h"

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/util/tsan_annotations.h"
#include "cortiq/v1/inference.grpc.pb.h"
#include "google/protobuf/util/message_differencer.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/client_interceptor.h"
#include "gtest/gtest.h"
#include "server/call_util.h"
#include "server/server.h"
#include "tests/common/model_test_util.h"
#include "tests/common/server_test_util.h"

namespace cortiq::server {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
namespace v1 = ::cortiq::v1;

constexpr char kRelayName[] = "relay-a";
// What A's channel to B reports as B's x-cortiq-node when B sends none
// (FakeNodeInterceptor); a B that sends one is checked against its own.
constexpr char kFakeNode[] = "node-b-fake";
constexpr char kTraceparent[] = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

std::chrono::system_clock::time_point In(milliseconds d) {
  return std::chrono::system_clock::now() + d;
}

// Every value of `key` in received metadata.
std::vector<std::string> Values(const std::multimap<grpc::string_ref, grpc::string_ref>& md,
                                const std::string& key) {
  std::vector<std::string> out;
  auto [lo, hi] = md.equal_range(key);
  for (auto it = lo; it != hi; ++it) out.emplace_back(it->second.data(), it->second.size());
  return out;
}

// Adds x-cortiq-node: kFakeNode to the initial metadata of a reply that
// carries none, as a node that names itself would send it.
class FakeNodeInterceptor final : public grpc::experimental::Interceptor {
 public:
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::POST_RECV_INITIAL_METADATA)) {
      auto* md = methods->GetRecvInitialMetadata();
      if (md->find(grpc::string_ref(kNodeMetadata.data(), kNodeMetadata.size())) == md->end()) {
        md->emplace(grpc::string_ref(kNodeMetadata.data(), kNodeMetadata.size()),
                    grpc::string_ref(kFakeNode));
      }
    }
    methods->Proceed();
  }
};
class FakeNodeFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new FakeNodeInterceptor;
  }
};

// A channel whose HTTP/2 receive window is small (and stays small: no BDP
// probing), so that a reader who stops reading stops its sender within a
// few messages instead of 64 KiB of them.
grpc::ChannelArguments SmallWindow() {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 1024);
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  return args;
}

// ---- A: the relaying server ----

using RelayBase =
    v1::Inference::WithRawCallbackMethod_Generate<v1::Inference::WithRawCallbackMethod_GetSession<
        v1::Inference::WithRawCallbackMethod_ReleaseSession<
            v1::Inference::WithRawCallbackMethod_ExportSession<v1::Inference::Service>>>>;

// Forwards every call to one target. Streams and GetSession go through
// ForwardStream / ForwardUnaryCall; ReleaseSession through the low-level
// ForwardUnary, its cancel handle kept for the test.
class RelayService final : public RelayBase {
 public:
  explicit RelayService(ForwardTarget target) : target_(std::move(target)) {}

  grpc::ServerWriteReactor<grpc::ByteBuffer>* Generate(grpc::CallbackServerContext* call,
                                                       const grpc::ByteBuffer* request) override {
    return Stream("/cortiq.v1.Inference/Generate", call, *request);
  }
  grpc::ServerWriteReactor<grpc::ByteBuffer>* ExportSession(
      grpc::CallbackServerContext* call, const grpc::ByteBuffer* request) override {
    return Stream("/cortiq.v1.Inference/ExportSession", call, *request);
  }
  grpc::ServerUnaryReactor* GetSession(grpc::CallbackServerContext* call,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override {
    auto* reactor =
        new TypedUnaryReactor<v1::GetSessionRequest, v1::SessionInfo>(request, response);
    Started();
    ForwardUnaryCall(target_, "/cortiq.v1.Inference/GetSession", call, reactor, Options(),
                     [this](const grpc::Status& s) { Ended(s, 0); });
    return reactor;
  }
  grpc::ServerUnaryReactor* ReleaseSession(grpc::CallbackServerContext* call,
                                           const grpc::ByteBuffer* request,
                                           grpc::ByteBuffer* response) override {
    auto* reactor = new TypedUnaryReactor<v1::ReleaseSessionRequest, v1::ReleaseSessionResponse>(
        request, response);
    Started();
    // In the handler, so no reaction (and no reply) runs before OnCancelled.
    ForwardCancel cancel =
        ForwardUnary(target_, "/cortiq.v1.Inference/ReleaseSession", call, *request, response,
                     Options(), [this, reactor](const grpc::Status& s) {
                       Ended(s, 0);
                       reactor->ReplyRaw(s);
                     });
    reactor->OnCancelled([cancel] { cancel.Cancel(); });
    std::lock_guard lock(mu_);
    last_cancel_ = cancel;
    return reactor;
  }

  const std::shared_ptr<ForwardStats>& stats() const { return stats_; }

  // Waits until `n` relayed calls have ended; their statuses and message
  // counts, in order of ending.
  bool WaitEnded(size_t n, milliseconds timeout) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return ended_.size() >= n; });
  }
  std::vector<std::pair<grpc::Status, uint64_t>> ended() {
    std::lock_guard lock(mu_);
    return ended_;
  }
  bool WaitAllEnded(milliseconds timeout) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return ended_.size() == started_; });
  }
  ForwardCancel last_cancel() {
    std::lock_guard lock(mu_);
    return last_cancel_;
  }

 private:
  ForwardOptions Options() const {
    return {.metadata = {{"x-cortiq-hops", "1"}, {"traceparent", kTraceparent}},
            .forwarded_by = kRelayName,
            .stats = stats_};
  }
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Stream(const char* method,
                                                     grpc::CallbackServerContext* call,
                                                     const grpc::ByteBuffer& request) {
    Started();
    return ForwardStream(target_, method, call, request, Options(),
                         [this](const grpc::Status& s, uint64_t n) { Ended(s, n); });
  }
  void Started() {
    std::lock_guard lock(mu_);
    ++started_;
  }
  void Ended(const grpc::Status& s, uint64_t messages) {
    {
      std::lock_guard lock(mu_);
      ended_.emplace_back(s, messages);
    }
    cv_.notify_all();
  }

  const ForwardTarget target_;
  const std::shared_ptr<ForwardStats> stats_ = std::make_shared<ForwardStats>();
  std::mutex mu_;
  std::condition_variable cv_;
  size_t started_ = 0;
  std::vector<std::pair<grpc::Status, uint64_t>> ended_;
  ForwardCancel last_cancel_;
};

// A on 127.0.0.1 port 0, forwarding to `target` over a channel with `args`
// and the FakeNodeInterceptor. The destructor waits for every relay to end
// (their `done` calls into the service) before the service goes.
class Relay {
 public:
  explicit Relay(const std::string& target, grpc::ChannelArguments args = {}) {
    std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> fake;
    fake.push_back(std::make_unique<FakeNodeFactory>());
    service_ = std::make_unique<RelayService>(
        ForwardTarget{.channel = grpc::experimental::CreateCustomChannelWithInterceptors(
                          target, grpc::InsecureChannelCredentials(), args, std::move(fake)),
                      .address = target});
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(service_.get());
    server_ = b.BuildAndStart();
    addr_ = "127.0.0.1:" + std::to_string(port_);
  }
  ~Relay() {
    server_->Shutdown(In(milliseconds(500)));
    EXPECT_TRUE(service_->WaitAllEnded(milliseconds(10'000))) << "a relay never ended";
    server_.reset();
  }

  // A stub to A; `args` for the client's own channel.
  std::unique_ptr<v1::Inference::Stub> Stub(grpc::ChannelArguments args = {}) const {
    return v1::Inference::NewStub(
        grpc::CreateCustomChannel(addr_, grpc::InsecureChannelCredentials(), args));
  }
  RelayService& service() { return *service_; }
  ForwardStats& stats() { return *service_->stats(); }

 private:
  std::unique_ptr<RelayService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string addr_;
};

// ---- B: a real node ----

testing::TestNode StartNode() {
  ServerConfig c;
  c.model_dir = testing::TempModel("tiny");
  c.grace = milliseconds(0);
  return testing::StartTestNode(c);
}

// B, A relaying to it, and a client of A; `args` for both A's channel to B
// and the client's to A.
struct TwoNodes {
  explicit TwoNodes(const grpc::ChannelArguments& args = {})
      : b(StartNode()), a(b.addr, args), via_a(a.Stub(args)) {}
  testing::TestNode b;
  Relay a;
  std::unique_ptr<v1::Inference::Stub> via_a;
};

// B's x-cortiq-node as the relay sees it: B's own when it sends one, else
// the interceptor's.
std::string ExpectedNode(const std::multimap<grpc::string_ref, grpc::string_ref>& direct_md) {
  std::vector<std::string> v = Values(direct_md, std::string(kNodeMetadata));
  return v.empty() ? kFakeNode : v.front();
}

v1::GenerateRequest Greedy(std::string prompt, uint32_t max_tokens) {
  v1::GenerateRequest r;
  r.set_prompt(std::move(prompt));
  r.set_max_tokens(max_tokens);
  r.set_ignore_eos(true);
  r.mutable_sampling()->set_temperature(0.0f);
  return r;
}

struct Streamed {
  grpc::Status status;
  std::vector<int32_t> ids;
  std::string text;
  std::optional<v1::GenerateSummary> summary;
  std::vector<std::string> node, forwarded_by;  // those initial metadata values
};

Streamed Generate(v1::Inference::Stub& stub, const v1::GenerateRequest& r) {
  grpc::ClientContext ctx;
  ctx.set_deadline(In(milliseconds(60'000)));
  Streamed o;
  auto reader = stub.Generate(&ctx, r);
  v1::GenerateResponse m;
  while (reader->Read(&m)) {
    if (m.has_token()) {
      o.ids.push_back(m.token().token_id());
      o.text += m.token().text();
    }
    if (m.has_summary()) o.summary = m.summary();
  }
  o.status = reader->Finish();
  o.node = Values(ctx.GetServerInitialMetadata(), std::string(kNodeMetadata));
  o.forwarded_by = Values(ctx.GetServerInitialMetadata(), std::string(kForwardedByMetadata));
  return o;
}

// The summary less what differs between two runs (timings, the new id).
v1::GenerateSummary Comparable(v1::GenerateSummary s) {
  s.clear_timings();
  s.clear_session_id();
  return s;
}

// A kept session on B after one direct turn; returns its id.
std::string OpenSession(testing::TestNode& b) {
  v1::GenerateRequest r = Greedy("Call me Ishmael.", 8);
  r.set_keep_session(true);
  testing::StreamOut o = testing::RunGenerate(*b.stub, r);
  EXPECT_TRUE(o.status.ok()) << o.status.error_message();
  return o.session;
}

std::string ExportBytes(v1::Inference::Stub& stub, const std::string& id, grpc::Status* status) {
  grpc::ClientContext ctx;
  ctx.set_deadline(In(milliseconds(60'000)));
  v1::ExportSessionRequest req;
  req.set_session_id(id);
  auto reader = stub.ExportSession(&ctx, req);
  std::string out;
  v1::WireChunk chunk;
  while (reader->Read(&chunk)) out += chunk.data();
  *status = reader->Finish();
  return out;
}

// ---- (a) (f) (g): the same answers as direct ----

TEST(ForwardTest, GreedyGenerateThroughTheRelayEqualsDirect) {
  TwoNodes n;
  auto& [b, a, via_a] = n;
  const v1::GenerateRequest r = Greedy("Some years ago, never mind how long precisely", 40);

  Streamed direct = Generate(*b.stub, r);
  Streamed relayed = Generate(*via_a, r);
  ASSERT_TRUE(direct.status.ok()) << direct.status.error_message();
  ASSERT_TRUE(relayed.status.ok()) << relayed.status.error_message();
  EXPECT_EQ(relayed.ids.size(), 40u);
  EXPECT_EQ(relayed.ids, direct.ids);
  EXPECT_EQ(relayed.text, direct.text);
  ASSERT_TRUE(direct.summary && relayed.summary);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(Comparable(*relayed.summary),
                                                                 Comparable(*direct.summary)))
      << relayed.summary->DebugString() << "\nvs direct\n"
      << direct.summary->DebugString();

  // The client sees which node served it (exactly one name: B's), and who relayed.
  const std::string b_name = direct.node.empty() ? std::string(kFakeNode) : direct.node.front();
  EXPECT_EQ(relayed.node, std::vector<std::string>{b_name});
  EXPECT_EQ(relayed.forwarded_by, std::vector<std::string>{kRelayName});

  ASSERT_TRUE(a.service().WaitEnded(1, milliseconds(10'000)));
  const auto ended = a.service().ended();
  EXPECT_TRUE(ended[0].first.ok()) << ended[0].first.error_message();
  EXPECT_EQ(ended[0].second, 41u);  // 40 tokens and the summary
  EXPECT_EQ(a.stats().read.load(), 41u);
  EXPECT_EQ(a.stats().written.load(), 41u);
  EXPECT_EQ(a.stats().max_held.load(), 1u);
}

TEST(ForwardTest, ExportSessionThroughTheRelayGivesTheSameBytes) {
  TwoNodes n;
  auto& [b, a, via_a] = n;
  const std::string id = OpenSession(b);
  grpc::Status direct_status, relayed_status;
  const std::string direct = ExportBytes(*b.stub, id, &direct_status);
  const std::string relayed = ExportBytes(*via_a, id, &relayed_status);
  ASSERT_TRUE(direct_status.ok()) << direct_status.error_message();
  ASSERT_TRUE(relayed_status.ok()) << relayed_status.error_message();
  EXPECT_GT(direct.size(), 0u);
  EXPECT_EQ(relayed, direct);
}

TEST(ForwardTest, GetSessionThroughTheRelayEqualsDirect) {
  TwoNodes n;
  auto& [b, a, via_a] = n;
  const std::string id = OpenSession(b);
  v1::GetSessionRequest req;
  req.set_session_id(id);

  grpc::ClientContext direct_ctx, relayed_ctx;
  v1::SessionInfo direct, relayed;
  ASSERT_TRUE(b.stub->GetSession(&direct_ctx, req, &direct).ok());
  const grpc::Status st = via_a->GetSession(&relayed_ctx, req, &relayed);
  ASSERT_TRUE(st.ok()) << st.error_message();
  for (v1::SessionInfo* s : {&direct, &relayed}) {  // the clock's fields
    s->clear_age_seconds();
    s->clear_idle_seconds();
    s->clear_ttl_remaining_seconds();
  }
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(relayed, direct))
      << relayed.DebugString() << "\nvs direct\n"
      << direct.DebugString();
  EXPECT_EQ(relayed.session_id(), id);
  EXPECT_EQ(Values(relayed_ctx.GetServerInitialMetadata(), std::string(kNodeMetadata)),
            std::vector<std::string>{ExpectedNode(direct_ctx.GetServerInitialMetadata())});
  EXPECT_EQ(Values(relayed_ctx.GetServerInitialMetadata(), std::string(kForwardedByMetadata)),
            std::vector<std::string>{kRelayName});
}

TEST(ForwardTest, UnaryThroughTheLowLevelCallAndItsCancelHandleAfterCompletion) {
  TwoNodes n;
  auto& [b, a, via_a] = n;
  const std::string id = OpenSession(b);
  grpc::ClientContext ctx;
  v1::ReleaseSessionRequest req;
  req.set_session_id(id);
  v1::ReleaseSessionResponse resp;
  const grpc::Status st = via_a->ReleaseSession(&ctx, req, &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_TRUE(resp.released());
  EXPECT_FALSE(b.server->store().Get(id).has_value());
  // The handle after its call completed: nothing happens, twice.
  ForwardCancel cancel = a.service().last_cancel();
  cancel.Cancel();
  cancel.Cancel();
  ForwardCancel().Cancel();  // a handle of no call
}

// ---- (b): errors pass through unchanged ----

TEST(ForwardTest, ErrorsComeBackUnchanged) {
  TwoNodes n;
  auto& [b, a, via_a] = n;
  const std::string unknown = "0123456789abcdef0123456789abcdef";

  {  // unary: NOT_FOUND
    v1::GetSessionRequest req;
    req.set_session_id(unknown);
    grpc::ClientContext c1, c2;
    v1::SessionInfo r1, r2;
    const grpc::Status direct = b.stub->GetSession(&c1, req, &r1);
    const grpc::Status relayed = via_a->GetSession(&c2, req, &r2);
    EXPECT_EQ(direct.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_EQ(relayed.error_code(), direct.error_code());
    EXPECT_EQ(relayed.error_message(), direct.error_message());
  }
  {  // stream: NOT_FOUND for a session B does not hold
    v1::GenerateRequest r = Greedy("x", 4);
    r.set_session_id(unknown);
    Streamed direct = Generate(*b.stub, r), relayed = Generate(*via_a, r);
    EXPECT_EQ(direct.status.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_EQ(relayed.status.error_code(), direct.status.error_code());
    EXPECT_EQ(relayed.status.error_message(), direct.status.error_message());
    EXPECT_TRUE(relayed.ids.empty());
  }
  {  // stream: INVALID_ARGUMENT with B's message
    v1::GenerateRequest r = Greedy("both", 4);
    r.add_prompt_tokens(1);
    Streamed direct = Generate(*b.stub, r), relayed = Generate(*via_a, r);
    EXPECT_EQ(direct.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(direct.status.error_message(), "");
    EXPECT_EQ(relayed.status.error_code(), direct.status.error_code());
    EXPECT_EQ(relayed.status.error_message(), direct.status.error_message());
  }
  {  // ExportSession of an unknown session
    grpc::Status direct, relayed;
    ExportBytes(*b.stub, unknown, &direct);
    ExportBytes(*via_a, unknown, &relayed);
    EXPECT_EQ(direct.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_EQ(relayed.error_code(), direct.error_code());
    EXPECT_EQ(relayed.error_message(), direct.error_message());
  }
  ASSERT_TRUE(a.service().WaitEnded(4, milliseconds(10'000)));
  for (const auto& [status, messages] : a.service().ended()) {
    EXPECT_NE(status.error_code(), grpc::StatusCode::OK);  // what the client got
    EXPECT_EQ(messages, 0u);
  }
}

TEST(ForwardTest, AnUnreachableOwnerIsUnavailable) {
  // A port nothing listens on: bind one, note it, close it.
  int port = 0;
  {
    grpc::ServerBuilder sb;
    sb.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    std::unique_ptr<grpc::Server> s = sb.BuildAndStart();
    s->Shutdown();
  }
  Relay a("127.0.0.1:" + std::to_string(port));
  auto via_a = a.Stub();
  Streamed s = Generate(*via_a, Greedy("x", 4));
  EXPECT_EQ(s.status.error_code(), grpc::StatusCode::UNAVAILABLE) << s.status.error_message();
  grpc::ClientContext ctx;
  ctx.set_deadline(In(milliseconds(20'000)));
  v1::GetSessionRequest req;
  req.set_session_id("x");
  v1::SessionInfo info;
  EXPECT_EQ(via_a->GetSession(&ctx, req, &info).error_code(), grpc::StatusCode::UNAVAILABLE);
}

// ---- (c) (d): deadline and cancel reach the owner ----

TEST(ForwardTest, AClientDeadlineThroughTheRelayEndsTheOwnersCall) {
  // Small windows on both hops: a client that stops reading stalls the
  // relay, which stalls B's stream; only the deadline ends B's call then.
  TwoNodes n(SmallWindow());
  auto& [b, a, via_a] = n;
  grpc::ClientContext ctx;
  ctx.set_deadline(In(milliseconds(1'500)));
  auto reader = via_a->Generate(&ctx, Greedy("Call me Ishmael.", 4000));
  v1::GenerateResponse m;
  reader->Read(&m);                          // (one token, or the deadline: then nothing came)
  const grpc::Status st = reader->Finish();  // reads nothing more
  EXPECT_EQ(st.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << st.error_message();

  ServiceContext& bctx = b.server->context();
  const auto until = std::chrono::steady_clock::now() + seconds(10);
  EXPECT_TRUE(bctx.streams_in_flight.WaitIdleUntil(until));
  EXPECT_TRUE(bctx.jobs_in_flight.WaitIdleUntil(until));
  ASSERT_TRUE(a.service().WaitEnded(1, milliseconds(10'000)));
  EXPECT_EQ(a.service().ended()[0].first.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_LT(a.service().ended()[0].second, 4001u);
}

TEST(ForwardTest, AClientCancelMidStreamCancelsTheOwnersJobAndKeepsTheSession) {
  TwoNodes n(SmallWindow());
  auto& [b, a, via_a] = n;
  const std::string id = OpenSession(b);
  const auto before = b.server->store().Get(id)->tokens;

  v1::GenerateRequest r = Greedy(" Some years ago", 4000);
  r.set_session_id(id);
  r.set_keep_session(true);
  {
    grpc::ClientContext ctx;
    auto reader = via_a->Generate(&ctx, r);
    v1::GenerateResponse m;
    ASSERT_TRUE(reader->Read(&m) && m.has_token());
    ASSERT_TRUE(reader->Read(&m) && m.has_token());
    ctx.TryCancel();
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  ServiceContext& bctx = b.server->context();
  const auto until = std::chrono::steady_clock::now() + seconds(10);
  EXPECT_TRUE(bctx.streams_in_flight.WaitIdleUntil(until));
  EXPECT_TRUE(bctx.jobs_in_flight.WaitIdleUntil(until));
  // B's job was cut short (the stalled stream kept it from finishing), and
  // the session it leased is back, not busy.
  auto snap = b.server->store().Get(id);
  ASSERT_TRUE(snap.has_value());
  EXPECT_FALSE(snap->busy);
  EXPECT_LT(snap->tokens, before + 4000);
  ASSERT_TRUE(a.service().WaitEnded(1, milliseconds(10'000)));
  EXPECT_EQ(a.service().ended()[0].first.error_code(), grpc::StatusCode::CANCELLED);

  // Still usable, through the relay.
  r.set_max_tokens(5);
  Streamed next = Generate(*via_a, r);
  ASSERT_TRUE(next.status.ok()) << next.status.error_message();
  EXPECT_EQ(next.ids.size(), 5u);
}

// ---- (e): backpressure ----

TEST(ForwardTest, ASlowClientHoldsTheRelayToOneMessageAndSlowsTheOwner) {
  TwoNodes n(SmallWindow());
  auto& [b, a, via_a] = n;
  constexpr uint32_t kTokens = 2000;
  const v1::GenerateRequest r = Greedy("Call me Ishmael.", kTokens);
  const Streamed direct = Generate(*b.stub, r);
  ASSERT_TRUE(direct.status.ok());

  grpc::ClientContext ctx;
  ctx.set_deadline(In(milliseconds(120'000)));
  auto reader = via_a->Generate(&ctx, r);
  std::vector<int32_t> ids;
  v1::GenerateResponse m;
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(reader->Read(&m) && m.has_token());
    ids.push_back(m.token().token_id());
  }
  // The client stops reading. Wait until the relay stops moving (nothing
  // read from B for 300 ms; there is no event for "stalled" to wait on).
  ForwardStats& stats = a.stats();
  uint64_t read = stats.read.load();
  auto still_since = std::chrono::steady_clock::now();
  const auto give_up = still_since + seconds(30);
  while (std::chrono::steady_clock::now() - still_since < milliseconds(300) &&
         std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(milliseconds(20));
    if (stats.read.load() != read) {
      read = stats.read.load();
      still_since = std::chrono::steady_clock::now();
    }
  }
  const uint64_t written = stats.written.load();
  EXPECT_LE(read - written, 1u) << read << " read from B, " << written << " written down";
  // A stopped reading B: most of the stream is still behind B, whose call
  // is still open.
  EXPECT_LT(read, kTokens / 2) << "the relay read on while its client did not";
  EXPECT_EQ(b.server->context().streams_in_flight.count(), 1u);

  // The client reads again: the rest arrives, the same as direct.
  while (reader->Read(&m)) {
    if (m.has_token()) ids.push_back(m.token().token_id());
  }
  const grpc::Status st = reader->Finish();
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(ids, direct.ids);
  EXPECT_EQ(stats.read.load(), kTokens + 1u);
  EXPECT_EQ(stats.written.load(), kTokens + 1u);
  EXPECT_EQ(stats.max_held.load(), 1u);
}

// ---- what goes upstream: a peer that never answers ----

// Records each call's metadata and deadline, answers nothing until the call
// is cancelled (then finishes it CANCELLED and counts the cancel).
class HangingPeer final : public v1::Inference::CallbackService {
 public:
  HangingPeer() {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(this);
    server_ = b.BuildAndStart();
  }
  ~HangingPeer() override { server_->Shutdown(In(milliseconds(500))); }
  std::string addr() const { return "127.0.0.1:" + std::to_string(port_); }

  struct Seen {
    std::string hops, traceparent;
    std::chrono::system_clock::time_point deadline;
  };
  bool WaitCalls(size_t n, milliseconds timeout) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return seen_.size() >= n; });
  }
  bool WaitCancels(size_t n, milliseconds timeout) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return cancels_ >= n; });
  }
  Seen seen(size_t i) {
    std::lock_guard lock(mu_);
    return seen_.at(i);
  }

  grpc::ServerUnaryReactor* GetSession(grpc::CallbackServerContext* call,
                                       const v1::GetSessionRequest*, v1::SessionInfo*) override {
    Record(call);
    return new Held<grpc::ServerUnaryReactor>(this);
  }
  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(grpc::CallbackServerContext* call,
                                                           const v1::GenerateRequest*) override {
    Record(call);
    return new Held<grpc::ServerWriteReactor<v1::GenerateResponse>>(this);
  }

 private:
  template <typename Base>
  class Held final : public Base {
   public:
    explicit Held(HangingPeer* peer) : peer_(peer) { util::TsanRelease(this); }
    void OnCancel() override {
      util::TsanAcquire(this);
      peer_->Cancelled();
      util::TsanRelease(this);
      this->Finish(grpc::Status::CANCELLED);
    }
    void OnDone() override {
      util::TsanAcquire(this);
      delete this;
    }

   private:
    HangingPeer* peer_;
  };

  void Record(grpc::CallbackServerContext* call) {
    auto one = [&](const char* key) {
      auto it = call->client_metadata().find(key);
      return it == call->client_metadata().end()
                 ? std::string()
                 : std::string(it->second.data(), it->second.size());
    };
    {
      std::lock_guard lock(mu_);
      seen_.push_back({one("x-cortiq-hops"), one("traceparent"), call->deadline()});
    }
    cv_.notify_all();
  }
  void Cancelled() {
    {
      std::lock_guard lock(mu_);
      ++cancels_;
    }
    cv_.notify_all();
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Seen> seen_;
  size_t cancels_ = 0;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

TEST(ForwardTest, TheCallersDeadlineAndTheRelaysMetadataGoUpstream) {
  HangingPeer peer;
  Relay a(peer.addr());
  auto via_a = a.Stub();
  grpc::ClientContext ctx;
  const auto deadline = In(milliseconds(800));
  ctx.set_deadline(deadline);
  v1::GetSessionRequest req;
  req.set_session_id("s");
  v1::SessionInfo info;
  EXPECT_EQ(via_a->GetSession(&ctx, req, &info).error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  ASSERT_TRUE(peer.WaitCalls(1, milliseconds(10'000)));
  const HangingPeer::Seen seen = peer.seen(0);
  EXPECT_EQ(seen.hops, "1");
  EXPECT_EQ(seen.traceparent, kTraceparent);
  // The owner's deadline is the caller's (gRPC carries it as a timeout, so
  // it arrives a little earlier, never later).
  EXPECT_LE(seen.deadline, deadline + milliseconds(50));
  EXPECT_GT(seen.deadline, deadline - milliseconds(700));
  ASSERT_TRUE(a.service().WaitEnded(1, milliseconds(10'000)));
  EXPECT_EQ(a.service().ended()[0].first.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
}

TEST(ForwardTest, AClientCancelReachesAnOwnerThatHasNotAnswered) {
  HangingPeer peer;
  Relay a(peer.addr());
  auto via_a = a.Stub();
  {  // unary, no deadline: only the cancel can end the upstream call
    grpc::ClientContext ctx;
    v1::GetSessionRequest req;
    req.set_session_id("s");
    v1::SessionInfo info;
    std::mutex mu;
    std::condition_variable cv;
    std::optional<grpc::Status> got;
    via_a->async()->GetSession(&ctx, &req, &info, [&](grpc::Status s) {
      std::lock_guard lock(mu);
      got = s;
      cv.notify_all();
    });
    ASSERT_TRUE(peer.WaitCalls(1, milliseconds(10'000)));
    ctx.TryCancel();
    EXPECT_TRUE(peer.WaitCancels(1, milliseconds(10'000)));
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, seconds(10), [&] { return got.has_value(); }));
    EXPECT_EQ(got->error_code(), grpc::StatusCode::CANCELLED);
  }
  {  // a stream whose owner sent nothing yet (no headers, no message)
    grpc::ClientContext ctx;
    auto reader = via_a->Generate(&ctx, Greedy("x", 4));
    ASSERT_TRUE(peer.WaitCalls(2, milliseconds(10'000)));
    ctx.TryCancel();
    EXPECT_TRUE(peer.WaitCancels(2, milliseconds(10'000)));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  ASSERT_TRUE(a.service().WaitEnded(2, milliseconds(10'000)));
  for (const auto& [status, messages] : a.service().ended()) {
    EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED) << status.error_message();
    EXPECT_EQ(messages, 0u);
  }
}

}  // namespace
}  // namespace cortiq::server
