// PlanRequest: every limit at its bound and one past it (INVALID_ARGUMENT
// naming the field and the limit), a new session's config checked and a
// continued one's not, the O(1) minimums rejected (never raised) on every
// path that sets them, and the plan's positions and projected bytes.
#include "core/session/request_plan.h"

#include <cmath>
#include <string>

#include "core/kv/o1_config.h"
#include "core/model/random_checkpoint.h"
#include "core/model/transformer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace cortiq::session {
namespace {

using ::testing::HasSubstr;

constexpr size_t kMaxTokens = 100;
constexpr size_t kContext = 1000;

class PlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto c = model::NamedShape("tiny");
    ASSERT_TRUE(c.ok()) << c.status();
    model_ = *c;
  }

  static GenerationRequest Request(std::vector<int32_t> prompt, size_t max_tokens) {
    GenerationRequest r;
    r.prompt = std::move(prompt);
    r.max_tokens = max_tokens;
    return r;
  }

  absl::StatusOr<RequestPlan> Plan(const GenerationRequest& r, size_t history = 0) const {
    return PlanRequest(r, limits_, model_, ExistingSession{history, {}});
  }

  // The request is refused with INVALID_ARGUMENT naming every needle.
  void ExpectRefused(const absl::StatusOr<RequestPlan>& plan,
                     std::initializer_list<std::string_view> needles) const {
    ASSERT_FALSE(plan.ok());
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument) << plan.status();
    for (std::string_view n : needles) {
      EXPECT_THAT(std::string(plan.status().message()), HasSubstr(std::string(n)));
    }
  }

  model::ModelConfig model_;
  const PlanLimits limits_{.max_tokens = kMaxTokens, .max_context = kContext, .max_n = 4};
  const GenerationRequest ok_ = Request({1, 2}, 10);
};

TEST_F(PlanTest, PlanHoldsThePositionsAndTheProjection) {
  absl::StatusOr<RequestPlan> p = Plan(Request({1, 2, 3}, 10), 40);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->history, 40u);
  EXPECT_EQ(p->prompt, 3u);
  EXPECT_EQ(p->max_tokens, 10u);
  EXPECT_EQ(p->total, 53u);
  EXPECT_EQ(p->projected.total(), ProjectedSessionBytes(model_, {}, 53, 43));
}

TEST_F(PlanTest, Prompt) {
  GenerationRequest r = ok_;
  r.prompt = {0};
  EXPECT_TRUE(Plan(r).ok());
  r.prompt.clear();
  ExpectRefused(Plan(r), {"prompt: empty"});
}

TEST_F(PlanTest, TokenIdsInsideTheVocabulary) {
  const int32_t vocab = static_cast<int32_t>(model_.vocab_size);
  GenerationRequest r = ok_;
  r.prompt = {0, vocab - 1};
  EXPECT_TRUE(Plan(r).ok());
  r.prompt = {1, vocab};
  ExpectRefused(Plan(r), {"prompt_tokens[1]", "[0, 259)"});
  r.prompt = {-1};
  ExpectRefused(Plan(r), {"prompt_tokens[0]"});
}

TEST_F(PlanTest, MaxTokens) {
  GenerationRequest r = ok_;
  for (size_t ok : {size_t{1}, kMaxTokens}) {
    r.max_tokens = ok;
    EXPECT_TRUE(Plan(r).ok()) << ok;
  }
  r.max_tokens = 0;
  ExpectRefused(Plan(r), {"max_tokens", "[1, 100]"});
  r.max_tokens = kMaxTokens + 1;
  ExpectRefused(Plan(r), {"max_tokens: 101", "[1, 100]"});
}

TEST_F(PlanTest, Sampling) {
  GenerationRequest r = ok_;
  r.sampling.top_p = 1.0f;
  r.sampling.temperature = 0;
  EXPECT_TRUE(Plan(r).ok());
  r.sampling.temperature = -1;
  ExpectRefused(Plan(r), {"temperature"});
  r.sampling.temperature = std::nanf("");
  ExpectRefused(Plan(r), {"temperature"});
  r = ok_;
  r.sampling.top_p = 1.5f;
  ExpectRefused(Plan(r), {"top_p"});
}

TEST_F(PlanTest, PenaltiesAndLogitBias) {
  const int32_t vocab = static_cast<int32_t>(model_.vocab_size);
  GenerationRequest r = ok_;
  r.sampling.presence_penalty = 2.0f;
  r.sampling.frequency_penalty = -2.0f;
  r.sampling.logit_bias = {{0, -100.0f}, {vocab - 1, 100.0f}};
  EXPECT_TRUE(Plan(r).ok());
  r.sampling.presence_penalty = 2.5f;
  ExpectRefused(Plan(r), {"presence_penalty", "[-2, 2]", "2.5"});
  r.sampling.presence_penalty = 0;
  r.sampling.frequency_penalty = std::nanf("");
  ExpectRefused(Plan(r), {"frequency_penalty", "[-2, 2]"});
  r.sampling.frequency_penalty = 0;
  r.sampling.logit_bias = {{vocab, 1.0f}};
  ExpectRefused(Plan(r), {"logit_bias: token id 259", "vocabulary [0, 259)"});
  r.sampling.logit_bias = {{-1, 1.0f}};
  ExpectRefused(Plan(r), {"logit_bias: token id -1"});
  r.sampling.logit_bias = {{5, 100.5f}};
  ExpectRefused(Plan(r), {"logit_bias[5]", "[-100, 100]"});
  r.sampling.logit_bias = {{5, 1.0f}, {5, 2.0f}};
  ExpectRefused(Plan(r), {"logit_bias: token id 5 appears twice"});
  r.sampling.logit_bias.assign(kMaxLogitBias + 1, {0, 0.0f});
  for (size_t i = 0; i < r.sampling.logit_bias.size(); ++i) {
    r.sampling.logit_bias[i].first = static_cast<int32_t>(i);
  }
  ExpectRefused(Plan(r), {"logit_bias: 1025 entries, at most 1024"});
}

TEST_F(PlanTest, StopTokenIdsMinTokensAndN) {
  const int32_t vocab = static_cast<int32_t>(model_.vocab_size);
  GenerationRequest r = ok_;
  r.stop_token_ids.assign(kMaxStopTokenIds, vocab - 1);
  r.min_tokens = r.max_tokens;
  r.n = limits_.max_n;
  EXPECT_TRUE(Plan(r).ok());
  r.stop_token_ids.push_back(0);
  ExpectRefused(Plan(r), {"stop_token_ids: 17 ids, at most 16"});
  r.stop_token_ids = {3, vocab};
  ExpectRefused(Plan(r), {"stop_token_ids[1]: id 259", "[0, 259)"});
  r.stop_token_ids = {-1};
  ExpectRefused(Plan(r), {"stop_token_ids[0]: id -1"});
  r.stop_token_ids.clear();
  r.min_tokens = r.max_tokens + 1;
  ExpectRefused(Plan(r), {"min_tokens: 11 is above max_tokens 10"});
  r.min_tokens = 0;
  r.n = 0;
  ExpectRefused(Plan(r), {"n: 0", "[1, 4]", "--max-n"});
  r.n = limits_.max_n + 1;
  ExpectRefused(Plan(r), {"n: 5", "[1, 4]"});
}

TEST_F(PlanTest, TopLogprobs) {
  GenerationRequest r = ok_;
  r.top_logprobs = kMaxTopLogprobs;
  EXPECT_TRUE(Plan(r).ok());
  r.top_logprobs = kMaxTopLogprobs + 1;
  ExpectRefused(Plan(r), {"top_logprobs: 21", "[0, 20]"});
  r.top_logprobs = 4'000'000'000u;  // the proto's uint32: no cast on the way
  ExpectRefused(Plan(r), {"top_logprobs: 4000000000"});
}

TEST_F(PlanTest, StopSequences) {
  GenerationRequest r = ok_;
  r.stop.assign(kMaxStopSequences, "x");
  EXPECT_TRUE(Plan(r).ok());
  r.stop.push_back("x");
  ExpectRefused(Plan(r), {"stop: 17 sequences, at most 16"});
  r.stop = {std::string(kMaxStopBytes, 's')};
  EXPECT_TRUE(Plan(r).ok());
  r.stop = {"a", std::string(kMaxStopBytes + 1, 's')};
  ExpectRefused(Plan(r), {"stop[1]: 257 bytes", "1 .. 256"});
  r.stop = {""};
  ExpectRefused(Plan(r), {"stop[0]"});
}

TEST_F(PlanTest, Context) {
  // history + prompt + max_tokens: exactly the context, then one past it.
  EXPECT_TRUE(Plan(ok_, kContext - 12).ok());
  ExpectRefused(Plan(ok_, kContext - 11),
                {"2 prompt tokens + max_tokens 10 + 989 session tokens = 1001 positions",
                 "beyond the context of 1000"});
  // A new session: no history.
  GenerationRequest r = Request(std::vector<int32_t>(kContext - 10, 1), 10);
  EXPECT_TRUE(PlanRequest(r, limits_, model_, SessionConfig{}).ok());
  r.prompt.push_back(1);
  ExpectRefused(PlanRequest(r, limits_, model_, SessionConfig{}), {"context of 1000"});
}

// A new session's config: the O(1) minimums and every mode size up to the
// context. Checked before the request's fields (the old order).
TEST_F(PlanTest, NewSessionConfig) {
  auto plan = [&](const SessionConfig& c) { return PlanRequest(ok_, limits_, model_, c); };
  SessionConfig o1;
  o1.attention = AttentionMode::kO1;
  o1.o1.layers = {0, 1};
  struct Field {
    size_t* value;
    size_t minimum;
    std::string name;
  };
  for (const Field& f : {Field{&o1.o1.m, kv::kO1MinLandmarks, "session_config.o1.m"},
                         Field{&o1.o1.w, kv::kO1MinWindow, "session_config.o1.window"},
                         Field{&o1.o1.sink, 0, "session_config.o1.sink"}}) {
    SCOPED_TRACE(f.name);
    const size_t keep = *f.value;
    *f.value = f.minimum;
    EXPECT_TRUE(plan(o1).ok()) << plan(o1).status();
    if (f.minimum > 0) {
      *f.value = f.minimum - 1;
      ExpectRefused(plan(o1), {f.name + ": " + std::to_string(f.minimum - 1) +
                               " is below the minimum " + std::to_string(f.minimum)});
    }
    *f.value = kContext;
    EXPECT_TRUE(plan(o1).ok()) << plan(o1).status();
    *f.value = kContext + 1;
    ExpectRefused(plan(o1), {f.name + ": 1001 is above the context of 1000"});
    *f.value = keep;
  }
  SessionConfig qsa;
  qsa.attention = AttentionMode::kQsa;
  qsa.qsa.layers = {0, 1};
  for (auto [value, name] : {std::pair{&qsa.qsa.ratio, "session_config.qsa.ratio"},
                             std::pair{&qsa.qsa.budget, "session_config.qsa.budget"}}) {
    SCOPED_TRACE(name);
    const size_t keep = *value;
    *value = kContext;
    EXPECT_TRUE(plan(qsa).ok());
    *value = kContext + 1;
    ExpectRefused(plan(qsa), {std::string(name) + ": 1001 is above the context of 1000"});
    *value = keep;
  }
  // The config comes first: a bad config and a bad field name the config.
  o1.o1.m = 2;
  GenerationRequest bad = ok_;
  bad.max_tokens = 0;
  ExpectRefused(PlanRequest(bad, limits_, model_, o1), {"session_config.o1.m"});
  // CreateSession's check is the same function.
  EXPECT_EQ(CheckSessionConfig(o1, kContext).message(), plan(o1).status().message());
  // A mode's parameters are checked only when the mode is on.
  o1.attention = AttentionMode::kExact;
  EXPECT_TRUE(plan(o1).ok());
}

// A continued session's config was checked when it was made (or imported):
// the plan does not check it again, whatever the context is now.
TEST_F(PlanTest, ContinuedSessionConfigIsNotCheckedAgain) {
  SessionConfig o1;
  o1.attention = AttentionMode::kO1;
  o1.o1.layers = {1};
  o1.o1.m = kContext + 1;
  EXPECT_TRUE(PlanRequest(ok_, limits_, model_, ExistingSession{5, o1}).ok());
}

// A new session's landmark count is capped by --max-o1-m, not only by the
// context: sealing a prompt costs O(m^3) per head on the engine thread
// (m = the context made one request stall every stream for minutes).
TEST_F(PlanTest, O1LandmarksAboveTheLimitAreRefused) {
  SessionConfig o1;
  o1.attention = AttentionMode::kO1;
  o1.o1.layers = {0};
  PlanLimits limits = limits_;
  limits.max_o1_m = 16;
  o1.o1.m = 16;
  EXPECT_TRUE(PlanRequest(ok_, limits, model_, o1).ok());
  o1.o1.m = 17;
  ExpectRefused(PlanRequest(ok_, limits, model_, o1),
                {"session_config.o1.m: 17", "limit of 16", "--max-o1-m"});
  EXPECT_EQ(CheckSessionConfig(o1, kContext, 16).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckSessionConfig(o1, kContext).ok());  // no limit given
}

// The O(1) minimums are one named constant each and one policy: a value
// below is refused, naming the field, on every path that can set it.
TEST_F(PlanTest, O1MinimumsAreRejectedNeverClamped) {
  // The request path.
  SessionConfig o1;
  o1.attention = AttentionMode::kO1;
  o1.o1.layers = {0};
  o1.o1.m = kv::kO1MinLandmarks - 1;
  ExpectRefused(PlanRequest(ok_, limits_, model_, o1), {"session_config.o1.m: 3", "minimum 4"});
  // The environment path (server defaults).
  auto env = [](const char* var, const char* value) {
    return kv::EnvOverrides([&](const char* name) -> const char* {
      return std::string_view(name) == var ? value : nullptr;
    });
  };
  const size_t layers = static_cast<size_t>(model_.num_hidden_layers);
  absl::StatusOr<kv::O1Overrides> e = env("CMF_O1_M", "3");
  ASSERT_TRUE(e.ok()) << e.status();
  absl::StatusOr<kv::O1Config> c = kv::ResolveO1Config({}, {}, *e, {}, layers);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("CMF_O1_M: 3 is below the minimum 4"));
  e = env("CMF_O1_WINDOW", "0");
  ASSERT_TRUE(e.ok()) << e.status();
  c = kv::ResolveO1Config({}, {}, *e, {}, layers);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr("CMF_O1_WINDOW: 0 is below the minimum 1"));
  // At the minimums: resolved as given.
  e = env("CMF_O1_M", "4");
  ASSERT_TRUE(e.ok());
  c = kv::ResolveO1Config({}, {}, *e, {}, layers);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->m, kv::kO1MinLandmarks);
  // The model hint path: parsed once into ModelConfig, refused at resolve.
  nlohmann::json j = nlohmann::json::parse(model_.ToJson());
  j["o1_attn"] = {{"layers", "all"}, {"m", 2}};
  absl::StatusOr<model::ModelConfig> hinted = model::ModelConfig::FromJson(j.dump(), "config.json");
  ASSERT_TRUE(hinted.ok()) << hinted.status();
  c = kv::ResolveO1Config({}, {}, {}, hinted->o1_hint, layers);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr("config.json o1_attn.m: 2 is below the minimum 4"));
}

// projected.total() is ProjectedSessionBytes in every attention mode, new or
// continued, and each kind holds what it should.
TEST_F(PlanTest, ProjectedBytesEqualProjectedSessionBytesInEveryMode) {
  const size_t layers = static_cast<size_t>(model_.num_hidden_layers);
  SessionConfig f32, int8, o1, qsa;
  int8.kv_mode = kv::KvMode::kInt8;
  o1.attention = AttentionMode::kO1;
  o1.o1.layers = {1};
  qsa.attention = AttentionMode::kQsa;
  auto q = model::MakeQsaConfig("all", 16, 4, layers);
  ASSERT_TRUE(q.ok()) << q.status();
  qsa.qsa = *q;
  const GenerationRequest r = Request(std::vector<int32_t>(120, 7), 30);
  for (const SessionConfig* c : {&f32, &int8, &o1, &qsa}) {
    SCOPED_TRACE(AttentionModeName(c->attention));
    absl::StatusOr<RequestPlan> fresh = PlanRequest(r, limits_, model_, *c);
    ASSERT_TRUE(fresh.ok()) << fresh.status();
    EXPECT_EQ(fresh->projected.total(), ProjectedSessionBytes(model_, *c, 150, 120));
    absl::StatusOr<RequestPlan> more = PlanRequest(r, limits_, model_, ExistingSession{200, *c});
    ASSERT_TRUE(more.ok()) << more.status();
    EXPECT_EQ(more->total, 350u);
    EXPECT_EQ(more->projected.total(), ProjectedSessionBytes(model_, *c, 350, 320));
    const MemoryByKind& m = fresh->projected;
    const bool is_int8 = c->kv_mode == kv::KvMode::kInt8;
    EXPECT_GT(m[is_int8 ? MemoryKind::kKvInt8 : MemoryKind::kKvF32], 0u);
    EXPECT_EQ(m[is_int8 ? MemoryKind::kKvF32 : MemoryKind::kKvInt8], 0u);
    EXPECT_EQ(m[MemoryKind::kO1] > 0, c->attention == AttentionMode::kO1);
    EXPECT_EQ(m[MemoryKind::kQsa] > 0, c->attention == AttentionMode::kQsa);
  }
}

}  // namespace
}  // namespace cortiq::session
