#include "tools/bench_server/scheduler_bench.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <stop_token>
#include <thread>

#include "core/math/kernels.h"
#include "core/model/model_files.h"
#include "core/model/transformer.h"
#include "core/session/session_store.h"
#include "core/tokenizer/tokenizer.h"
#include "core/util/thread_pool.h"

namespace cortiq::tools {
namespace {

using Clock = std::chrono::steady_clock;

using session::Seconds;
double Ms(Clock::duration d) { return Seconds(d) * 1e3; }

// The model, its tokenizer and a store, loaded once per scenario; each
// engine of the scenario runs on them (one engine at a time).
struct Bed {
  std::unique_ptr<util::ThreadPool> pool;
  std::unique_ptr<model::Transformer> model;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  std::unique_ptr<session::SessionStore> store;
};

// As the server loads it (Server::Init): bf16 activations, the
// checkpoint's weights.
absl::StatusOr<Bed> LoadBed(const SchedulerBenchOptions& opt) {
  Bed bed;
  bed.pool = std::make_unique<util::ThreadPool>(opt.threads);
  model::LoadOptions load;
  load.pool = bed.pool.get();
  absl::StatusOr<std::unique_ptr<model::Transformer>> m =
      model::Transformer::Load(opt.model_dir, load);
  if (!m.ok()) return m.status();
  bed.model = *std::move(m);
  absl::StatusOr<model::ModelTokenizer> tok = model::LoadModelTokenizer(opt.model_dir);
  if (!tok.ok()) return tok.status();
  bed.tokenizer = std::make_unique<tokenizer::Tokenizer>(std::move(tok->tokenizer));
  bed.store = std::make_unique<session::SessionStore>(session::StoreOptions{});
  return bed;
}

void PrintBed(const Bed& bed, const SchedulerBenchOptions& opt) {
  std::printf("model %s; %zu math threads; kernels %s; engine in this process (no gRPC)\n",
              opt.model_dir.c_str(), bed.model->pool()->num_threads(),
              math::IsaName(math::ActiveIsa()));
}

// `n` token ids of the vocabulary, `salt` making prompts differ.
std::vector<int32_t> Prompt(size_t n, int64_t vocab, size_t salt) {
  std::vector<int32_t> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = int32_t((i * 7919 + 13 + salt * 104729) % size_t(vocab));
  return p;
}

session::GenerationRequest Greedy(std::vector<int32_t> prompt, size_t max_tokens) {
  session::GenerationRequest g;
  g.prompt = std::move(prompt);
  g.max_tokens = max_tokens;
  g.sampling.temperature = 0;
  g.ignore_eos = true;
  g.release_at_end = true;
  return g;
}

// One request as its client saw it.
struct RequestTrace {
  Clock::time_point submitted;
  std::vector<Clock::time_point> tokens;  // when each token was popped
  size_t prompt_tokens = 0;
  double queue_seconds = 0;  // GenerationResult: submit → first prefill chunk
  bool finished = false;     // the job ended and its result was read
};

// A client: one thread that submits `request` on a fresh one-shot session
// of `tenant`, up to `max_requests` times one after another with `gap`
// between, until Stop(). Its methods are called from one other thread.
class Client {
 public:
  Client(Bed& bed, session::Engine& engine, std::string tenant, session::GenerationRequest request,
         Clock::duration gap, size_t max_requests)
      : bed_(bed),
        engine_(engine),
        tenant_(std::move(tenant)),
        request_(std::move(request)),
        gap_(gap),
        max_requests_(max_requests),
        thread_([this](std::stop_token st) { Run(st); }) {}
  ~Client() { Stop(); }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // No new request; the running one is cancelled. Returns once the thread
  // has ended. Idempotent.
  void Stop() {
    thread_.request_stop();
    {
      std::lock_guard lock(mu_);
      if (job_) job_->Cancel();
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  // Blocks until the client has popped `n` tokens in all or has ended.
  void WaitTokens(size_t n) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return tokens_ >= n || done_; });
  }
  void WaitDone() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return done_; });
  }
  size_t tokens() const {
    std::lock_guard lock(mu_);
    return tokens_;
  }
  bool done() const {
    std::lock_guard lock(mu_);
    return done_;
  }
  const std::string& tenant() const { return tenant_; }
  // Valid once the client has ended (Stop, WaitDone).
  const std::vector<RequestTrace>& traces() const { return traces_; }
  const absl::Status& status() const { return status_; }

 private:
  void Run(std::stop_token st) {
    for (size_t i = 0; i < max_requests_ && !st.stop_requested(); ++i) {
      if (i > 0 && gap_ > Clock::duration::zero()) {
        std::unique_lock lock(mu_);
        cv_.wait_for(lock, st, gap_, [] { return false; });  // the gap, or until Stop
        if (st.stop_requested()) break;
      }
      if (!RunOne(st)) break;
    }
    std::lock_guard lock(mu_);
    done_ = true;
    job_.reset();
    cv_.notify_all();
  }
  // One request; false when it could not be submitted (status_ says why).
  bool RunOne(const std::stop_token& st) {
    absl::StatusOr<session::SessionStore::Lease> lease =
        bed_.store->Create(*bed_.model, {}, 0, tenant_);
    const Clock::time_point submitted = Clock::now();
    absl::StatusOr<std::shared_ptr<session::Job>> job =
        lease.ok() ? engine_.Submit(*std::move(lease), request_) : lease.status();
    if (!job.ok()) {
      std::lock_guard lock(mu_);
      status_ = job.status();
      return false;
    }
    {
      std::lock_guard lock(mu_);
      traces_.push_back(
          {.submitted = submitted, .tokens = {}, .prompt_tokens = request_.prompt.size()});
      job_ = *job;
      if (st.stop_requested()) job_->Cancel();
    }
    session::GenerationEvent ev;
    while ((*job)->WaitPop(&ev)) {
      const auto now = Clock::now();
      std::lock_guard lock(mu_);
      traces_.back().tokens.push_back(now);
      ++tokens_;
      cv_.notify_all();
    }
    const session::GenerationResult& r = (*job)->result();
    std::lock_guard lock(mu_);
    traces_.back().queue_seconds = r.queue_seconds;
    traces_.back().finished = true;
    if (!r.status.ok() && status_.ok()) status_ = r.status;
    job_.reset();
    return true;
  }

  Bed& bed_;
  session::Engine& engine_;
  const std::string tenant_;
  const session::GenerationRequest request_;
  const Clock::duration gap_;
  const size_t max_requests_;

  mutable std::mutex mu_;
  std::condition_variable_any cv_;
  std::shared_ptr<session::Job> job_;  // the running request's
  std::vector<RequestTrace> traces_;
  size_t tokens_ = 0;
  bool done_ = false;
  absl::Status status_;
  std::jthread thread_;  // last: it starts once every member above exists
};

using Clients = std::vector<std::unique_ptr<Client>>;

void WaitEachTokens(const Clients& clients, const std::vector<size_t>& at_least) {
  for (size_t i = 0; i < clients.size(); ++i) clients[i]->WaitTokens(at_least[i]);
}

std::vector<size_t> TokensPlus(const Clients& clients, size_t more) {
  std::vector<size_t> n;
  for (const auto& c : clients) n.push_back(c->tokens() + more);
  return n;
}

void StopAll(Clients& clients) {
  for (auto& c : clients) c->Stop();
}

// The first failure among the clients (a job's error), or OK.
absl::Status FirstError(const Clients& clients) {
  for (const auto& c : clients) {
    if (!c->status().ok()) return c->status();
  }
  return absl::OkStatus();
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
  return 1;
}

// ---------------------------------------------------------------------------
// The engine's steps, as its observer sees them.

class StepLog : public session::EngineObserver {
 public:
  struct Step {
    Clock::time_point end;
    size_t decode_rows = 0, prefill_tokens = 0;
    double seconds = 0;
  };
  StepLog() { steps_.reserve(1 << 16); }
  void OnStep(size_t decode_batch, size_t prefill_tokens, double seconds) override {
    std::lock_guard lock(mu_);
    steps_.push_back({Clock::now(), decode_batch, prefill_tokens, seconds});
  }
  // After the engine has shut down.
  std::vector<Step> steps() const {
    std::lock_guard lock(mu_);
    return steps_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<Step> steps_;
};

struct Window {
  Clock::time_point begin, end;
  bool Overlaps(Clock::time_point a, Clock::time_point b) const { return a < end && b > begin; }
};

// ---------------------------------------------------------------------------
// --long-prompt

struct LongPromptRow {
  size_t step_tokens = 0;
  std::vector<double> ttft_ms;                  // the long prompt's, per round
  std::vector<double> itl_during, itl_outside;  // ms, every decoder's gaps
  double mixed_step_ms = 0, mixed_rows = 0;     // mean over the windows' steps with both kinds
  size_t mixed_steps = 0, max_rows = 0;         // ... and the most rows a window's step held
};

absl::StatusOr<LongPromptRow> RunLongPromptOnce(Bed& bed, const SchedulerBenchOptions& opt,
                                                std::optional<size_t> step_tokens,
                                                size_t long_prompt) {
  StepLog log;
  session::EngineOptions eo = EngineOptionsFor(opt.flags, step_tokens);
  eo.observer = &log;
  session::Engine engine(*bed.model, *bed.tokenizer, eo);
  LongPromptRow row;
  row.step_tokens = eo.step_tokens;
  const int64_t vocab = bed.model->config().vocab_size;
  // Each step while the long prompt is absorbed takes at least one of its
  // chunks, so a decoder gets at most ceil(N / chunk) tokens per window,
  // plus the 8 waited for before and after each: enough to outlast the
  // rounds, no more (the caches are sized for it).
  constexpr size_t kSettle = 8;
  const size_t per_window = (long_prompt + eo.prefill_chunk - 1) / eo.prefill_chunk + 2 * kSettle;
  const size_t decoder_tokens =
      std::min(opt.rounds * per_window + 8 * kSettle, engine.max_context() - opt.prompt_tokens);

  Clients decoders;
  for (size_t i = 0; i < opt.streams; ++i) {
    decoders.push_back(std::make_unique<Client>(
        bed, engine, "", Greedy(Prompt(opt.prompt_tokens, vocab, i), decoder_tokens),
        Clock::duration::zero(), 1));
  }
  WaitEachTokens(decoders, std::vector<size_t>(opt.streams, 2));
  const Clock::time_point all_decoding = Clock::now();
  std::vector<Window> windows;
  for (size_t r = 0; r < opt.rounds; ++r) {
    WaitEachTokens(decoders, TokensPlus(decoders, kSettle));
    Client long_one(bed, engine, "", Greedy(Prompt(long_prompt, vocab, 1000 + r), 1),
                    Clock::duration::zero(), 1);
    long_one.WaitDone();
    if (!long_one.status().ok()) return long_one.status();
    const RequestTrace& t = long_one.traces().at(0);
    if (t.tokens.empty()) return absl::InternalError("the long prompt's job sent no token");
    windows.push_back({t.submitted, t.tokens[0]});
    row.ttft_ms.push_back(Ms(t.tokens[0] - t.submitted));
  }
  WaitEachTokens(decoders, TokensPlus(decoders, kSettle));
  const Clock::time_point end = Clock::now();
  bool ran_out = false;
  for (const auto& d : decoders) ran_out |= d->done();
  StopAll(decoders);
  engine.Shutdown();
  if (absl::Status s = FirstError(decoders); !s.ok()) return s;
  if (ran_out) {
    return absl::FailedPreconditionError(
        "--long-prompt: a decoder generated all of its " + std::to_string(decoder_tokens) +
        " tokens before the last window closed (sized for at least one chunk of the long "
        "prompt per step, within the model's context of " +
        std::to_string(engine.max_context()) + ")");
  }

  for (const auto& d : decoders) {
    const std::vector<Clock::time_point>& ts = d->traces().at(0).tokens;
    for (size_t i = 1; i < ts.size(); ++i) {
      if (ts[i - 1] < all_decoding || ts[i] > end) continue;
      const bool during = std::any_of(windows.begin(), windows.end(), [&](const Window& w) {
        return w.Overlaps(ts[i - 1], ts[i]);
      });
      (during ? row.itl_during : row.itl_outside).push_back(Ms(ts[i] - ts[i - 1]));
    }
  }
  double seconds = 0, rows = 0;
  for (const StepLog::Step& s : log.steps()) {
    const bool in_window = std::any_of(windows.begin(), windows.end(), [&](const Window& w) {
      return s.end > w.begin && s.end <= w.end;
    });
    if (!in_window || s.decode_rows == 0 || s.prefill_tokens == 0) continue;
    ++row.mixed_steps;
    seconds += s.seconds;
    rows += double(s.decode_rows + s.prefill_tokens);
    row.max_rows = std::max(row.max_rows, s.decode_rows + s.prefill_tokens);
  }
  if (row.mixed_steps > 0) {
    row.mixed_step_ms = 1e3 * seconds / double(row.mixed_steps);
    row.mixed_rows = rows / double(row.mixed_steps);
  }
  return row;
}

// ---------------------------------------------------------------------------
// --tenants

constexpr std::string_view kFlood = "flood", kLight = "light";

// What each tenant got over a window: tokens generated (popped in it) and
// prompt tokens absorbed (each request's prompt spread evenly over its
// first chunk → first token, the part inside the window counted).
struct Shares {
  double flood_generated = 0, light_generated = 0;
  double flood_prompt = 0, light_prompt = 0;
  static double Of(double mine, double other) {
    return mine + other > 0 ? 100.0 * mine / (mine + other) : 0;
  }
};

void AddShares(const Client& c, const Window& w, Shares& s) {
  const bool light = c.tenant() == kLight;
  double generated = 0, prompt = 0;
  for (const RequestTrace& t : c.traces()) {
    for (const Clock::time_point& at : t.tokens) generated += at > w.begin && at <= w.end ? 1 : 0;
    if (!t.finished || t.tokens.empty()) continue;
    const Clock::time_point a = t.submitted + std::chrono::duration_cast<Clock::duration>(
                                                  std::chrono::duration<double>(t.queue_seconds));
    const Clock::time_point b = t.tokens[0];
    const double span = Seconds(b - a);
    const double inside = Seconds(std::min(b, w.end) - std::max(a, w.begin));
    if (span <= 0) {
      prompt += b > w.begin && b <= w.end ? double(t.prompt_tokens) : 0;
    } else if (inside > 0) {
      prompt += double(t.prompt_tokens) * inside / span;
    }
  }
  (light ? s.light_generated : s.flood_generated) += generated;
  (light ? s.light_prompt : s.flood_prompt) += prompt;
}

Shares SharesOver(const Clients& clients, const Window& w) {
  Shares s;
  for (const auto& c : clients) AddShares(*c, w, s);
  return s;
}

std::vector<double> TtftMs(const Client& c) {
  std::vector<double> v;
  for (const RequestTrace& t : c.traces()) {
    if (!t.tokens.empty()) v.push_back(Ms(t.tokens[0] - t.submitted));
  }
  return v;
}

std::vector<double> DurationsMs(const Client& c) {
  std::vector<double> v;
  for (const RequestTrace& t : c.traces()) {
    if (!t.tokens.empty()) v.push_back(Ms(t.tokens.back() - t.submitted));
  }
  return v;
}

void PrintSharesRow(const char* phase, double ttft_ms, double alone_ms, const Shares& s) {
  std::printf("| %s | %.1f | %.2fx | %.1f / %.1f | %.1f / %.1f |\n", phase, ttft_ms,
              ttft_ms / alone_ms, Shares::Of(s.flood_generated, s.light_generated),
              Shares::Of(s.light_generated, s.flood_generated),
              Shares::Of(s.flood_prompt, s.light_prompt),
              Shares::Of(s.light_prompt, s.flood_prompt));
}

}  // namespace

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, size_t(p * double(v.size() - 1) + 0.5));
  return v[i];
}

session::EngineOptions EngineOptionsFor(const SchedulerFlags& flags,
                                        std::optional<size_t> step_tokens) {
  session::EngineOptions eo;
  eo.max_batch = flags.max_batch;
  if (step_tokens) eo.step_tokens = *step_tokens;
  if (flags.prefill_chunk) eo.prefill_chunk = *flags.prefill_chunk;
  if (flags.aging_steps) eo.aging_steps = *flags.aging_steps;
  if (flags.tenant_weights) eo.tenant_weights = *flags.tenant_weights;
  return eo;
}

int RunLongPromptBench(const SchedulerBenchOptions& opt, size_t long_prompt) {
  absl::StatusOr<Bed> bed = LoadBed(opt);
  if (!bed.ok()) return Fail(bed.status());
  const size_t context = size_t(bed->model->config().max_position_embeddings);
  if (long_prompt + 1 > context) {
    return Fail(absl::InvalidArgumentError("--long-prompt " + std::to_string(long_prompt) +
                                           " is beyond the model's context of " +
                                           std::to_string(context)));
  }
  PrintBed(*bed, opt);
  std::vector<std::optional<size_t>> budgets(opt.flags.step_tokens.begin(),
                                             opt.flags.step_tokens.end());
  if (budgets.empty()) budgets.push_back(std::nullopt);
  std::vector<LongPromptRow> rows;
  for (std::optional<size_t> budget : budgets) {
    absl::StatusOr<LongPromptRow> row = RunLongPromptOnce(*bed, opt, budget, long_prompt);
    if (!row.ok()) return Fail(row.status());
    rows.push_back(*std::move(row));
  }
  const session::EngineOptions eo = EngineOptionsFor(opt.flags, std::nullopt);
  std::printf(
      "\n%zu streams decoding (%zu-token prompts, greedy); then one %zu-token prompt arrives, "
      "%zu times per step budget.\nprefill chunk %zu, max batch %zu. ITL: gaps between a "
      "stream's consecutive tokens, 'during' when the gap overlaps [long submit, long first "
      "token].\n\n",
      opt.streams, opt.prompt_tokens, long_prompt, opt.rounds, eo.prefill_chunk, eo.max_batch);
  std::printf(
      "| step tokens | long prompt TTFT ms (p50) | ITL during p50 / p99 ms | ITL outside p50 / "
      "p99 ms | mixed step ms (mean rows, max rows) | ITL p99 during / mixed step |\n"
      "|---:|---:|---:|---:|---:|---:|\n");
  for (const LongPromptRow& r : rows) {
    const double p99 = Percentile(r.itl_during, 0.99);
    std::printf("| %zu | %.1f | %.1f / %.1f | %.1f / %.1f | %.1f (%.0f, %zu) | %s |\n",
                r.step_tokens, Percentile(r.ttft_ms, 0.5), Percentile(r.itl_during, 0.5), p99,
                Percentile(r.itl_outside, 0.5), Percentile(r.itl_outside, 0.99), r.mixed_step_ms,
                r.mixed_rows, r.max_rows,
                r.mixed_steps > 0
                    ? (std::to_string(p99 / r.mixed_step_ms).substr(0, 4) + "x").c_str()
                    : "no mixed step");
  }
  for (const LongPromptRow& r : rows) {
    // The engine's bound on a step (Engine, step 2b): the first chunk of a
    // step always runs.
    const size_t bound = std::max(r.step_tokens, opt.streams + eo.prefill_chunk);
    std::printf(
        "step tokens %zu: ITL p99 during the long prefill %.1f ms = %.2fx the mean mixed step "
        "(%.1f ms, %.0f rows; %zu steps); the largest step held %zu rows: %s max(step tokens, "
        "decode rows + prefill chunk) = %zu\n",
        r.step_tokens, Percentile(r.itl_during, 0.99),
        r.mixed_step_ms > 0 ? Percentile(r.itl_during, 0.99) / r.mixed_step_ms : 0.0,
        r.mixed_step_ms, r.mixed_rows, r.mixed_steps, r.max_rows,
        r.max_rows <= bound ? "within" : "BEYOND", bound);
  }
  return 0;
}

int RunTenantsBench(const SchedulerBenchOptions& opt) {
  const TenantWeights weights =
      opt.flags.tenant_weights.value_or(TenantWeights{{"flood", 1.0}, {"light", 1.0}});
  for (const auto& [name, w] : weights) {
    if (name != kFlood && name != kLight) {
      return Fail(
          absl::InvalidArgumentError("--tenant-weights: the scenario's tenants are "
                                     "'flood' and 'light', not '" +
                                     name + "'"));
    }
  }
  absl::StatusOr<Bed> bed = LoadBed(opt);
  if (!bed.ok()) return Fail(bed.status());
  PrintBed(*bed, opt);
  SchedulerFlags flags = opt.flags;
  flags.tenant_weights = weights;
  const std::optional<size_t> budget =
      flags.step_tokens.empty() ? std::nullopt : std::optional(flags.step_tokens[0]);
  const session::EngineOptions eo = EngineOptionsFor(flags, budget);
  session::Engine engine(*bed->model, *bed->tokenizer, eo);
  const int64_t vocab = bed->model->config().vocab_size;
  const size_t light_requests = 4 * opt.rounds;
  auto request = [&](size_t salt) {
    return Greedy(Prompt(opt.prompt_tokens, vocab, salt), opt.max_tokens);
  };
  auto flood = [&](Clients& into, std::string_view tenant, size_t salt) {
    for (size_t i = 0; i < opt.streams; ++i) {
      into.push_back(std::make_unique<Client>(*bed, engine, std::string(tenant), request(salt + i),
                                              Clock::duration::zero(), size_t(-1)));
    }
  };

  // 1. The light tenant alone.
  Client alone(*bed, engine, std::string(kLight), request(0), Clock::duration::zero(),
               light_requests);
  alone.WaitDone();
  if (!alone.status().ok()) return Fail(alone.status());
  const double alone_ttft = Percentile(TtftMs(alone), 0.5);
  Shares alone_shares;
  AddShares(alone, {alone.traces().front().submitted, Clock::now()}, alone_shares);
  // Under the flood it sends a request, then waits as long as one takes alone.
  const auto gap = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double, std::milli>(Percentile(DurationsMs(alone), 0.5)));

  // 2. The flood, and the light tenant now and then.
  Clients flooded;
  flood(flooded, kFlood, 100);
  WaitEachTokens(flooded, std::vector<size_t>(opt.streams, 1));
  flooded.push_back(
      std::make_unique<Client>(*bed, engine, std::string(kLight), request(1), gap, light_requests));
  flooded.back()->WaitDone();
  const Client& light = *flooded.back();
  const Window under{light.traces().front().submitted, Clock::now()};
  StopAll(flooded);
  if (absl::Status s = FirstError(flooded); !s.ok()) return Fail(s);
  const double flood_ttft = Percentile(TtftMs(light), 0.5);
  const Shares flood_shares = SharesOver(flooded, under);

  // 3. Both tenants backlogged, as long as phase 2 ran and at least
  // kMinBacklogged: with a small model phase 2 can be a few steps long
  // (22 ms once, with the 4M-parameter model under a parallel test run),
  // a window in which the light tenant's prompts were by chance never
  // absorbed (0 % of the prompt tokens, a share of nothing).
  constexpr std::chrono::milliseconds kMinBacklogged{250};
  Clients both;
  flood(both, kFlood, 200);
  flood(both, kLight, 300);
  WaitEachTokens(both, std::vector<size_t>(both.size(), 1));
  const Clock::time_point b0 = Clock::now();
  std::this_thread::sleep_for(
      std::max<Clock::duration>(under.end - under.begin, kMinBacklogged));
  const Window backlogged{b0, Clock::now()};
  StopAll(both);
  engine.Shutdown();
  if (absl::Status s = FirstError(both); !s.ok()) return Fail(s);
  const Shares both_shares = SharesOver(both, backlogged);
  std::vector<double> both_light_ttft;
  for (const auto& c : both) {
    if (c->tenant() != kLight) continue;
    for (const RequestTrace& t : c->traces()) {
      if (!t.tokens.empty() && t.submitted >= b0)
        both_light_ttft.push_back(Ms(t.tokens[0] - t.submitted));
    }
  }

  const double wf = session::TenantWeight(eo, kFlood);
  const double wl = session::TenantWeight(eo, kLight);
  std::printf(
      "\ntenants: flood (%zu clients resubmitting at once, weight %g), light (weight %g: one "
      "client, %zu requests, a pause as long as one request between them).\nrequests: %zu-token "
      "prompt, %zu greedy tokens; step tokens %zu, prefill chunk %zu, max batch %zu.\n"
      "shares: %% of the tokens generated / prompt tokens absorbed in the phase's window "
      "(flood / light); the weights give light %.1f %%.\n\n",
      opt.streams, wf, wl, light_requests, opt.prompt_tokens, opt.max_tokens, eo.step_tokens,
      eo.prefill_chunk, eo.max_batch, 100.0 * wl / (wf + wl));
  std::printf(
      "| phase | light TTFT p50 ms | x alone | generated %% flood / light | prompt %% flood / "
      "light |\n|---|---:|---:|---:|---:|\n");
  PrintSharesRow("light alone", alone_ttft, alone_ttft, alone_shares);
  PrintSharesRow("flood + light now and then", flood_ttft, alone_ttft, flood_shares);
  PrintSharesRow("both backlogged", Percentile(both_light_ttft, 0.5), alone_ttft, both_shares);
  std::printf(
      "\nlight's TTFT p50 under the flood: %.2fx alone (%.1f ms against %.1f ms)\n"
      "both backlogged: light got %.1f %% of the generated tokens and %.1f %% of the prompt "
      "tokens absorbed; its weight share is %.1f %% (decode rows %s: %zu jobs, max batch %zu)\n",
      flood_ttft / alone_ttft, flood_ttft, alone_ttft,
      Shares::Of(both_shares.light_generated, both_shares.flood_generated),
      Shares::Of(both_shares.light_prompt, both_shares.flood_prompt), 100.0 * wl / (wf + wl),
      2 * opt.streams > eo.max_batch ? "contended"
                                     : "not contended, so generated shares follow "
                                       "demand",
      2 * opt.streams, eo.max_batch);
  return 0;
}

}  // namespace cortiq::tools
