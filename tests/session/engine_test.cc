// Engine: continuous batching equals decoding alone, chunked prefill,
// continuation, stop sequences, cancellation (a retry waits for the lease),
// deadlines (a kept session gives back its unused reservation), slow
// readers, and the attention modes, on a real (random) model.
#include "core/session/engine.h"

#include <unistd.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <thread>

#include "core/model/transformer.h"
#include "core/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "tests/common/engine_test_util.h"
#include "tests/common/model_test_util.h"

namespace cortiq::session {
namespace {

using std::chrono::milliseconds;

using Output = testing::JobOutput;

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(testing::LoadTempModel("tiny", &model_, &tok_));
  }

  std::unique_ptr<Engine> MakeEngine(EngineOptions o = {}) {
    return std::make_unique<Engine>(*model_, *tok_, o);
  }

  GenerationRequest Greedy(std::vector<int32_t> prompt, size_t max_tokens) {
    GenerationRequest r;
    r.prompt = std::move(prompt);
    r.max_tokens = max_tokens;
    r.sampling.temperature = 0;
    r.ignore_eos = true;  // random weights: keep lengths deterministic
    return r;
  }

  std::shared_ptr<Job> Start(Engine& e, SessionStore& store, GenerationRequest r,
                             const SessionConfig& c = {}, std::string session_id = {}) {
    absl::StatusOr<SessionStore::Lease> lease =
        session_id.empty() ? store.Create(*model_, c, 0) : store.Acquire(session_id);
    EXPECT_TRUE(lease.ok()) << lease.status();
    auto job = e.Submit(*std::move(lease), std::move(r));
    EXPECT_TRUE(job.ok()) << job.status();
    return *job;
  }

  static Output Drain(Job& job) { return testing::DrainJob(job); }

  std::unique_ptr<model::Transformer> model_;
  std::unique_ptr<tokenizer::Tokenizer> tok_;
};

// --max-context past the model's positions is the model's: the forward
// refuses a row past them, and a refused step ends every job in it (one
// client's request failed everyone's step).
TEST_F(EngineTest, TheContextIsNeverPastTheModelsPositions) {
  const auto positions = static_cast<size_t>(model_->config().max_position_embeddings);
  EXPECT_EQ(MakeEngine({.max_context = 4 * positions})->max_context(), positions);
  EXPECT_EQ(MakeEngine({.max_context = positions / 2})->max_context(), positions / 2);
  EXPECT_EQ(MakeEngine()->max_context(), positions);
}

TEST_F(EngineTest, GreedyEqualsAHandWrittenDecodeLoop) {
  const auto prompt = testing::TestIds(37, model_->config().vocab_size, 1);
  // Reference: prefill, then one DecodeBatch per token, argmax.
  model::SequenceKv kv(model_->config(), kv::KvMode::kF32);
  model::ForwardScratch scratch;
  std::vector<float> logits(model_->config().vocab_size);
  ASSERT_TRUE(model_->Prefill(prompt, kv, scratch, logits.data()).ok());
  std::vector<int32_t> want;
  for (int i = 0; i < 12; ++i) {
    const int32_t t = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    want.push_back(t);
    model::SequenceKv* p = &kv;
    ASSERT_TRUE(model_->DecodeBatch(std::span<const int32_t>(&t, 1), std::span(&p, 1), scratch,
                                    logits.data())
                    .ok());
  }
  SessionStore store({});
  auto engine = MakeEngine();
  auto job = Start(*engine, store, Greedy(prompt, 12));
  Output out = Drain(*job);
  EXPECT_EQ(out.ids, want);
  EXPECT_EQ(out.result.finish_reason, FinishReason::kLength);
  EXPECT_TRUE(out.result.status.ok());
  EXPECT_EQ(out.result.prompt_tokens, 37u);
  EXPECT_EQ(out.result.completion_tokens, 12u);
  EXPECT_EQ(out.result.session_tokens, 49u);
  EXPECT_GT(out.result.memory.total(), 0u);
}

TEST_F(EngineTest, ConcurrentJobsEqualTheSameJobsAlone) {
  SessionStore store({});
  auto engine = MakeEngine();
  constexpr int kJobs = 12;
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < kJobs; ++i) {
    GenerationRequest r = Greedy(testing::TestIds(5 + 9 * i, model_->config().vocab_size, 100 + i),
                                 8 + i);
    if (i % 3 == 1) {  // some seeded sampling too
      r.sampling.temperature = 0.8f;
      r.sampling.top_p = 0.9f;
      r.sampling.seed = 42 + i;
    }
    reqs.push_back(r);
  }
  std::vector<Output> alone;
  for (const auto& r : reqs) alone.push_back(Drain(*Start(*engine, store, r)));
  std::vector<std::shared_ptr<Job>> jobs;
  for (const auto& r : reqs) jobs.push_back(Start(*engine, store, r));
  for (int i = 0; i < kJobs; ++i) {
    Output together = Drain(*jobs[i]);
    EXPECT_EQ(together.ids, alone[i].ids) << "job " << i;
    EXPECT_EQ(together.text, alone[i].text) << "job " << i;
  }
  EXPECT_GT(engine->steps(), 0u);
}

TEST_F(EngineTest, ChunkedPrefillGivesTheSameTokens) {
  const auto prompt = testing::TestIds(150, model_->config().vocab_size, 3);
  SessionStore store({});
  auto whole = MakeEngine();
  EngineOptions o;
  o.prefill_chunk = 16;
  auto chunked = MakeEngine(o);
  Output a = Drain(*Start(*whole, store, Greedy(prompt, 10)));
  Output b = Drain(*Start(*chunked, store, Greedy(prompt, 10)));
  EXPECT_EQ(a.ids, b.ids);
}

TEST_F(EngineTest, ContinuationExtendsTheSessionAndKeepsItsRng) {
  SessionStore store({});
  auto engine = MakeEngine();
  GenerationRequest r = Greedy(testing::TestIds(20, model_->config().vocab_size, 5), 6);
  r.sampling.temperature = 1.0f;
  r.sampling.seed = 9;
  auto lease = store.Create(*model_, {}, 0);
  ASSERT_TRUE(lease.ok());
  const std::string id = (*lease)->id();
  auto job = engine->Submit(*std::move(lease), r);
  ASSERT_TRUE(job.ok());
  Output first = Drain(**job);
  auto snap = store.Get(id);
  ASSERT_TRUE(snap.has_value());
  EXPECT_EQ(snap->tokens, 26u);
  EXPECT_EQ(snap->cached_tokens, 25u);  // the last sampled token is fed next time
  EXPECT_FALSE(snap->busy);

  // Continue without a seed: the RNG goes on; the same continuation from a
  // copy made at the same point samples the same tokens.
  GenerationRequest more = r;
  more.prompt = {1, 2, 3};
  more.seed_given = false;
  Output second = Drain(*Start(*engine, store, more, {}, id));
  EXPECT_EQ(second.result.completion_tokens, 6u);
  snap = store.Get(id);
  EXPECT_EQ(snap->tokens, 35u);
  EXPECT_EQ(snap->cached_tokens, 34u);

  // Replaying the whole conversation in a fresh session gives the same ids.
  auto l2 = store.Create(*model_, {}, 0);
  ASSERT_TRUE(l2.ok());
  const std::string id2 = (*l2)->id();
  auto j1 = engine->Submit(*std::move(l2), r);
  ASSERT_TRUE(j1.ok());
  EXPECT_EQ(Drain(**j1).ids, first.ids);
  EXPECT_EQ(Drain(*Start(*engine, store, more, {}, id2)).ids, second.ids);
}

TEST_F(EngineTest, StopSequenceEndsTheStreamBeforeTheStopText) {
  SessionStore store({});
  auto engine = MakeEngine();
  const auto prompt = testing::TestIds(30, model_->config().vocab_size, 11);
  // The tiny model is byte-level: ids < 256 are bytes. Find the free-running
  // text, then stop on a piece of it.
  Output free_run = Drain(*Start(*engine, store, Greedy(prompt, 40)));
  ASSERT_GE(free_run.text.size(), 12u);
  const std::string stop = free_run.text.substr(6, 3);
  const size_t at = free_run.text.find(stop);
  GenerationRequest r = Greedy(prompt, 40);
  r.stop = {stop, "never-matches-this"};
  Output stopped = Drain(*Start(*engine, store, r));
  EXPECT_EQ(stopped.result.finish_reason, FinishReason::kStop);
  EXPECT_EQ(stopped.text, free_run.text.substr(0, at));
  EXPECT_LT(stopped.ids.size(), free_run.ids.size());
}

TEST_F(EngineTest, CancelStopsAtTheNextStepAndReleasesAOneShotSession) {
  SessionStore store({});
  auto engine = MakeEngine();
  GenerationRequest r = Greedy(testing::TestIds(10, model_->config().vocab_size, 2), 4000);
  r.release_at_end = true;
  auto job = Start(*engine, store, r);
  GenerationEvent ev;
  ASSERT_TRUE(job->WaitPop(&ev));
  job->Cancel();
  while (job->WaitPop(&ev)) {
  }
  EXPECT_EQ(job->result().finish_reason, FinishReason::kCancelled);
  EXPECT_LT(job->result().completion_tokens, 4000u);
  EXPECT_EQ(store.num_sessions(), 0u);
  EXPECT_EQ(store.MemoryByKindTotal().total(), 0u);
  EXPECT_EQ(store.releases()[static_cast<size_t>(ReleaseReason::kCancelled)], 1u);
}

TEST_F(EngineTest, OneShotSessionIsReleasedAtTheEnd) {
  SessionStore store({});
  auto engine = MakeEngine();
  GenerationRequest r = Greedy(testing::TestIds(10, model_->config().vocab_size, 2), 5);
  r.release_at_end = true;
  Output o = Drain(*Start(*engine, store, r));
  EXPECT_GT(o.result.memory.total(), 0u);  // reported before the release
  EXPECT_EQ(store.num_sessions(), 0u);
  EXPECT_EQ(store.releases()[static_cast<size_t>(ReleaseReason::kOneshot)], 1u);
}

TEST_F(EngineTest, ReleaseSessionCancelsARunningGeneration) {
  SessionStore store({});
  auto engine = MakeEngine();
  auto job = Start(*engine, store, Greedy({1, 2, 3}, 4000));
  GenerationEvent ev;
  ASSERT_TRUE(job->WaitPop(&ev));
  ReleaseResult r = store.Release(job->session_id());
  EXPECT_TRUE(r.released);
  EXPECT_EQ(store.num_sessions(), 0u);
  while (job->WaitPop(&ev)) {
  }
  EXPECT_EQ(job->result().finish_reason, FinishReason::kCancelled);
}

TEST_F(EngineTest, DeadlineEndsTheJobWithDeadlineExceeded) {
  SessionStore store({});
  auto engine = MakeEngine();
  GenerationRequest r = Greedy({1, 2, 3}, 4000);
  r.deadline = Clock::now() + milliseconds(30);
  Output o = Drain(*Start(*engine, store, r));
  EXPECT_EQ(o.result.status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(o.result.completion_tokens, 4000u);
}

// A call whose deadline has passed before the engine takes it is not
// admitted: the kept session it names is as it was (admission would append
// its prompt and reserve its positions; reusing a prefix, cut the history).
TEST_F(EngineTest, ACallPastItsDeadlineBeforeItBeginsLeavesItsSessionAsItWas) {
  SessionStore store({});
  auto engine = MakeEngine();
  auto first = Start(*engine, store, Greedy({1, 2, 3}, 4));
  const std::string id = first->session_id();
  ASSERT_TRUE(Drain(*first).result.status.ok());
  const auto before = store.Get(id);
  ASSERT_TRUE(before.has_value());
  GenerationRequest late = Greedy({4, 5, 6, 7}, 100);
  late.deadline = Clock::now() - milliseconds(1);
  Output o = Drain(*Start(*engine, store, late, {}, id));
  EXPECT_EQ(o.result.status.code(), absl::StatusCode::kDeadlineExceeded) << o.result.status;
  EXPECT_EQ(o.result.completion_tokens, 0u);
  const auto after = store.Get(id);
  ASSERT_TRUE(after.has_value());
  EXPECT_EQ(after->tokens, before->tokens);
  EXPECT_EQ(after->memory.total(), before->memory.total());
}

// The last-step gauges read 0 once the engine is idle (they used to keep
// the last busy step's rows: a dashboard showed streams that had ended).
TEST_F(EngineTest, TheLastStepGaugesReadZeroWhenIdle) {
  SessionStore store({});
  auto engine = MakeEngine();
  ASSERT_TRUE(Drain(*Start(*engine, store, Greedy({1, 2, 3}, 8))).result.status.ok());
  for (int i = 0; i < 500 && (engine->last_batch() != 0 || engine->last_step_tokens() != 0); ++i) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_EQ(engine->last_batch(), 0u);
  EXPECT_EQ(engine->last_step_tokens(), 0u);
  EXPECT_GT(engine->steps(), 0u);
}

TEST_F(EngineTest, ARetryRightAfterACancelWaitsForTheLeaseAConcurrentCallDoesNot) {
  SessionStore store({});
  auto engine = MakeEngine();
  auto job = Start(*engine, store, Greedy({1, 2, 3}, 4000));
  const std::string id = job->session_id();
  GenerationEvent ev;
  ASSERT_TRUE(job->WaitPop(&ev));
  // Still generating: a second call is refused at once.
  const auto t0 = Clock::now();
  EXPECT_EQ(store.Acquire(id).status().code(), absl::StatusCode::kAborted);
  EXPECT_LT(Clock::now() - t0, milliseconds(100));
  // Cancelled: the retry, made before the engine has returned the lease,
  // waits for it instead of answering ABORTED (20 tries, every one leases).
  for (int i = 0; i < 20; ++i) {
    job->Cancel();
    absl::StatusOr<SessionStore::Lease> retry = store.Acquire(id);
    ASSERT_TRUE(retry.ok()) << "try " << i << ": " << retry.status();
    // (A paused job holds at most a queue of 64 tokens: 20 turns fit the context.)
    auto next = engine->Submit(*std::move(retry), Greedy({4}, 1000));
    ASSERT_TRUE(next.ok()) << next.status();
    job = *next;
    ASSERT_TRUE(job->WaitPop(&ev));
  }
  job->Cancel();
}

TEST_F(EngineTest, AKeptSessionCutShortByItsDeadlineHoldsOnlyWhatItsTokensNeed) {
  SessionStore store({});
  auto engine = MakeEngine();
  GenerationRequest r = Greedy(testing::TestIds(10, model_->config().vocab_size, 2), 4000);
  r.deadline = Clock::now() + milliseconds(40);
  auto job = Start(*engine, store, r);
  const std::string id = job->session_id();
  Output o = Drain(*job);
  ASSERT_EQ(o.result.status.code(), absl::StatusCode::kDeadlineExceeded);
  ASSERT_LT(o.result.session_tokens, 4000u);
  const size_t tokens = o.result.session_tokens;
  const SessionConfig c;
  const size_t reserved = ProjectedSessionBytes(model_->config(), c, 10 + 4000, 10);
  // What the tokens need plus one growth step (x2, from 16) and a page
  // either side of each head block's rows (K and V per layer and head).
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t slack = 2 * page * 2 * model_->config().num_hidden_layers *
                       model_->config().num_key_value_heads;
  const size_t bound =
      ProjectedSessionBytes(model_->config(), c, std::max<size_t>(16, 2 * tokens), 10) + slack;
  EXPECT_LE(o.result.memory.total(), bound) << tokens << " tokens";
  EXPECT_LT(o.result.memory.total(), reserved / 2);
  // The store's accounting (admission) and the gauges read the same bytes:
  // the call's reservation ended with its lease.
  EXPECT_EQ(store.committed_bytes(), o.result.memory.total());
  EXPECT_EQ(store.MemoryByKindTotal().total(), o.result.memory.total());
  auto snap = store.Get(id);
  ASSERT_TRUE(snap.has_value());
  EXPECT_EQ(snap->memory.total(), o.result.memory.total());
}

TEST_F(EngineTest, ASlowReaderPausesOnlyItsOwnJob) {
  SessionStore store({});
  EngineOptions opt;
  opt.queue_capacity = 2;
  auto engine = MakeEngine(opt);
  auto slow = Start(*engine, store, Greedy({5, 6, 7}, 50));
  auto fast = Start(*engine, store, Greedy({8, 9}, 50));
  Output f = Drain(*fast);  // completes although `slow` is never read
  EXPECT_EQ(f.result.completion_tokens, 50u);
  EXPECT_FALSE(slow->finished());
  std::this_thread::sleep_for(milliseconds(20));
  EXPECT_FALSE(slow->finished());  // paused with a full queue
  Output s = Drain(*slow);         // reading resumes it
  EXPECT_EQ(s.result.completion_tokens, 50u);
  EXPECT_EQ(s.ids.size(), 50u);
}

// The field-by-field checks are PlanRequest's (request_plan_test.cc). A
// caller without a front end gets them from Submit(lease, request), against
// the engine's own context; a plan that is not the request's is a bug.
TEST_F(EngineTest, SubmitTakesThePlanAndChecksOnlyThatItIsTheRequests) {
  SessionStore store({});
  auto engine = MakeEngine();
  auto submit = [&](GenerationRequest r) {
    auto lease = store.Create(*model_, {}, 0);
    EXPECT_TRUE(lease.ok()) << lease.status();
    return engine->Submit(*std::move(lease), std::move(r));
  };
  EXPECT_EQ(submit(Greedy({1, 259}, 4)).status().code(), absl::StatusCode::kInvalidArgument);
  absl::Status s = submit(Greedy({1, 2}, 4095)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("context of 4096"), std::string::npos) << s;

  const GenerationRequest r = Greedy({1, 2, 3}, 5);
  const PlanLimits limits{.max_tokens = 5, .max_context = engine->max_context()};
  absl::StatusOr<RequestPlan> plan = PlanRequest(r, limits, model_->config(), SessionConfig{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto lease = store.Create(*model_, *plan);
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(store.committed_bytes(), plan->projected.total());
  GenerationRequest other = r;
  other.max_tokens = 6;
  auto refused = engine->Submit(*std::move(lease), other, *plan);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInternal);

  lease = store.Create(*model_, *plan);
  ASSERT_TRUE(lease.ok()) << lease.status();
  auto job = engine->Submit(*std::move(lease), r, *plan);
  ASSERT_TRUE(job.ok()) << job.status();
  Output o = Drain(**job);
  EXPECT_EQ(o.result.completion_tokens, 5u);
  EXPECT_EQ(o.result.session_tokens, plan->total);  // 3 prompt + 5 sampled
}

TEST_F(EngineTest, O1AndQsaSessionsGenerateAndReportTheirKinds) {
  SessionStore store({});
  auto engine = MakeEngine();
  const SessionConfig o1 = testing::SmallO1Config();
  SessionConfig qsa;
  qsa.attention = AttentionMode::kQsa;
  auto q = model::MakeQsaConfig("all", 16, 4, model_->config().num_hidden_layers);
  ASSERT_TRUE(q.ok());
  qsa.qsa = *q;
  const auto prompt = testing::TestIds(120, model_->config().vocab_size, 4);
  Output a = Drain(*Start(*engine, store, Greedy(prompt, 8), o1));
  Output b = Drain(*Start(*engine, store, Greedy(prompt, 8), qsa));
  EXPECT_EQ(a.ids.size(), 8u);
  EXPECT_EQ(b.ids.size(), 8u);
  EXPECT_GT(a.result.memory[MemoryKind::kO1], 0u);
  EXPECT_GT(b.result.memory[MemoryKind::kQsa], 0u);
  EXPECT_EQ(store.MemoryByKindTotal().total(),
            a.result.memory.total() + b.result.memory.total());
}

// ---------------------------------------------------------------------------
// The OpenAI-style controls: logit_bias, presence / frequency penalties,
// stop_token_ids, min_tokens — against a greedy decode loop written here.

// Greedy by hand: prefill `prompt` on a fresh exact sequence, then `steps`
// times adjust(logits, completion so far), argmax (lowest id on ties), feed.
// Stops early when stop(id) says so (the id is kept).
std::vector<int32_t> HandGreedy(
    const model::Transformer& model, const std::vector<int32_t>& prompt, size_t steps,
    const std::function<void(std::vector<float>&, const std::vector<int32_t>&)>& adjust,
    const std::function<bool(int32_t)>& stop = [](int32_t) { return false; }) {
  model::SequenceKv kv(model.config(), kv::KvMode::kF32);
  model::ForwardScratch scratch;
  std::vector<float> logits(model.config().vocab_size);
  EXPECT_TRUE(model.Prefill(prompt, kv, scratch, logits.data()).ok());
  std::vector<int32_t> out;
  for (size_t i = 0; i < steps; ++i) {
    adjust(logits, out);
    const int32_t t = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(t);
    if (stop(t)) break;
    model::SequenceKv* p = &kv;
    EXPECT_TRUE(model.DecodeBatch(std::span<const int32_t>(&t, 1), std::span(&p, 1), scratch,
                                  logits.data())
                    .ok());
  }
  return out;
}

// OpenAI's definitions over the completion only: a prompt full of repeats
// is not penalised (the engine passes the call's own tokens, not the history).
TEST_F(EngineTest, PenaltiesAndLogitBiasFollowTheirDefinitionsOverTheCompletion) {
  SessionStore store({});
  auto engine = MakeEngine();
  std::vector<int32_t> prompt = testing::TestIds(12, model_->config().vocab_size, 21);
  for (int i = 0; i < 4; ++i) prompt.insert(prompt.end(), prompt.begin(), prompt.begin() + 12);
  GenerationRequest r = Greedy(prompt, 24);
  r.sampling.presence_penalty = 1.5f;
  r.sampling.frequency_penalty = 2.0f;
  r.sampling.logit_bias = {{prompt[0], 0.5f}, {prompt[1], -0.25f}};
  std::sort(r.sampling.logit_bias.begin(), r.sampling.logit_bias.end());
  ASSERT_NE(prompt[0], prompt[1]);
  const auto want = HandGreedy(*model_, prompt, 24, [&](std::vector<float>& x, const auto& done) {
    for (const auto& [id, bias] : r.sampling.logit_bias) x[id] += bias;
    std::map<int32_t, int> count;
    for (int32_t id : done) ++count[id];
    for (const auto& [id, c] : count) {
      x[id] -= r.sampling.frequency_penalty * static_cast<float>(c) + r.sampling.presence_penalty;
    }
  });
  Output got = Drain(*Start(*engine, store, r));
  EXPECT_EQ(got.ids, want);
  // And they changed something: without them the loop repeats itself more.
  Output plain = Drain(*Start(*engine, store, Greedy(prompt, 24)));
  EXPECT_NE(plain.ids, got.ids);
}

// A stop id ends the call with finish reason stop; its text is not streamed.
TEST_F(EngineTest, AStopTokenIdEndsTheChoiceWithStop) {
  SessionStore store({});
  auto engine = MakeEngine();
  const auto prompt = testing::TestIds(30, model_->config().vocab_size, 11);
  // Seeded sampling: a varied stream, the same on every run.
  GenerationRequest sampled = Greedy(prompt, 30);
  sampled.sampling.temperature = 2.0f;
  sampled.sampling.seed = 5;
  Output free_run = Drain(*Start(*engine, store, sampled));
  ASSERT_EQ(free_run.ids.size(), 30u);
  // The first id that differs from the first: it ends the call there.
  const size_t at = std::find_if(free_run.ids.begin(), free_run.ids.end(),
                                 [&](int32_t id) { return id != free_run.ids[0]; }) -
                    free_run.ids.begin();
  ASSERT_LT(at, 30u);
  const int32_t stop = free_run.ids[at];
  GenerationRequest r = sampled;
  r.stop_token_ids = {static_cast<int32_t>(model_->config().vocab_size - 1), stop};
  std::vector<GenerationEvent> events;
  auto job = Start(*engine, store, r);
  GenerationEvent ev;
  while (job->WaitPop(&ev)) events.push_back(ev);
  ASSERT_EQ(events.size(), at + 1);
  EXPECT_EQ(events.back().token_id, stop);
  EXPECT_EQ(events.back().text, "");
  EXPECT_EQ(job->result().finish_reason, FinishReason::kStop);
  EXPECT_EQ(job->result().completion_tokens, at + 1);
  std::string text, want;
  for (const auto& e : events) text += e.text;
  sampled.max_tokens = at;
  Output prefix = Drain(*Start(*engine, store, sampled));
  EXPECT_EQ(text, prefix.text);  // everything before the stop id, nothing of it
  // The stop id is in the session's history (as EOS would be).
  EXPECT_EQ(job->result().session_tokens, prompt.size() + at + 1);
}

// min_tokens masks EOS and the stop ids for the call's first samples: with a
// +100 bias on EOS (and on a stop id) the model wants to end at once.
TEST_F(EngineTest, MinTokensMasksEosAndStopIds) {
  SessionStore store({});
  auto engine = MakeEngine();
  const auto prompt = testing::TestIds(16, model_->config().vocab_size, 31);
  ASSERT_FALSE(model_->config().eos_token_ids.empty());
  const int32_t eos_id = model_->config().eos_token_ids[0];
  for (size_t min_tokens : {size_t{0}, size_t{1}, size_t{5}}) {
    GenerationRequest r = Greedy(prompt, 20);
    r.ignore_eos = false;
    r.min_tokens = min_tokens;
    r.sampling.logit_bias = {{eos_id, 100.0f}};
    Output o = Drain(*Start(*engine, store, r));
    EXPECT_EQ(o.result.finish_reason, FinishReason::kEos) << min_tokens;
    ASSERT_EQ(o.ids.size(), min_tokens + 1) << min_tokens;
    EXPECT_EQ(o.ids.back(), eos_id);
    const auto want = HandGreedy(
        *model_, prompt, min_tokens + 1, [&](std::vector<float>& x, const auto& done) {
          x[eos_id] += 100.0f;
          if (done.size() < min_tokens) x[eos_id] = -std::numeric_limits<float>::infinity();
        });
    EXPECT_EQ(o.ids, want) << min_tokens;
  }
  // A stop id under min_tokens: masked too, then it ends the call (stop).
  const int32_t stop = 'q';
  GenerationRequest r = Greedy(prompt, 20);
  r.min_tokens = 3;
  r.stop_token_ids = {stop};
  r.sampling.logit_bias = {{stop, 100.0f}};
  Output o = Drain(*Start(*engine, store, r));
  EXPECT_EQ(o.result.finish_reason, FinishReason::kStop);
  ASSERT_EQ(o.ids.size(), 4u);
  EXPECT_EQ(std::count(o.ids.begin(), o.ids.end(), stop), 1);
  // ignore_eos: EOS is neither masked nor an end; min_tokens = max_tokens.
  r = Greedy(prompt, 6);
  r.min_tokens = 6;
  r.sampling.logit_bias = {{eos_id, 100.0f}};
  o = Drain(*Start(*engine, store, r));
  EXPECT_EQ(o.result.finish_reason, FinishReason::kLength);
  EXPECT_EQ(o.ids, std::vector<int32_t>(6, eos_id));
}

// ---------------------------------------------------------------------------
// n > 1: one prefill, then forks — against n = 1 runs, in every attention mode.

// The session configs of every mode, sized for the tiny model (2 layers) and
// a 120-token prompt: O(1) seals, QSA selects past its inert bound (64), the
// window drops rows.
std::vector<std::pair<std::string, SessionConfig>> EveryMode(const model::ModelConfig& m) {
  std::vector<std::pair<std::string, SessionConfig>> modes;
  modes.emplace_back("exact f32", SessionConfig{});
  SessionConfig int8;
  int8.kv_mode = kv::KvMode::kInt8;
  modes.emplace_back("exact int8", int8);
  SessionConfig o1;
  o1.attention = AttentionMode::kO1;
  o1.o1.layers = {1};
  o1.o1.m = 8;
  o1.o1.w = 16;
  o1.o1.sink = 2;
  modes.emplace_back("o1", o1);
  SessionConfig qsa;
  qsa.attention = AttentionMode::kQsa;
  qsa.qsa = *model::MakeQsaConfig("all", 16, 4, m.num_hidden_layers);
  modes.emplace_back("qsa", qsa);
  SessionConfig window;
  window.attention = AttentionMode::kWindow;
  window.window = *attention::MakeWindowConfig("all", 2, 8, m.num_hidden_layers);
  modes.emplace_back("window", window);
  return modes;
}

// What the gRPC service does for n choices: one plan, then n sessions
// created together (a new session) or the n - 1 forks next to the leased
// one (a continuation), then Submit with the forks.
absl::StatusOr<std::shared_ptr<Job>> SubmitN(const model::Transformer& model, Engine& engine,
                                             SessionStore& store, const GenerationRequest& r,
                                             const SessionConfig& config,
                                             const std::string& session_id = {}) {
  const PlanLimits limits{
      .max_tokens = engine.max_context(), .max_context = engine.max_context(), .max_n = 8};
  SessionStore::Lease lease;
  std::vector<SessionStore::Lease> forks;
  absl::StatusOr<RequestPlan> plan;
  if (session_id.empty()) {
    plan = PlanRequest(r, limits, model.config(), config);
    if (!plan.ok()) return plan.status();
    auto leases = store.CreateMany(model, *plan, r.n);
    if (!leases.ok()) return leases.status();
    lease = std::move((*leases)[0]);
    for (size_t i = 1; i < leases->size(); ++i) forks.push_back(std::move((*leases)[i]));
  } else {
    auto existing = store.Peek(session_id);
    if (!existing.ok()) return existing.status();
    plan = PlanRequest(r, limits, model.config(), *existing);
    if (!plan.ok()) return plan.status();
    auto acquired = store.Acquire(session_id, *plan);
    if (!acquired.ok()) return acquired.status();
    lease = *std::move(acquired);
    if (r.n > 1) {
      auto leases = store.CreateMany(model, *plan, r.n - 1);
      if (!leases.ok()) return leases.status();
      forks = *std::move(leases);
    }
  }
  return engine.Submit(std::move(lease), std::move(forks), r, *plan);
}

// Every choice's events, by GenerationEvent::index.
std::vector<Output> DrainChoices(Job& job, size_t n) {
  std::vector<Output> out(n);
  GenerationEvent ev;
  while (job.WaitPop(&ev)) {
    EXPECT_LT(ev.index, n);
    if (ev.index >= n) continue;
    out[ev.index].ids.push_back(ev.token_id);
    out[ev.index].text += ev.text;
  }
  for (Output& o : out) o.result = job.result();
  return out;
}

TEST_F(EngineTest, NChoicesEqualNSeparateRunsInEveryMode) {
  const auto prompt = testing::TestIds(120, model_->config().vocab_size, 41);
  auto engine = MakeEngine();
  for (const auto& [name, config] : EveryMode(model_->config())) {
    SCOPED_TRACE(name);
    SessionStore store({});
    // Greedy: every choice is the n = 1 output.
    GenerationRequest greedy = Greedy(prompt, 10);
    greedy.release_at_end = true;
    const Output alone = Drain(*Start(*engine, store, greedy, config));
    greedy.n = 3;
    auto job = SubmitN(*model_, *engine, store, greedy, config);
    ASSERT_TRUE(job.ok()) << job.status();
    std::vector<Output> choices = DrainChoices(**job, 3);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(choices[i].ids, alone.ids) << "choice " << i;
      EXPECT_EQ(choices[i].text, alone.text) << "choice " << i;
    }
    const GenerationResult& res = (*job)->result();
    EXPECT_TRUE(res.status.ok()) << res.status;
    ASSERT_EQ(res.choices.size(), 3u);
    for (const ChoiceResult& c : res.choices) {
      EXPECT_EQ(c.finish_reason, FinishReason::kLength);
      EXPECT_EQ(c.completion_tokens, 10u);
    }
    EXPECT_EQ(res.completion_tokens, 30u);
    EXPECT_EQ(res.finish_reason, FinishReason::kLength);
    EXPECT_EQ(res.session_tokens, alone.result.session_tokens);

    // Sampled: choice i is the n = 1 run with seed + i; a stop id ends
    // each choice on its own.
    GenerationRequest sampled = Greedy(prompt, 12);
    sampled.release_at_end = true;
    sampled.sampling.temperature = 40.0f;  // the random model's logits are steep
    sampled.sampling.seed = 100;
    sampled.sampling.presence_penalty = 0.5f;
    sampled.stop_token_ids = {'e'};
    std::vector<Output> singles;
    for (uint64_t i = 0; i < 4; ++i) {
      GenerationRequest one = sampled;
      one.sampling.seed = 100 + i;
      singles.push_back(Drain(*Start(*engine, store, one, config)));
    }
    sampled.n = 4;
    auto sjob = SubmitN(*model_, *engine, store, sampled, config);
    ASSERT_TRUE(sjob.ok()) << sjob.status();
    std::vector<Output> got = DrainChoices(**sjob, 4);
    size_t total = 0;
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(got[i].ids, singles[i].ids) << "choice " << i;
      EXPECT_EQ(got[i].text, singles[i].text) << "choice " << i;
      EXPECT_EQ((*sjob)->result().choices[i].finish_reason, singles[i].result.finish_reason);
      EXPECT_EQ((*sjob)->result().choices[i].completion_tokens, singles[i].ids.size());
      total += singles[i].ids.size();
    }
    EXPECT_EQ((*sjob)->result().completion_tokens, total);
    EXPECT_NE(got[0].ids, got[1].ids);  // the seeds differ
    // Every session was one-shot: nothing is left, every byte came back.
    EXPECT_EQ(store.num_sessions(), 0u);
    EXPECT_EQ(store.MemoryByKindTotal().total(), 0u);
    EXPECT_EQ(store.committed_bytes(), 0u);
  }
}

// A kept session continued with n = 2: choice 0 extends it exactly as an
// n = 1 call would; the fork goes at the end of the call (reason oneshot)
// and the store holds the kept session's bytes alone.
TEST_F(EngineTest, NChoicesOnAContinuedSessionKeepOnlyChoiceZero) {
  const auto prompt = testing::TestIds(70, model_->config().vocab_size, 43);
  auto engine = MakeEngine();
  for (const auto& [name, config] : EveryMode(model_->config())) {
    SCOPED_TRACE(name);
    SessionStore store({});
    std::vector<std::string> ids;
    for (int k = 0; k < 2; ++k) {
      auto lease = store.Create(*model_, config, 0);
      ASSERT_TRUE(lease.ok()) << lease.status();
      ids.push_back((*lease)->id());
      lease->Return();
      GenerationRequest first = Greedy(prompt, 5);
      first.sampling.temperature = 0.9f;
      first.sampling.seed = 3;
      Drain(*Start(*engine, store, first, config, ids.back()));
    }
    GenerationRequest more = Greedy({7, 8, 9}, 6);
    more.sampling.temperature = 0.9f;
    more.seed_given = false;  // choice 0 continues the session's RNG
    const Output alone = Drain(*Start(*engine, store, more, config, ids[0]));
    const auto baseline = store.releases();
    more.n = 2;
    auto job = SubmitN(*model_, *engine, store, more, config, ids[1]);
    ASSERT_TRUE(job.ok()) << job.status();
    std::vector<Output> got = DrainChoices(**job, 2);
    EXPECT_EQ(got[0].ids, alone.ids);
    EXPECT_EQ(got[1].ids.size(), 6u);
    EXPECT_EQ(store.num_sessions(), 2u);  // the two kept sessions, no fork
    const auto after = store.releases();
    EXPECT_EQ(after[size_t(ReleaseReason::kOneshot)] - baseline[size_t(ReleaseReason::kOneshot)],
              1u);
    auto a = store.Get(ids[0]), b = store.Get(ids[1]);
    ASSERT_TRUE(a && b);
    EXPECT_EQ(b->tokens, a->tokens);
    EXPECT_EQ(b->memory.bytes, a->memory.bytes);
    EXPECT_EQ(store.MemoryByKindTotal().total(), a->memory.total() + b->memory.total());
    EXPECT_EQ(store.committed_bytes(), store.MemoryByKindTotal().total());
  }
}

// n copies that do not fit the budget: RESOURCE_EXHAUSTED before anything
// is created or leased; a budget for exactly n copies runs.
TEST_F(EngineTest, ABudgetTooSmallForNCopiesRefusesAndChangesNothing) {
  auto engine = MakeEngine();
  GenerationRequest r = Greedy(testing::TestIds(30, model_->config().vocab_size, 44), 8);
  r.n = 3;
  r.release_at_end = true;
  const PlanLimits limits{.max_tokens = 100, .max_context = engine->max_context(), .max_n = 8};
  auto plan = PlanRequest(r, limits, model_->config(), SessionConfig{});
  ASSERT_TRUE(plan.ok());
  const size_t each = plan->projected.total();
  {
    SessionStore store({.memory_budget_bytes = 3 * each - 1});
    auto job = SubmitN(*model_, *engine, store, r, {});
    EXPECT_EQ(job.status().code(), absl::StatusCode::kResourceExhausted) << job.status();
    EXPECT_NE(job.status().message().find("3 sessions (n)"), std::string::npos) << job.status();
    EXPECT_EQ(store.num_sessions(), 0u);
    EXPECT_EQ(store.committed_bytes(), 0u);
    // A continuation: choice 0 leased, the forks do not fit; the session
    // comes back as it was.
    SessionStore kept({.memory_budget_bytes = 2 * each});
    auto lease = kept.Create(*model_, SessionConfig{}, 0);
    ASSERT_TRUE(lease.ok());
    const std::string id = (*lease)->id();
    lease->Return();
    auto refused = SubmitN(*model_, *engine, kept, r, {}, id);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
    EXPECT_EQ(kept.num_sessions(), 1u);
    EXPECT_EQ(kept.num_leased(), 0u);
    EXPECT_EQ(kept.Get(id)->tokens, 0u);
    EXPECT_EQ(kept.committed_bytes(), 0u);
  }
  SessionStore cap({.max_sessions = 2});
  auto capped = SubmitN(*model_, *engine, cap, r, {});
  EXPECT_EQ(capped.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(cap.num_sessions(), 0u);
  SessionStore exact({.memory_budget_bytes = 3 * each});
  auto job = SubmitN(*model_, *engine, exact, r, {});
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(DrainChoices(**job, 3)[2].ids.size(), 8u);
  EXPECT_EQ(exact.num_sessions(), 0u);
}

// Cancel (and a release of choice 0's session) ends every choice; the forks
// are released with reason cancelled.
TEST_F(EngineTest, CancelEndsEveryChoice) {
  auto engine = MakeEngine();
  SessionStore store({});
  GenerationRequest r = Greedy(testing::TestIds(10, model_->config().vocab_size, 45), 4000);
  r.n = 3;
  r.release_at_end = true;
  auto job = SubmitN(*model_, *engine, store, r, {});
  ASSERT_TRUE(job.ok()) << job.status();
  GenerationEvent ev;
  ASSERT_TRUE((*job)->WaitPop(&ev));
  (*job)->Cancel();
  while ((*job)->WaitPop(&ev)) {
  }
  const GenerationResult& res = (*job)->result();
  EXPECT_EQ(res.finish_reason, FinishReason::kCancelled);
  for (const ChoiceResult& c : res.choices) EXPECT_EQ(c.finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(store.num_sessions(), 0u);
  EXPECT_EQ(store.releases()[size_t(ReleaseReason::kCancelled)], 3u);

  // Releasing choice 0's session mid-call ends the forks too.
  r.release_at_end = false;
  auto kept = SubmitN(*model_, *engine, store, r, {});
  ASSERT_TRUE(kept.ok());
  ASSERT_TRUE((*kept)->WaitPop(&ev));
  EXPECT_TRUE(store.Release((*kept)->session_id()).released);
  while ((*kept)->WaitPop(&ev)) {
  }
  for (const ChoiceResult& c : (*kept)->result().choices) {
    EXPECT_EQ(c.finish_reason, FinishReason::kCancelled);
  }
  EXPECT_EQ(store.num_sessions(), 0u);
  EXPECT_EQ(store.MemoryByKindTotal().total(), 0u);
}

}  // namespace
}  // namespace cortiq::session
