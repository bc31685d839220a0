#include "server/service.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <atomic>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "core/session/request_plan.h"
#include "core/session/session.h"
#include "core/session/session_wire.h"
#include "core/util/status_macros.h"
#include "core/util/tsan_annotations.h"
#include "server/call_util.h"
#include "server/forwarding.h"
#include "server/generation.h"
#include "server/status_util.h"
#include "spdlog/spdlog.h"

namespace cortiq::server {

using session::Clock;

namespace {

constexpr std::string_view kServerVersion = "0.1.0";

// The request's sampling parameters with the documented defaults.
model::SamplingParams SamplingFrom(const v1::SamplingParams& p) {
  model::SamplingParams s;
  if (p.has_temperature()) s.temperature = p.temperature();
  if (p.has_top_k()) s.top_k = p.top_k();
  if (p.has_top_p()) s.top_p = p.top_p();
  if (p.has_min_p()) s.min_p = p.min_p();
  if (p.has_repetition_penalty()) s.repetition_penalty = p.repetition_penalty();
  if (p.has_seed()) s.seed = p.seed();
  if (p.has_presence_penalty()) s.presence_penalty = p.presence_penalty();
  if (p.has_frequency_penalty()) s.frequency_penalty = p.frequency_penalty();
  s.logit_bias.assign(p.logit_bias().begin(), p.logit_bias().end());
  std::sort(s.logit_bias.begin(), s.logit_bias.end());  // a proto map has no order
  return s;
}

// ---------------------------------------------------------------------------
// Generate: one reactor per call.

// gRPC ends a call at its deadline by its own clock (a cached monotonic
// time converted to system_clock), which runs a millisecond or more ahead of
// system_clock, and more on a loaded or instrumented (TSan) process: a call
// cancelled within this of its deadline is counted as DEADLINE_EXCEEDED (so
// is a client's own cancel that close to its deadline).
constexpr auto kDeadlineSlack = std::chrono::milliseconds(25);

// On the raw API: the request is parsed in Start, and each GenerateResponse
// is serialised into wire_ before it is written.
class GenerateReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  GenerateReactor(ServiceContext* ctx, grpc::CallbackServerContext* call)
      : ctx_(ctx),
        call_(call),
        log_(ctx, call, "Generate"),
        stream_(ctx->streams_in_flight.Enter()) {
    AddNodeMetadata(*ctx, call);
  }

  // Runs in the handler, before gRPC calls any reaction. A call naming a
  // spilled session is set up on a ctx_->read_back worker instead, where
  // reading the session's file back may take a second: this gRPC thread
  // returns at once. Until Setup is done there, OnCancel only marks the call
  // (setting_up_) and Started finishes it; the worker holds a reference
  // (refs_), so that OnDone leaves `this` to it if it comes first.
  void Start(const grpc::ByteBuffer& bytes) {
    absl::StatusOr<v1::GenerateRequest> request =
        ParseRequest<v1::GenerateRequest>(*ctx_, call_, "Generate", bytes);
    absl::StatusOr<Caller> caller =
        request.ok() ? Authorize(*ctx_, call_, "Generate") : request.status();
    absl::Status st =
        caller.ok() ? Setup(*request, *caller, session::ReadBack::kRefuse) : caller.status();
    if (session::IsSpilledRefusal(st) && ctx_->read_back != nullptr) {
      {
        std::lock_guard lock(mu_);
        setting_up_ = true;
      }
      const std::string id = request->session_id();
      refs_.fetch_add(1, std::memory_order_relaxed);
      st = SubmitReadBack(*ctx_, id, [this, req = *std::move(request), who = *std::move(caller)] {
        Started(Setup(req, who, session::ReadBack::kInline));
        Unref();
      });
      if (st.ok()) return;
      refs_.fetch_sub(1, std::memory_order_relaxed);
    }
    Started(st);
  }

  void OnWriteDone(bool ok) override {
    util::TsanAcquire(this);  // gRPC ran this after the op we started
    {
      std::lock_guard lock(mu_);
      writing_ = false;
      if (summary_written_) {  // the summary went (or the client is gone): the end
        util::TsanRelease(this);
        Finish(grpc::Status::OK);
        return;
      }
      if (!ok) {  // the stream is broken (client gone): stop generating
        job_->Cancel();
        FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "stream write failed"));
        return;
      }
    }
    Pump();
  }

  void OnCancel() override {
    util::TsanAcquire(this);
    {
      // First: a job that ends because of this cancel must not be reported
      // by Pump as a finished (OK) call.
      std::lock_guard lock(mu_);
      if (setting_up_) {  // a read_back worker holds `this`: Started finishes
        cancelled_ = true;
        return;
      }
      FinishLocked(grpc::Status::CANCELLED);
    }
    if (job_) job_->Cancel();
  }

  void OnDone() override {
    util::TsanAcquire(this);
    size_t completion = 0;
    if (job_) {
      // No engine callback reaches this object after this; the job stays
      // in jobs_in_flight until the engine has finished it (its next step).
      ReleaseWhenFinished(job_, job_in_flight_);
      job_->Cancel();  // no-op when finished; a disconnected client stops here
      if (job_->finished()) completion = job_->result().completion_tokens;
    }
    grpc::StatusCode code = final_code_;
    if (code == grpc::StatusCode::CANCELLED &&
        call_->deadline() <= std::chrono::system_clock::now() + kDeadlineSlack) {
      code = grpc::StatusCode::DEADLINE_EXCEEDED;
    }
    log_.Done(code, final_message_,
              {{"session", session_id_},
               {"prompt_tokens", static_cast<int64_t>(prompt_tokens_)},
               {"completion_tokens", static_cast<int64_t>(completion)},
               {"finish", finish_reason_},
               {"priority", std::string(priority_)}});
    stream_.Release();
    Unref();
  }

 private:
  // Drops one reference: gRPC's (OnDone) or a read_back worker's (Start).
  void Unref() {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  // Setup's outcome: the stream starts (the job's events are pumped), or the
  // call finishes with the error, or with CANCELLED when OnCancel came while
  // a read_back worker set it up.
  void Started(const absl::Status& st) {
    {
      std::lock_guard lock(mu_);
      setting_up_ = false;
      if (!st.ok()) {
        FinishLocked(cancelled_ ? grpc::Status::CANCELLED : ToGrpcStatus(st));
        return;
      }
      job_in_flight_ = std::make_shared<util::InFlight::Token>(ctx_->jobs_in_flight.Enter());
      job_->SetNotify([this] { Pump(); });
      if (cancelled_) {  // OnDone cancels the job
        FinishLocked(grpc::Status::CANCELLED);
        return;
      }
    }
    Pump();
  }

  absl::Status Setup(const v1::GenerateRequest& req, const Caller& caller,
                     session::ReadBack read_back) {
    CORTIQ_RETURN_IF_ERROR(Unavailable(*ctx_));
    session::GenerationRequest g;
    CORTIQ_ASSIGN_OR_RETURN(g.priority, PriorityFromProto(req.priority()));
    priority_ = session::PriorityName(g.priority);
    if (!req.prompt().empty() && req.prompt_tokens_size() > 0) {
      return absl::InvalidArgumentError("prompt: give prompt text or prompt_tokens, not both");
    }
    CORTIQ_RETURN_IF_ERROR(CheckPromptBytes(*ctx_, "prompt", req.prompt().size()));
    CORTIQ_RETURN_IF_ERROR(
        CheckPromptIds(*ctx_, "prompt_tokens", static_cast<size_t>(req.prompt_tokens_size())));
    if (req.prompt_tokens_size() > 0) {
      g.prompt.assign(req.prompt_tokens().begin(), req.prompt_tokens().end());
    } else {
      g.prompt = ctx_->tokenizer->Encode(req.prompt());
    }
    g.max_tokens = req.max_tokens();
    g.stop.assign(req.stop().begin(), req.stop().end());
    g.sampling = SamplingFrom(req.sampling());
    g.seed_given = req.sampling().has_seed();
    g.logprobs = req.logprobs();
    g.top_logprobs = req.top_logprobs();
    g.ignore_eos = req.ignore_eos();
    g.stop_token_ids.assign(req.stop_token_ids().begin(), req.stop_token_ids().end());
    g.min_tokens = req.min_tokens();
    g.n = req.n() == 0 ? 1 : req.n();
    g.reuse_prefix = req.reuse_prefix();
    const auto deadline = call_->deadline();
    const auto left = deadline - std::chrono::system_clock::now();
    if (left < std::chrono::hours(24 * 365)) {
      g.deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(left);
    }
    prompt_tokens_ = g.prompt.size();
    CORTIQ_ASSIGN_OR_RETURN(SubmittedGeneration s,
                            SubmitGeneration(*ctx_, caller, std::move(g),
                                             {.session_id = req.session_id(),
                                              .session_config = req.session_config(),
                                              .keep_session = req.keep_session(),
                                              .create_if_missing = req.create_if_missing(),
                                              .read_back = read_back}));
    session_id_ = std::move(s.session_id);
    job_ = std::move(s.job);
    return absl::OkStatus();
  }

  // Moves the stream forward: writes the next event, or the summary once the
  // job is drained. Called from the engine thread (job notify), from
  // OnWriteDone and from Start; one write in flight at a time.
  void Pump() {
    std::lock_guard lock(mu_);
    if (job_->finished()) job_in_flight_->Release();  // the engine is done with it
    if (writing_ || finished_) return;
    session::GenerationEvent ev;
    if (job_->Pop(&ev)) {
      msg_.Clear();
      v1::GeneratedToken* t = msg_.mutable_token();
      t->set_index(ev.index);
      t->set_token_id(ev.token_id);
      t->set_text(std::move(ev.text));
      if (ev.logprobs) {
        auto fill = [&](const model::TokenLogprob& lp, v1::TokenLogprob* out) {
          out->set_token_id(lp.id);
          out->set_logprob(lp.logprob);
          const int32_t id = lp.id;
          out->set_text(ctx_->tokenizer->Decode(std::span<const int32_t>(&id, 1)));
        };
        fill(ev.logprobs->chosen, t->mutable_logprob());
        for (const auto& alt : ev.logprobs->top) fill(alt, t->add_top_logprobs());
      }
      const grpc::Status st = SerializeMessage();
      if (!st.ok()) {
        job_->Cancel();
        FinishLocked(st);
        return;
      }
      writing_ = true;
      util::TsanRelease(this);
      StartWrite(&wire_);
      return;
    }
    if (!job_->Drained()) return;  // the engine will notify again
    const session::GenerationResult& r = job_->result();
    finish_reason_ = std::string(session::FinishReasonName(r.finish_reason));
    if (!r.status.ok()) {
      FinishLocked(ToGrpcStatus(r.status));
      return;
    }
    // One summary per choice, index order, the stream's last messages (n =
    // 1: exactly one, as ever); OnWriteDone finishes the call after the last.
    const bool last = summaries_sent_ + 1 >= r.choices.size();
    const grpc::Status st = SerializeSummary(r, summaries_sent_++);
    if (!st.ok()) {
      FinishLocked(st);
      return;
    }
    if (!last) {
      writing_ = true;
      util::TsanRelease(this);
      StartWrite(&wire_);
      return;
    }
    finished_ = true;
    final_code_ = grpc::StatusCode::OK;
    // The last summary, then the status once its write is done — not one
    // StartWriteAndFinish: over gRPC 1.51's in-process transport (the
    // create_if_missing relay to this node, forwarding.h) a write-and-finish
    // lost the last message to the relay reading it and left this call
    // unfinished, holding up the server's shutdown.
    summary_written_ = true;
    util::TsanRelease(this);  // after every write OnWriteDone / OnDone read
    StartWrite(&wire_);
  }

  // The summary of choice `index` into wire_. With n > 1 its finish_reason
  // and completion_tokens are the choice's; the rest is the call's.
  grpc::Status SerializeSummary(const session::GenerationResult& r, size_t index) {
    msg_.Clear();
    v1::GenerateSummary* s = msg_.mutable_summary();
    const bool many = r.choices.size() > 1;
    s->set_index(static_cast<uint32_t>(index));
    s->set_finish_reason(ToProto(many ? r.choices[index].finish_reason : r.finish_reason));
    s->mutable_usage()->set_prompt_tokens(static_cast<uint32_t>(r.prompt_tokens));
    s->mutable_usage()->set_completion_tokens(static_cast<uint32_t>(
        many ? r.choices[index].completion_tokens : r.completion_tokens));
    s->mutable_usage()->set_session_tokens(r.session_tokens);
    s->mutable_usage()->set_cached_tokens(static_cast<uint32_t>(r.cached_tokens));
    s->mutable_timings()->set_queue_seconds(r.queue_seconds);
    s->mutable_timings()->set_time_to_first_token_seconds(r.ttft_seconds);
    s->mutable_timings()->set_decode_tokens_per_second(r.decode_tokens_per_second);
    s->mutable_timings()->set_total_seconds(r.total_seconds);
    s->set_session_id(session_id_);
    s->set_session_kept(ctx_->store->Get(session_id_).has_value());
    ToProto(r.memory, s->mutable_memory());
    return SerializeMessage();
  }

  // msg_ into wire_, the bytes StartWrite sends (the previous write is done:
  // one in flight). Fails only for a message over 2 GiB, which no response
  // comes near.
  grpc::Status SerializeMessage() {
    wire_.Clear();  // Serialize writes into an empty buffer only
    bool own = false;
    return grpc::SerializationTraits<v1::GenerateResponse>::Serialize(msg_, &wire_, &own);
  }

  void FinishLocked(const grpc::Status& status) {
    if (finished_) return;
    finished_ = true;
    final_code_ = status.error_code();
    final_message_ = status.error_message();
    util::TsanRelease(this);
    Finish(status);
  }

  ServiceContext* ctx_;
  grpc::CallbackServerContext* call_;
  CallLog log_;
  util::InFlight::Token stream_;  // in ctx_->streams_in_flight until OnDone
  std::shared_ptr<session::Job> job_;
  // In ctx_->jobs_in_flight from Submit until the engine has finished the
  // job (shared with the job's notify once this reactor is gone).
  std::shared_ptr<util::InFlight::Token> job_in_flight_;
  std::string session_id_;
  size_t prompt_tokens_ = 0;
  size_t summaries_sent_ = 0;  // GenerateSummary messages written (one per choice)
  std::string finish_reason_;  // empty until the job is drained
  // PriorityName of the request's level; empty (not logged) until it parsed.
  std::string_view priority_;

  std::mutex mu_;
  // A read_back worker runs Setup (Start); OnCancel meanwhile sets cancelled_.
  bool setting_up_ = false;
  bool cancelled_ = false;
  std::atomic<int> refs_{1};  // gRPC's until OnDone, plus a read_back worker's
  bool writing_ = false;
  bool summary_written_ = false;  // the last write: OnWriteDone finishes the call
  bool finished_ = false;
  grpc::StatusCode final_code_ = grpc::StatusCode::OK;
  std::string final_message_;
  v1::GenerateResponse msg_;  // the message being built
  grpc::ByteBuffer wire_;     // msg_ serialised: the write in flight
};

}  // namespace

// ---------------------------------------------------------------------------
// Session configuration

absl::StatusOr<session::SessionConfig> DefaultSessionConfig(const ServerConfig& config,
                                                            const model::Transformer& model,
                                                            const std::string& /*model_dir*/) {
  session::SessionConfig c;
  c.kv_mode = config.kv_dtype == "int8" ? kv::KvMode::kInt8 : kv::KvMode::kF32;
  const size_t layers = static_cast<size_t>(model.config().num_hidden_layers);
  // The O(1) defaults (used by requests asking for o1 without parameters and
  // by --attention o1): flags > env > the model's hint (parsed with its
  // config.json) > built-in defaults.
  auto env = kv::EnvOverrides();
  if (!env.ok()) return env.status();
  const kv::O1Overrides& hint = model.config().o1_hint;
  kv::O1Overrides flags = config.o1;
  if (!flags.layers && !env->layers && !hint.layers) flags.layers = "all";
  auto o1 = kv::ResolveO1Config({}, flags, *env, hint, layers);
  if (!o1.ok()) return o1.status();
  c.o1 = *o1;
  auto qsa = model::MakeQsaConfig(config.qsa_layers.value_or("all"), config.qsa_ratio.value_or(64),
                                  config.qsa_budget.value_or(16), layers);
  if (!qsa.ok()) return qsa.status();
  c.qsa = *qsa;
  auto window = attention::MakeWindowConfig(
      config.window_layers.value_or("all"),
      config.window_sink.value_or(attention::WindowConfig::kDefaultSink),
      config.window_size.value_or(attention::WindowConfig::kDefaultWindow), layers);
  if (!window.ok()) return window.status();
  c.window = *window;
  c.attention = config.attention == "o1"       ? session::AttentionMode::kO1
                : config.attention == "qsa"    ? session::AttentionMode::kQsa
                : config.attention == "window" ? session::AttentionMode::kWindow
                                               : session::AttentionMode::kExact;
  if (c.attention == session::AttentionMode::kWindow && c.kv_mode != kv::KvMode::kF32) {
    return absl::InvalidArgumentError(
        "--attention window: sink + window attention keeps f32 rows; it does not run with "
        "--kv-dtype int8");
  }
  return c;
}

absl::StatusOr<session::SessionConfig> ResolveSessionConfig(const v1::SessionConfig& request,
                                                            const ServiceContext& ctx) {
  session::SessionConfig c = ctx.default_session;
  const size_t layers = static_cast<size_t>(ctx.model->config().num_hidden_layers);
  switch (request.kv_dtype()) {
    case v1::KV_DTYPE_UNSPECIFIED:
      break;
    case v1::KV_DTYPE_F32:
      c.kv_mode = kv::KvMode::kF32;
      break;
    case v1::KV_DTYPE_INT8:
      c.kv_mode = kv::KvMode::kInt8;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat("session_config.kv_dtype: unknown value ",
                                                     static_cast<int>(request.kv_dtype()),
                                                     " (KV_DTYPE_F32 = 1 | KV_DTYPE_INT8 = 2)"));
  }
  switch (request.attention()) {
    case v1::ATTENTION_MODE_UNSPECIFIED:
      return c;
    case v1::ATTENTION_MODE_EXACT:
      c.attention = session::AttentionMode::kExact;
      return c;
    case v1::ATTENTION_MODE_O1: {
      c.attention = session::AttentionMode::kO1;
      const v1::O1Params& p = request.o1();
      if (p.has_layers()) {
        auto l = kv::ParseLayerSpec(p.layers(), layers);
        if (!l.ok()) {
          return absl::InvalidArgumentError(
              absl::StrCat("session_config.o1.layers: ", l.status().message()));
        }
        c.o1.layers = *l;
      }
      // m, window and sink are checked with the rest of the request
      // (session::CheckSessionConfig, from PlanRequest or CreateSession).
      if (p.has_m()) c.o1.m = p.m();
      if (p.has_window()) c.o1.w = p.window();
      if (p.has_sink()) c.o1.sink = p.sink();
      if (p.has_rect()) {
        auto r = kv::ParseO1Rect(p.rect());
        if (!r.ok()) {
          return absl::InvalidArgumentError(
              absl::StrCat("session_config.o1.rect: '", p.rect(), "' is not agg | fm"));
        }
        c.o1.rect = *r;
      }
      return c;
    }
    case v1::ATTENTION_MODE_QSA: {
      c.attention = session::AttentionMode::kQsa;
      const v1::QsaParams& p = request.qsa();
      std::string spec = p.has_layers() ? p.layers() : LayersSpec(c.qsa.layers);
      const size_t ratio = p.has_ratio() ? p.ratio() : c.qsa.ratio;
      const size_t budget = p.has_budget() ? p.budget() : c.qsa.budget;
      auto q = model::MakeQsaConfig(spec, ratio, budget, layers);
      if (!q.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("session_config.qsa: ", q.status().message()));
      }
      c.qsa = *q;
      return c;
    }
    case v1::ATTENTION_MODE_WINDOW: {
      c.attention = session::AttentionMode::kWindow;
      const v1::WindowParams& p = request.window();
      // Unset fields take the server's defaults (its --window-* flags).
      auto w = attention::MakeWindowConfig(
          p.has_layers() ? p.layers() : LayersSpec(c.window.layers),
          p.has_sink() ? p.sink() : c.window.sink, p.has_window() ? p.window() : c.window.window,
          layers);
      if (!w.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("session_config.window: ", w.status().message()));
      }
      c.window = *w;
      return c;
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "session_config.attention: unknown mode ", static_cast<int>(request.attention()),
          " (ATTENTION_MODE_EXACT = 1 | ATTENTION_MODE_O1 = 2 | ATTENTION_MODE_QSA = 3 | "
          "ATTENTION_MODE_WINDOW = 4)"));
  }
}

// ---------------------------------------------------------------------------
// Handlers

grpc::ServerWriteReactor<grpc::ByteBuffer>* InferenceService::Generate(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  // A continuation of a session another node holds is relayed there.
  if (auto* forwarded =
          MaybeForwardStream<v1::GenerateRequest>(ctx_, context, *request, "Generate")) {
    return forwarded;
  }
  auto* reactor = new GenerateReactor(ctx_, context);
  reactor->Start(*request);
  return reactor;
}

grpc::ServerUnaryReactor* InferenceService::CreateSession(grpc::CallbackServerContext* context,
                                                          const v1::CreateSessionRequest* request,
                                                          v1::SessionInfo* response,
                                                          UnaryReactor* reactor) {
  return Unary(ctx_, context, reactor, "CreateSession", [&](const Caller& caller) -> absl::Status {
    CORTIQ_RETURN_IF_ERROR(Unavailable(*ctx_));
    auto config = ResolveSessionConfig(request->config(), *ctx_);
    if (!config.ok()) return config.status();
    CORTIQ_RETURN_IF_ERROR(
        session::CheckSessionConfig(*config, ctx_->engine->max_context(), ctx_->config->max_o1_m));
    auto lease = ctx_->store->Create(*ctx_->model, *config, /*projected_bytes=*/0, caller.tenant);
    if (!lease.ok()) return lease.status();
    const std::string id = (*lease)->id();
    (*lease)->PublishMemory();
    lease->Return();
    auto snap = ctx_->store->Get(id);
    if (!snap) return absl::NotFoundError(absl::StrCat("session_id: '", id, "' was released"));
    ToProto(*snap, ctx_->node_name, response);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* InferenceService::GetSession(grpc::CallbackServerContext* context,
                                                       const v1::GetSessionRequest* request,
                                                       v1::SessionInfo* response,
                                                       UnaryReactor* reactor) {
  if (ShouldForward(*ctx_, context, request->session_id(), reactor->caller())) {
    return ForwardUnaryToOwner(ctx_, context, reactor, "GetSession", request->session_id(),
                               reactor->caller());
  }
  return Unary(ctx_, context, reactor, "GetSession", [&](const Caller& caller) -> absl::Status {
    CORTIQ_RETURN_IF_ERROR(CheckSessionId(request->session_id()));
    auto snap = ctx_->store->Get(request->session_id(), caller.sessions());
    if (!snap) {
      return absl::NotFoundError(
          absl::StrCat("session_id: no session '", request->session_id(), "' on this node"));
    }
    ToProto(*snap, ctx_->node_name, response);
    return absl::OkStatus();
  }, {{"session", request->session_id()}});
}

grpc::ServerUnaryReactor* InferenceService::ListSessions(grpc::CallbackServerContext* context,
                                                         const v1::ListSessionsRequest* request,
                                                         v1::ListSessionsResponse* response,
                                                         UnaryReactor* reactor) {
  if (request->cluster() && CallHops(context) < kMaxForwardHops) {
    return ListClusterSessions(ctx_, context, reactor, response, reactor->caller());
  }
  return Unary(ctx_, context, reactor, "ListSessions", [&](const Caller& caller) -> absl::Status {
    session::MemoryByKind total;
    for (const auto& s : ctx_->store->List(caller.sessions())) {
      ToProto(s, ctx_->node_name, response->add_sessions());
      total += s.memory;
    }
    ToProto(total, response->mutable_total_memory());
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* InferenceService::ReleaseSession(grpc::CallbackServerContext* context,
                                                           const v1::ReleaseSessionRequest* request,
                                                           v1::ReleaseSessionResponse* response,
                                                           UnaryReactor* reactor) {
  if (ShouldForward(*ctx_, context, request->session_id(), reactor->caller())) {
    // Released nowhere (no node holds it): released = false, as here.
    return ForwardUnaryToOwner(ctx_, context, reactor, "ReleaseSession", request->session_id(),
                               reactor->caller(), [reactor] {
                                 bool own = false;
                                 (void)grpc::SerializationTraits<v1::ReleaseSessionResponse>::
                                     Serialize(v1::ReleaseSessionResponse(),
                                               reactor->response_bytes(), &own);
                               });
  }
  return Unary(ctx_, context, reactor, "ReleaseSession", [&](const Caller& caller) -> absl::Status {
    CORTIQ_RETURN_IF_ERROR(CheckSessionId(request->session_id()));
    const session::ReleaseResult r = ctx_->store->Release(
        request->session_id(), session::ReleaseReason::kExplicit, caller.sessions());
    response->set_released(r.released);
    response->set_freed_bytes(r.freed_bytes);
    return absl::OkStatus();
  }, {{"session", request->session_id()}});
}

grpc::ServerUnaryReactor* InferenceService::Tokenize(grpc::CallbackServerContext* context,
                                                     const v1::TokenizeRequest* request,
                                                     v1::TokenizeResponse* response,
                                                     UnaryReactor* reactor) {
  return Unary(ctx_, context, reactor, "Tokenize", [&](const Caller&) -> absl::Status {
    CORTIQ_RETURN_IF_ERROR(CheckPromptBytes(*ctx_, "text", request->text().size()));
    const bool special = !request->has_parse_special() || request->parse_special();
    for (int32_t id : ctx_->tokenizer->Encode(request->text(), special)) {
      response->add_token_ids(id);
      response->add_tokens(std::string(ctx_->tokenizer->TokenString(id)));
    }
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* InferenceService::GetModelInfo(grpc::CallbackServerContext* context,
                                                         const v1::GetModelInfoRequest*,
                                                         v1::ModelInfo* response,
                                                         UnaryReactor* reactor) {
  return Unary(ctx_, context, reactor, "GetModelInfo", [&](const Caller&) -> absl::Status {
    const auto& c = ctx_->model->config();
    response->set_name(ctx_->model_name);
    response->set_node(ctx_->node_name);
    response->set_model_type(model::ModelConfig::ArchName(c.arch));
    response->set_fingerprint(ctx_->fingerprint);
    response->set_vocab_size(static_cast<uint32_t>(c.vocab_size));
    response->set_num_layers(static_cast<uint32_t>(c.num_hidden_layers));
    response->set_hidden_size(static_cast<uint32_t>(c.hidden_size));
    response->set_num_attention_heads(static_cast<uint32_t>(c.num_attention_heads));
    response->set_num_key_value_heads(static_cast<uint32_t>(c.num_key_value_heads));
    response->set_head_dim(static_cast<uint32_t>(c.head_dim));
    response->set_max_context(ctx_->engine->max_context());
    for (int32_t id : c.eos_token_ids) response->add_eos_token_ids(id);
    response->set_weight_bytes(ctx_->model->WeightBytesPerStep());
    response->set_max_tokens_limit(static_cast<uint32_t>(ctx_->config->max_tokens_limit));
    response->set_max_sessions(static_cast<uint32_t>(ctx_->store->options().max_sessions));
    response->set_memory_budget_bytes(ctx_->store->options().memory_budget_bytes);
    response->set_server_version(std::string(kServerVersion));
    for (uint32_t v = session::kSessionWireMinVersion; v <= session::kSessionWireMaxVersion; ++v) {
      response->add_wire_versions(v);
    }
    ToProto(ctx_->default_session, response->mutable_default_session_config());
    return absl::OkStatus();
  });
}

// ---------------------------------------------------------------------------
// The raw entry points of the unary methods: parse, then the typed handler.

grpc::ServerUnaryReactor* InferenceService::CreateSession(grpc::CallbackServerContext* context,
                                                          const grpc::ByteBuffer* request,
                                                          grpc::ByteBuffer* response) {
  return ServeUnary<v1::CreateSessionRequest, v1::SessionInfo>(
      ctx_, context, "CreateSession", request, response,
      [this](auto... args) { return CreateSession(args...); });
}

grpc::ServerUnaryReactor* InferenceService::GetSession(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request,
                                                       grpc::ByteBuffer* response) {
  return ServeUnary<v1::GetSessionRequest, v1::SessionInfo>(
      ctx_, context, "GetSession", request, response,
      [this](auto... args) { return GetSession(args...); });
}

grpc::ServerUnaryReactor* InferenceService::ListSessions(grpc::CallbackServerContext* context,
                                                         const grpc::ByteBuffer* request,
                                                         grpc::ByteBuffer* response) {
  return ServeUnary<v1::ListSessionsRequest, v1::ListSessionsResponse>(
      ctx_, context, "ListSessions", request, response,
      [this](auto... args) { return ListSessions(args...); });
}

grpc::ServerUnaryReactor* InferenceService::ReleaseSession(grpc::CallbackServerContext* context,
                                                           const grpc::ByteBuffer* request,
                                                           grpc::ByteBuffer* response) {
  return ServeUnary<v1::ReleaseSessionRequest, v1::ReleaseSessionResponse>(
      ctx_, context, "ReleaseSession", request, response,
      [this](auto... args) { return ReleaseSession(args...); });
}

grpc::ServerUnaryReactor* InferenceService::Tokenize(grpc::CallbackServerContext* context,
                                                     const grpc::ByteBuffer* request,
                                                     grpc::ByteBuffer* response) {
  return ServeUnary<v1::TokenizeRequest, v1::TokenizeResponse>(
      ctx_, context, "Tokenize", request, response,
      [this](auto... args) { return Tokenize(args...); });
}

grpc::ServerUnaryReactor* InferenceService::GetModelInfo(grpc::CallbackServerContext* context,
                                                         const grpc::ByteBuffer* request,
                                                         grpc::ByteBuffer* response) {
  return ServeUnary<v1::GetModelInfoRequest, v1::ModelInfo>(
      ctx_, context, "GetModelInfo", request, response,
      [this](auto... args) { return GetModelInfo(args...); });
}

grpc::ServerUnaryReactor* InferenceService::MigrateSession(grpc::CallbackServerContext* context,
                                                           const grpc::ByteBuffer* request,
                                                           grpc::ByteBuffer* response) {
  return ServeUnary<v1::MigrateSessionRequest, v1::MigrateSessionResponse>(
      ctx_, context, "MigrateSession", request, response,
      [this](auto... args) { return MigrateSession(args...); });
}

grpc::ServerUnaryReactor* InferenceService::Drain(grpc::CallbackServerContext* context,
                                                  const grpc::ByteBuffer* request,
                                                  grpc::ByteBuffer* response) {
  return ServeUnary<v1::DrainRequest, v1::DrainResponse>(
      ctx_, context, "Drain", request, response, [this](auto... args) { return Drain(args...); });
}

}  // namespace cortiq::server
