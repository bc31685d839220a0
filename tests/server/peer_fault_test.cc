// Peers cannot hang a node (issue 17, requirement 2). A fake peer — a real
// gRPC server written here, not a mock of ours — answers GetModelInfo as a
// real node does (a copy of a real node's ModelInfo), and its ImportSession
// reads the first chunk, then stops reading and never answers. Against it:
// a caller's cancel or deadline unlocks the source session at once, intact;
// ReleaseSession during the stalled migration answers promptly with what it
// freed, the gauges agreeing; the per-call deadline scales with the bytes;
// a drain migrates in parallel and ends by --drain-timeout; and a real
// cortiq-server process exits after SIGTERM within its configured bound.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <future>
#include <mutex>
#include <thread>

#include "cortiq/v1/inference.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/migration.h"
#include "server/server.h"
#include "tests/common/model_test_util.h"
#include "tests/common/prom_text.h"
#include "tests/common/server_test_util.h"

namespace cortiq::server {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
namespace v1 = ::cortiq::v1;

double MsSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// The stalling peer. GetModelInfo answers `info`; ImportSession reads one
// chunk, counts the stream as stalled, and then holds the call (reading
// nothing more) until the caller cancels it or the peer is destroyed.
class StallingPeer final : public v1::Inference::Service {
 public:
  explicit StallingPeer(v1::ModelInfo info) : info_(std::move(info)) {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(this);
    server_ = b.BuildAndStart();
  }
  ~StallingPeer() override {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    server_->Shutdown(std::chrono::system_clock::now() + milliseconds(500));
  }
  std::string addr() const { return "127.0.0.1:" + std::to_string(port_); }

  // Waits until `n` imports have stalled (read their first chunk).
  bool WaitStalled(int n, milliseconds timeout) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return stalled_ >= n; });
  }
  int stalled() {
    std::lock_guard lock(mu_);
    return stalled_;
  }

  // The traceparent metadata of every call received ("" when none came).
  std::vector<std::string> traceparents() {
    std::lock_guard lock(mu_);
    return traceparents_;
  }

  grpc::Status GetModelInfo(grpc::ServerContext* ctx, const v1::GetModelInfoRequest*,
                            v1::ModelInfo* out) override {
    Record(*ctx);
    *out = info_;
    return grpc::Status::OK;
  }
  grpc::Status ImportSession(grpc::ServerContext* ctx, grpc::ServerReader<v1::WireChunk>* reader,
                             v1::ImportSessionResponse*) override {
    Record(*ctx);
    v1::WireChunk first;
    if (!reader->Read(&first)) return {grpc::StatusCode::INVALID_ARGUMENT, "no chunk"};
    std::unique_lock lock(mu_);
    ++stalled_;
    cv_.notify_all();
    // A sync handler cannot be woken by the cancel: look every 5 ms.
    while (!stopping_ && !ctx->IsCancelled()) cv_.wait_for(lock, milliseconds(5));
    return {grpc::StatusCode::CANCELLED, "stalled peer: call ended"};
  }

 private:
  void Record(const grpc::ServerContext& ctx) {
    auto it = ctx.client_metadata().find("traceparent");
    std::lock_guard lock(mu_);
    traceparents_.emplace_back(it == ctx.client_metadata().end()
                                   ? std::string()
                                   : std::string(it->second.data(), it->second.size()));
  }

  const v1::ModelInfo info_;
  int port_ = 0;
  std::vector<std::string> traceparents_;
  std::unique_ptr<grpc::Server> server_;
  std::mutex mu_;
  std::condition_variable cv_;
  int stalled_ = 0;
  bool stopping_ = false;
};

// Small peer timeouts: connect 300 ms; the tiny model's sessions (a few
// hundred KiB) at 1 GiB/s add ~0: a stalled ImportSession ends after about
// 300 ms + kPeerDeadlineFloor (1 s).
ServerConfig NodeConfig() {
  ServerConfig c;
  c.model_dir = testing::TempModel("tiny");
  c.grace = milliseconds(0);
  c.peer_connect_timeout = milliseconds(300);
  c.peer_min_throughput = size_t{1} << 30;
  return c;
}

// A real node's ModelInfo, for the fake peer to answer with.
v1::ModelInfo InfoOf(testing::TestNode& n) {
  grpc::ClientContext ctx;
  v1::ModelInfo info;
  EXPECT_TRUE(n.stub->GetModelInfo(&ctx, {}, &info).ok());
  return info;
}

// What a real node with NodeConfig() answers, from a node started (once)
// for the purpose: a fake peer that must exist before the node that names it.
const v1::ModelInfo& TinyModelInfo() {
  static const v1::ModelInfo info = [] {
    testing::TestNode n = testing::StartTestNode(NodeConfig());
    return InfoOf(n);
  }();
  return info;
}

using testing::KeptTurn;

// `n` kept sessions opened on `node` (one turn each); fewer if a turn failed
// (the test's size check then fails).
std::vector<std::string> KeepSessions(testing::TestNode& node, int n) {
  std::vector<std::string> ids;
  for (int i = 0; i < n; ++i) {
    testing::StreamOut s = KeptTurn(node, "", "session " + std::to_string(i));
    EXPECT_TRUE(s.status.ok()) << s.status.error_message();
    if (s.status.ok()) ids.push_back(s.session);
  }
  return ids;
}

v1::MigrateSessionRequest MigrateTo(const std::string& session, const std::string& peer) {
  v1::MigrateSessionRequest r;
  r.set_session_id(session);
  r.set_peer(peer);
  return r;
}

// Polls (1 ms) until the session is not leased; the time it took, or -1
// after `timeout`.
double MsUntilUnlocked(session::SessionStore& store, const std::string& id, milliseconds timeout) {
  const auto start = Clock::now();
  while (Clock::now() - start < timeout) {
    std::optional<session::SessionSnapshot> s = store.Get(id);
    if (s && !s->busy) return MsSince(start);
    std::this_thread::sleep_for(milliseconds(1));
  }
  return -1;
}

// The slack a loaded 2-core CI machine gets over the 100 ms the issue asks for.
constexpr double kPromptMs = 300;

class PeerFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    peer_ = std::make_unique<StallingPeer>(TinyModelInfo());
    ServerConfig c = NodeConfig();
    c.migrate_allow = {peer_->addr()};  // MigrateSession's target
    a_ = testing::StartTestNode(c);
    ASSERT_TRUE(a_.server);
  }
  testing::TestNode a_;
  std::unique_ptr<StallingPeer> peer_;
};

// (a) The caller cancels, or its deadline passes, while the peer stalls:
// the session is unlocked within kPromptMs and continues exactly as an
// untouched twin does.
TEST_F(PeerFaultTest, CallerCancelOrDeadlineUnlocksTheSessionIntact) {
  const std::string prompt = "It was the best of times";
  for (bool use_deadline : {false, true}) {
    SCOPED_TRACE(use_deadline ? "deadline" : "cancel");
    testing::StreamOut moved = KeptTurn(a_, "", prompt), twin = KeptTurn(a_, "", prompt);
    ASSERT_TRUE(moved.status.ok() && twin.status.ok());
    const int stalled_before = peer_->stalled();
    grpc::ClientContext ctx;
    if (use_deadline) ctx.set_deadline(std::chrono::system_clock::now() + milliseconds(400));
    v1::MigrateSessionResponse resp;
    auto call = std::async(std::launch::async, [&] {
      return a_.stub->MigrateSession(&ctx, MigrateTo(moved.session, peer_->addr()), &resp);
    });
    ASSERT_TRUE(peer_->WaitStalled(stalled_before + 1, milliseconds(5000)));
    ASSERT_TRUE(a_.server->store().Get(moved.session)->busy);
    Clock::time_point ended;
    if (use_deadline) {
      const grpc::Status st = call.get();
      EXPECT_EQ(st.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << st.error_message();
      ended = Clock::now();
    } else {
      ended = Clock::now();
      ctx.TryCancel();
      EXPECT_EQ(call.get().error_code(), grpc::StatusCode::CANCELLED);
    }
    const double ms = MsUntilUnlocked(a_.server->store(), moved.session, milliseconds(5000));
    const double total = MsSince(ended);
    std::printf("unlocked %.1f ms after the %s reached the client\n", total,
                use_deadline ? "deadline" : "cancel");
    EXPECT_GE(ms, 0) << "still leased after 5 s";
    EXPECT_LT(total, kPromptMs);
    // Generate works at once and the state is the twin's.
    testing::StreamOut a = KeptTurn(a_, moved.session, " it was the worst");
    testing::StreamOut b = KeptTurn(a_, twin.session, " it was the worst");
    ASSERT_TRUE(a.status.ok()) << a.status.error_message();
    EXPECT_EQ(a.ids, b.ids);
  }
}

// A caller's W3C traceparent travels with the migration: both peer calls
// (GetModelInfo, ImportSession) carry it.
TEST_F(PeerFaultTest, TheCallersTraceContextReachesThePeer) {
  testing::StreamOut s = KeptTurn(a_, "", "a traced session");
  ASSERT_TRUE(s.status.ok());
  const std::string trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  grpc::ClientContext ctx;
  ctx.AddMetadata("traceparent", trace);
  ctx.set_deadline(std::chrono::system_clock::now() + milliseconds(400));
  v1::MigrateSessionResponse resp;
  EXPECT_FALSE(a_.stub->MigrateSession(&ctx, MigrateTo(s.session, peer_->addr()), &resp).ok());
  EXPECT_EQ(peer_->traceparents(), (std::vector<std::string>{trace, trace}));
}

// The ImportSession deadline scales with the bytes (connect timeout +
// bytes / --peer-min-throughput + floor): with no caller deadline a stalled
// peer is given up at about that budget, not 600 s.
TEST_F(PeerFaultTest, StalledStreamEndsAtItsByteScaledDeadline) {
  testing::StreamOut s = KeptTurn(a_, "", "a session to move");
  ASSERT_TRUE(s.status.ok());
  const ServerConfig& c = a_.server->config();
  const auto start = Clock::now();
  grpc::ClientContext ctx;
  v1::MigrateSessionResponse resp;
  const grpc::Status st = a_.stub->MigrateSession(&ctx, MigrateTo(s.session, peer_->addr()), &resp);
  const double ms = MsSince(start);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(st.error_message().find("--peer-min-throughput"), std::string::npos)
      << st.error_message();
  const double budget =
      PeerStreamBudget(c.peer_connect_timeout, c.peer_min_throughput, 1 << 20).count();
  EXPECT_GT(ms, 1000.0);  // the floor, at least
  EXPECT_LT(ms, budget + 1000.0);
  EXPECT_FALSE(a_.server->store().Get(s.session)->busy);
  EXPECT_EQ(PeerStreamBudget(milliseconds(5000), 20 << 20, size_t{200} << 20),
            milliseconds(5000 + 10000 + 1000));
}

// (b) ReleaseSession during the stalled migration cancels it and answers
// promptly: released, the bytes it freed, and the store and the scraped
// gauges no longer count the session when it returns.
TEST(PeerFaultReleaseTest, ReleaseDuringAStalledMigrationFreesAtOnce) {
  StallingPeer peer(TinyModelInfo());
  ServerConfig c = NodeConfig();
  c.migrate_allow = {peer.addr()};
  c.listen = "127.0.0.1:0";
  c.metrics_listen = "127.0.0.1:0";
  c.threads = 1;
  auto server = Server::Start(c);
  ASSERT_TRUE(server.ok()) << server.status();
  testing::TestNode a;
  a.server = *std::move(server);
  a.addr = "127.0.0.1:" + std::to_string(a.server->port());
  a.stub = v1::Inference::NewStub(grpc::CreateChannel(a.addr, grpc::InsecureChannelCredentials()));

  testing::StreamOut s = KeptTurn(a, "", "hold this one");
  ASSERT_TRUE(s.status.ok());
  const size_t bytes = a.server->store().MemoryByKindTotal().total();
  ASSERT_GT(bytes, 0u);
  grpc::ClientContext mctx;
  v1::MigrateSessionResponse mresp;
  auto call = std::async(std::launch::async, [&] {
    return a.stub->MigrateSession(&mctx, MigrateTo(s.session, peer.addr()), &mresp);
  });
  ASSERT_TRUE(peer.WaitStalled(1, milliseconds(5000)));

  const auto start = Clock::now();
  grpc::ClientContext rctx;
  v1::ReleaseSessionRequest rreq;
  rreq.set_session_id(s.session);
  v1::ReleaseSessionResponse rresp;
  ASSERT_TRUE(a.stub->ReleaseSession(&rctx, rreq, &rresp).ok());
  const double ms = MsSince(start);
  const testing::Exposition e = testing::Scrape(a.server->metrics_port());
  std::printf("ReleaseSession during a stalled migration answered in %.1f ms\n", ms);
  EXPECT_LT(ms, kPromptMs);
  EXPECT_TRUE(rresp.released());
  EXPECT_EQ(rresp.freed_bytes(), bytes);
  EXPECT_EQ(a.server->store().num_sessions(), 0u);
  EXPECT_EQ(a.server->store().MemoryByKindTotal().total(), 0u);
  EXPECT_EQ(e.Value("cortiq_sessions_active"), 0.0);
  EXPECT_EQ(e.Value("cortiq_session_memory_total_bytes"), 0.0);
  const grpc::Status st = call.get();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::CANCELLED) << st.error_message();
}

// A drain that finds a session busy in a MigrateSession to a stalled peer
// cancels that migration and moves the session to its own peer: the session
// is not given up as busy (and lost when the process exits).
TEST(PeerFaultDrainTest, DrainTakesOverASessionFromAMigrationInFlight) {
  StallingPeer stalled(TinyModelInfo());
  ServerConfig bc = NodeConfig();
  testing::TestNode b = testing::StartTestNode(bc);
  ASSERT_TRUE(b.server);
  ServerConfig c = NodeConfig();
  c.peers = {b.addr};                  // the drain's target
  c.migrate_allow = {stalled.addr()};  // MigrateSession's
  testing::TestNode a = testing::StartTestNode(c);
  ASSERT_TRUE(a.server);
  testing::StreamOut s = KeptTurn(a, "", "a session on the move");
  ASSERT_TRUE(s.status.ok());
  grpc::ClientContext ctx;
  v1::MigrateSessionResponse resp;
  auto call = std::async(std::launch::async, [&] {
    return a.stub->MigrateSession(&ctx, MigrateTo(s.session, stalled.addr()), &resp);
  });
  ASSERT_TRUE(stalled.WaitStalled(1, milliseconds(5000)));
  const DrainReport r = a.server->Drain(milliseconds(0));
  ASSERT_EQ(r.sessions.size(), 1u);
  EXPECT_TRUE(r.sessions[0].migrated) << r.sessions[0].error;
  EXPECT_EQ(r.migrated, 1u);
  EXPECT_EQ(b.server->store().num_sessions(), 1u);
  EXPECT_EQ(a.server->store().num_sessions(), 0u);
  EXPECT_EQ(call.get().error_code(), grpc::StatusCode::CANCELLED);
}

// A session its owner releases while the drain migrates it (the release
// cancels the migration) is reported released, not failed: the drain, and so
// the process's exit status, does not count it as lost.
TEST(PeerFaultDrainTest, ASessionReleasedDuringTheDrainIsNotAFailure) {
  ServerConfig c = NodeConfig();
  StallingPeer peer(TinyModelInfo());
  c.peers = {peer.addr()};
  testing::TestNode a = testing::StartTestNode(c);
  ASSERT_TRUE(a.server);
  testing::StreamOut s = KeptTurn(a, "", "a session its owner lets go");
  ASSERT_TRUE(s.status.ok());
  auto drain = std::async(std::launch::async, [&] { return a.server->Drain(milliseconds(0)); });
  ASSERT_TRUE(peer.WaitStalled(1, milliseconds(5000)));
  grpc::ClientContext rctx;
  v1::ReleaseSessionRequest rreq;
  rreq.set_session_id(s.session);
  v1::ReleaseSessionResponse rresp;
  ASSERT_TRUE(a.stub->ReleaseSession(&rctx, rreq, &rresp).ok());
  EXPECT_TRUE(rresp.released());
  const DrainReport r = drain.get();
  ASSERT_EQ(r.sessions.size(), 1u);
  EXPECT_TRUE(r.sessions[0].released) << r.sessions[0].error;
  EXPECT_EQ(r.released, 1u);
  EXPECT_EQ(r.failed, 0u);
  EXPECT_EQ(a.server->store().num_sessions(), 0u);
}

// (c) Drain with three sessions and a stalling peer. Each migration stalls
// until its own deadline (~1.3 s); in parallel the three take about one
// stall, not three.
TEST(PeerFaultDrainTest, DrainMigratesInParallel) {
  ServerConfig c = NodeConfig();
  c.drain_parallelism = 4;
  c.drain_timeout = milliseconds(10'000);
  StallingPeer peer(TinyModelInfo());
  c.peers = {peer.addr()};
  testing::TestNode a = testing::StartTestNode(c);
  ASSERT_TRUE(a.server);
  const std::vector<std::string> ids = KeepSessions(a, 3);
  ASSERT_EQ(ids.size(), 3u);
  const double one_stall =
      PeerStreamBudget(c.peer_connect_timeout, c.peer_min_throughput, 1 << 20).count();
  const auto start = Clock::now();
  const DrainReport r = a.server->Drain(milliseconds(0));
  const double ms = MsSince(start);
  std::printf("drain of 3 sessions against a stalling peer: %.0f ms (one stall %.0f ms)\n", ms,
              one_stall);
  EXPECT_EQ(peer.stalled(), 3);
  EXPECT_EQ(r.failed, 3u);
  EXPECT_LT(ms, 2 * one_stall);  // one at a time would take 3 stalls
  for (const std::string& id : ids) {
    std::optional<session::SessionSnapshot> snap = a.server->store().Get(id);
    ASSERT_TRUE(snap.has_value());  // intact
    EXPECT_FALSE(snap->busy);
  }
}

// (c) --drain-timeout bounds a drain whose migrations would each take far
// longer (a 1 byte/s minimum throughput): they are cancelled at the timeout,
// reported failed, and the sessions stay, unlocked.
TEST(PeerFaultDrainTest, DrainEndsAtTheDrainTimeout) {
  ServerConfig c = NodeConfig();
  c.peer_min_throughput = 1;
  c.drain_parallelism = 2;  // three sessions: the third waits for a worker
  c.drain_timeout = milliseconds(800);
  StallingPeer peer(TinyModelInfo());
  c.peers = {peer.addr()};
  testing::TestNode a = testing::StartTestNode(c);
  ASSERT_TRUE(a.server);
  const std::vector<std::string> ids = KeepSessions(a, 3);
  ASSERT_EQ(ids.size(), 3u);
  const auto start = Clock::now();
  const DrainReport r = a.server->Drain(milliseconds(0));
  const double ms = MsSince(start);
  std::printf("drain with --drain-timeout 0.8 s: %.0f ms\n", ms);
  EXPECT_LT(ms, 800 + kPromptMs);
  EXPECT_EQ(r.failed, 3u);
  for (const DrainReport::Entry& e : r.sessions) {
    EXPECT_FALSE(e.migrated);
    EXPECT_NE(e.error.find("--drain-timeout"), std::string::npos) << e.error;
  }
  for (const std::string& id : ids) {
    std::optional<session::SessionSnapshot> snap = a.server->store().Get(id);
    ASSERT_TRUE(snap.has_value());
    EXPECT_FALSE(snap->busy);
  }
  // A draining node starts no new migration (the drain owns the sessions).
  grpc::ClientContext ctx;
  v1::MigrateSessionResponse resp;
  const grpc::Status st = a.stub->MigrateSession(&ctx, MigrateTo(ids[0], peer.addr()), &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << st.error_message();
  EXPECT_NE(st.error_message().find("draining"), std::string::npos) << st.error_message();
}

// (d) SIGTERM to a real cortiq-server process whose only peer stalls: it
// exits (status 3: a session could not move) within --grace +
// --drain-timeout + 10 s, the bound the manifests use; here in about
// grace + drain timeout.
TEST(PeerFaultProcessTest, SigtermExitsWithinTheConfiguredBound) {
  StallingPeer peer(TinyModelInfo());

  int out[2];
  ASSERT_EQ(pipe(out), 0);
  const std::string bin = std::string(CORTIQ_BINARY_DIR) + "/server/cortiq-server";
  const std::string model = testing::TempModel("tiny");
  const std::string peer_addr = peer.addr();
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    close(out[0]);
    close(out[1]);
    execl(bin.c_str(), bin.c_str(), "--model", model.c_str(), "--listen", "127.0.0.1:0",
          "--metrics-listen", "off", "--http-listen", "off", "--threads", "1", "--peers", peer_addr.c_str(), "--grace",
          "0.5", "--drain-timeout", "1", "--peer-min-throughput", "1", "--peer-connect-timeout",
          "0.5", "--log-level", "warn", nullptr);
    _exit(127);
  }
  close(out[1]);
  FILE* f = fdopen(out[0], "r");
  char line[256] = {0};
  int port = 0, metrics = 0;
  while (fgets(line, sizeof(line), f) != nullptr) {
    if (std::sscanf(line, "listening on %*[^:]:%d metrics %d", &port, &metrics) == 2) break;
  }
  ASSERT_GT(port, 0) << "no 'listening on' line from " << bin;
  testing::TestNode node;
  node.stub = v1::Inference::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  testing::StreamOut s = KeptTurn(node, "", "kept across a drain");
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();

  const auto start = Clock::now();
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  int status = 0;
  const double bound_ms = 500 + 1000 + 10'000;
  pid_t done = 0;
  while ((done = waitpid(pid, &status, WNOHANG)) == 0 && MsSince(start) < bound_ms + 5000) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  const double ms = MsSince(start);
  if (done == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
  }
  fclose(f);
  std::printf("SIGTERM to exit: %.0f ms (--grace 0.5 --drain-timeout 1; bound %.0f ms)\n", ms,
              bound_ms);
  ASSERT_EQ(done, pid) << "still running after " << ms << " ms";
  EXPECT_LT(ms, bound_ms);
  EXPECT_LT(ms, 500 + 1000 + 1500.0);  // what it should take: grace + drain timeout + ~0
  EXPECT_GE(peer.stalled(), 1);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 3);  // the session could not move
}

}  // namespace
}  // namespace cortiq::server
