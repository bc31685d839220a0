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
//
// In Mode::kLater, A sets each relay up without a target and the test plays
// the service's lookup on the ForwardPending handle: a Begin long after the
// handler returned gives the same answers; Fail gives its status, from A; a
// cancel or deadline before Begin ends the call and the later Begin starts
// nothing; a retry after an unreachable owner or one that no longer holds
// the session (FakeOwner: names itself "wrong", then NOT_FOUND) goes to B
// with only B's node name; a stream that sent a message is never retried.
#include "server/forward.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
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

// A gRPC server on 127.0.0.1 port 0 serving `service` (null: none), shut
// down (500 ms of grace) by Stop or when it goes. As a member, the last one:
// calls may come as soon as it is built.
class Loopback {
 public:
  explicit Loopback(grpc::Service* service) {
    int port = 0;
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    if (service) b.RegisterService(service);
    server_ = b.BuildAndStart();
    addr_ = "127.0.0.1:" + std::to_string(port);
  }
  ~Loopback() { Stop(); }
  void Stop() {
    if (!server_) return;
    server_->Shutdown(In(milliseconds(500)));
    server_.reset();
  }
  const std::string& addr() const { return addr_; }

 private:
  std::unique_ptr<grpc::Server> server_;
  std::string addr_;
};

// A port nothing listens on: bind one, note it, close it.
std::string ClosedPort() {
  Loopback none(nullptr);
  none.Stop();
  return none.addr();
}

// A target for Begin: its own channel to `addr`.
ForwardTarget TargetAt(const std::string& addr) {
  return {.channel = grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()),
          .address = addr};
}

// ---- A: the relaying server ----

// The unary reactor A's handlers answer through: the call's bytes as they
// are (a relay never parses them).
class RawReactor final : public UnaryReactor {
 public:
  RawReactor(const grpc::ByteBuffer* request, grpc::ByteBuffer* response)
      : request_(request), response_(response) {}
  void Reply(const grpc::Status& status) override { ReplyRaw(status); }
  void ReplyRaw(const grpc::Status& status) override {
    util::TsanRelease(this);
    Finish(status);
  }
  const grpc::ByteBuffer& request_bytes() const override { return *request_; }
  grpc::ByteBuffer* response_bytes() override { return response_; }
  void OnDone() override {
    util::TsanAcquire(this);
    delete this;
  }

 private:
  const grpc::ByteBuffer* request_;
  grpc::ByteBuffer* response_;
};

// kNow: every handler forwards at once to A's one target. kLater: Generate,
// ExportSession and GetSession set a relay up without a target (the Later
// forms) and post its handle for the test, which plays the lookup: Begin,
// Fail, and Begin again after a retry, from the test's thread.
enum class Mode { kNow, kLater };

using RelayBase =
    v1::Inference::WithRawCallbackMethod_Generate<v1::Inference::WithRawCallbackMethod_GetSession<
        v1::Inference::WithRawCallbackMethod_ReleaseSession<
            v1::Inference::WithRawCallbackMethod_ExportSession<v1::Inference::Service>>>>;

// Forwards every call. kNow: to one target; streams and GetSession go
// through ForwardStream / ForwardUnaryCall, ReleaseSession through the
// low-level ForwardUnary, its cancel handle kept for the test. kLater: see
// Mode; each retry the relays ask is recorded and answered with
// set_retry's answer (default: no retry).
class RelayService final : public RelayBase {
 public:
  RelayService(ForwardTarget target, Mode mode) : target_(std::move(target)), mode_(mode) {}

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
    auto* reactor = new RawReactor(request, response);
    Started();
    auto ended = [this](const grpc::Status& s) { Ended(s, 0); };
    if (mode_ == Mode::kLater) {
      auto handle = std::make_shared<std::atomic<ForwardPending*>>(nullptr);
      ForwardPending* p = ForwardUnaryLater("/cortiq.v1.Inference/GetSession", call, reactor,
                                            Options(handle), ended);
      handle->store(p);  // before Post: retry runs only after the test's Begin
      Post(p);
    } else {
      ForwardUnaryCall(target_, "/cortiq.v1.Inference/GetSession", call, reactor, Options(), ended);
    }
    return reactor;
  }
  grpc::ServerUnaryReactor* ReleaseSession(grpc::CallbackServerContext* call,
                                           const grpc::ByteBuffer* request,
                                           grpc::ByteBuffer* response) override {
    auto* reactor = new RawReactor(request, response);
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
  void set_unary_limit(milliseconds limit) { unary_limit_ = limit; }

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
  const ForwardTarget& target() const { return target_; }

  // kLater: the next relay's handle, in order of arrival (null after
  // `timeout`).
  ForwardPending* WaitPending(milliseconds timeout) {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return !pending_.empty(); })) return nullptr;
    ForwardPending* p = pending_.front();
    pending_.erase(pending_.begin());
    return p;
  }
  // What retry answers from now on.
  void set_retry(bool answer) { retry_answer_.store(answer); }
  // From now on each retry takes the next of `targets` (while there is one)
  // and calls Begin on it itself, from inside retry — as a lookup that
  // finds a cached owner does — and answers true.
  void set_retry_targets(std::vector<ForwardTarget> targets) {
    std::lock_guard lock(mu_);
    retry_targets_ = std::move(targets);
  }
  // Waits until `n` retries were asked; the statuses they were asked with.
  bool WaitRetries(size_t n, milliseconds timeout) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return retries_.size() >= n; });
  }
  std::vector<grpc::Status> retries() {
    std::lock_guard lock(mu_);
    return retries_;
  }

 private:
  // `handle`: where the relay's handle will be (kLater), for a retry that
  // begins at once.
  ForwardOptions Options(std::shared_ptr<std::atomic<ForwardPending*>> handle = nullptr) {
    ForwardOptions o{.metadata = {{"x-cortiq-hops", "1"}, {"traceparent", kTraceparent}},
                     .forwarded_by = kRelayName,
                     .stats = stats_};
    o.unary_limit = unary_limit_.load();
    if (mode_ == Mode::kLater) {
      o.retry = [this, handle](const grpc::Status& s) {
        std::optional<ForwardTarget> next;
        {
          std::lock_guard lock(mu_);
          retries_.push_back(s);
          if (!retry_targets_.empty()) {
            next = retry_targets_.front();
            retry_targets_.erase(retry_targets_.begin());
          }
        }
        cv_.notify_all();
        if (next) {
          handle->load()->Begin(*next);
          return true;
        }
        return retry_answer_.load();
      };
    }
    return o;
  }
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Stream(const char* method,
                                                     grpc::CallbackServerContext* call,
                                                     const grpc::ByteBuffer& request) {
    Started();
    auto ended = [this](const grpc::Status& s, uint64_t n) { Ended(s, n); };
    if (mode_ == Mode::kLater) {
      auto handle = std::make_shared<std::atomic<ForwardPending*>>(nullptr);
      ForwardStreamStart start = ForwardStreamLater(method, call, request, Options(handle), ended);
      handle->store(start.pending);
      Post(start.pending);
      return start.reactor;
    }
    return ForwardStream(target_, method, call, request, Options(), ended);
  }
  void Post(ForwardPending* p) {
    {
      std::lock_guard lock(mu_);
      pending_.push_back(p);
    }
    cv_.notify_all();
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
  const Mode mode_;
  const std::shared_ptr<ForwardStats> stats_ = std::make_shared<ForwardStats>();
  std::atomic<milliseconds> unary_limit_{milliseconds(0)};
  std::atomic<bool> retry_answer_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  size_t started_ = 0;
  std::vector<std::pair<grpc::Status, uint64_t>> ended_;
  ForwardCancel last_cancel_;
  std::vector<ForwardPending*> pending_;
  std::vector<grpc::Status> retries_;
  std::vector<ForwardTarget> retry_targets_;
};

// A on 127.0.0.1 port 0, forwarding to `target` over a channel with `args`
// and the FakeNodeInterceptor. The destructor waits for every relay to end
// (their `done` calls into the service) before the service goes: in kLater
// mode, the test must have answered every handle.
class Relay {
 public:
  explicit Relay(const std::string& target, grpc::ChannelArguments args = {},
                 Mode mode = Mode::kNow)
      : service_(std::make_unique<RelayService>(TargetOf(target, args), mode)),
        server_(service_.get()) {}
  ~Relay() {
    server_.Stop();
    EXPECT_TRUE(service_->WaitAllEnded(milliseconds(10'000))) << "a relay never ended";
  }

  // A stub to A; `args` for the client's own channel.
  std::unique_ptr<v1::Inference::Stub> Stub(grpc::ChannelArguments args = {}) const {
    return v1::Inference::NewStub(
        grpc::CreateCustomChannel(server_.addr(), grpc::InsecureChannelCredentials(), args));
  }
  RelayService& service() { return *service_; }
  ForwardStats& stats() { return *service_->stats(); }

 private:
  static ForwardTarget TargetOf(const std::string& target, const grpc::ChannelArguments& args) {
    std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> fake;
    fake.push_back(std::make_unique<FakeNodeFactory>());
    return {.channel = grpc::experimental::CreateCustomChannelWithInterceptors(
                target, grpc::InsecureChannelCredentials(), args, std::move(fake)),
            .address = target};
  }

  std::unique_ptr<RelayService> service_;
  Loopback server_;
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
  Relay a(ClosedPort());
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
  std::string addr() const { return server_.addr(); }

  struct Seen {
    std::string method, hops, traceparent;
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
  size_t calls() {
    std::lock_guard lock(mu_);
    return seen_.size();
  }

  grpc::ServerUnaryReactor* GetSession(grpc::CallbackServerContext* call,
                                       const v1::GetSessionRequest*, v1::SessionInfo*) override {
    Record(call, "GetSession");
    return new Held<grpc::ServerUnaryReactor>(this);
  }
  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(grpc::CallbackServerContext* call,
                                                           const v1::GenerateRequest*) override {
    Record(call, "Generate");
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

  void Record(grpc::CallbackServerContext* call, std::string method) {
    auto one = [&](const char* key) {
      auto it = call->client_metadata().find(key);
      return it == call->client_metadata().end()
                 ? std::string()
                 : std::string(it->second.data(), it->second.size());
    };
    {
      std::lock_guard lock(mu_);
      seen_.push_back(
          {std::move(method), one("x-cortiq-hops"), one("traceparent"), call->deadline()});
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
  Loopback server_{this};  // last: it serves the members above
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

// A client without a deadline: the relay's unary limit bounds the wait for
// an owner that never answers (it used to wait for ever), upstream and
// down; the owner's call is cancelled at that deadline.
TEST(ForwardTest, AUnaryRelayWaitsForAHangingOwnerAtMostItsLimit) {
  HangingPeer peer;
  Relay a(peer.addr());
  a.service().set_unary_limit(milliseconds(300));
  auto via_a = a.Stub();
  grpc::ClientContext ctx;  // no deadline
  v1::GetSessionRequest req;
  req.set_session_id("s");
  v1::SessionInfo info;
  const auto before = std::chrono::system_clock::now();
  EXPECT_EQ(via_a->GetSession(&ctx, req, &info).error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  ASSERT_TRUE(peer.WaitCalls(1, milliseconds(10'000)));
  // The owner's deadline is its receive time plus the timeout gRPC carries
  // (rounded up), so it may lie a little past the relay's own; bound it.
  EXPECT_LE(peer.seen(0).deadline, std::chrono::system_clock::now() + milliseconds(50));
  EXPECT_GT(peer.seen(0).deadline, before);
  EXPECT_TRUE(peer.WaitCancels(1, milliseconds(10'000)));
  ASSERT_TRUE(a.service().WaitEnded(1, milliseconds(10'000)));
  EXPECT_EQ(a.service().ended()[0].first.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  // A client deadline earlier than the limit is the one that goes upstream.
  a.service().set_unary_limit(milliseconds(600'000));
  grpc::ClientContext short_ctx;
  const auto deadline = In(milliseconds(300));
  short_ctx.set_deadline(deadline);
  EXPECT_EQ(via_a->GetSession(&short_ctx, req, &info).error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);
  ASSERT_TRUE(peer.WaitCalls(2, milliseconds(10'000)));
  EXPECT_LE(peer.seen(1).deadline, deadline + milliseconds(50));
}

// ---- deferred start and retry ----

constexpr char kWrongNode[] = "wrong";

// A node that no longer holds the session: it names itself ("wrong") in
// its initial metadata, sends them, then fails GetSession and Generate with
// `status` — Generate after `messages` token messages.
class FakeOwner final : public v1::Inference::CallbackService {
 public:
  explicit FakeOwner(int messages = 0,
                     grpc::Status status = grpc::Status(grpc::StatusCode::NOT_FOUND,
                                                        "fake owner: no such session"))
      : messages_(messages), status_(std::move(status)) {}
  std::string addr() const { return server_.addr(); }

  grpc::ServerUnaryReactor* GetSession(grpc::CallbackServerContext* call,
                                       const v1::GetSessionRequest*, v1::SessionInfo*) override {
    return new WrongUnary(call, status_);
  }
  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(grpc::CallbackServerContext* call,
                                                           const v1::GenerateRequest*) override {
    return new WrongStream(call, messages_, status_);
  }

 private:
  class WrongUnary final : public grpc::ServerUnaryReactor {
   public:
    WrongUnary(grpc::CallbackServerContext* call, grpc::Status status)
        : status_(std::move(status)) {
      call->AddInitialMetadata(std::string(kNodeMetadata), kWrongNode);
      util::TsanRelease(this);
      StartSendInitialMetadata();
    }
    void OnSendInitialMetadataDone(bool /*ok*/) override {
      util::TsanAcquire(this);
      util::TsanRelease(this);
      Finish(status_);
    }
    void OnDone() override {
      util::TsanAcquire(this);
      delete this;
    }

   private:
    const grpc::Status status_;
  };

  class WrongStream final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
   public:
    WrongStream(grpc::CallbackServerContext* call, int messages, grpc::Status status)
        : left_(messages), status_(std::move(status)) {
      call->AddInitialMetadata(std::string(kNodeMetadata), kWrongNode);
      message_.mutable_token()->set_token_id(7);
      message_.mutable_token()->set_text("?");
      util::TsanRelease(this);
      StartSendInitialMetadata();
    }
    void OnSendInitialMetadataDone(bool ok) override { Next(ok); }
    void OnWriteDone(bool ok) override { Next(ok); }
    void OnDone() override {
      util::TsanAcquire(this);
      delete this;
    }

   private:
    void Next(bool ok) {
      util::TsanAcquire(this);
      if (ok && left_ > 0) {
        --left_;
        util::TsanRelease(this);
        StartWrite(&message_);
      } else {
        util::TsanRelease(this);
        Finish(status_);
      }
    }
    int left_;
    const grpc::Status status_;
    v1::GenerateResponse message_;
  };

  const int messages_;
  const grpc::Status status_;
  Loopback server_{this};  // last: it serves the members above
};

struct UnaryOut {
  grpc::Status status;
  v1::SessionInfo info;
  std::vector<std::string> node, forwarded_by;  // those initial metadata values
};

// GetSession of `id` through `stub` on `ctx` (a 60 s deadline unless it has
// one), blocking.
UnaryOut GetSession(v1::Inference::Stub& stub, const std::string& id, grpc::ClientContext& ctx) {
  if (ctx.deadline() == std::chrono::system_clock::time_point::max()) {
    ctx.set_deadline(In(milliseconds(60'000)));
  }
  v1::GetSessionRequest req;
  req.set_session_id(id);
  UnaryOut o;
  o.status = stub.GetSession(&ctx, req, &o.info);
  o.node = Values(ctx.GetServerInitialMetadata(), std::string(kNodeMetadata));
  o.forwarded_by = Values(ctx.GetServerInitialMetadata(), std::string(kForwardedByMetadata));
  // The clock's fields differ between two reads.
  o.info.clear_age_seconds();
  o.info.clear_idle_seconds();
  o.info.clear_ttl_remaining_seconds();
  return o;
}
UnaryOut GetSession(v1::Inference::Stub& stub, const std::string& id) {
  grpc::ClientContext ctx;
  return GetSession(stub, id, ctx);
}

// The relay's handle for the call the test just made (kLater).
ForwardPending* NextPending(Relay& a) {
  ForwardPending* p = a.service().WaitPending(milliseconds(10'000));
  EXPECT_NE(p, nullptr) << "no relay was set up";
  return p;
}

// A call made through A (kLater) on a thread of its own, and the handle of
// the relay A set up for it (null when none came).
template <typename Out>
struct Relayed {
  std::future<Out> out;
  ForwardPending* pending;
};
template <typename Call>
Relayed<std::invoke_result_t<Call>> Through(Relay& a, Call call) {
  auto out = std::async(std::launch::async, std::move(call));
  return {std::move(out), NextPending(a)};
}

// `got` (through A) is `want`'s answer (direct to B): the same tokens, the
// same node name (B's, exactly one), and A as the relay.
void ExpectSameStream(const Streamed& got, const Streamed& want) {
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.ids, want.ids);
  EXPECT_EQ(got.text, want.text);
  EXPECT_EQ(got.node, want.node);
  EXPECT_EQ(got.forwarded_by, std::vector<std::string>{kRelayName});
}
// ... the same session info.
void ExpectSameInfo(const UnaryOut& got, const UnaryOut& want) {
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(got.info, want.info))
      << got.info.DebugString() << "\nvs direct\n"
      << want.info.DebugString();
  EXPECT_EQ(got.node, want.node);
  EXPECT_EQ(got.forwarded_by, std::vector<std::string>{kRelayName});
}

void ExpectStatus(const grpc::Status& got, const grpc::Status& want) {
  EXPECT_EQ(got.error_code(), want.error_code()) << got.error_message();
  EXPECT_EQ(got.error_message(), want.error_message());
}

// B and its direct answers, to compare what comes through A with.
struct DirectB {
  explicit DirectB(const v1::GenerateRequest& r) : node(StartNode()) {
    tokens = Generate(*node.stub, r);
    EXPECT_TRUE(tokens.status.ok()) << tokens.status.error_message();
    EXPECT_EQ(tokens.node.size(), 1u);
    id = OpenSession(node);
    info = GetSession(*node.stub, id);
    EXPECT_TRUE(info.status.ok()) << info.status.error_message();
  }
  testing::TestNode node;
  Streamed tokens;  // r's answer
  std::string id;   // a kept session
  UnaryOut info;    // its GetSession
};

TEST(ForwardTest, ADeferredBeginGivesTheSameTokensAndSessionInfo) {
  const v1::GenerateRequest r = Greedy("It is a truth universally acknowledged", 24);
  DirectB b(r);
  Relay a(b.node.addr, {}, Mode::kLater);
  auto via_a = a.Stub();
  // Each time the owner is known only later: the handler returned its
  // reactor long ago (a delay to show it, not a synchronisation).
  {
    auto call = Through(a, [&] { return Generate(*via_a, r); });
    ASSERT_NE(call.pending, nullptr);
    std::this_thread::sleep_for(milliseconds(200));
    call.pending->Begin(TargetAt(b.node.addr));
    ExpectSameStream(call.out.get(), b.tokens);
  }
  {
    auto call = Through(a, [&] { return GetSession(*via_a, b.id); });
    ASSERT_NE(call.pending, nullptr);
    std::this_thread::sleep_for(milliseconds(200));
    call.pending->Begin(TargetAt(b.node.addr));
    ExpectSameInfo(call.out.get(), b.info);
  }
  ASSERT_TRUE(a.service().WaitEnded(2, milliseconds(10'000)));
  for (const auto& [status, messages] : a.service().ended()) EXPECT_TRUE(status.ok());
  EXPECT_EQ(a.service().ended()[0].second, 25u);  // 24 tokens and the summary
  EXPECT_EQ(a.stats().attempts.load(), 2u);
  EXPECT_TRUE(a.service().retries().empty());  // none is asked when the owner answers OK
}

TEST(ForwardTest, FailEndsTheCallWithItsStatusFromThisNode) {
  Relay a(ClosedPort(), {}, Mode::kLater);
  auto via_a = a.Stub();
  const grpc::Status not_found(grpc::StatusCode::NOT_FOUND,
                               "no session '0123456789abcdef0123456789abcdef' on this node or "
                               "its 2 peers");
  // This node answered: its name, and no relay header.
  {
    auto call = Through(a, [&] { return Generate(*via_a, Greedy("x", 4)); });
    ASSERT_NE(call.pending, nullptr);
    call.pending->Fail(not_found);
    const Streamed got = call.out.get();
    ExpectStatus(got.status, not_found);
    EXPECT_TRUE(got.ids.empty());
    EXPECT_EQ(got.node, std::vector<std::string>{kRelayName});
    EXPECT_TRUE(got.forwarded_by.empty());
  }
  {
    auto call = Through(a, [&] { return GetSession(*via_a, "s"); });
    ASSERT_NE(call.pending, nullptr);
    call.pending->Fail(not_found);
    const UnaryOut got = call.out.get();
    ExpectStatus(got.status, not_found);
    EXPECT_EQ(got.node, std::vector<std::string>{kRelayName});
    EXPECT_TRUE(got.forwarded_by.empty());
  }
  ASSERT_TRUE(a.service().WaitEnded(2, milliseconds(10'000)));
  for (const auto& [status, messages] : a.service().ended()) {
    ExpectStatus(status, not_found);
    EXPECT_EQ(messages, 0u);
  }
  EXPECT_EQ(a.stats().attempts.load(), 0u);
}

TEST(ForwardTest, ACancelBeforeBeginEndsTheCallAndTheLaterBeginStartsNothing) {
  HangingPeer peer;
  Relay a(ClosedPort(), {}, Mode::kLater);
  a.service().set_retry(true);
  auto via_a = a.Stub();
  std::vector<ForwardPending*> late;  // each gets its Begin once its call is over
  {                                   // a stream, the client cancels
    grpc::ClientContext ctx;
    auto reader = via_a->Generate(&ctx, Greedy("x", 4));
    ForwardPending* p = NextPending(a);
    ASSERT_NE(p, nullptr);
    ctx.TryCancel();
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
    // The relay ended the call with no owner (its done ran; no Begin yet).
    ASSERT_TRUE(a.service().WaitEnded(1, milliseconds(10'000)));
    late.push_back(p);
  }
  {  // a unary call whose deadline passes
    grpc::ClientContext ctx;
    ctx.set_deadline(In(milliseconds(300)));
    EXPECT_EQ(GetSession(*via_a, "s", ctx).status.error_code(),
              grpc::StatusCode::DEADLINE_EXCEEDED);
    ForwardPending* p = NextPending(a);
    ASSERT_NE(p, nullptr);
    ASSERT_TRUE(a.service().WaitEnded(2, milliseconds(10'000)));
    late.push_back(p);
  }
  // The same while a retry waits for its Begin: the first owner is
  // unreachable, retry says yes, and the client cancels before the next.
  {  // a stream
    grpc::ClientContext ctx;
    auto reader = via_a->Generate(&ctx, Greedy("x", 4));
    ForwardPending* p = NextPending(a);
    ASSERT_NE(p, nullptr);
    p->Begin(a.service().target());
    ASSERT_TRUE(a.service().WaitRetries(1, milliseconds(20'000)));
    ctx.TryCancel();
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
    ASSERT_TRUE(a.service().WaitEnded(3, milliseconds(10'000)));
    late.push_back(p);
  }
  {  // a unary call
    grpc::ClientContext ctx;
    auto call = Through(a, [&] { return GetSession(*via_a, "s", ctx); });
    ASSERT_NE(call.pending, nullptr);
    call.pending->Begin(a.service().target());
    ASSERT_TRUE(a.service().WaitRetries(2, milliseconds(20'000)));
    ctx.TryCancel();
    EXPECT_EQ(call.out.get().status.error_code(), grpc::StatusCode::CANCELLED);
    ASSERT_TRUE(a.service().WaitEnded(4, milliseconds(10'000)));
    late.push_back(call.pending);
  }
  const auto ended = a.service().ended();
  ASSERT_EQ(ended.size(), 4u);
  EXPECT_EQ(ended[0].first.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(ended[1].first.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(ended[2].first.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(ended[3].first.error_code(), grpc::StatusCode::CANCELLED);
  for (const auto& [status, messages] : ended) EXPECT_EQ(messages, 0u);
  for (const auto& s : a.service().retries()) {
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  }

  // Now the owner is "found": these Begins only free their relays.
  for (ForwardPending* p : late) p->Begin(TargetAt(peer.addr()));
  EXPECT_EQ(a.stats().attempts.load(), 2u);  // the two unreachable ones only
  // The peer sees the next call made to it, and only that one.
  grpc::ClientContext probe_ctx;
  probe_ctx.set_deadline(In(milliseconds(1'000)));
  auto probe = Through(a, [&] { return GetSession(*via_a, "probe", probe_ctx); });
  ASSERT_NE(probe.pending, nullptr);
  probe.pending->Begin(TargetAt(peer.addr()));
  EXPECT_EQ(probe.out.get().status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  ASSERT_TRUE(peer.WaitCancels(1, milliseconds(10'000)));
  EXPECT_EQ(peer.calls(), 1u);
  EXPECT_EQ(peer.seen(0).method, "GetSession");
  // The probe's attempt ended by its client's deadline: not offered to
  // retry (which would say yes), answered.
  ASSERT_TRUE(a.service().WaitEnded(5, milliseconds(10'000)));
  EXPECT_EQ(a.service().ended()[4].first.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(a.service().retries().size(), 2u);
}

TEST(ForwardTest, ARetriedStreamGoesToTheNextOwnerWithOnlyItsNodeName) {
  const v1::GenerateRequest r = Greedy("Happy families are all alike", 24);
  DirectB b(r);
  FakeOwner wrong;
  Relay a(ClosedPort(), {}, Mode::kLater);
  a.service().set_retry(true);
  auto via_a = a.Stub();

  // First an owner that cannot be reached (nothing was sent down), then
  // one that names itself and answers NOT_FOUND; each time B after it.
  const ForwardTarget firsts[] = {a.service().target(), TargetAt(wrong.addr())};
  const grpc::StatusCode codes[] = {grpc::StatusCode::UNAVAILABLE, grpc::StatusCode::NOT_FOUND};
  for (size_t i = 0; i < 2; ++i) {
    auto call = Through(a, [&] { return Generate(*via_a, r); });
    ASSERT_NE(call.pending, nullptr);
    call.pending->Begin(firsts[i]);
    ASSERT_TRUE(a.service().WaitRetries(i + 1, milliseconds(20'000)));
    EXPECT_EQ(a.service().retries()[i].error_code(), codes[i])
        << a.service().retries()[i].error_message();
    call.pending->Begin(TargetAt(b.node.addr));  // the same handle, once more
    ExpectSameStream(call.out.get(), b.tokens);
  }
  ASSERT_TRUE(a.service().WaitEnded(2, milliseconds(10'000)));
  for (const auto& [status, messages] : a.service().ended()) {
    EXPECT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(messages, 25u);
  }
  EXPECT_EQ(a.service().retries().size(), 2u);
  EXPECT_EQ(a.stats().attempts.load(), 4u);
  EXPECT_EQ(a.stats().read.load(), 50u);  // nothing from the failed attempts
}

TEST(ForwardTest, ARetriedUnaryCallGivesTheNextOwnersAnswerAndNodeOnly) {
  DirectB b(Greedy("x", 1));
  FakeOwner wrong;
  Relay a(ClosedPort(), {}, Mode::kLater);
  a.service().set_retry(true);
  auto via_a = a.Stub();

  auto call = Through(a, [&] { return GetSession(*via_a, b.id); });
  ASSERT_NE(call.pending, nullptr);
  call.pending->Begin(TargetAt(wrong.addr()));  // sends x-cortiq-node: wrong, then NOT_FOUND
  ASSERT_TRUE(a.service().WaitRetries(1, milliseconds(20'000)));
  EXPECT_EQ(a.service().retries()[0].error_code(), grpc::StatusCode::NOT_FOUND);
  call.pending->Begin(TargetAt(b.node.addr));
  ExpectSameInfo(call.out.get(), b.info);  // B's node only, not "wrong"
  ASSERT_TRUE(a.service().WaitEnded(1, milliseconds(10'000)));
  EXPECT_TRUE(a.service().ended()[0].first.ok());
  EXPECT_EQ(a.stats().attempts.load(), 2u);
}

TEST(ForwardTest, ARetryMayBeginTheNextAttemptFromInsideRetry) {
  const v1::GenerateRequest r = Greedy("All happy families are alike", 16);
  DirectB b(r);
  FakeOwner wrong;
  Relay a(ClosedPort(), {}, Mode::kLater);
  auto via_a = a.Stub();
  {  // a stream: unreachable, then the fake owner (begun inside the first
     // retry), then B (inside the second)
    a.service().set_retry_targets({TargetAt(wrong.addr()), TargetAt(b.node.addr)});
    auto call = Through(a, [&] { return Generate(*via_a, r); });
    ASSERT_NE(call.pending, nullptr);
    call.pending->Begin(a.service().target());
    ExpectSameStream(call.out.get(), b.tokens);
  }
  {  // a unary call: the fake owner, then B
    a.service().set_retry_targets({TargetAt(b.node.addr)});
    auto call = Through(a, [&] { return GetSession(*via_a, b.id); });
    ASSERT_NE(call.pending, nullptr);
    call.pending->Begin(TargetAt(wrong.addr()));
    ExpectSameInfo(call.out.get(), b.info);
  }
  ASSERT_TRUE(a.service().WaitEnded(2, milliseconds(10'000)));
  for (const auto& [status, messages] : a.service().ended()) EXPECT_TRUE(status.ok());
  const auto retries = a.service().retries();
  ASSERT_EQ(retries.size(), 3u);
  EXPECT_EQ(retries[0].error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(retries[1].error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(retries[2].error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(a.stats().attempts.load(), 5u);
}

TEST(ForwardTest, ADeclinedRetryAnswersWithTheOwnersStatusAndNode) {
  FakeOwner wrong;
  Relay a(ClosedPort(), {}, Mode::kLater);  // retry answers false
  auto via_a = a.Stub();
  const grpc::Status owners(grpc::StatusCode::NOT_FOUND, "fake owner: no such session");
  {
    auto call = Through(a, [&] { return Generate(*via_a, Greedy("x", 4)); });
    ASSERT_NE(call.pending, nullptr);
    call.pending->Begin(TargetAt(wrong.addr()));
    const Streamed got = call.out.get();
    ExpectStatus(got.status, owners);
    EXPECT_EQ(got.node, std::vector<std::string>{kWrongNode});
    EXPECT_EQ(got.forwarded_by, std::vector<std::string>{kRelayName});
  }
  {
    auto call = Through(a, [&] { return GetSession(*via_a, "s"); });
    ASSERT_NE(call.pending, nullptr);
    call.pending->Begin(TargetAt(wrong.addr()));
    const UnaryOut got = call.out.get();
    ExpectStatus(got.status, owners);
    EXPECT_EQ(got.node, std::vector<std::string>{kWrongNode});
  }
  EXPECT_EQ(a.service().retries().size(), 2u);  // asked, and declined
  ASSERT_TRUE(a.service().WaitEnded(2, milliseconds(10'000)));
  for (const auto& [status, messages] : a.service().ended()) ExpectStatus(status, owners);
}

TEST(ForwardTest, AStreamThatSentAMessageIsNeverRetried) {
  const grpc::Status gone(grpc::StatusCode::UNAVAILABLE, "fake owner: gone mid-stream");
  FakeOwner half(1, gone);
  Relay a(ClosedPort(), {}, Mode::kLater);
  a.service().set_retry(true);
  auto via_a = a.Stub();
  auto call = Through(a, [&] { return Generate(*via_a, Greedy("x", 4)); });
  ASSERT_NE(call.pending, nullptr);
  call.pending->Begin(TargetAt(half.addr()));
  const Streamed got = call.out.get();
  EXPECT_EQ(got.ids, std::vector<int32_t>{7});  // the one message went down ...
  ExpectStatus(got.status, gone);               // ... then its status
  EXPECT_EQ(got.node, std::vector<std::string>{kWrongNode});
  ASSERT_TRUE(a.service().WaitEnded(1, milliseconds(10'000)));
  EXPECT_EQ(a.service().ended()[0].second, 1u);
  EXPECT_TRUE(a.service().retries().empty());  // never asked
  EXPECT_EQ(a.stats().attempts.load(), 1u);
}

}  // namespace
}  // namespace cortiq::server
