// The lease of a session, end to end on loopback (issue 17, req 6): a
// Generate right after a cancelled one on the same session waits for the
// lease instead of answering ABORTED, a truly concurrent call is still
// refused at once, and a kept session whose call its deadline cut short
// holds afterwards only what its tokens need, in GetSession, the store's
// admission accounting and the gauges' source alike.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "core/session/request_plan.h"
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

using testing::TestNode;

TestNode StartNode() {
  ServerConfig c;
  c.model_dir = testing::TempModel("tiny");
  return testing::StartTestNode(c);
}

v1::GenerateRequest Continue(const std::string& session, uint32_t max_tokens) {
  v1::GenerateRequest r;
  r.set_prompt("and then");
  r.set_max_tokens(max_tokens);
  r.set_ignore_eos(true);
  r.set_keep_session(true);
  r.set_session_id(session);
  r.mutable_sampling()->set_temperature(0);
  return r;
}

// A kept session made by a short call.
std::string NewSession(TestNode& n) {
  v1::GenerateRequest r = Continue("", 2);
  r.set_prompt("It was");
  testing::StreamOut o = testing::RunGenerate(*n.stub, r);
  EXPECT_TRUE(o.status.ok()) << o.status.error_message();
  return o.session;
}

// Starts a Generate continuing `session` and reads its first message.
struct Running {
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader;
  v1::GenerateResponse first;
  bool streaming = false;  // the first message was a token

  Running(v1::Inference::Stub& stub, const std::string& session) {
    reader = stub.Generate(&ctx, Continue(session, 1000));
    streaming = reader->Read(&first) && first.has_token();
  }
  // Cancels (if still open) and returns the call's status.
  grpc::Status End() {
    ctx.TryCancel();
    v1::GenerateResponse m;
    while (reader->Read(&m)) {
    }
    return reader->Finish();
  }
};

TEST(LeaseTest, ARetryRightAfterACancelIsNotAbortedAConcurrentCallIs) {
  TestNode n = StartNode();
  {
    const std::string id = NewSession(n);
    ASSERT_FALSE(id.empty());
    Running first(*n.stub, id);
    ASSERT_TRUE(first.streaming);
    // The first call is generating: a second one is refused, without
    // waiting for the first call to end.
    const auto t0 = std::chrono::steady_clock::now();
    testing::StreamOut busy = testing::RunGenerate(*n.stub, Continue(id, 4));
    EXPECT_EQ(busy.status.error_code(), grpc::StatusCode::ABORTED);
    EXPECT_NE(busy.status.error_message().find("in use by another call"), std::string::npos)
        << busy.status.error_message();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(500));
    first.End();
  }
  // Cancel, retry at once, 20 times (each on its own session, so that the
  // history stays within the tiny model's context): every retry streams.
  // Before the wait for an ending holder, 20 of 20 got ABORTED.
  int refused = 0;
  for (int i = 0; i < 20; ++i) {
    const std::string id = NewSession(n);
    ASSERT_FALSE(id.empty());
    Running call(*n.stub, id);
    ASSERT_TRUE(call.streaming);
    EXPECT_EQ(call.End().error_code(), grpc::StatusCode::CANCELLED);
    Running retry(*n.stub, id);
    if (!retry.streaming) {
      const grpc::Status st = retry.End();
      ++refused;
      ADD_FAILURE() << "retry " << i << ": " << st.error_code() << " " << st.error_message();
      continue;
    }
    retry.End();
  }
  EXPECT_EQ(refused, 0);
}

TEST(LeaseTest, AKeptSessionCutShortByItsDeadlineHoldsWhatItsTokensNeed) {
  TestNode n = StartNode();
  const std::string id = NewSession(n);
  ASSERT_FALSE(id.empty());

  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + milliseconds(60));
  auto reader = n.stub->Generate(&ctx, Continue(id, 4000));
  v1::GenerateResponse m;
  while (reader->Read(&m)) {
  }
  ASSERT_EQ(reader->Finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);

  // The session stays (kept); wait for the engine to end the call.
  v1::SessionInfo info;
  for (int i = 0; i < 200; ++i) {
    grpc::ClientContext c;
    v1::GetSessionRequest g;
    g.set_session_id(id);
    ASSERT_TRUE(n.stub->GetSession(&c, g, &info).ok());
    if (!info.busy()) break;
    std::this_thread::sleep_for(milliseconds(5));
  }
  ASSERT_FALSE(info.busy());
  const size_t tokens = info.tokens();
  ASSERT_LT(tokens, 4000u);

  // What the tokens need plus one growth step (x2, from 16) and a page either
  // side of each head block's rows (K and V per layer and K/V head); the
  // call had reserved 4000 more positions.
  const model::ModelConfig& mc = n.server->model().config();
  const session::SessionConfig exact;  // the server's default: exact f32 rows
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t slack = 2 * page * 2 * mc.num_hidden_layers * mc.num_key_value_heads;
  const size_t bound =
      session::ProjectedSessionBytes(mc, exact, std::max<size_t>(16, 2 * tokens), tokens) + slack;
  const size_t reserved = session::ProjectedSessionBytes(mc, exact, tokens + 4000, tokens);
  const size_t held = info.memory().total_bytes();
  EXPECT_GT(held, 0u);
  EXPECT_LE(held, bound) << tokens << " tokens";
  EXPECT_LT(held, reserved / 2);
  // Admission (the store's committed bytes) and the gauges (the store's
  // total by kind, read at scrape time) count the same bytes.
  EXPECT_EQ(n.server->store().committed_bytes(), held);
  EXPECT_EQ(n.server->store().MemoryByKindTotal().total(), held);
}

}  // namespace
}  // namespace cortiq::server
