// Drain by migration on loopback: node A holds five kept sessions of
// different modes, A drains (the Drain RPC, as `cortiq drain` sends it), and
// all five continue on B token-identically; health goes NOT_SERVING and new
// work is refused with UNAVAILABLE; without a peer every session is reported.
#include <future>
#include <thread>

#include "cortiq/v1/inference.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "tests/common/model_test_util.h"
#include "tests/common/server_test_util.h"

namespace cortiq::server {
namespace {

using std::chrono::milliseconds;
namespace v1 = ::cortiq::v1;

using testing::StreamOut;
using testing::TestNode;

TestNode StartNode(std::vector<std::string> peers) {
  ServerConfig c;
  c.model_dir = testing::TempModel("tiny");
  c.grace = milliseconds(2000);
  c.peers = std::move(peers);
  return testing::StartTestNode(c);
}

StreamOut Turn(TestNode& n, const std::string& session, const std::string& prompt, int mode) {
  v1::GenerateRequest r = testing::KeptTurnRequest(session, prompt);
  r.mutable_sampling()->set_temperature(mode == 4 ? 0.8f : 0.0f);
  if (session.empty()) {
    r.mutable_sampling()->set_seed(99);
    // Mode 4 here is an exact session that samples (temperature above).
    testing::SetSessionMode(mode == 4 ? 0 : mode, r.mutable_session_config());
  }
  return testing::RunGenerate(*n.stub, r);
}

TEST(DrainTest, FiveKeptSessionsOfEveryModeContinueOnThePeerTokenIdentically) {
  TestNode b = StartNode({});
  TestNode a = StartNode({"127.0.0.1:1", b.addr});  // a dead peer first: drain moves on
  const std::string opening = std::string(100, 'x') + " Call me Ishmael.";
  std::vector<std::string> on_a, refs;
  for (int mode = 0; mode < 5; ++mode) {
    StreamOut x = Turn(a, "", opening, mode), y = Turn(b, "", opening, mode);
    ASSERT_TRUE(x.status.ok() && y.status.ok()) << x.status.error_message();
    ASSERT_EQ(x.ids, y.ids) << "mode " << mode;
    on_a.push_back(x.session);
    refs.push_back(y.session);
  }
  grpc::ClientContext ctx;
  v1::DrainRequest req;
  req.set_grace_seconds(1);
  v1::DrainResponse resp;
  grpc::Status st = a.stub->Drain(&ctx, req, &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(resp.migrated(), 5u);
  EXPECT_EQ(resp.failed(), 0u);
  EXPECT_EQ(a.server->store().num_sessions(), 0u);
  // A refuses new work now.
  StreamOut refused = Turn(a, "", "hello", 0);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  for (const auto& s : resp.sessions()) {
    ASSERT_TRUE(s.migrated()) << s.error();
    EXPECT_EQ(s.peer(), b.addr);
    const size_t mode = std::find(on_a.begin(), on_a.end(), s.session_id()) - on_a.begin();
    ASSERT_LT(mode, 5u);
    StreamOut moved = Turn(b, s.peer_session_id(), " Some years ago", int(mode));
    StreamOut ref = Turn(b, refs[mode], " Some years ago", int(mode));
    ASSERT_TRUE(moved.status.ok()) << moved.status.error_message();
    EXPECT_EQ(moved.ids, ref.ids) << "mode " << mode;
  }
}

TEST(DrainTest, WithoutAPeerEverySessionIsReportedWithItsReason) {
  TestNode a = StartNode({});
  StreamOut x = Turn(a, "", "alone", 0);
  ASSERT_TRUE(x.status.ok());
  const DrainReport r = a.server->Drain(milliseconds(0));
  EXPECT_EQ(r.migrated, 0u);
  ASSERT_EQ(r.failed, 1u);
  EXPECT_EQ(r.sessions[0].session_id, x.session);
  EXPECT_NE(r.sessions[0].error.find("no peer"), std::string::npos);
  // The session stays (nothing is lost by a failed drain).
  EXPECT_TRUE(a.server->store().Get(x.session).has_value());
}

// An import still arriving when a drain lists the sessions it moves: the
// drain does not see it, so installing it afterwards would leave it on a
// node about to exit, in neither place (the soak found this: a worker's
// MigrateSession to a node whose drain had begun). It is refused when it
// ends, and its session stays on its source.
TEST(DrainTest, AnImportStillArrivingWhenTheDrainListsIsRefusedAndTheSourceKeepsIt) {
  TestNode a = StartNode({});
  TestNode b = StartNode({a.addr});
  StreamOut x = Turn(a, "", "a session that moves", 0);
  ASSERT_TRUE(x.status.ok()) << x.status.error_message();
  std::vector<v1::WireChunk> chunks;
  {
    grpc::ClientContext ctx;
    v1::ExportSessionRequest req;
    req.set_session_id(x.session);
    auto reader = a.stub->ExportSession(&ctx, req);
    for (v1::WireChunk c; reader->Read(&c);) chunks.push_back(c);
    ASSERT_TRUE(reader->Finish().ok());
  }
  ASSERT_FALSE(chunks.empty());
  grpc::ClientContext ctx;
  v1::ImportSessionResponse resp;
  auto writer = b.stub->ImportSession(&ctx, &resp);
  for (const v1::WireChunk& c : chunks) ASSERT_TRUE(writer->Write(c));
  // B has begun the import (it checked then that it was not draining); the
  // stream has not ended. B drains meanwhile.
  for (int i = 0; i < 2000 && b.server->store().num_imports() == 0; ++i) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  ASSERT_EQ(b.server->store().num_imports(), 1u);
  const DrainReport r = b.server->Drain(milliseconds(0));
  EXPECT_TRUE(r.sessions.empty());
  writer->WritesDone();
  const grpc::Status st = writer->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << st.error_message();
  EXPECT_NE(st.error_message().find("draining"), std::string::npos) << st.error_message();
  EXPECT_EQ(b.server->store().num_sessions(), 0u);
  // The import's reservation goes with its call, which may end just after
  // the client has its answer.
  for (int i = 0; i < 2000 && b.server->store().num_imports() != 0; ++i) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  EXPECT_EQ(b.server->store().num_imports(), 0u);
  EXPECT_TRUE(a.server->store().Get(x.session).has_value());
  StreamOut next = Turn(a, x.session, " continues at home", 0);
  EXPECT_TRUE(next.status.ok()) << next.status.error_message();
}

// A peer that is full for now (here its --max-concurrent-imports, taken by
// another import) answers RESOURCE_EXHAUSTED: the drain tries again until
// --drain-timeout instead of leaving the session behind at the first refusal
// (the persist soak saw drains exit 3 with the peers only busy).
TEST(DrainTest, APeerFullForNowIsTriedAgainUntilItHasRoom) {
  ServerConfig bc;
  bc.model_dir = testing::TempModel("tiny");
  bc.max_concurrent_imports = 1;
  TestNode b = testing::StartTestNode(bc);
  TestNode a = StartNode({b.addr});
  StreamOut x = Turn(a, "", "a session that waits for room", 0);
  ASSERT_TRUE(x.status.ok()) << x.status.error_message();
  // Another import takes B's only slot: its first chunk sent, never ended.
  std::vector<v1::WireChunk> chunks;
  {
    grpc::ClientContext ctx;
    v1::ExportSessionRequest req;
    req.set_session_id(x.session);
    req.set_version(3);  // a new session on B, not the id the drain moves
    auto reader = a.stub->ExportSession(&ctx, req);
    for (v1::WireChunk c; reader->Read(&c);) chunks.push_back(c);
    ASSERT_TRUE(reader->Finish().ok());
  }
  ASSERT_FALSE(chunks.empty());
  grpc::ClientContext hold;
  v1::ImportSessionResponse hold_resp;
  auto writer = b.stub->ImportSession(&hold, &hold_resp);
  ASSERT_TRUE(writer->Write(chunks[0]));
  for (int i = 0; i < 2000 && b.server->store().num_imports() == 0; ++i) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  ASSERT_EQ(b.server->store().num_imports(), 1u);

  std::shared_future<DrainReport> drain =
      std::async(std::launch::async, [&] { return a.server->Drain(milliseconds(0)); }).share();
  // The drain is refused for a while (several rounds), then the slot frees.
  ASSERT_EQ(drain.wait_for(milliseconds(700)), std::future_status::timeout)
      << "the drain gave up while the peer was only busy: "
      << (drain.get().sessions.empty() ? "" : drain.get().sessions[0].error);
  hold.TryCancel();
  writer->Finish();
  const DrainReport r = drain.get();
  ASSERT_EQ(r.sessions.size(), 1u);
  EXPECT_TRUE(r.sessions[0].migrated) << r.sessions[0].error;
  EXPECT_EQ(r.failed, 0u);
  EXPECT_TRUE(b.server->store().Get(x.session).has_value());
  EXPECT_FALSE(a.server->store().Get(x.session).has_value());
}

// A refusal that waiting cannot mend (here the only peer is not listening:
// UNAVAILABLE) still ends the session's drain at once, reported.
TEST(DrainTest, APeerThatCannotTakeItIsNotWaitedFor) {
  TestNode a = StartNode({"127.0.0.1:1"});
  StreamOut x = Turn(a, "", "nowhere to go", 0);
  ASSERT_TRUE(x.status.ok()) << x.status.error_message();
  const auto start = std::chrono::steady_clock::now();
  const DrainReport r = a.server->Drain(milliseconds(0));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  ASSERT_EQ(r.failed, 1u);
  EXPECT_EQ(r.sessions[0].error.find("rounds"), std::string::npos) << r.sessions[0].error;
  EXPECT_TRUE(a.server->store().Get(x.session).has_value());
}

}  // namespace
}  // namespace cortiq::server
