// Conversations over gRPC on one node: reuse_prefix (the prompt is the whole
// conversation; Usage.cached_tokens says how much of it the session already
// held, Usage.prompt_tokens counts all of it) and create_if_missing (a
// session created under the caller's id, then continued).
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

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

constexpr char kId[] = "0123456789abcdef0123456789abcdef";

using Turn = testing::StreamOut;

Turn Call(v1::Inference::Stub& stub, const v1::GenerateRequest& r, const std::string& token = "") {
  return testing::RunGenerate(stub, r, token);
}

// A greedy request of 8 tokens (EOS ignored) with the given prompt ids.
v1::GenerateRequest Greedy(const std::vector<int32_t>& prompt, const std::string& session) {
  v1::GenerateRequest r;
  for (int32_t id : prompt) r.add_prompt_tokens(id);
  r.set_max_tokens(8);
  r.set_ignore_eos(true);
  r.mutable_sampling()->set_temperature(0.0f);
  r.set_session_id(session);
  return r;
}

std::vector<int32_t> Cat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

class ReuseE2eTest : public ::testing::Test {
 protected:
  void Start(ServerConfig c = {}) {
    c.model_dir = testing::TempModel("tiny");
    c.grace = milliseconds(0);
    node_ = testing::StartTestNode(c);
    ASSERT_TRUE(node_.server);
  }
  void TearDown() override {
    if (node_.server) node_.server->Shutdown(milliseconds(0));
  }

  grpc::Status GetSession(const std::string& id, v1::SessionInfo* info,
                          const std::string& token = "") {
    grpc::ClientContext ctx;
    if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
    v1::GetSessionRequest req;
    req.set_session_id(id);
    return node_.stub->GetSession(&ctx, req, info);
  }

  testing::TestNode node_;
};

// A chat client's loop: every turn sends the whole conversation on one
// named session (created by the first turn), and gets the tokens a fresh
// one-shot session prefilling the whole conversation gives, with
// cached_tokens = what the session already held.
TEST_F(ReuseE2eTest, AWholeConversationEachTurnReusesTheSessionsPrefix) {
  Start();
  std::vector<int32_t> conversation;
  size_t history = 0;
  for (int turn = 0; turn < 3; ++turn) {
    conversation = Cat(conversation, testing::TestIds(30, 259, 7 + turn));
    v1::GenerateRequest r = Greedy(conversation, kId);
    r.set_reuse_prefix(true);
    r.set_create_if_missing(true);
    const Turn got = Call(*node_.stub, r);
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    const Turn fresh = Call(*node_.stub, Greedy(conversation, ""));
    ASSERT_TRUE(fresh.status.ok()) << fresh.status.error_message();
    EXPECT_EQ(got.ids, fresh.ids) << "turn " << turn;
    const v1::Usage& u = got.summary.usage();
    EXPECT_EQ(u.prompt_tokens(), conversation.size());
    // The last reply's last token was sampled, not yet absorbed.
    EXPECT_EQ(u.cached_tokens(), history == 0 ? 0u : history - 1) << "turn " << turn;
    EXPECT_EQ(fresh.summary.usage().cached_tokens(), 0u);
    EXPECT_EQ(got.summary.session_id(), kId);
    EXPECT_TRUE(got.summary.session_kept());
    conversation = Cat(conversation, got.ids);
    history = conversation.size();
    EXPECT_EQ(u.session_tokens(), history);
  }
  // An edited history (the first reply re-tokenized differently): the
  // common prefix is kept, the rest rolled back.
  std::vector<int32_t> edited = conversation;
  edited[35] = (edited[35] + 1) % 256;
  v1::GenerateRequest r = Greedy(edited, kId);
  r.set_reuse_prefix(true);
  const Turn got = Call(*node_.stub, r);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.summary.usage().cached_tokens(), 35u);
  EXPECT_EQ(got.ids, Call(*node_.stub, Greedy(edited, "")).ids);
  v1::SessionInfo info;
  ASSERT_TRUE(GetSession(kId, &info).ok());
  EXPECT_EQ(info.tokens(), edited.size() + 8);
  EXPECT_EQ(info.memory().total_bytes(), got.summary.memory().total_bytes());
  EXPECT_EQ(node_.server->store().MemoryByKindTotal().total(), info.memory().total_bytes());
}

// create_if_missing: an unknown id of the right form is created (with the
// request's session_config, kept) and then continued; an id of another form
// is INVALID_ARGUMENT naming session_id and creates nothing; without the
// flag an unknown id stays NOT_FOUND.
TEST_F(ReuseE2eTest, CreateIfMissingCreatesUnderTheCallersIdThenContinues) {
  Start();
  v1::GenerateRequest r = Greedy({1, 2, 3, 4}, kId);
  EXPECT_EQ(Call(*node_.stub, r).status.error_code(), grpc::StatusCode::NOT_FOUND);
  r.set_create_if_missing(true);
  for (const std::string bad : {"0123456789ABCDEF0123456789ABCDEF", "abc"}) {
    r.set_session_id(bad);
    const Turn refused = Call(*node_.stub, r);
    EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << bad;
    EXPECT_NE(refused.status.error_message().find("session_id"), std::string::npos)
        << refused.status.error_message();
    EXPECT_NE(refused.status.error_message().find("32 lowercase hex digits"), std::string::npos);
  }
  EXPECT_EQ(node_.server->store().num_sessions(), 0u);

  r.set_session_id(kId);
  r.mutable_session_config()->set_kv_dtype(v1::KV_DTYPE_INT8);
  const Turn first = Call(*node_.stub, r);
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  EXPECT_EQ(first.summary.session_id(), kId);
  EXPECT_TRUE(first.summary.session_kept());
  EXPECT_EQ(first.summary.usage().session_tokens(), 12u);
  v1::SessionInfo info;
  ASSERT_TRUE(GetSession(kId, &info).ok());
  EXPECT_EQ(info.config().kv_dtype(), v1::KV_DTYPE_INT8);
  // Continued: the session_config is that of the session, not the request's.
  r.mutable_session_config()->set_kv_dtype(v1::KV_DTYPE_F32);
  const Turn second = Call(*node_.stub, r);
  ASSERT_TRUE(second.status.ok()) << second.status.error_message();
  EXPECT_EQ(second.summary.usage().session_tokens(), 24u);
  ASSERT_TRUE(GetSession(kId, &info).ok());
  EXPECT_EQ(info.config().kv_dtype(), v1::KV_DTYPE_INT8);
  EXPECT_EQ(node_.server->store().num_sessions(), 1u);
}

// create_if_missing with n > 1 whose other choices are refused (the session
// cap) leaves nothing: the session it created goes too. And a request's
// own bad field is INVALID_ARGUMENT before its named session is looked up
// (an unknown id was NOT_FOUND, a busy one ABORTED, a spilled one read back).
TEST_F(ReuseE2eTest, ARefusedCreateIfMissingLeavesNothing) {
  ServerConfig c;
  c.max_sessions = 2;
  Start(c);
  v1::GenerateRequest r = Greedy({1, 2, 3, 4}, kId);
  r.set_create_if_missing(true);
  r.set_n(3);
  r.mutable_sampling()->set_temperature(0.7f);
  const Turn refused = Call(*node_.stub, r);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << refused.status.error_message();
  EXPECT_EQ(node_.server->store().num_sessions(), 0u);
  v1::SessionInfo info;
  EXPECT_EQ(GetSession(kId, &info).error_code(), grpc::StatusCode::NOT_FOUND);
  r.set_n(2);  // fits: created, then continued
  ASSERT_TRUE(Call(*node_.stub, r).status.ok());
  EXPECT_EQ(node_.server->store().num_sessions(), 1u);

  v1::GenerateRequest bad = Greedy({1, 2, 3, 4}, "fedcba9876543210fedcba9876543210");
  bad.mutable_sampling()->set_temperature(-1);
  const Turn unknown = Call(*node_.stub, bad);
  EXPECT_EQ(unknown.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << unknown.status.error_message();
  EXPECT_NE(unknown.status.error_message().find("temperature"), std::string::npos);
}

// Tenants: a session created under an id belongs to its caller's tenant;
// another tenant naming the same id gets NOT_FOUND, as for any session it
// cannot see, and creates nothing.
TEST_F(ReuseE2eTest, CreateIfMissingCreatesForTheCallersTenant) {
  const std::string file = (std::filesystem::temp_directory_path() /
                            ("cortiq_reuse_test_" + std::to_string(getpid()) + ".tokens"))
                               .string();
  std::ofstream(file) << "alice client alice-token-0123456789\n"
                         "bob client bob-token-0123456789ab\n";
  ServerConfig c;
  c.auth_tokens_file = file;
  Start(c);
  v1::GenerateRequest r = Greedy({5, 6, 7}, kId);
  r.set_create_if_missing(true);
  const Turn mine = Call(*node_.stub, r, "alice-token-0123456789");
  ASSERT_TRUE(mine.status.ok()) << mine.status.error_message();
  v1::SessionInfo info;
  ASSERT_TRUE(GetSession(kId, &info, "alice-token-0123456789").ok());
  EXPECT_EQ(info.tenant(), "alice");
  const Turn theirs = Call(*node_.stub, r, "bob-token-0123456789ab");
  EXPECT_EQ(theirs.status.error_code(), grpc::StatusCode::NOT_FOUND)
      << theirs.status.error_message();
  EXPECT_EQ(node_.server->store().num_sessions(), 1u);
  std::filesystem::remove(file);
}

}  // namespace
}  // namespace cortiq::server
