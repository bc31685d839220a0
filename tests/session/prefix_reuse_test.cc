// reuse_prefix: a conversation sent whole on every turn keeps the longest
// common prefix of the session's history (rolled back where the attention
// mode can, started over where it cannot) and prefills only the rest — in
// every attention mode, with the same greedy tokens as a fresh session
// prefilling the whole conversation, cached_tokens as planned and the
// store's gauges exact afterwards. Also the plan and the store's side:
// PeekForReuse → PlanRequest → Acquire(id, plan), and CreateNamed.
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/model/transformer.h"
#include "core/session/engine.h"
#include "core/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "tests/common/engine_test_util.h"
#include "tests/common/model_test_util.h"

namespace cortiq::session {
namespace {

constexpr size_t kReply = 12;  // tokens generated per turn

// One attention mode under test and what it can do after a call.
struct Mode {
  std::string name;
  SessionConfig config;
  // Its state rolls back to any earlier position after the calls below
  // (otherwise a reuse that is not an exact extension starts over).
  bool rolls_back = true;
  // A session continued by an exact extension holds what a fresh session
  // prefilling the whole conversation holds. Not for sealed O(1): a later
  // turn streams through the Nyström states, a fresh prompt is sealed whole.
  bool extension_equals_fresh = true;
};

std::vector<Mode> Modes() {
  const size_t layers = 2;  // the "tiny" shape
  std::vector<Mode> m;
  m.push_back({.name = "exact_f32", .config = {}});
  SessionConfig int8;
  int8.kv_mode = kv::KvMode::kInt8;
  m.push_back({.name = "int8", .config = int8});
  const SessionConfig o1 = testing::SmallO1Config();
  m.push_back({.name = "o1_sealed",
                .config = o1,
                .rolls_back = false,
                .extension_equals_fresh = false});
  // O(1) on int8 rows: the seal is refused, the layer stays exact (and can
  // roll back).
  SessionConfig o1_int8 = o1;
  o1_int8.kv_mode = kv::KvMode::kInt8;
  m.push_back({.name = "o1_unsealed", .config = o1_int8});
  SessionConfig qsa;
  qsa.attention = AttentionMode::kQsa;
  qsa.qsa = *model::MakeQsaConfig("all", 16, 4, layers);
  m.push_back({.name = "qsa", .config = qsa});
  SessionConfig wide;
  wide.attention = AttentionMode::kWindow;
  wide.window = *attention::MakeWindowConfig("all", 4, 1024, layers);
  m.push_back({.name = "window_kept_all", .config = wide});
  // A window the conversation outgrows: rows are dropped, no rollback.
  SessionConfig narrow = wide;
  narrow.window = *attention::MakeWindowConfig("all", 2, 24, layers);
  m.push_back({.name = "window_evicted", .config = narrow, .rolls_back = false});
  return m;
}

using Output = testing::JobOutput;

class ReuseTestBase : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(testing::LoadTempModel("tiny", &model_, &tok_));
    engine_ = std::make_unique<Engine>(*model_, *tok_, EngineOptions{});
  }

  int64_t vocab() const { return model_->config().vocab_size; }

  static GenerationRequest Greedy(std::vector<int32_t> prompt, bool reuse) {
    GenerationRequest r;
    r.prompt = std::move(prompt);
    r.max_tokens = kReply;
    r.sampling.temperature = 0;
    r.ignore_eos = true;  // random weights: keep lengths deterministic
    r.reuse_prefix = reuse;
    return r;
  }

  static Output Drain(Job& job) {
    Output o = testing::DrainJob(job);
    EXPECT_TRUE(o.result.status.ok()) << o.result.status;
    return o;
  }

  // An empty kept session of the mode under test.
  std::string NewSession() {
    auto lease = store_.Create(*model_, config_, 0);
    EXPECT_TRUE(lease.ok()) << lease.status();
    return (*lease)->id();
  }

  // One call on session `id` the way the server makes it: PeekForReuse (or
  // Peek) → PlanRequest → Acquire(id, plan) → Submit(lease, request, plan).
  Output Call(const std::string& id, GenerationRequest r) {
    const PlanLimits limits{.max_tokens = 64, .max_context = engine_->max_context()};
    absl::StatusOr<ExistingSession> existing =
        r.reuse_prefix ? store_.PeekForReuse(id, r.prompt) : store_.Peek(id);
    EXPECT_TRUE(existing.ok()) << existing.status();
    absl::StatusOr<RequestPlan> plan = PlanRequest(r, limits, model_->config(), *existing);
    EXPECT_TRUE(plan.ok()) << plan.status();
    auto lease = store_.Acquire(id, *plan);
    EXPECT_TRUE(lease.ok()) << lease.status();
    auto job = engine_->Submit(*std::move(lease), std::move(r), *plan);
    EXPECT_TRUE(job.ok()) << job.status();
    return Drain(**job);
  }

  // The whole conversation prefilled by a fresh kept session of the mode.
  Output Fresh(const std::vector<int32_t>& conversation) {
    return Call(NewSession(), Greedy(conversation, /*reuse=*/false));
  }

  // The store's gauges and admission read exactly the session's bytes, as
  // its attention state counts them now: nothing reserved stays counted.
  void ExpectExactGauges(const std::string& id, const Output& o) {
    auto snap = store_.Get(id);
    ASSERT_TRUE(snap.has_value());
    EXPECT_EQ(snap->memory.total(), o.result.memory.total());
    EXPECT_EQ(store_.MemoryByKindTotal().total(), o.result.memory.total());
    EXPECT_EQ(store_.committed_bytes(), o.result.memory.total());
    auto lease = store_.Acquire(id);
    ASSERT_TRUE(lease.ok()) << lease.status();
    EXPECT_EQ(MemoryOf((*lease)->kv()).total(), o.result.memory.total());
    EXPECT_EQ((*lease)->kv().position() + 1, (*lease)->tokens().size());
  }

  // Releases every session but `keep` (the references), so the store's
  // totals are one session's.
  void ReleaseAllBut(const std::string& keep) {
    for (const auto& s : store_.List()) {
      if (s.id != keep) store_.Release(s.id);
    }
  }

  static std::vector<int32_t> Cat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  }

  SessionConfig config_;  // of the sessions NewSession makes
  SessionStore store_{StoreOptions{}};
  std::unique_ptr<model::Transformer> model_;
  std::unique_ptr<tokenizer::Tokenizer> tok_;
  std::unique_ptr<Engine> engine_;
};

class PrefixReuseTest : public ReuseTestBase, public ::testing::WithParamInterface<Mode> {
 protected:
  void SetUp() override {
    ReuseTestBase::SetUp();
    config_ = GetParam().config;
  }
};

// Three turns, each sending the whole conversation (the previous replies
// included): the same greedy tokens as a fresh session given the whole
// conversation, every turn after the first prefilling only the new user
// message (and the previous reply's last token, sampled but not absorbed).
TEST_P(PrefixReuseTest, ThreeTurnsEqualAFreshSessionPrefillingTheConversation) {
  const std::string id = NewSession();
  // The reference for sealed O(1): the same turns as plain continuations.
  const std::string plain = NewSession();
  std::vector<int32_t> conversation;
  for (int turn = 0; turn < 3; ++turn) {
    const std::vector<int32_t> user = testing::TestIds(40 - 7 * turn, vocab(), 11 + turn);
    const size_t history = conversation.size();
    conversation = Cat(conversation, user);
    const Output got = Call(id, Greedy(conversation, /*reuse=*/true));
    const Output want = GetParam().extension_equals_fresh
                            ? Fresh(conversation)
                            : Call(plain, Greedy(user, /*reuse=*/false));
    EXPECT_EQ(got.ids, want.ids) << "turn " << turn;
    EXPECT_EQ(got.text, want.text) << "turn " << turn;
    EXPECT_EQ(got.result.prompt_tokens, conversation.size()) << "turn " << turn;
    EXPECT_EQ(got.result.cached_tokens, history == 0 ? 0 : history - 1) << "turn " << turn;
    conversation = Cat(conversation, got.ids);
    EXPECT_EQ(got.result.session_tokens, conversation.size());
  }
  ReleaseAllBut(id);
  ExpectExactGauges(id, Call(id, Greedy(conversation, /*reuse=*/true)));
}

// The previous reply re-tokenized differently (a token in the middle of the
// first reply edited): the session keeps the common prefix and rolls the
// rest back, or starts over where its mode cannot roll back; either way the
// answer is a fresh session's, and the bytes are exact.
TEST_P(PrefixReuseTest, AnEditedHistoryRollsBackToTheCommonPrefixOrStartsOver) {
  const std::string id = NewSession();
  const std::vector<int32_t> user1 = testing::TestIds(40, vocab(), 21);
  const Output first = Call(id, Greedy(user1, /*reuse=*/true));
  std::vector<int32_t> conversation = Cat(user1, first.ids);
  const Output second =
      Call(id, Greedy(Cat(conversation, testing::TestIds(30, vocab(), 22)), /*reuse=*/true));
  conversation = Cat(Cat(conversation, testing::TestIds(30, vocab(), 22)), second.ids);

  // Edit the first reply's sixth token; then a new user message.
  std::vector<int32_t> edited = conversation;
  const size_t at = user1.size() + 5;
  edited[at] = (edited[at] + 1) % static_cast<int32_t>(vocab());
  edited = Cat(edited, testing::TestIds(20, vocab(), 23));
  const Output got = Call(id, Greedy(edited, /*reuse=*/true));
  const std::string fresh_id = NewSession();
  const Output want = Call(fresh_id, Greedy(edited, /*reuse=*/false));
  EXPECT_EQ(got.ids, want.ids);
  EXPECT_EQ(got.result.prompt_tokens, edited.size());
  EXPECT_EQ(got.result.cached_tokens, GetParam().rolls_back ? at : 0u);
  EXPECT_EQ(got.result.session_tokens, edited.size() + kReply);
  if (!GetParam().rolls_back) {
    // Started over: every byte was freed and the session holds exactly what
    // a fresh one holds for the same call.
    EXPECT_EQ(got.result.memory.bytes, want.result.memory.bytes);
  }
  ReleaseAllBut(id);
  ExpectExactGauges(id, got);

  // A much shorter conversation: the rows past it are given back (whole
  // pages of the row blocks; constant-size states stay as they are).
  const std::vector<int32_t> short_conversation(user1.begin(), user1.begin() + 10);
  const Output shorter = Call(id, Greedy(short_conversation, /*reuse=*/true));
  EXPECT_EQ(shorter.ids, Fresh(short_conversation).ids);
  ReleaseAllBut(id);
  EXPECT_EQ(shorter.result.cached_tokens, GetParam().rolls_back ? 9u : 0u);
  EXPECT_EQ(shorter.result.session_tokens, 10 + kReply);
  // Never more; fewer bytes only where the rows given back fill a whole
  // block of the cache's row storage, which depends on its block size, so
  // not asserted. The gauges stay exact either way.
  EXPECT_LE(shorter.result.memory.total(), got.result.memory.total());
  ExpectExactGauges(id, shorter);
}

// A retry — the conversation equals the history — still prefills one token
// (the last) for its logits; nothing is rolled back, in every mode.
TEST_P(PrefixReuseTest, ARetryOfTheSameConversationPrefillsOneToken) {
  const std::string id = NewSession();
  const std::vector<int32_t> user = testing::TestIds(40, vocab(), 31);
  const Output first = Call(id, Greedy(user, /*reuse=*/true));
  const std::vector<int32_t> conversation = Cat(user, first.ids);
  const Output retry = Call(id, Greedy(conversation, /*reuse=*/true));
  EXPECT_EQ(retry.result.cached_tokens, conversation.size() - 1);
  EXPECT_EQ(retry.result.session_tokens, conversation.size() + kReply);
  if (GetParam().extension_equals_fresh) {
    EXPECT_EQ(retry.ids, Fresh(conversation).ids);
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, PrefixReuseTest, ::testing::ValuesIn(Modes()),
                         [](const auto& info) { return info.param.name; });

// ---------------------------------------------------------------------------
// Exact mode only: the sampler, the detokenizer, the plan and the store.

using PrefixReuseExactTest = ReuseTestBase;

// Sampling continues as for any continuation: the RNG of the previous call
// carries over (no seed), as a plain continuation's does.
TEST_F(PrefixReuseExactTest, TheRngContinuesAsForAContinuation) {
  GenerationRequest r = Greedy(testing::TestIds(30, vocab(), 41), /*reuse=*/true);
  r.sampling.temperature = 1.0f;
  r.sampling.seed = 5;
  const std::string a = NewSession(), b = NewSession();
  const Output a1 = Call(a, r);
  GenerationRequest plain = r;
  plain.reuse_prefix = false;
  const Output b1 = Call(b, plain);
  ASSERT_EQ(a1.ids, b1.ids);
  const std::vector<int32_t> user2 = testing::TestIds(9, vocab(), 42);
  GenerationRequest next = r;
  next.seed_given = false;
  next.prompt = Cat(Cat(r.prompt, a1.ids), user2);
  GenerationRequest plain_next = next;
  plain_next.reuse_prefix = false;
  plain_next.prompt = user2;
  EXPECT_EQ(Call(a, next).ids, Call(b, plain_next).ids);
}

// The detokenizer's held-back bytes (a UTF-8 character cut at the end of
// the last reply) belong to the history's last tokens: an exact extension
// keeps them for the next text, a rollback drops them with those tokens.
TEST_F(PrefixReuseExactTest, HeldBackBytesGoWithTheTokensThatMadeThem) {
  const std::vector<int32_t> user = testing::TestIds(30, vocab(), 51);
  auto run = [&](bool edit) {
    const std::string id = NewSession();
    const Output first = Call(id, Greedy(user, /*reuse=*/true));
    {
      auto lease = store_.Acquire(id);
      EXPECT_TRUE(lease.ok());
      (*lease)->KeepDetokPending("\xE2\x82");  // the first two bytes of "€"
    }
    std::vector<int32_t> conversation = Cat(user, first.ids);
    if (edit) conversation.back() = (conversation.back() + 1) % static_cast<int32_t>(vocab());
    return Call(id, Greedy(Cat(conversation, {65, 66}), /*reuse=*/true));
  };
  const Output kept = run(/*edit=*/false);
  const Output dropped = run(/*edit=*/true);
  EXPECT_EQ(kept.result.cached_tokens, user.size() + kReply - 1);
  EXPECT_EQ(dropped.result.cached_tokens, user.size() + kReply - 1);
  // Without the bytes, the text is exactly the tokens' own.
  tokenizer::IncrementalDetokenizer detok(*tok_);
  std::string own;
  for (int32_t t : dropped.ids) own += detok.Push(t);
  EXPECT_EQ(dropped.text, own);
  EXPECT_NE(kept.text.substr(0, 3), own.substr(0, std::min<size_t>(3, own.size())));
}

// The plan of a reuse_prefix call: the kept history and the appended rest;
// the context is checked against the whole conversation.
TEST_F(PrefixReuseExactTest, ThePlanKeepsThePrefixAndCountsTheConversation) {
  const std::string id = NewSession();
  const std::vector<int32_t> user = testing::TestIds(30, vocab(), 61);
  const Output first = Call(id, Greedy(user, /*reuse=*/true));
  std::vector<int32_t> conversation = Cat(user, first.ids);
  conversation[20] = (conversation[20] + 1) % static_cast<int32_t>(vocab());
  conversation.push_back(7);
  const GenerationRequest r = Greedy(conversation, /*reuse=*/true);
  auto existing = store_.PeekForReuse(id, r.prompt);
  ASSERT_TRUE(existing.ok()) << existing.status();
  ASSERT_TRUE(existing->reuse.has_value());
  EXPECT_EQ(existing->history, user.size() + kReply);
  EXPECT_EQ(existing->reuse->lcp, 20u);
  EXPECT_EQ(existing->reuse->kept, 20u);
  EXPECT_EQ(existing->reuse->cached, 20u);
  EXPECT_FALSE(existing->reuse->start_over);
  PlanLimits limits{.max_tokens = 64, .max_context = engine_->max_context()};
  auto plan = PlanRequest(r, limits, model_->config(), *existing);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->history, 20u);
  EXPECT_EQ(plan->prompt, conversation.size() - 20);
  EXPECT_EQ(plan->total, conversation.size() + kReply);
  EXPECT_EQ(plan->projected.total(),
            ProjectedSessionBytes(model_->config(), {}, plan->total, conversation.size()));
  // The context: the conversation + max_tokens, whatever the session held.
  limits.max_context = conversation.size() + kReply - 1;
  auto over = PlanRequest(r, limits, model_->config(), *existing);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(over.status().message().find("context of"), std::string_view::npos);
  // A reuse_prefix request planned on a plain Peek is a programmer error.
  auto peeked = store_.Peek(id);
  ASSERT_TRUE(peeked.ok());
  EXPECT_EQ(PlanRequest(r, limits, model_->config(), *peeked).status().code(),
            absl::StatusCode::kInternal);
  // A new session: nothing kept, nothing cached.
  auto fresh = PlanRequest(r, limits, model_->config(), SessionConfig{});
  ASSERT_FALSE(fresh.ok());  // over the context above
  limits.max_context = engine_->max_context();
  fresh = PlanRequest(r, limits, model_->config(), SessionConfig{});
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_EQ(fresh->reuse, PrefixReuse{});
  EXPECT_EQ(fresh->prompt, conversation.size());
}

// Acquire(id, plan) refuses a reuse_prefix plan when the session was leased
// since PeekForReuse, even with a history of the same length (another call
// may have rolled back and regenerated); Submit refuses a plan whose reuse
// is not the session's.
TEST_F(PrefixReuseExactTest, AcquireRefusesASessionLeasedSinceThePeek) {
  const std::string id = NewSession();
  const std::vector<int32_t> user = testing::TestIds(30, vocab(), 71);
  const Output first = Call(id, Greedy(user, /*reuse=*/true));
  const GenerationRequest r = Greedy(Cat(user, first.ids), /*reuse=*/true);
  auto existing = store_.PeekForReuse(id, r.prompt);
  ASSERT_TRUE(existing.ok());
  const PlanLimits limits{.max_tokens = 64, .max_context = engine_->max_context()};
  auto plan = PlanRequest(r, limits, model_->config(), *existing);
  ASSERT_TRUE(plan.ok());
  store_.Acquire(id)->Return();  // leased and returned: nothing changed, yet
  auto refused = store_.Acquire(id, *plan);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(refused.status().message().find("retry"), std::string_view::npos);

  existing = store_.PeekForReuse(id, r.prompt);
  ASSERT_TRUE(existing.ok());
  plan = PlanRequest(r, limits, model_->config(), *existing);
  ASSERT_TRUE(plan.ok());
  RequestPlan wrong = *plan;
  wrong.reuse->cached -= 1;
  auto lease = store_.Acquire(id, wrong);
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(engine_->Submit(*std::move(lease), r, wrong).status().code(),
            absl::StatusCode::kInternal);
}

// CreateNamed: a session under the caller's id; ALREADY_EXISTS for a taken
// id (whoever's); INVALID_ARGUMENT naming session_id for an id not of the
// form; nothing is created on an error.
TEST_F(PrefixReuseExactTest, CreateNamedMakesASessionUnderTheCallersId) {
  const std::string id(32, 'a');
  const GenerationRequest r = Greedy({1, 2, 3}, /*reuse=*/true);
  const PlanLimits limits{.max_tokens = 64, .max_context = engine_->max_context()};
  auto plan = PlanRequest(r, limits, model_->config(), SessionConfig{});
  ASSERT_TRUE(plan.ok());
  {
    auto lease = store_.CreateNamed(*model_, *plan, id, "alice");
    ASSERT_TRUE(lease.ok()) << lease.status();
    EXPECT_EQ((*lease)->id(), id);
    EXPECT_EQ((*lease)->tenant(), "alice");
    EXPECT_EQ(store_.committed_bytes(), plan->projected.total());
  }
  EXPECT_EQ(store_.CreateNamed(*model_, *plan, id, "bob").status().code(),
            absl::StatusCode::kAlreadyExists);
  const absl::Status bad = store_.CreateNamed(*model_, *plan, "ABC", "alice").status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("session_id"), std::string_view::npos);
  EXPECT_EQ(store_.num_sessions(), 1u);
  ASSERT_TRUE(store_.Get(id, std::string("alice")).has_value());
  EXPECT_FALSE(store_.Get(id, std::string("bob")).has_value());
}

}  // namespace
}  // namespace cortiq::session
