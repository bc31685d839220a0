// The OpenAI-style controls end to end over loopback (a real server on
// 127.0.0.1 port 0): n > 1 streams each choice's tokens with its index, then
// one GenerateSummary per choice in index order as the stream's last
// messages, and choice i equals an n = 1 call with seed + i; n = 1 streams
// as before; the forks' sessions are gone after the call; the validation
// errors name the field and the limit; n copies that do not fit the memory
// budget are RESOURCE_EXHAUSTED and change nothing; a stop id ends with STOP.
#include <map>
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

namespace v1 = ::cortiq::v1;
using std::chrono::milliseconds;

// A Generate call read whole, by choice.
struct Choices {
  grpc::Status status;
  std::map<uint32_t, std::vector<int32_t>> ids;   // by GeneratedToken.index
  std::map<uint32_t, std::string> text;           // by GeneratedToken.index
  std::vector<v1::GenerateSummary> summaries;     // in stream order
  bool token_after_summary = false;
};

Choices Call(v1::Inference::Stub& stub, const v1::GenerateRequest& r) {
  grpc::ClientContext ctx;
  Choices c;
  auto reader = stub.Generate(&ctx, r);
  v1::GenerateResponse m;
  while (reader->Read(&m)) {
    if (m.has_token()) {
      c.token_after_summary |= !c.summaries.empty();
      c.ids[m.token().index()].push_back(m.token().token_id());
      c.text[m.token().index()] += m.token().text();
    } else if (m.has_summary()) {
      c.summaries.push_back(m.summary());
    }
  }
  c.status = reader->Finish();
  return c;
}

v1::GenerateRequest Sampled(uint32_t max_tokens, uint64_t seed) {
  v1::GenerateRequest r;
  r.set_prompt("It was the best of times, it was the worst of times");
  r.set_max_tokens(max_tokens);
  r.set_ignore_eos(true);
  r.mutable_sampling()->set_temperature(40.0f);  // the random model's logits are steep
  r.mutable_sampling()->set_seed(seed);
  r.mutable_sampling()->set_presence_penalty(0.5f);
  r.mutable_sampling()->set_frequency_penalty(0.25f);
  (*r.mutable_sampling()->mutable_logit_bias())[101] = 3.0f;
  return r;
}

void ExpectCode(const grpc::Status& s, grpc::StatusCode code, const std::string& needle) {
  EXPECT_EQ(s.error_code(), code) << s.error_message();
  EXPECT_NE(s.error_message().find(needle), std::string::npos)
      << "'" << needle << "' not in: " << s.error_message();
}

class SamplingE2eTest : public ::testing::Test {
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
  testing::TestNode node_;
};

TEST_F(SamplingE2eTest, NChoicesStreamTheirIndexThenOneSummaryEach) {
  Start();
  for (int mode : {0, 3}) {  // exact, QSA (its indexer state is copied too)
    SCOPED_TRACE(mode);
    std::vector<Choices> singles;
    for (uint64_t i = 0; i < 3; ++i) {
      v1::GenerateRequest one = Sampled(10, 7 + i);
      testing::SetSessionMode(mode, one.mutable_session_config());
      singles.push_back(Call(*node_.stub, one));
      ASSERT_TRUE(singles.back().status.ok()) << singles.back().status.error_message();
      // n = 1: one summary, index 0, as before.
      ASSERT_EQ(singles.back().summaries.size(), 1u);
      EXPECT_EQ(singles.back().summaries[0].index(), 0u);
      EXPECT_EQ(singles.back().ids.size(), 1u);
    }
    v1::GenerateRequest r = Sampled(10, 7);
    testing::SetSessionMode(mode, r.mutable_session_config());
    r.set_n(3);
    Choices got = Call(*node_.stub, r);
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    EXPECT_FALSE(got.token_after_summary) << "the summaries are the last messages";
    ASSERT_EQ(got.summaries.size(), 3u);
    uint32_t total = 0;
    for (uint32_t i = 0; i < 3; ++i) {
      EXPECT_EQ(got.ids[i], singles[i].ids[0]) << "choice " << i;
      EXPECT_EQ(got.text[i], singles[i].text[0]) << "choice " << i;
      const v1::GenerateSummary& s = got.summaries[i];
      EXPECT_EQ(s.index(), i);
      EXPECT_EQ(s.finish_reason(), v1::FINISH_REASON_LENGTH);
      EXPECT_EQ(s.usage().completion_tokens(), got.ids[i].size());
      EXPECT_EQ(s.session_id(), got.summaries[0].session_id());
      EXPECT_FALSE(s.session_kept());
      total += s.usage().completion_tokens();
    }
    EXPECT_EQ(total, 30u);
    // One-shot: choice 0's session and both forks are gone, every byte back.
    EXPECT_EQ(node_.server->store().num_sessions(), 0u);
    EXPECT_EQ(node_.server->store().committed_bytes(), 0u);
  }
}

TEST_F(SamplingE2eTest, AStopTokenIdEndsWithStopAndKeepsChoiceZerosSession) {
  Start();
  v1::GenerateRequest free_run = Sampled(12, 3);
  Choices a = Call(*node_.stub, free_run);
  ASSERT_TRUE(a.status.ok());
  const std::vector<int32_t>& ids = a.ids[0];
  size_t at = 1;
  while (at < ids.size() && ids[at] == ids[0]) ++at;
  ASSERT_LT(at, ids.size());
  v1::GenerateRequest r = free_run;
  r.add_stop_token_ids(ids[at]);
  r.set_keep_session(true);
  r.set_n(2);
  Choices b = Call(*node_.stub, r);
  ASSERT_TRUE(b.status.ok()) << b.status.error_message();
  ASSERT_EQ(b.summaries.size(), 2u);
  EXPECT_EQ(b.summaries[0].finish_reason(), v1::FINISH_REASON_STOP);
  EXPECT_EQ(b.ids[0], std::vector<int32_t>(ids.begin(), ids.begin() + at + 1));
  EXPECT_TRUE(b.summaries[0].session_kept());
  // Only choice 0's session stays.
  EXPECT_EQ(node_.server->store().num_sessions(), 1u);
  EXPECT_TRUE(node_.server->store().Get(b.summaries[0].session_id()).has_value());
}

TEST_F(SamplingE2eTest, BadControlsGetInvalidArgumentNamingTheFieldAndTheLimit) {
  ServerConfig c;
  c.max_n = 4;
  Start(c);
  auto refused = [&](auto edit, grpc::StatusCode code, const std::string& needle) {
    v1::GenerateRequest r = Sampled(8, 1);
    edit(r);
    Choices got = Call(*node_.stub, r);
    ExpectCode(got.status, code, needle);
    EXPECT_TRUE(got.ids.empty());
  };
  const auto bad = grpc::StatusCode::INVALID_ARGUMENT;
  refused([](auto& r) { r.mutable_sampling()->set_presence_penalty(2.5f); }, bad,
          "presence_penalty: must be in [-2, 2], got 2.5");
  refused([](auto& r) { r.mutable_sampling()->set_frequency_penalty(-3.0f); }, bad,
          "frequency_penalty");
  refused([](auto& r) { (*r.mutable_sampling()->mutable_logit_bias())[259] = 1.0f; }, bad,
          "logit_bias: token id 259 is outside the vocabulary [0, 259)");
  refused([](auto& r) { (*r.mutable_sampling()->mutable_logit_bias())[5] = 101.0f; }, bad,
          "logit_bias[5]: bias must be in [-100, 100]");
  refused([](auto& r) { for (int i = 0; i < 17; ++i) r.add_stop_token_ids(i); }, bad,
          "stop_token_ids: 17 ids, at most 16");
  refused([](auto& r) { r.add_stop_token_ids(-4); }, bad, "stop_token_ids[0]: id -4");
  refused([](auto& r) { r.set_min_tokens(9); }, bad, "min_tokens: 9 is above max_tokens 8");
  refused([](auto& r) { r.set_n(5); }, bad, "n: 5 is outside [1, 4] (--max-n)");
  EXPECT_EQ(node_.server->store().num_sessions(), 0u);
}

TEST_F(SamplingE2eTest, NCopiesBeyondTheBudgetAreRefusedAndChangeNothing) {
  ServerConfig c;
  c.memory_budget_bytes = 100'000;
  Start(c);
  // tiny: 512 bytes per position; about 60 positions fit once, not twice.
  v1::GenerateRequest r = Sampled(50, 1);
  Choices one = Call(*node_.stub, r);
  ASSERT_TRUE(one.status.ok()) << one.status.error_message();
  r.set_n(2);
  Choices two = Call(*node_.stub, r);
  ExpectCode(two.status, grpc::StatusCode::RESOURCE_EXHAUSTED, "2 sessions (n)");
  EXPECT_TRUE(two.ids.empty());
  EXPECT_EQ(node_.server->store().num_sessions(), 0u);
  // A kept session continued with n = 2: refused the same way, and it
  // comes back unchanged.
  v1::GenerateRequest keep = Sampled(8, 1);
  keep.set_keep_session(true);
  Choices kept = Call(*node_.stub, keep);
  ASSERT_TRUE(kept.status.ok());
  const std::string id = kept.summaries[0].session_id();
  const auto before = node_.server->store().Get(id);
  v1::GenerateRequest more = Sampled(50, 2);
  more.set_session_id(id);
  more.set_n(2);
  ExpectCode(Call(*node_.stub, more).status, grpc::StatusCode::RESOURCE_EXHAUSTED,
             "memory budget");
  const auto after = node_.server->store().Get(id);
  ASSERT_TRUE(before && after);
  EXPECT_EQ(after->tokens, before->tokens);
  EXPECT_EQ(after->memory.total(), before->memory.total());
  EXPECT_FALSE(after->busy);
  EXPECT_EQ(node_.server->store().num_sessions(), 1u);
}

}  // namespace
}  // namespace cortiq::server
