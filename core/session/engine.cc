#include "core/session/engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/session/session_persister.h"
#include "spdlog/spdlog.h"

namespace cortiq::session {

std::string_view FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone: return "none";
    case FinishReason::kLength: return "length";
    case FinishReason::kStop: return "stop";
    case FinishReason::kEos: return "eos";
    case FinishReason::kCancelled: return "cancelled";
  }
  return "unknown";
}

namespace {


// Length of the longest suffix of `text` that is a proper prefix of one of
// the stop strings: that much text must be held back, it may still become a
// stop sequence.
size_t HeldSuffix(std::string_view text, const std::vector<std::string>& stops) {
  size_t best = 0;
  for (const std::string& stop : stops) {
    const size_t max_k = std::min(text.size(), stop.size() - 1);
    for (size_t k = max_k; k > best; --k) {
      if (text.substr(text.size() - k) == std::string_view(stop).substr(0, k)) {
        best = k;
        break;
      }
    }
  }
  return best;
}

// Engine::Submit's programmer invariant: `plan` is PlanRequest's for this
// request on this session as leased.
absl::Status CheckPlanIsTheRequests(const Session& s, const GenerationRequest& r,
                                    const RequestPlan& plan) {
  const size_t kept = plan.reuse.has_value() ? plan.reuse->kept : 0;
  const bool reuse_ok =
      r.reuse_prefix ? plan.reuse.has_value() && *plan.reuse == s.PlanReuse(r.prompt)
                     : !plan.reuse.has_value();
  const size_t history = r.reuse_prefix ? kept : s.tokens().size();
  if (reuse_ok && kept <= r.prompt.size() && plan.prompt == r.prompt.size() - kept &&
      plan.max_tokens == r.max_tokens && plan.history == history &&
      plan.total == plan.history + plan.prompt + plan.max_tokens) {
    return absl::OkStatus();
  }
  return absl::InternalError(absl::StrCat(
      "Submit: the plan (", plan.history, " + ", plan.prompt, " + ", plan.max_tokens,
      " positions", plan.reuse.has_value() ? ", reusing a prefix" : "",
      ") is not this request's (", s.tokens().size(), " + ", r.prompt.size(), " + ",
      r.max_tokens, r.reuse_prefix ? ", reuse_prefix" : "", ")"));
}

}  // namespace

// ---------------------------------------------------------------------------
// Job

Job::Job(Engine* engine, SessionStore::Lease lease, std::vector<SessionStore::Lease> forks,
         GenerationRequest request, size_t positions)
    : engine_(engine),
      lease_(std::move(lease)),
      ending_(lease_.ending()),
      session_id_(lease_->id()),
      request_(std::move(request)),
      positions_(positions) {
  choices_.resize(forks.size() + 1);
  choices_[0].session = lease_.get();
  for (size_t c = 1; c < choices_.size(); ++c) {
    choices_[c].fork = std::move(forks[c - 1]);
    choices_[c].session = choices_[c].fork.get();
  }
}

size_t Job::LiveChoices() const {
  return static_cast<size_t>(std::count_if(choices_.begin(), choices_.end(), [](const Choice& c) {
    return c.finish == FinishReason::kNone;
  }));
}

bool Job::Pop(GenerationEvent* event) {
  bool was_full;
  {
    std::unique_lock lock(mu_);
    if (queue_.empty()) return false;
    was_full = queue_.size() >= engine_->options_.queue_capacity;
    *event = std::move(queue_.front());
    queue_.pop_front();
    if (finished_) was_full = false;  // the engine no longer schedules this job
  }
  if (was_full) engine_->Wake();
  return true;
}

bool Job::WaitPop(GenerationEvent* event) {
  {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return !queue_.empty() || finished_; });
    if (queue_.empty()) return false;
  }
  return Pop(event);
}

bool Job::Drained() const {
  std::unique_lock lock(mu_);
  return finished_ && queue_.empty();
}

bool Job::finished() const {
  std::unique_lock lock(mu_);
  return finished_;
}

const GenerationResult& Job::result() const { return result_; }

void Job::Cancel() {
  if (!cancelled_.exchange(true)) {
    ending_.Mark();
    std::unique_lock lock(mu_);
    if (!finished_) {
      lock.unlock();
      engine_->Wake();
    }
  }
}

void Job::SetNotify(std::function<void()> notify) {
  std::unique_lock lock(mu_);
  notify_ = std::move(notify);
}

void Job::ClearNotify() {
  std::unique_lock lock(mu_);
  notify_cv_.wait(lock, [&] { return notify_running_ == 0; });
  notify_ = nullptr;
}

void Job::Notify() {
  {
    std::unique_lock lock(mu_);
    if (!notify_) return;
    ++notify_running_;
  }
  notify_();
  {
    std::unique_lock lock(mu_);
    if (--notify_running_ == 0) notify_cv_.notify_all();
  }
}

bool Job::QueueHasRoom() const {
  std::unique_lock lock(mu_);
  return queue_.size() < engine_->options_.queue_capacity;
}

void Job::Push(GenerationEvent event) {
  {
    std::unique_lock lock(mu_);
    queue_.push_back(std::move(event));
  }
  cv_.notify_all();
  Notify();
}

void Job::Finish(FinishReason reason, absl::Status status) {
  {
    std::unique_lock lock(mu_);
    result_.finish_reason = reason;
    result_.status = std::move(status);
    finished_ = true;
  }
  cv_.notify_all();
  Notify();
}

// ---------------------------------------------------------------------------
// Engine

Engine::Engine(const model::Transformer& model, const tokenizer::Tokenizer& tokenizer,
               EngineOptions options)
    : model_(model), tokenizer_(tokenizer), options_(options) {
  const auto& cfg = model_.config();
  // Never past the model's positions: the forward refuses a row there, and
  // a refused step ends every job in it, not only the one that went too far.
  const auto model_positions = static_cast<size_t>(cfg.max_position_embeddings);
  max_context_ =
      options_.max_context > 0 ? std::min(options_.max_context, model_positions) : model_positions;
  if (options_.max_context > model_positions) {
    spdlog::warn("engine: --max-context {} is past the model's {} positions: {} used",
                 options_.max_context, model_positions, max_context_);
  }
  eos_ids_ = cfg.eos_token_ids;
  for (auto id : {tokenizer_.endoftext_id(), tokenizer_.im_end_id()}) {
    if (id && std::find(eos_ids_.begin(), eos_ids_.end(), *id) == eos_ids_.end()) {
      eos_ids_.push_back(*id);
    }
  }
  // Room for a step of max_batch decode rows and as many prompt ends; a
  // step with more prompt ends grows it once.
  logits_.resize(2 * std::max<size_t>(options_.max_batch, 1) *
                 static_cast<size_t>(cfg.vocab_size));
  step_.reserve(options_.max_batch + 64);
  segments_.reserve(options_.max_batch + 64);
  thread_ = std::thread([this] { Loop(); });
}

Engine::~Engine() { Shutdown(); }

void Engine::Shutdown() {
  {
    std::unique_lock lock(mu_);
    if (stop_) {
      // Already stopping: just wait for the thread below.
    }
    stop_ = true;
    wake_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Engine::Wake() {
  {
    std::unique_lock lock(mu_);
    wake_ = true;
  }
  cv_.notify_all();
}

absl::StatusOr<std::shared_ptr<Job>> Engine::Submit(SessionStore::Lease lease,
                                                    GenerationRequest request) {
  if (!lease) return absl::InvalidArgumentError("Submit: no session lease");
  const PlanLimits limits{
      .max_tokens = max_context_, .max_context = max_context_, .max_n = options_.max_batch};
  ExistingSession session{.history = lease->tokens().size(), .config = lease->config()};
  if (request.reuse_prefix) session.reuse = lease->PlanReuse(request.prompt);
  absl::StatusOr<RequestPlan> plan = PlanRequest(request, limits, model_.config(), session);
  if (!plan.ok()) return plan.status();
  return Submit(std::move(lease), std::move(request), *plan);
}

absl::StatusOr<std::shared_ptr<Job>> Engine::Submit(SessionStore::Lease lease,
                                                    GenerationRequest request,
                                                    const RequestPlan& plan) {
  return Submit(std::move(lease), {}, std::move(request), plan);
}

absl::StatusOr<std::shared_ptr<Job>> Engine::Submit(SessionStore::Lease lease,
                                                    std::vector<SessionStore::Lease> forks,
                                                    GenerationRequest request,
                                                    const RequestPlan& plan) {
  // The forks live for this call only: released whenever their lease
  // returns, from here on (a refused Submit included).
  for (SessionStore::Lease& f : forks) f.ReleaseOnReturn(ReleaseReason::kOneshot);
  if (!lease) return absl::InvalidArgumentError("Submit: no session lease");
  // A one-shot session too (its id never reached the client): FinishJob
  // sets the real reason when the job runs.
  if (request.release_at_end) lease.ReleaseOnReturn(ReleaseReason::kCancelled);
  if (forks.size() + 1 != std::max<size_t>(request.n, 1)) {
    return absl::InternalError(absl::StrCat("Submit: ", forks.size(), " forks for n = ",
                                            request.n, " (n - 1 expected)"));
  }
  if (request.n > std::max<size_t>(options_.max_batch, 1)) {
    return absl::InvalidArgumentError(absl::StrCat("n: ", request.n,
                                                   " choices cannot share a decode step of ",
                                                   options_.max_batch, " rows (--max-batch)"));
  }
  // Programmer invariants: the plan is this request's, on this session as
  // leased (the lease keeps its history still until the job ends).
  if (absl::Status st = CheckPlanIsTheRequests(*lease, request, plan); !st.ok()) return st;
  std::shared_ptr<Job> job(
      new Job(this, std::move(lease), std::move(forks), std::move(request), plan.total));
  job->reuse_ = plan.reuse;
  job->min_tokens_masked_ = MinTokensMask(job->request_);
  job->result_.choices.resize(job->choices_.size());
  job->submitted_ = Clock::now();
  // Past its deadline the job ends at the next step: a next call waits for it.
  job->lease_.EndsBy(job->request_.deadline);
  std::weak_ptr<Job> weak = job;
  auto cancel = [weak] {
    if (auto j = weak.lock()) j->Cancel();
  };
  job->lease_.SetCanceller(cancel);
  // Releasing a fork (an admin who found it in the list) ends the call too.
  for (size_t c = 1; c < job->choices_.size(); ++c) {
    job->choices_[c].fork.EndsBy(job->request_.deadline);
    job->choices_[c].fork.SetCanceller(cancel);
  }
  {
    std::unique_lock lock(mu_);
    if (stop_) return absl::UnavailableError("engine: shutting down");
    job->waiting_ = true;
    waiting_[static_cast<size_t>(job->request_.priority)].fetch_add(1, std::memory_order_relaxed);
    submitted_.push_back(job);
    queued_.store(submitted_.size(), std::memory_order_relaxed);
    wake_ = true;
  }
  cv_.notify_all();
  return job;
}

bool Engine::Admit(Job& job) {
  Session& s = *job.lease_;
  const GenerationRequest& r = job.request_;
  const absl::Status st =
      s.kv().position() > s.tokens().size()
          ? absl::InternalError("session: cache holds more positions than its history")
          : s.ChooseSampler(r.sampling, r.seed_given);
  if (!st.ok()) {
    FinishJob(job, FinishReason::kNone, st);
    return false;
  }
  if (job.reuse_.has_value()) {
    AdmitReuse(job);  // before the detokenizer: a rollback drops held-back bytes
  } else {
    s.AppendPrompt(r.prompt);
  }
  job.choices_[0].detok = NewDetokenizer(s);
  job.pending_.assign(s.tokens().begin() + static_cast<std::ptrdiff_t>(s.kv().position()),
                      s.tokens().end());
  // One reservation for the whole call (the plan's positions): no
  // reallocation while decoding.
  s.ReservePositions(job.positions_);
  s.PublishMemory();
  job.phase_ = Job::Phase::kPrefill;
  job.serial_ = next_serial_++;
  job.admitted_step_ = steps_.load(std::memory_order_relaxed);
  JoinTenant(job);
  return true;
}

double TenantWeight(const EngineOptions& options, std::string_view tenant) {
  for (const auto& [name, weight] : options.tenant_weights) {
    if (name == tenant) return weight;
  }
  return options.default_tenant_weight;
}

void Engine::JoinTenant(Job& job) {
  const std::string& name = job.lease_->tenant();
  auto [it, inserted] = tenants_.try_emplace(name);
  TenantShare& t = it->second;
  if (inserted) {
    t.name = name;
    t.weight = TenantWeight(options_, name);
    if (!(t.weight > 0)) t.weight = 1.0;
    // A tenant that becomes busy starts level with the busy ones: time
    // spent idle earns no credit.
    bool any = false;
    double least = 0;
    for (const auto& [n, other] : tenants_) {
      if (&other == &t) continue;
      least = any ? std::min(least, other.vtime) : other.vtime;
      any = true;
    }
    t.vtime = least;
  }
  ++t.jobs;
  job.tenant_ = &t;
}

void Engine::LeaveTenant(Job& job) {
  TenantShare* t = job.tenant_;
  if (t == nullptr) return;
  job.tenant_ = nullptr;
  if (--t->jobs == 0) tenants_.erase(t->name);
}

double Engine::Vtime(const Job& job) const {
  return job.tenant_ != nullptr ? job.tenant_->vtime : 0.0;
}

size_t Engine::AgedPriority(const Job& job, uint64_t since) const {
  const uint64_t waited = steps_.load(std::memory_order_relaxed) - since;
  const uint64_t aged = waited / std::max<size_t>(options_.aging_steps, 1);
  return static_cast<size_t>(
      std::min<uint64_t>(static_cast<uint64_t>(job.request_.priority) + aged, kNumPriorities - 1));
}

void Engine::DoneWaiting(Job& job) {
  if (!job.waiting_) return;
  job.waiting_ = false;
  waiting_[static_cast<size_t>(job.request_.priority)].fetch_sub(1, std::memory_order_relaxed);
}

std::unique_ptr<tokenizer::IncrementalDetokenizer> Engine::NewDetokenizer(
    const Session& session) const {
  auto d = std::make_unique<tokenizer::IncrementalDetokenizer>(tokenizer_);
  if (!d->RestorePending(session.detok_pending()).ok()) d->Reset();
  return d;
}

void Engine::ForkChoices(Job& job) {
  const Session& source = *job.lease_;
  for (size_t c = 1; c < job.choices_.size(); ++c) {
    Job::Choice& ch = job.choices_[c];
    Session& fork = *ch.session;
    // An explicit deep copy: the fork shares nothing mutable with choice 0.
    fork.CopyStateFrom(source);
    model::SamplingParams params = source.sampler()->params();
    params.seed += c;
    // The parameters were checked (the plan, and choice 0's sampler): a
    // failure here is a bug, reported as the job's error.
    if (absl::Status st = fork.ChooseSampler(params, /*seed_given=*/true); !st.ok()) {
      FinishJob(job, FinishReason::kNone, absl::InternalError(st.message()));
      return;
    }
    ch.detok = NewDetokenizer(fork);
    fork.ReservePositions(job.positions_);
    fork.PublishMemory();
  }
}

void Engine::EndChoice(Job& job, size_t c, FinishReason reason) {
  Job::Choice& ch = job.choices_[c];
  ch.finish = reason;
  if (!ch.fork) return;
  ch.fork.ReleaseOnReturn(reason == FinishReason::kCancelled ? ReleaseReason::kCancelled
                                                              : ReleaseReason::kOneshot);
  ch.fork.Return();
  ch.session = nullptr;
}

std::vector<int32_t> Engine::MinTokensMask(const GenerationRequest& request) const {
  if (request.min_tokens == 0) return {};
  std::vector<int32_t> ids = request.stop_token_ids;
  if (!request.ignore_eos) ids.insert(ids.end(), eos_ids_.begin(), eos_ids_.end());
  return ids;
}

void Engine::AdmitReuse(Job& job) {
  Session& s = *job.lease_;
  const PrefixReuse& reuse = *job.reuse_;
  s.RewindForReuse(reuse);
  s.AppendPrompt(std::span<const int32_t>(job.request_.prompt).subspan(reuse.kept));
  job.result_.cached_tokens = reuse.cached;
}

void Engine::FinishJob(Job& job, FinishReason reason, absl::Status status) {
  if (job.phase_ == Job::Phase::kDone) return;
  job.phase_ = Job::Phase::kDone;
  DoneWaiting(job);
  LeaveTenant(job);
  const auto now = Clock::now();
  GenerationResult& res = job.result_;
  Session& s = *job.lease_;
  Job::Choice& first = job.choices_[0];
  if (first.detok) s.KeepDetokPending(first.detok->pending_bytes());
  // Choices still running end with the job's reason; a fork's session goes.
  for (size_t c = 0; c < job.choices_.size(); ++c) {
    if (job.choices_[c].finish == FinishReason::kNone) {
      EndChoice(job, c, reason == FinishReason::kNone ? FinishReason::kCancelled : reason);
    }
    res.choices[c] = {job.choices_[c].finish, job.choices_[c].completion_tokens};
  }
  // A kept session holds, after the call, what its tokens need: the rows
  // reserved for max_tokens and not used are given back (the store's
  // reservation ends with the lease). A one-shot session is freed whole.
  if (job.request_.release_at_end) {
    s.PublishMemory();
  } else {
    s.ReleaseUnusedPositions();
  }
  res.prompt_tokens = job.request_.prompt.size();
  res.session_tokens = s.tokens().size();
  res.memory = s.Memory();
  res.total_seconds = Seconds(now - job.submitted_);
  res.finish_reason = reason;
  if (res.completion_tokens > 1) {
    const double dt = Seconds(job.last_token_ - job.first_token_);
    res.decode_tokens_per_second = dt > 0 ? (res.completion_tokens - 1) / dt : 0.0;
  }
  if (options_.observer) options_.observer->OnFinish(job.request_.frontend, reason, status, res);
  if (job.request_.release_at_end) {
    job.lease_.ReleaseOnReturn(reason == FinishReason::kCancelled || !status.ok()
                                   ? ReleaseReason::kCancelled
                                   : ReleaseReason::kOneshot);
  }
  // A kept session's file gets this call's record (prepared here, with the
  // lease: a copy of the new rows); the consumer learns the job is over
  // once it is written (under --persist-sync turn, on disk).
  // It is queued before the lease returns, so a release that the return
  // carries out deletes the file after this write, never before it.
  // A call past its deadline ends between steps, as a cancelled one does:
  // its state (a prompt absorbed, tokens sampled) is whole and is written.
  // A failed step may leave the layers partly extended: no record, and the
  // session is counted as unpersisted when it moved past its file.
  std::optional<SessionPersister::Pending> record;
  if (options_.persister != nullptr && !job.request_.release_at_end) {
    if (status.ok() || absl::IsDeadlineExceeded(status)) {
      record = options_.persister->Prepare(s);
    } else {
      options_.persister->CountUnpersisted(s, status);
    }
  }
  if (!record) {
    // The session is no longer the engine's: return the lease before the
    // consumer learns the job is over, so a next call on the session (or a
    // ReleaseSession waiting for it) proceeds at once.
    job.lease_.Return();
    job.Finish(reason, std::move(status));
    return;
  }
  // The job finishes once both the write is done and the lease returned.
  struct Ending {
    std::shared_ptr<Job> job;
    FinishReason reason;
    absl::Status status;
    std::atomic<int> left{2};
    void Arrive() {
      if (left.fetch_sub(1, std::memory_order_acq_rel) == 1) job->Finish(reason, std::move(status));
    }
  };
  auto ending = std::make_shared<Ending>();
  ending->job = job.shared_from_this();
  ending->reason = reason;
  ending->status = std::move(status);
  options_.persister->Submit(*std::move(record), [ending] { ending->Arrive(); });
  job.lease_.Return();
  ending->Arrive();
}

void Engine::OnLogits(Job& job, size_t c, const float* logits) {
  Job::Choice& ch = job.choices_[c];
  Session& s = *ch.session;
  const GenerationRequest& r = job.request_;
  const size_t vocab = static_cast<size_t>(model_.config().vocab_size);
  std::span<const float> row(logits, vocab);
  const bool under_min = ch.completion_tokens < r.min_tokens;
  const int32_t t =
      s.SampleNext(row, ch.completion_tokens,
                   under_min ? std::span<const int32_t>(job.min_tokens_masked_)
                             : std::span<const int32_t>());
  GenerationEvent ev;
  ev.index = static_cast<uint32_t>(c);
  ev.token_id = t;
  if (r.logprobs || r.top_logprobs > 0) {
    absl::StatusOr<model::Logprobs> lp =
        model::ComputeLogprobs(row, r.sampling.temperature, t, static_cast<int>(r.top_logprobs));
    if (lp.ok()) ev.logprobs = *std::move(lp);
  }
  ch.next_input = t;
  ++ch.completion_tokens;
  ++job.result_.completion_tokens;
  const auto now = Clock::now();
  if (job.result_.completion_tokens == 1) {
    job.first_token_ = now;
    job.result_.ttft_seconds = Seconds(now - job.submitted_);
    if (options_.observer) options_.observer->OnFirstToken(r.frontend, job.result_.ttft_seconds);
  } else if (ch.completion_tokens > 1 && options_.observer) {
    options_.observer->OnInterToken(r.frontend, Seconds(now - ch.last_token));
  }
  ch.last_token = now;
  job.last_token_ = now;

  // A stop id ends the choice like EOS does (its text is not streamed), with
  // finish reason stop.
  const bool stop_id =
      std::find(r.stop_token_ids.begin(), r.stop_token_ids.end(), t) != r.stop_token_ids.end();
  const bool eos = !stop_id && !r.ignore_eos &&
                   std::find(eos_ids_.begin(), eos_ids_.end(), t) != eos_ids_.end();
  ev.end_token = eos || stop_id;
  if (!eos && !stop_id) ch.held += ch.detok->Push(t);
  FinishReason finish = FinishReason::kNone;
  size_t stop_at = std::string::npos;
  for (const std::string& stop : r.stop) {
    stop_at = std::min(stop_at, ch.held.find(stop));
  }
  if (stop_at != std::string::npos) {
    ev.text = ch.held.substr(0, stop_at);
    ch.held.clear();
    finish = FinishReason::kStop;
  } else if (eos || stop_id || ch.completion_tokens >= r.max_tokens) {
    ev.text = std::move(ch.held);
    ch.held.clear();
    // A session that ends with this call (a one-shot session, a fork)
    // flushes a cut character (as U+FFFD); a kept one keeps the bytes for
    // its next call.
    if (r.release_at_end || c > 0) ev.text += ch.detok->Flush();
    finish = stop_id ? FinishReason::kStop : eos ? FinishReason::kEos : FinishReason::kLength;
  } else {
    const size_t keep = HeldSuffix(ch.held, r.stop);
    ev.text = ch.held.substr(0, ch.held.size() - keep);
    ch.held.erase(0, ch.held.size() - keep);
  }
  s.PublishMemory();
  job.Push(std::move(ev));
  if (finish == FinishReason::kNone) {
    job.phase_ = Job::Phase::kDecode;
    return;
  }
  EndChoice(job, c, finish);
  if (job.LiveChoices() == 0) FinishJob(job, job.choices_[0].finish, absl::OkStatus());
}

void Engine::PromptDone(Job& job, const float* logits) {
  DoneWaiting(job);
  // Its first token comes from these logits: it decoded in this step (the
  // decode rows age from here).
  job.decoded_step_ = steps_.load(std::memory_order_relaxed);
  // The prompt is absorbed: O(1) layers seal now (their exact rows are freed).
  model_.SealO1(job.lease_.sequence());
  // Every choice samples its first token from these logits; the forks first
  // receive choice 0's state as it stands now.
  if (job.choices_.size() > 1) {
    ForkChoices(job);
    if (job.phase_ == Job::Phase::kDone) return;
  }
  for (size_t c = 0; c < job.choices_.size(); ++c) OnLogits(job, c, logits);
}

void Engine::PlanStep() {
  step_.clear();
  const size_t budget = std::max<size_t>(options_.step_tokens, 1);
  const size_t chunk = std::max<size_t>(options_.prefill_chunk, 1);
  size_t rows = 0;
  // Decode rows: every running job with room in its event queue, all of a
  // job's live choices together; past max_batch, by priority aged since the
  // job last decoded (AgedPriority: a lower level still advances while
  // higher ones fill the batch), then tenant share, then the job that
  // decoded least recently (a round robin among equals).
  order_.clear();
  size_t wanted = 0;
  for (auto& j : jobs_) {
    if (j->phase_ == Job::Phase::kDecode && j->QueueHasRoom()) {
      order_.push_back(j.get());
      wanted += j->LiveChoices();
    }
  }
  if (wanted > options_.max_batch) {
    std::sort(order_.begin(), order_.end(), [&](const Job* a, const Job* b) {
      const size_t pa = AgedPriority(*a, a->decoded_step_), pb = AgedPriority(*b, b->decoded_step_);
      if (pa != pb) return pa > pb;
      if (Vtime(*a) != Vtime(*b)) return Vtime(*a) < Vtime(*b);
      if (a->decoded_step_ != b->decoded_step_) return a->decoded_step_ < b->decoded_step_;
      return a->serial_ < b->serial_;
    });
  }
  const uint64_t step = steps_.load(std::memory_order_relaxed);
  for (Job* j : order_) {
    const size_t live = j->LiveChoices();
    if (rows + live > options_.max_batch) continue;
    j->decoded_step_ = step;
    for (size_t c = 0; c < j->choices_.size(); ++c) {
      if (j->choices_[c].finish == FinishReason::kNone) step_.push_back({j, c, 0, 1, true, false});
    }
    rows += live;
  }
  // Chunks: waiting jobs by effective priority, tenant share, arrival; whole
  // chunks while they fit (the step's first chunk always runs); a job that
  // does not fit ends the filling (no lower job runs ahead of it). At most
  // max_batch prompts end in one step (their logits' room).
  order_.clear();
  for (auto& j : jobs_) {
    if (j->phase_ == Job::Phase::kPrefill) order_.push_back(j.get());
  }
  std::sort(order_.begin(), order_.end(), [&](const Job* a, const Job* b) {
    const size_t pa = AgedPriority(*a, a->admitted_step_), pb = AgedPriority(*b, b->admitted_step_);
    if (pa != pb) return pa > pb;
    const double va = Vtime(*a), vb = Vtime(*b);
    if (va != vb) return va < vb;
    return a->serial_ < b->serial_;
  });
  bool any_chunk = false;
  size_t ends = 0;
  for (Job* j : order_) {
    size_t at = j->prefill_done_;
    const size_t total = j->pending_.size();
    bool full = false;
    while (at < total) {
      const size_t n = std::min(chunk, total - at);
      const bool last = at + n == total;
      if (any_chunk && (rows + n > budget || (last && ends >= options_.max_batch))) {
        full = true;
        break;
      }
      step_.push_back({j, 0, at, n, false, last});
      rows += n;
      at += n;
      any_chunk = true;
      ends += last;
    }
    if (full) break;
  }
}

Engine::StepRows Engine::RunStep() {
  segments_.clear();
  size_t with_logits = 0;
  StepRows rows;
  const auto now = Clock::now();
  for (StepPart& p : step_) {
    Job& j = *p.job;
    model::StepSegment g;
    if (p.decode) {
      Job::Choice& ch = j.choices_[p.choice];
      g.kv = p.choice == 0 ? &j.lease_.sequence() : &ch.fork.sequence();
      g.tokens = std::span<const int32_t>(&ch.next_input, 1);
      g.decode = true;
      g.logits = true;
      ++rows.decode;
    } else {
      if (p.start == 0) {  // the prompt's first chunk
        j.first_chunk_ = now;
        j.result_.queue_seconds = Seconds(now - j.submitted_);
        if (options_.observer) {
          options_.observer->OnQueueWait(j.request_.frontend, j.request_.priority,
                                         j.result_.queue_seconds);
        }
      }
      g.kv = &j.lease_.sequence();
      g.tokens = std::span<const int32_t>(j.pending_.data() + p.start, p.tokens);
      g.decode = false;
      g.logits = p.last;
      rows.prefill += p.tokens;
    }
    with_logits += g.logits;
    if (TenantShare* t = j.tenant_) (p.decode ? t->step_decode : t->step_prefill) += p.tokens;
    segments_.push_back(g);
  }
  const size_t vocab = static_cast<size_t>(model_.config().vocab_size);
  if (logits_.size() < with_logits * vocab) logits_.resize(with_logits * vocab);
  const absl::Status st = model_.Step(segments_, scratch_, logits_.data());
  // Tenants' shares: the rows each was served. A busy tenant served
  // nothing in a step that served others (its streams paused on full
  // queues, its work of a lower level) earns no credit for it: its virtual
  // time is kept level with the least of the served ones' as the step began
  // (it used to stay behind and bank the difference, then take it back as
  // a burst ahead of everyone).
  double clock = std::numeric_limits<double>::infinity();
  for (auto& [name, t] : tenants_) {
    if (t.step_decode + t.step_prefill == 0) continue;
    clock = std::min(clock, t.vtime);
    t.vtime += double(t.step_decode + t.step_prefill) / t.weight;
    if (options_.observer) options_.observer->OnTenantStep(name, t.step_decode, t.step_prefill);
    t.step_decode = t.step_prefill = 0;
  }
  if (clock != std::numeric_limits<double>::infinity()) {
    for (auto& [name, t] : tenants_) {
      if (t.vtime < clock) t.vtime = clock;  // (the served ones are past it)
    }
  }
  last_batch_.store(rows.decode, std::memory_order_relaxed);
  last_step_tokens_.store(rows.decode + rows.prefill, std::memory_order_relaxed);
  if (!st.ok()) {
    // Every sequence of the step may be partly extended: each job ends.
    spdlog::error("engine: a step of {} decode rows and {} prompt tokens failed: {}", rows.decode,
                  rows.prefill, st.ToString());
    for (StepPart& p : step_) FinishJob(*p.job, FinishReason::kNone, st);
    return rows;
  }
  size_t k = 0;
  for (StepPart& p : step_) {
    Job& j = *p.job;
    const float* row = nullptr;
    if (p.decode || p.last) row = logits_.data() + (k++) * vocab;
    if (j.phase_ == Job::Phase::kDone) continue;  // an earlier row ended it
    if (p.decode) {
      OnLogits(j, p.choice, row);
      continue;
    }
    j.prefill_done_ += p.tokens;
    if (p.last) {
      PromptDone(j, row);
    } else if (&p == &step_.back() || (&p + 1)->job != &j) {
      j.lease_->PublishMemory();  // the job's last chunk of this step
    }
  }
  return rows;
}

void Engine::Loop() {
  for (;;) {
    std::deque<std::shared_ptr<Job>> incoming;
    bool stop;
    {
      std::unique_lock lock(mu_);
      stop = stop_;
      incoming.swap(submitted_);
      queued_.store(0, std::memory_order_relaxed);
      wake_ = false;
    }
    for (auto& j : incoming) {
      if (stop || j->cancelled_.load()) {
        j->phase_ = Job::Phase::kPrefill;
        FinishJob(*j, FinishReason::kCancelled, absl::OkStatus());
      } else if (Clock::now() >= j->request_.deadline) {
        // Past its deadline before it began: not admitted, so its session
        // is as it was (admission appends the prompt, reserves its
        // positions and, reusing a prefix, cuts the history back).
        j->phase_ = Job::Phase::kPrefill;
        FinishJob(*j, FinishReason::kCancelled,
                  absl::DeadlineExceededError("deadline exceeded before the generation began"));
      } else if (Admit(*j)) {
        jobs_.push_back(std::move(j));
      }
    }
    const auto now = Clock::now();
    for (auto& j : jobs_) {
      if (stop || j->cancelled_.load()) {
        FinishJob(*j, FinishReason::kCancelled, absl::OkStatus());
      } else if (now >= j->request_.deadline) {
        FinishJob(*j, FinishReason::kCancelled,
                  absl::DeadlineExceededError("deadline exceeded before the generation finished"));
      }
    }
    std::erase_if(jobs_, [](const auto& j) { return j->phase_ == Job::Phase::kDone; });
    active_.store(jobs_.size(), std::memory_order_relaxed);
    if (stop) break;

    PlanStep();
    if (step_.empty()) {
      // Idle: the last-step gauges read 0, not the last busy step's rows.
      last_batch_.store(0, std::memory_order_relaxed);
      last_step_tokens_.store(0, std::memory_order_relaxed);
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return wake_ || stop_; });
      continue;
    }
    const auto t0 = Clock::now();
    const StepRows rows = RunStep();
    steps_.fetch_add(1, std::memory_order_relaxed);
    if (options_.observer) {
      options_.observer->OnStep(rows.decode, rows.prefill, Seconds(Clock::now() - t0));
    }
  }
  jobs_.clear();
  active_.store(0, std::memory_order_relaxed);
}

}  // namespace cortiq::session
