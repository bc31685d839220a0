// A spilled session (--state-dir) is read back off the gRPC threads: a
// Generate or ExportSession naming it is set up on the server's read-back
// workers (Server::read_back_runner), continues exactly as a session that
// never left RAM, and a call cancelled while its session is read back ends
// CANCELLED and leaves the session usable.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <future>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/session/session_persister.h"
#include "cortiq/v1/inference.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "tests/common/model_test_util.h"
#include "tests/common/prom_text.h"
#include "tests/common/server_test_util.h"

namespace cortiq::server {
namespace {

using std::chrono::milliseconds;
namespace v1 = ::cortiq::v1;
namespace fs = std::filesystem;
using testing::KeptTurn;
using testing::StreamOut;
using testing::TestNode;

class SpillReadBackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/cortiq_spill_read_back_", getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    ServerConfig c;
    c.model_dir = testing::TempModel("tiny");
    c.grace = milliseconds(0);
    c.state_dir = dir_;
    c.metrics_listen = "127.0.0.1:0";
    node_ = testing::StartTestNode(c);
    ASSERT_NE(node_.server, nullptr);
    ASSERT_NE(node_.server->persister(), nullptr);
    ServerConfig r;
    r.model_dir = c.model_dir;
    r.grace = milliseconds(0);
    ref_ = testing::StartTestNode(r);
    ASSERT_NE(ref_.server, nullptr);
  }
  void TearDown() override {
    if (node_.server) {
      node_.server->persister()->set_load_hook(nullptr);
      node_.server->persister()->set_write_hook(nullptr);
      node_.server->Shutdown(milliseconds(0));
    }
    if (ref_.server) ref_.server->Shutdown(milliseconds(0));
    fs::remove_all(dir_);
  }

  // Spills every idle session (the TTL, an hour ahead); true when `id` is
  // now spilled.
  bool Spill(const std::string& id) {
    node_.server->store().ReapIdle(session::Clock::now() + std::chrono::hours(24));
    const auto snap = node_.server->store().Get(id);
    return snap.has_value() && snap->spilled;
  }

  std::string dir_;
  TestNode node_, ref_;
};

TEST_F(SpillReadBackTest, GenerateAndExportReadASpilledSessionBackOnAReadBackWorker) {
  StreamOut a = KeptTurn(node_, "", "Call me Ishmael.");
  StreamOut r = KeptTurn(ref_, "", "Call me Ishmael.");
  ASSERT_TRUE(a.status.ok() && r.status.ok()) << a.status.error_message();
  ASSERT_EQ(a.ids, r.ids);
  std::atomic<int> loads{0}, on_worker{0};
  node_.server->persister()->set_load_hook([&](const std::string&) {
    ++loads;
    if (node_.server->read_back_runner().OnWorkerThread()) ++on_worker;
  });
  for (int turn = 0; turn < 2; ++turn) {
    ASSERT_TRUE(Spill(a.session)) << "turn " << turn;
    StreamOut x = KeptTurn(node_, a.session, " Some years ago");
    StreamOut y = KeptTurn(ref_, r.session, " Some years ago");
    ASSERT_TRUE(x.status.ok()) << x.status.error_message();
    EXPECT_EQ(x.ids, y.ids) << "turn " << turn;
    EXPECT_EQ(x.summary.usage().session_tokens(), y.summary.usage().session_tokens());
  }
  EXPECT_EQ(loads.load(), 2);
  EXPECT_EQ(on_worker.load(), 2) << "a spilled session was read back on a gRPC thread";
  EXPECT_EQ(node_.server->store().unspills(), 2u);

  // ExportSession likewise; the stream imports on another node and the
  // session continues there as here.
  ASSERT_TRUE(Spill(a.session));
  std::string wire;
  {
    grpc::ClientContext ctx;
    v1::ExportSessionRequest req;
    req.set_session_id(a.session);
    auto reader = node_.stub->ExportSession(&ctx, req);
    v1::WireChunk chunk;
    while (reader->Read(&chunk)) wire += chunk.data();
    const grpc::Status st = reader->Finish();
    ASSERT_TRUE(st.ok()) << st.error_message();
  }
  EXPECT_EQ(loads.load(), 3);
  EXPECT_EQ(on_worker.load(), 3);
  v1::ImportSessionResponse imported;
  {
    grpc::ClientContext ctx;
    auto writer = ref_.stub->ImportSession(&ctx, &imported);
    v1::WireChunk chunk;
    chunk.set_data(wire);
    ASSERT_TRUE(writer->Write(chunk));
    ASSERT_TRUE(writer->WritesDone());
    const grpc::Status st = writer->Finish();
    ASSERT_TRUE(st.ok()) << st.error_message();
  }
  StreamOut here = KeptTurn(node_, a.session, " Call me");
  StreamOut there = KeptTurn(ref_, imported.session().session_id(), " Call me");
  ASSERT_TRUE(here.status.ok() && there.status.ok()) << there.status.error_message();
  EXPECT_EQ(here.ids, there.ids);

  // The export read it back: it is resident now, and no call loads it.
  EXPECT_TRUE(KeptTurn(node_, a.session, " more").status.ok());
  EXPECT_EQ(loads.load(), 3);
}

// The client cancels while its session's file is being read: the call ends
// CANCELLED, the read-back completes, and the session answers the next call
// (its lease returned); the server stops cleanly with nothing left in flight.
TEST_F(SpillReadBackTest, ACallCancelledDuringTheReadBackEndsAndLeavesTheSessionUsable) {
  StreamOut a = KeptTurn(node_, "", "Call me Ishmael.");
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  ASSERT_TRUE(Spill(a.session));
  std::promise<void> entered, go;
  std::shared_future<void> go_f = go.get_future().share();
  std::atomic<bool> first{true};
  node_.server->persister()->set_load_hook([&, go_f](const std::string&) {
    if (!first.exchange(false)) return;
    entered.set_value();
    go_f.wait();
  });
  grpc::ClientContext ctx;
  auto reader = node_.stub->Generate(&ctx, testing::KeptTurnRequest(a.session, " Some years"));
  ASSERT_EQ(entered.get_future().wait_for(std::chrono::seconds(30)), std::future_status::ready);
  // Counted while it waits on its read-back.
  EXPECT_EQ(testing::Scrape(node_.server->metrics_port())
                .Value("cortiq_session_read_backs_in_flight"),
            1.0);
  // Held in the read-back: another call on another session is still served
  // (the gRPC thread that took the first call is free).
  StreamOut other = KeptTurn(node_, "", "Loomings.");
  EXPECT_TRUE(other.status.ok()) << other.status.error_message();
  ctx.TryCancel();
  v1::GenerateResponse m;
  while (reader->Read(&m)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  go.set_value();
  // The session is read back and its lease returns: the next call runs
  // (after the cancelled one's job, which may still hold it for a step).
  grpc::Status next;
  for (int i = 0; i < 100; ++i) {
    next = KeptTurn(node_, a.session, " Some years ago").status;
    if (next.error_code() != grpc::StatusCode::ABORTED) break;
    std::this_thread::sleep_for(milliseconds(20));
  }
  EXPECT_TRUE(next.ok()) << next.error_message();
  EXPECT_FALSE(node_.server->store().Get(a.session)->spilled);
  // (The worker's task ends just after the lease it returned.)
  ASSERT_TRUE(node_.server->read_back_runner().WaitIdleUntil(std::chrono::steady_clock::now() +
                                                             std::chrono::seconds(30)));
  EXPECT_EQ(testing::Scrape(node_.server->metrics_port())
                .Value("cortiq_session_read_backs_in_flight"),
            0.0);
  node_.server->persister()->set_load_hook(nullptr);
  node_.server->Shutdown(milliseconds(0));
  EXPECT_EQ(node_.server->read_back_runner().in_flight(), 0u);
}

}  // namespace
}  // namespace cortiq::server

namespace cortiq::server {
namespace {

// An import whose call ends while its installed session's file is written
// (a migration's deadline passing during the peer's fsync): its source was
// told the import failed and keeps the session, so the copy here goes
// (released, its file deleted), and the reactor outlives the write (the
// writer's callback used to reach it freed). The write is held on the
// persister's thread until the server has seen the cancellation.
TEST_F(SpillReadBackTest, ImportEndedWhileItsFileIsWrittenLeavesNothing) {
  StreamOut r = KeptTurn(ref_, "", "Call me Ishmael.");
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  const testing::Exported exported = testing::ExportWire(*ref_.stub, r.session);
  ASSERT_TRUE(exported.status.ok()) << exported.status.error_message();
  const std::string& wire = exported.wire;
  const fs::path file = fs::path(dir_) / (r.session + ".cqsj");

  std::promise<void> entered, go;
  std::shared_future<void> go_f = go.get_future().share();
  std::atomic<bool> first{true};
  node_.server->persister()->set_write_hook([&, go_f](const std::string&) {
    if (!first.exchange(false)) return;
    entered.set_value();
    go_f.wait();
  });
  struct Go {  // never leaves the writer held (TearDown's Shutdown waits for it)
    std::promise<void>& p;
    bool set = false;
    void Set() {
      if (!std::exchange(set, true)) p.set_value();
    }
    ~Go() { Set(); }
  } release{go};

  grpc::ClientContext ctx;
  v1::ImportSessionResponse resp;
  auto writer = node_.stub->ImportSession(&ctx, &resp);
  v1::WireChunk chunk;
  chunk.set_data(wire);
  ASSERT_TRUE(writer->Write(chunk));
  ASSERT_TRUE(writer->WritesDone());
  ASSERT_EQ(entered.get_future().wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_TRUE(node_.server->store().Get(r.session).has_value());  // installed, not answered
  ctx.TryCancel();
  EXPECT_EQ(writer->Finish().error_code(), grpc::StatusCode::CANCELLED);
  // The server has ended the call (OnDone counts it) before the write goes on.
  auto migrations_in = [&](const std::string& result) {
    return testing::Scrape(node_.server->metrics_port())
        .Get("cortiq_migrations_total", {{"direction", "in"}, {"result", result}})
        .value_or(0);
  };
  for (int i = 0; i < 3000 && migrations_in("failed") < 1; ++i) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  ASSERT_EQ(migrations_in("failed"), 1.0);
  release.Set();
  for (int i = 0; i < 3000 && node_.server->store().Get(r.session).has_value(); ++i) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_FALSE(node_.server->store().Get(r.session).has_value());
  ASSERT_TRUE(node_.server->background_runner().WaitIdleUntil(std::chrono::steady_clock::now() +
                                                              std::chrono::seconds(30)));
  EXPECT_FALSE(fs::exists(file));
  EXPECT_EQ(migrations_in("ok"), 0.0);

  // The same stream imported whole afterwards installs, answers and persists.
  node_.server->persister()->set_write_hook(nullptr);
  grpc::ClientContext again;
  auto w2 = node_.stub->ImportSession(&again, &resp);
  ASSERT_TRUE(w2->Write(chunk));
  ASSERT_TRUE(w2->WritesDone());
  ASSERT_TRUE(w2->Finish().ok());
  EXPECT_TRUE(node_.server->store().Get(r.session).has_value());
  EXPECT_TRUE(fs::exists(file));
}

}  // namespace
}  // namespace cortiq::server
