// Drain by migration on loopback: node A holds five kept sessions of
// different modes, A drains (the Drain RPC, as `cortiq drain` sends it), and
// all five continue on B token-identically; health goes NOT_SERVING and new
// work is refused with UNAVAILABLE; without a peer every session is reported.
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

}  // namespace
}  // namespace cortiq::server
