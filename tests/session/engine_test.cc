// Engine: continuous batching equals decoding alone, chunked prefill,
// continuation, stop sequences, cancellation (a retry waits for the lease),
// deadlines (a kept session gives back its unused reservation), slow
// readers, and the attention modes, on a real (random) model.
#include "core/session/engine.h"

#include <unistd.h>

#include <algorithm>
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

}  // namespace
}  // namespace cortiq::session
