// The engine's scheduler (issue 19): mixed steps of decode rows and prompt
// chunks under a token budget give every job the outputs it gets alone, in
// every attention mode; short prompts that arrive together are absorbed in
// one step; priorities order the prefill and aging bounds the wait of a
// lower level; tenants share the steps by weight. Steps are counted through
// the observer (never timed): a test observer can hold the engine thread in
// OnStep (a gate) so that a batch of submissions lands between two steps.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/attention/window_attention.h"
#include "core/model/transformer.h"
#include "core/session/engine.h"
#include "core/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "tests/common/engine_test_util.h"
#include "tests/common/model_test_util.h"

namespace cortiq::session {
namespace {

// Records every step and first chunk; OnStep waits while the gate is shut.
class CountingObserver : public EngineObserver {
 public:
  struct Step {
    size_t decode, prefill;
  };
  struct Wait {
    size_t step;  // index of the step the first chunk ran in
    Priority priority;
  };

  void OnStep(size_t decode, size_t prefill, double) override {
    std::unique_lock lock(mu_);
    steps_.push_back({decode, prefill});
    in_step_ = true;
    cv_.notify_all();
    cv_.wait(lock, [&] { return open_ || permits_ > 0; });
    if (!open_) --permits_;
    in_step_ = false;
  }
  void OnQueueWait(Frontend, Priority p, double) override {
    std::unique_lock lock(mu_);
    waits_.push_back({steps_.size(), p});
  }
  void OnTenantStep(std::string_view tenant, size_t decode, size_t prefill) override {
    std::unique_lock lock(mu_);
    (void)decode;
    if (prefill > 0) served_.push_back({steps_.size(), std::string(tenant), prefill});
  }

  // Shuts the gate: the engine thread's next OnStep holds it there.
  void Shut() {
    std::unique_lock lock(mu_);
    open_ = false;
  }
  // Waits until the engine thread is held in OnStep (after Shut).
  void WaitHeld() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return in_step_; });
  }
  // Lets the held engine thread run one more step, and waits until it is
  // held after it.
  void StepOnce() {
    std::unique_lock lock(mu_);
    const size_t n = steps_.size();
    ++permits_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return in_step_ && steps_.size() > n; });
  }
  // Opens the gate; returns the index the next step will have.
  size_t Open() {
    std::unique_lock lock(mu_);
    open_ = true;
    cv_.notify_all();
    return steps_.size();
  }
  std::vector<Step> steps() {
    std::unique_lock lock(mu_);
    return steps_;
  }
  std::vector<Wait> waits() {
    std::unique_lock lock(mu_);
    return waits_;
  }
  // Every step's prefill tokens per tenant.
  struct Served {
    size_t step;
    std::string tenant;
    size_t prefill;
  };
  std::vector<Served> served() {
    std::unique_lock lock(mu_);
    return served_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = true, in_step_ = false;
  size_t permits_ = 0;  // steps the shut gate lets through (StepOnce)
  std::vector<Step> steps_;
  std::vector<Wait> waits_;
  std::vector<Served> served_;
};

// Token ids and the chosen token's logprob bits of every event.
struct Trace {
  std::vector<int32_t> ids;
  std::vector<uint32_t> logprob_bits;
  GenerationResult result;
};

Trace DrainTrace(Job& job) {
  Trace t;
  GenerationEvent ev;
  while (job.WaitPop(&ev)) {
    t.ids.push_back(ev.token_id);
    uint32_t bits = 0;
    if (ev.logprobs) std::memcpy(&bits, &ev.logprobs->chosen.logprob, 4);
    t.logprob_bits.push_back(bits);
  }
  t.result = job.result();
  return t;
}

class SchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(testing::LoadTempModel("tiny", &model_, &tok_));
  }

  GenerationRequest Greedy(size_t prompt, size_t max_tokens, uint32_t seed,
                           Priority priority = Priority::kNormal) {
    GenerationRequest r;
    r.prompt = testing::TestIds(prompt, model_->config().vocab_size, seed);
    r.max_tokens = max_tokens;
    r.sampling.temperature = 0;
    r.ignore_eos = true;
    r.logprobs = true;
    r.priority = priority;
    return r;
  }

  std::shared_ptr<Job> Start(Engine& e, SessionStore& store, GenerationRequest r,
                             const SessionConfig& c = {}, std::string tenant = {}) {
    auto lease = store.Create(*model_, c, 0, std::move(tenant));
    EXPECT_TRUE(lease.ok()) << lease.status();
    auto job = e.Submit(*std::move(lease), std::move(r));
    EXPECT_TRUE(job.ok()) << job.status();
    return *job;
  }

  static EngineOptions Budget(size_t step_tokens, size_t chunk, CountingObserver* obs) {
    EngineOptions o;
    o.step_tokens = step_tokens;
    o.prefill_chunk = chunk;
    o.observer = obs;
    return o;
  }
  // A stream that keeps the engine stepping, with the engine thread then
  // held in OnStep once the stream has its first token: what the test
  // submits next lands between two steps. The gate shuts before the stream
  // starts and lets one step through at a time: shut after the first token,
  // the engine could already have filled the stream's event queue (its
  // consumer reads one event here) and gone idle, never to reach OnStep.
  std::shared_ptr<Job> HoldTheEngine(Engine& e, SessionStore& store, CountingObserver& obs) {
    obs.Shut();
    auto warm = Start(e, store, Greedy(4, 400, 1));
    return HeldAtFirstToken(obs, warm);
  }
  // With the gate shut and `job` started: steps one at a time until it has
  // its first token, the engine thread held after that step.
  static std::shared_ptr<Job> HeldAtFirstToken(CountingObserver& obs, std::shared_ptr<Job> job) {
    obs.WaitHeld();
    GenerationEvent ev;
    while (!job->Pop(&ev)) obs.StepOnce();
    return job;
  }
  static void Stop(Job& job) {
    job.Cancel();
    DrainTrace(job);
  }

  std::vector<SessionConfig> EveryMode() const {
    const auto& m = model_->config();
    std::vector<SessionConfig> modes(5);
    modes[1].kv_mode = kv::KvMode::kInt8;
    modes[2] = testing::SmallO1Config();
    modes[3].attention = AttentionMode::kQsa;
    modes[3].qsa = *model::MakeQsaConfig("all", 16, 4, m.num_hidden_layers);
    modes[4].attention = AttentionMode::kWindow;
    modes[4].window = *attention::MakeWindowConfig("all", 2, 8, m.num_hidden_layers);
    return modes;
  }

  std::unique_ptr<model::Transformer> model_;
  std::unique_ptr<tokenizer::Tokenizer> tok_;
};

// Jobs of every mode, long and short prompts (chunks of 64 rows on the
// GEMM, shorter ones with the decode rows), arriving while others decode:
// each streams the same tokens with the same logprob bits as alone.
TEST_F(SchedulerTest, MixedStepsGiveEveryJobItsOwnOutputsInEveryMode) {
  CountingObserver obs;
  EngineOptions o = Budget(160, 64, &obs);
  SessionStore store({});  // outlives the engine
  Engine engine(*model_, *tok_, o);
  const std::vector<SessionConfig> modes = EveryMode();
  struct Case {
    size_t mode, prompt, max_tokens;
  };
  std::vector<Case> cases;
  for (size_t m = 0; m < modes.size(); ++m) {
    cases.push_back({m, 150, 12});
    cases.push_back({m, 40 + 7 * m, 20});
  }
  std::vector<Trace> alone;
  for (size_t i = 0; i < cases.size(); ++i) {
    alone.push_back(DrainTrace(*Start(
        engine, store, Greedy(cases[i].prompt, cases[i].max_tokens, 7 + i), modes[cases[i].mode])));
  }
  // Together: the short prompts first; once they decode, the long ones
  // arrive (their chunks share steps with the decode rows).
  std::vector<std::shared_ptr<Job>> jobs(cases.size());
  for (size_t i = 1; i < cases.size(); i += 2) {
    jobs[i] = Start(engine, store, Greedy(cases[i].prompt, cases[i].max_tokens, 7 + i),
                    modes[cases[i].mode]);
  }
  GenerationEvent first;
  ASSERT_TRUE(jobs[1]->WaitPop(&first));
  for (size_t i = 0; i < cases.size(); i += 2) {
    jobs[i] = Start(engine, store, Greedy(cases[i].prompt, cases[i].max_tokens, 7 + i),
                    modes[cases[i].mode]);
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    Trace t = DrainTrace(*jobs[i]);
    if (i == 1) {  // its first event was popped above
      t.ids.insert(t.ids.begin(), first.token_id);
      uint32_t bits;
      std::memcpy(&bits, &first.logprobs->chosen.logprob, 4);
      t.logprob_bits.insert(t.logprob_bits.begin(), bits);
    }
    EXPECT_EQ(t.ids, alone[i].ids) << "job " << i << " (mode " << cases[i].mode << ")";
    EXPECT_EQ(t.logprob_bits, alone[i].logprob_bits) << "job " << i;
    EXPECT_TRUE(t.result.status.ok()) << t.result.status;
  }
  size_t mixed = 0;
  for (const auto& s : obs.steps()) {
    mixed += s.decode > 0 && s.prefill > 0;
    // The budget: at most max(step_tokens, decode rows + one chunk).
    EXPECT_LE(s.decode + s.prefill, std::max<size_t>(o.step_tokens, s.decode + o.prefill_chunk));
  }
  EXPECT_GE(mixed, 2u) << "no step mixed decode rows with prompt chunks";
}

// More decode rows than max_batch: every step holds at most max_batch of
// them, the jobs take turns (the least recently decoded first), and each
// streams what it streams alone.
TEST_F(SchedulerTest, DecodeRowsPastMaxBatchTakeTurns) {
  CountingObserver obs;
  EngineOptions o = Budget(128, 64, &obs);
  o.max_batch = 2;
  SessionStore store({});  // outlives the engine
  Engine engine(*model_, *tok_, o);
  std::vector<Trace> alone;
  for (int i = 0; i < 5; ++i) alone.push_back(DrainTrace(*Start(engine, store, Greedy(6, 12, 90 + i))));
  auto warm = HoldTheEngine(engine, store, obs);
  std::vector<std::shared_ptr<Job>> jobs;
  for (int i = 0; i < 5; ++i) jobs.push_back(Start(engine, store, Greedy(6, 12, 90 + i)));
  warm->Cancel();  // (takes effect before the next step)
  const size_t next = obs.Open();
  DrainTrace(*warm);
  for (int i = 0; i < 5; ++i) {
    const Trace t = DrainTrace(*jobs[i]);
    EXPECT_EQ(t.ids, alone[i].ids) << "job " << i;
    EXPECT_EQ(t.logprob_bits, alone[i].logprob_bits) << "job " << i;
  }
  // A job's last token is queued before its step reaches the observer; the
  // engine counts its jobs again only after that.
  while (engine.active_jobs() > 0) std::this_thread::yield();
  const auto steps = obs.steps();
  size_t rows = 0;
  for (size_t s = next; s < steps.size(); ++s) {
    EXPECT_LE(steps[s].decode, 2u) << "step " << s;
    rows += steps[s].decode;
  }
  // 11 decode rows each after the first token; taking turns, the 55 rows
  // fill 2 per step but for the last odd one.
  EXPECT_EQ(rows, 5u * 11u) << [&] {
    std::string s;
    for (size_t i = next - 1; i < steps.size(); ++i) {
      s += std::to_string(steps[i].decode) + "+" + std::to_string(steps[i].prefill) + " ";
    }
    return s;
  }();
  EXPECT_LE(steps.size() - next, 1u + 28u + 1u);
}

// A low stream decoding beside high ones that fill max_batch still decodes:
// its rows age from its last one (it used to wait for every high stream to
// end). The highs' consumers read all the while, so their queues never
// pause them.
TEST_F(SchedulerTest, ALowStreamDecodesWhileHigherOnesFillTheBatch) {
  CountingObserver obs;
  EngineOptions o = Budget(128, 64, &obs);
  o.max_batch = 2;
  o.aging_steps = 4;
  SessionStore store({});  // outlives the engine
  Engine engine(*model_, *tok_, o);
  auto warm = HoldTheEngine(engine, store, obs);
  auto low = Start(engine, store, Greedy(6, 4, 50, Priority::kLow));
  std::vector<std::shared_ptr<Job>> high;
  for (int i = 0; i < 2; ++i)
    high.push_back(Start(engine, store, Greedy(6, 300, 60 + i, Priority::kHigh)));
  warm->Cancel();
  obs.Open();
  std::atomic<int> highs_done{0};
  std::vector<std::thread> readers;
  for (auto& h : high) {
    readers.emplace_back([&, h] {
      DrainTrace(*h);
      ++highs_done;
    });
  }
  DrainTrace(*warm);
  const Trace t = DrainTrace(*low);
  const int done_then = highs_done.load();
  for (auto& r : readers) r.join();
  EXPECT_EQ(t.ids.size(), 4u);
  EXPECT_EQ(done_then, 0) << "the low stream decoded only once the high ones had ended";
}

// Eight short prompts that arrive together are absorbed in ONE step with
// the running stream's decode row, and each has its first token after it.
TEST_F(SchedulerTest, ShortPromptsArrivingTogetherShareOneStep) {
  CountingObserver obs;
  EngineOptions o = Budget(256, 64, &obs);
  SessionStore store({});  // outlives the engine
  Engine engine(*model_, *tok_, o);
  obs.Shut();  // before the stream starts (see HoldTheEngine)
  auto running = HeldAtFirstToken(obs, Start(engine, store, Greedy(8, 400, 1)));
  std::vector<std::shared_ptr<Job>> jobs;
  for (int i = 0; i < 8; ++i) jobs.push_back(Start(engine, store, Greedy(30, 4, 20 + i)));
  const size_t next = obs.Open();
  for (auto& j : jobs) {
    const Trace t = DrainTrace(*j);
    EXPECT_EQ(t.ids.size(), 4u);
  }
  Stop(*running);
  size_t first_chunks = 0;
  for (const auto& w : obs.waits()) {
    if (w.step >= next) {
      EXPECT_EQ(w.step, next) << "a short prompt waited for a later step";
      ++first_chunks;
    }
  }
  EXPECT_EQ(first_chunks, 8u);
  const auto steps = obs.steps();
  ASSERT_GT(steps.size(), next);
  EXPECT_EQ(steps[next].prefill, 8u * 30u);
  EXPECT_LE(steps[next].decode, 1u);  // (0 once the running stream's queue is full)
}

// A low job submitted before a flood of high ones: the high ones are
// prefilled first, and aging lifts the low one to the top within
// (kHigh - kLow) · aging_steps steps, although the flood holds far more.
TEST_F(SchedulerTest, AgingBoundsTheWaitOfALowerPriority) {
  CountingObserver obs;
  EngineOptions o = Budget(16, 16, &obs);
  o.aging_steps = 4;
  SessionStore store({});  // outlives the engine
  Engine engine(*model_, *tok_, o);
  auto warm = HoldTheEngine(engine, store, obs);
  auto low = Start(engine, store, Greedy(32, 1, 2, Priority::kLow));
  std::vector<std::shared_ptr<Job>> high;
  // 30 prompts of 4 chunks each: 120 steps of prefill.
  for (int i = 0; i < 30; ++i) high.push_back(Start(engine, store, Greedy(64, 1, 3 + i, Priority::kHigh)));
  const size_t next = obs.Open();
  DrainTrace(*low);
  for (auto& j : high) DrainTrace(*j);
  Stop(*warm);
  size_t low_step = 0, high_before = 0;
  for (const auto& w : obs.waits()) {
    if (w.step < next) continue;
    if (w.priority == Priority::kLow) low_step = w.step;
  }
  for (const auto& w : obs.waits()) {
    if (w.step >= next && w.priority == Priority::kHigh && w.step < low_step) ++high_before;
  }
  ASSERT_GE(low_step, next);
  EXPECT_GE(high_before, 1u) << "the higher level was not prefilled first";
  EXPECT_LE(low_step - next, 2 * o.aging_steps) << "aging did not bound the wait";
}

// A tenant whose only stream is paused (its consumer does not read: a full
// event queue) while another tenant is served banks no share for that time:
// when both then flood with prompts, they share the prefill evenly (the
// paused tenant's virtual time used to stay behind, and its prompts all went
// first until it had caught up).
TEST_F(SchedulerTest, APausedStreamBanksNoShareForItsTenant) {
  CountingObserver obs;
  EngineOptions o = Budget(16, 16, &obs);
  SessionStore store({});  // outlives the engine
  Engine engine(*model_, *tok_, o);
  auto paused = Start(engine, store, Greedy(4, 1000, 7), {}, "h");  // never read
  auto busy = Start(engine, store, Greedy(4, 1000, 8), {}, "g");
  GenerationEvent ev;
  for (int i = 0; i < 400; ++i) ASSERT_TRUE(busy->WaitPop(&ev));
  obs.Shut();
  obs.WaitHeld();
  std::vector<std::shared_ptr<Job>> jobs;
  for (const char* tenant : {"h", "g"}) {
    for (int i = 0; i < 8; ++i) {
      jobs.push_back(Start(engine, store, Greedy(128, 1, 40 + i), {}, tenant));
    }
  }
  const size_t next = obs.Open();
  std::thread reader([&] { DrainTrace(*busy); });
  for (auto& j : jobs) DrainTrace(*j);
  Stop(*paused);
  busy->Cancel();  // (its reader drains it)
  reader.join();
  std::map<std::string, size_t> served;
  for (const auto& s : obs.served()) {
    if (s.step >= next && s.step < next + 40) served[s.tenant] += s.prefill;
  }
  ASSERT_GT(served["g"], 0u);
  EXPECT_NEAR(double(served["h"]) / double(served["g"]), 1.0, 0.2)
      << "h " << served["h"] << ", g " << served["g"];
}

// Two tenants with waiting prompts share the prefill tokens by weight, and a
// light tenant's prompt is not queued behind a flood from another tenant.
TEST_F(SchedulerTest, TenantsShareThePrefillByWeight) {
  CountingObserver obs;
  EngineOptions o = Budget(16, 16, &obs);
  o.tenant_weights = {{"a", 3.0}, {"b", 1.0}};
  SessionStore store({});  // outlives the engine
  Engine engine(*model_, *tok_, o);
  auto warm = HoldTheEngine(engine, store, obs);
  std::vector<std::shared_ptr<Job>> jobs;
  // Both flood: 8 prompts of 8 chunks each, a's first.
  for (const char* tenant : {"a", "b"}) {
    for (int i = 0; i < 8; ++i) {
      jobs.push_back(Start(engine, store, Greedy(128, 1, 40 + i), {}, tenant));
    }
  }
  const size_t next = obs.Open();
  for (auto& j : jobs) DrainTrace(*j);
  Stop(*warm);
  // Over the first 40 steps both have work left (64 chunks each): a is
  // served 3 chunks for each of b's (one chunk per step).
  std::map<std::string, size_t> served;
  for (const auto& s : obs.served()) {
    if (s.step >= next && s.step < next + 40) served[s.tenant] += s.prefill;
  }
  EXPECT_EQ(served["a"] + served["b"], 40u * 16u);
  EXPECT_NEAR(double(served["a"]) / double(served["b"]), 3.0, 0.2)
      << "a " << served["a"] << ", b " << served["b"];
}

TEST_F(SchedulerTest, ALightTenantIsNotQueuedBehindAFlood) {
  CountingObserver obs;
  EngineOptions o = Budget(16, 16, &obs);
  SessionStore store({});  // outlives the engine
  Engine engine(*model_, *tok_, o);
  auto warm = HoldTheEngine(engine, store, obs);
  std::vector<std::shared_ptr<Job>> flood;
  for (int i = 0; i < 8; ++i) flood.push_back(Start(engine, store, Greedy(64, 1, 60 + i), {}, "flood"));
  auto light = Start(engine, store, Greedy(64, 1, 70, Priority::kNormal), {}, "light");
  const size_t next = obs.Open();
  const Trace t = DrainTrace(*light);
  for (auto& j : flood) DrainTrace(*j);
  Stop(*warm);
  // The light prompt (4 chunks) alternates with the flood: arrival order
  // alone would put it behind 32 chunks.
  std::vector<size_t> light_steps;
  for (const auto& s : obs.served()) {
    if (s.tenant == "light" && s.step >= next) light_steps.push_back(s.step - next);
  }
  ASSERT_EQ(light_steps.size(), 4u);
  EXPECT_LE(light_steps.front(), 1u);
  EXPECT_LE(light_steps.back(), 8u);
  EXPECT_EQ(t.ids.size(), 1u);
}

}  // namespace
}  // namespace cortiq::session
