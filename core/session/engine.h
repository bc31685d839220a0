// Engine: the scheduler thread that runs every generation on this node with
// continuous batching.
//
// Each iteration of the loop is one step:
//   1. admits newly submitted jobs, finishes cancelled / expired ones;
//   2. picks the step's rows under a budget of options.step_tokens:
//      a. the decode row of every job in the decode phase whose token queue
//         has room (at most max_batch; under contention by priority, then by
//         tenant share);
//      b. then prefill chunks of the jobs still absorbing their prompt, in
//         order of (effective) priority, then tenant share, then arrival, as
//         many whole chunks as fit (the first chunk of a step always runs,
//         so a step holds at most max(step_tokens, rows + prefill_chunk));
//   3. runs them as ONE forward (Transformer::Step): every weight matrix is
//      read once for the decode rows and the chunks together.
// A job's prompt is cut into chunks of prefill_chunk tokens from its start,
// whatever else runs, so its outputs (bits included) are the same alone or
// in any mix: decode rows and chunks of fewer than math::ChunkGemmMinRows
// rows are computed batch-invariantly, larger chunks as a lone Prefill of that
// chunk would compute them (Transformer::Step).
//
// Scheduling. A waiting job's effective priority is its level plus one per
// options.aging_steps steps since it was submitted (capped at kHigh): a job
// of level p starts its prefill at most (kHigh - p) · aging_steps steps
// after submission plus the chunks queued ahead of it at kHigh then (tested
// on counted steps). The decode rows, when more jobs run than max_batch, age
// the same way from each job's last decode row, so a running lower level
// has a row at least every (kHigh - p + 1) · aging_steps steps or so among
// jobs of one tenant. Tenants (Session::tenant) with waiting work share the
// prefill tokens and, when more jobs decode than max_batch, the decode rows
// in proportion to options.tenant_weights (weighted fair queueing on
// virtual time: a tenant's served rows / its weight; a tenant that becomes
// busy starts at the busy tenants' minimum, and one served nothing in a step
// that served others is kept level with the least served: idle or paused
// time earns no credit).
// The math runs on the model's thread pool, driven from this thread; callers
// (gRPC threads) only submit jobs and pop their events.
//
// A Job is shared by the engine and its consumer (a gRPC reactor, a test, the
// benchmark). Its queue of events is bounded (options.queue_capacity): a job
// whose consumer is slow stops being scheduled until it pops, pausing only
// itself. Cancel(), the deadline and a release of the session take effect at
// the next step boundary.
//
// The engine takes requests with their RequestPlan (PlanRequest, called by
// the front end before it leases anything) and does not check them again.
//
// Example:
//   Engine engine(model, tokenizer, {});
//   CORTIQ_ASSIGN_OR_RETURN(auto job, engine.Submit(std::move(lease), request, plan));
//   GenerationEvent ev;
//   while (job->WaitPop(&ev)) { std::cout << ev.text; }
//   const GenerationResult& r = job->result();
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/model/sampler.h"
#include "core/model/transformer.h"
#include "core/session/request_plan.h"
#include "core/session/session.h"
#include "core/session/session_store.h"
#include "core/tokenizer/detokenizer.h"
#include "core/tokenizer/tokenizer.h"

namespace cortiq::session {

enum class FinishReason : uint8_t { kNone = 0, kLength, kStop, kEos, kCancelled };
std::string_view FinishReasonName(FinishReason reason);  // "length" | "stop" | "eos" | "cancelled"

// One sampled token.
struct GenerationEvent {
  uint32_t index = 0;  // the choice (GenerationRequest::n)
  int32_t token_id = 0;
  std::string text;  // whole UTF-8 characters; stop-sequence prefixes held back
  std::optional<model::Logprobs> logprobs;
  // token_id is an end-of-sequence or stop id: it ends the choice and is not
  // part of the text (`text` may still hold bytes held back before it).
  bool end_token = false;
};

// How one choice of an n > 1 request ended.
struct ChoiceResult {
  FinishReason finish_reason = FinishReason::kNone;
  size_t completion_tokens = 0;
};

struct GenerationResult {
  // Choice 0's (the only one when n == 1).
  FinishReason finish_reason = FinishReason::kNone;
  absl::Status status;           // non-OK: the job failed (model error, deadline)
  size_t prompt_tokens = 0;      // prompt tokens of this call (the request's prompt)
  size_t completion_tokens = 0;  // tokens sampled by this call, every choice
  size_t cached_tokens = 0;      // prompt tokens already in the session (reuse_prefix)
  std::vector<ChoiceResult> choices;  // one per choice, index order
  size_t session_tokens = 0;     // history length after the call
  double queue_seconds = 0;      // submit → first prefill chunk
  double ttft_seconds = 0;       // submit → first token
  double decode_tokens_per_second = 0;
  double total_seconds = 0;      // submit → finish
  MemoryByKind memory;           // the session's bytes at the end
};

// Receives the engine's measurements (metrics live outside core/). Called on
// the engine thread; must not block, and should not allocate (OnFirstToken
// and OnInterToken run once per sampled token). `frontend` is the job's
// GenerationRequest::frontend.
class EngineObserver {
 public:
  virtual ~EngineObserver() = default;
  virtual void OnStep(size_t /*decode_batch*/, size_t /*prefill_tokens*/, double /*seconds*/) {}
  // Once per job, at its first prefill chunk: seconds since Submit.
  virtual void OnQueueWait(Frontend /*frontend*/, Priority /*priority*/, double /*seconds*/) {}
  // Once per step for each tenant ("" = none) that had rows in it.
  virtual void OnTenantStep(std::string_view /*tenant*/, size_t /*decode_rows*/,
                            size_t /*prefill_tokens*/) {}
  virtual void OnFirstToken(Frontend /*frontend*/, double /*ttft_seconds*/) {}
  virtual void OnInterToken(Frontend /*frontend*/, double /*seconds*/) {}
  // Once per job, when it ends, before its consumer can see it finished (so
  // a consumer that waited for the job sees it counted). `result` holds every
  // measurement (tokens, queue / TTFT / total seconds); its finish_reason and
  // status are not set yet: they are `reason` and `status`.
  virtual void OnFinish(Frontend /*frontend*/, FinishReason /*reason*/,
                        const absl::Status& /*status*/, const GenerationResult& /*result*/) {}
};

class SessionPersister;

struct EngineOptions {
  size_t max_batch = 32;          // decode rows per step (< kMatMulGemmMinBatch keeps batches bit-identical to single streams); a request's n choices share one step, so n <= max_batch
  // Rows one step may hold: decode rows plus prefill chunk rows
  // (--step-tokens). It bounds a step's time, so the inter-token latency of
  // running streams while prompts are absorbed. >= 1.
  size_t step_tokens = 128;
  // A prompt is absorbed in chunks of this many tokens, cut from its start
  // (--prefill-chunk); a step takes whole chunks. >= 1.
  size_t prefill_chunk = 64;
  // A waiting job rises one priority level per this many steps (>= 1).
  size_t aging_steps = 64;
  // Weight of each tenant's share (--tenant-weights); a tenant not listed
  // (and "" , no tenant) has default_tenant_weight. Weights > 0.
  std::vector<std::pair<std::string, double>> tenant_weights = {};
  double default_tenant_weight = 1.0;
  size_t queue_capacity = 64;     // events buffered per job before it pauses
  size_t max_context = 0;         // positions per session (0 = the model's max_position_embeddings)
  EngineObserver* observer = nullptr;  // not owned; may be null
  // --state-dir (not owned; may be null): at the end of each call on a kept
  // session (completed, cancelled or past its deadline; not a failed step)
  // the engine prepares the session's journal record (a copy of its new
  // rows, with the lease) and the job's consumer learns the call is over
  // once the persister has written it.
  SessionPersister* persister = nullptr;
};

class Engine;

// A tenant's weight under `options`: its --tenant-weights entry, else
// default_tenant_weight.
double TenantWeight(const EngineOptions& options, std::string_view tenant);

// A tenant's share of the engine's steps (engine thread only): weighted fair
// queueing on virtual time, rows served / weight. The engine keeps one while
// the tenant has admitted jobs.
struct TenantShare {
  std::string name;
  double weight = 1.0;
  double vtime = 0.0;
  size_t jobs = 0;
  size_t step_decode = 0, step_prefill = 0;  // this step's rows
};

class Job : public std::enable_shared_from_this<Job> {
 public:
  // ---- consumer side (any one thread) ----
  // Pops one event without blocking; false when none is queued.
  bool Pop(GenerationEvent* event);
  // Blocks until an event (true) or the end of the job with an empty queue
  // (false).
  bool WaitPop(GenerationEvent* event);
  // True once the job has finished and every event was popped.
  bool Drained() const;
  // Final result; valid once finished() (the engine publishes it last).
  bool finished() const;
  const GenerationResult& result() const;
  // Stops the job at the next step boundary (finish reason cancelled), and
  // marks its lease ending so a next call on the session waits for it
  // (SessionStore::LeaseEnding) instead of answering ABORTED.
  void Cancel();
  // Called on the engine thread after each event push and at the finish (may
  // be called while the consumer runs: it must be cheap and thread-safe).
  // ClearNotify() returns only once no call is running.
  void SetNotify(std::function<void()> notify);
  void ClearNotify();
  const std::string& session_id() const { return session_id_; }

 private:
  friend class Engine;
  Job(Engine* engine, SessionStore::Lease lease, std::vector<SessionStore::Lease> forks,
      GenerationRequest request, size_t positions);

  // One choice of the request (GenerationRequest::n): choice 0 runs on the
  // job's session, choice i > 0 on fork i, a session of its own that
  // receives a deep copy of choice 0's state after the prompt (ForkChoices).
  struct Choice {
    Session* session = nullptr;  // choice 0: *lease_; else *fork
    SessionStore::Lease fork;    // choices > 0, until the choice ends (then released)
    std::unique_ptr<tokenizer::IncrementalDetokenizer> detok;
    std::string held;           // text held back (possible stop prefix)
    int32_t next_input = -1;    // sampled token to feed in the next decode step
    size_t completion_tokens = 0;
    FinishReason finish = FinishReason::kNone;  // kNone while it runs
    Clock::time_point last_token;
  };
  // The choices still sampling.
  size_t LiveChoices() const;

  // engine side
  bool QueueHasRoom() const;
  void Push(GenerationEvent event);
  void Finish(FinishReason reason, absl::Status status);
  void Notify();

  Engine* engine_;
  SessionStore::Lease lease_;
  const SessionStore::LeaseEnding ending_;  // lease_'s, for Cancel on any thread
  const std::string session_id_;
  GenerationRequest request_;
  const size_t positions_;  // RequestPlan::total: what the session's caches reserve
  // Ids masked while a choice has sampled fewer than request_.min_tokens:
  // the EOS ids (unless ignore_eos) and the stop ids. Empty without min_tokens.
  std::vector<int32_t> min_tokens_masked_;
  std::optional<PrefixReuse> reuse_;  // RequestPlan::reuse: applied at admission
  std::atomic<bool> cancelled_{false};

  // engine-thread state
  enum class Phase : uint8_t { kPrefill, kDecode, kDone } phase_ = Phase::kPrefill;
  uint64_t serial_ = 0;         // arrival order
  uint64_t admitted_step_ = 0;  // Engine::steps_ at admission (aging)
  uint64_t decoded_step_ = 0;   // Engine::steps_ when it last had decode rows
  TenantShare* tenant_ = nullptr;  // while admitted
  bool waiting_ = false;        // counted in Engine::waiting_
  size_t prefill_done_ = 0;           // tokens of `pending_` absorbed
  std::vector<int32_t> pending_;      // tokens to absorb: history tail + prompt
  std::vector<Choice> choices_;       // request_.n of them, index order
  Clock::time_point submitted_, first_chunk_, first_token_, last_token_;
  GenerationResult result_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<GenerationEvent> queue_;
  bool finished_ = false;
  std::function<void()> notify_;
  int notify_running_ = 0;
  std::condition_variable notify_cv_;
};

class Engine {
 public:
  Engine(const model::Transformer& model, const tokenizer::Tokenizer& tokenizer,
         EngineOptions options);
  ~Engine();  // Shutdown()
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Takes the lease and queues the job. The session's state belongs to the
  // engine until the job finishes; the lease returns when both the engine and
  // the consumer have dropped the job. `plan` is PlanRequest's for this
  // request on this session: not checked again (INTERNAL when it was made for
  // another request or another history — for reuse_prefix, when its reuse is
  // not Session::PlanReuse's now: a bug). UNAVAILABLE after Shutdown.
  //
  // reuse_prefix: at admission the session keeps plan.reuse->kept tokens of
  // its history (rolled back, or started over: Session::RewindForReuse) and
  // absorbs the rest of the prompt; GenerationResult::cached_tokens is
  // plan.reuse->cached, prompt_tokens the whole prompt.
  absl::StatusOr<std::shared_ptr<Job>> Submit(SessionStore::Lease lease, GenerationRequest request,
                                              const RequestPlan& plan);
  // The same for n > 1: `forks` are request.n - 1 fresh sessions the caller
  // created in the store for this call (SessionStore::CreateMany, admitted
  // with the plan's bytes each, same config). They are released at the end
  // of their choice (reason oneshot, cancelled when the call was), or at
  // once if Submit fails. After choice 0's prefill the engine deep-copies
  // its whole state (attention state of every mode, history, held-back
  // bytes) into each fork; choice i then samples with the sampler's seed + i
  // (choice 0 exactly as an n = 1 request), its own detokenizer and stop
  // hold-back, and every live choice decodes in the same batched step.
  // Cancel, the deadline or a release of any of the sessions ends every
  // choice. INTERNAL when forks.size() != request.n - 1; INVALID_ARGUMENT
  // when request.n > options.max_batch (the choices could not share a step).
  absl::StatusOr<std::shared_ptr<Job>> Submit(SessionStore::Lease lease,
                                              std::vector<SessionStore::Lease> forks,
                                              GenerationRequest request, const RequestPlan& plan);
  // For callers without a front end (tests, benchmarks, tools): plans the
  // request on the leased session against the engine's own limits
  // (max_tokens and the session's positions up to max_context()), then
  // Submit(lease, request, plan). INVALID_ARGUMENT from PlanRequest.
  absl::StatusOr<std::shared_ptr<Job>> Submit(SessionStore::Lease lease,
                                              GenerationRequest request);

  // Cancels every job (finish reason cancelled) and stops the thread.
  // Idempotent.
  void Shutdown();

  // Positions a session may hold.
  size_t max_context() const { return max_context_; }
  const model::Transformer& model() const { return model_; }

  // ---- gauges (any thread) ----
  size_t active_jobs() const { return active_.load(std::memory_order_relaxed); }
  size_t queued_jobs() const { return queued_.load(std::memory_order_relaxed); }
  size_t last_batch() const { return last_batch_.load(std::memory_order_relaxed); }
  // Jobs of `priority` (their own level, not the aged one) submitted and
  // not yet done absorbing their prompt: the waiting queue.
  size_t waiting_jobs(Priority priority) const {
    return waiting_[static_cast<size_t>(priority)].load(std::memory_order_relaxed);
  }
  // Rows of the last step: decode rows + prefill chunk rows (<= about
  // step_tokens(): see the class comment). Both gauges read 0 while idle.
  size_t last_step_tokens() const { return last_step_tokens_.load(std::memory_order_relaxed); }
  size_t step_tokens() const { return options_.step_tokens; }
  uint64_t steps() const { return steps_.load(std::memory_order_relaxed); }

 private:
  friend class Job;
  void Loop();
  void Wake();
  bool Admit(Job& job);                    // prepares a new job; false: finished at once
  // Admission's step for a reuse_prefix job: rolls the session back to what
  // the plan keeps (or starts it over) and appends the rest of the
  // conversation; the prompt tokens not prefilled are its cached_tokens.
  void AdmitReuse(Job& job);
  void JoinTenant(Job& job);
  void LeaveTenant(Job& job);
  // The job's level plus one per aging_steps steps since `since` (an
  // engine step), capped at kHigh: from admission for the prefill chunks,
  // from its last decode row for the decode rows past max_batch.
  size_t AgedPriority(const Job& job, uint64_t since) const;
  double Vtime(const Job& job) const;
  // The job no longer waits for its prompt (counted in waiting_ no more).
  void DoneWaiting(Job& job);
  // Picks the step's rows (decode rows, then whole chunks) into step_.
  void PlanStep();
  // Runs step_ as one Transformer::Step and hands out its logits.
  struct StepRows {
    size_t decode = 0, prefill = 0;
  };
  StepRows RunStep();
  // After the last chunk of the job's prompt: O(1) seals, forks, the first
  // token of every choice from `logits`.
  void PromptDone(Job& job, const float* logits);
  // After the prompt: deep-copies choice 0's state into every fork and
  // gives each its sampler (seed + i) and detokenizer.
  void ForkChoices(Job& job);
  // Samples choice `c` from logits, pushes the event, decides its finish.
  void OnLogits(Job& job, size_t c, const float* logits);
  // Choice `c` ended with `reason`: a fork's session is released now.
  void EndChoice(Job& job, size_t c, FinishReason reason);
  // Ends every choice still running with `reason`, then the job.
  void FinishJob(Job& job, FinishReason reason, absl::Status status);
  // A detokenizer continuing `session`'s held-back bytes.
  std::unique_ptr<tokenizer::IncrementalDetokenizer> NewDetokenizer(const Session& session) const;
  // The ids a request masks under its min_tokens (Job::min_tokens_masked_).
  std::vector<int32_t> MinTokensMask(const GenerationRequest& request) const;

  const model::Transformer& model_;
  const tokenizer::Tokenizer& tokenizer_;
  const EngineOptions options_;
  size_t max_context_;
  std::vector<int32_t> eos_ids_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> submitted_;
  bool stop_ = false;
  bool wake_ = false;

  // engine thread only
  std::vector<std::shared_ptr<Job>> jobs_;
  uint64_t next_serial_ = 0;
  std::unordered_map<std::string, TenantShare> tenants_;
  // One row source of the step being run: a decode row (a choice of a job)
  // or a chunk of a job's prompt; segments_ is the same, for the model.
  struct StepPart {
    Job* job;
    size_t choice;  // decode rows
    size_t start;   // chunks: its first token in the job's pending_
    size_t tokens;  // chunks: its length
    bool decode;
    bool last;      // chunks: the prompt's last
  };
  std::vector<StepPart> step_;
  std::vector<model::StepSegment> segments_;
  std::vector<Job*> order_;                // candidates, sorted (reused)
  model::ForwardScratch scratch_;
  std::vector<float> logits_;              // [rows wanting logits × vocab], grown

  std::atomic<size_t> active_{0}, queued_{0}, last_batch_{0}, last_step_tokens_{0};
  std::atomic<size_t> waiting_[kNumPriorities] = {};
  std::atomic<uint64_t> steps_{0};
  std::thread thread_;
};

}  // namespace cortiq::session
