// Sink + window attention as a server default (--attention window and the
// --window-* flags): new sessions get it without asking, a request's own
// window parameters override the flags field by field, and a server that
// would run it on int8 rows refuses to start.
#include <string>

#include "cortiq/v1/inference.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/common/model_test_util.h"
#include "tests/common/server_test_util.h"

namespace cortiq::server {
namespace {

v1::SessionInfo RunAndDescribe(testing::TestNode& n, const v1::GenerateRequest& r) {
  const testing::StreamOut out = testing::RunGenerate(*n.stub, r);
  EXPECT_TRUE(out.status.ok()) << out.status.error_message();
  grpc::ClientContext ctx;
  v1::GetSessionRequest get;
  get.set_session_id(out.session);
  v1::SessionInfo info;
  const grpc::Status st = n.stub->GetSession(&ctx, get, &info);
  EXPECT_TRUE(st.ok()) << st.error_message();
  return info;
}

TEST(WindowModeTest, TheServerDefaultAppliesAndRequestsOverrideItFieldByField) {
  ServerConfig c;
  c.model_dir = testing::TempModel("tiny");
  c.attention = "window";
  c.window_sink = 2;
  c.window_size = 8;
  testing::TestNode n = testing::StartTestNode(c);
  ASSERT_NE(n.server, nullptr);
  v1::GenerateRequest r;
  r.set_prompt(std::string(40, 'a'));  // longer than sink + window: rows are dropped
  r.set_max_tokens(4);
  r.set_keep_session(true);
  v1::SessionInfo info = RunAndDescribe(n, r);
  EXPECT_EQ(info.config().attention(), v1::ATTENTION_MODE_WINDOW);
  EXPECT_EQ(info.config().window().sink(), 2u);
  EXPECT_EQ(info.config().window().window(), 8u);
  EXPECT_EQ(info.config().window().layers(), "0,1");
  const uint64_t bytes = info.memory().kv_f32_bytes();
  EXPECT_GT(bytes, 0u);
  // A request's own window size, the flags' sink.
  r.mutable_session_config()->set_attention(v1::ATTENTION_MODE_WINDOW);
  r.mutable_session_config()->mutable_window()->set_window(16);
  info = RunAndDescribe(n, r);
  EXPECT_EQ(info.config().window().sink(), 2u);
  EXPECT_EQ(info.config().window().window(), 16u);
  EXPECT_GT(info.memory().kv_f32_bytes(), bytes);  // 2 + 16 rows held instead of 2 + 8
}

TEST(WindowModeTest, AServerDefaultOnInt8RowsDoesNotStart) {
  ServerConfig c;
  c.model_dir = testing::TempModel("tiny");
  c.attention = "window";
  c.kv_dtype = "int8";
  c.listen = "127.0.0.1:0";
  c.metrics_listen = "off";
  auto s = Server::Start(c);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("--kv-dtype int8"), std::string::npos) << s.status();
}

}  // namespace
}  // namespace cortiq::server
