// RequestPlan: a generation request checked once, at the edge, against every
// limit, and turned into the numbers admission and the engine use — the
// positions the session will hold and the bytes it will hold at its peak.
//
// The front end (server/service.cc) calls PlanRequest before it leases or
// creates anything; SessionStore::Create / Acquire admit by the plan's bytes;
// Engine::Submit takes the plan and trusts it (it only checks that the plan
// belongs to the request and the session, as a programmer invariant).
//
// Contract of PlanRequest: every error is INVALID_ARGUMENT whose message names
// the request field and the limit, in this order:
//   [new session] session_config.o1.m ≥ kv::kO1MinLandmarks,
//       session_config.o1.window ≥ kv::kO1MinWindow (O(1) sessions); the
//       O(1) m / window / sink and the QSA ratio / budget ≤ limits.max_context
//       (CheckSessionConfig);
//   prompt non-empty; prompt_tokens[i] ∈ [0, vocab_size);
//   max_tokens ∈ [1, limits.max_tokens]; sampling (SamplingParams::Validate:
//   the penalties, logit_bias's size, order and biases), logit_bias ids in
//   the vocabulary; at most kMaxStopTokenIds stop_token_ids, each in the
//   vocabulary; min_tokens ≤ max_tokens; n ∈ [1, limits.max_n];
//   top_logprobs ≤ kMaxTopLogprobs; at most kMaxStopSequences stop
//   sequences, each 1 .. kMaxStopBytes bytes;
//   history + prompt + max_tokens ≤ limits.max_context (with reuse_prefix:
//   the whole conversation + max_tokens, whatever the session held).
// Not checked here, and by whom: prompt text size (--max-prompt-bytes), prompt
// vs prompt_tokens, session id syntax, unknown enum values, O(1) layer specs
// and rectifier names, and the QSA minimums (model::MakeQsaConfig, when the
// front end resolves the session config); auth, draining; the session cap and
// memory budget (SessionStore admission, RESOURCE_EXHAUSTED); a continued
// session's config (checked when it was created or imported).
//
// All functions are pure and thread-safe; PlanRequest is O(prompt + stop
// bytes + layers) and allocates only the plan.
//
// Example:
//   CORTIQ_ASSIGN_OR_RETURN(RequestPlan plan,
//                           PlanRequest(request, limits, model.config(), new_config));
//   CORTIQ_ASSIGN_OR_RETURN(SessionStore::Lease lease, store.Create(model, plan));
//   CORTIQ_ASSIGN_OR_RETURN(auto job, engine.Submit(std::move(lease), request, plan));
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/model/model_config.h"
#include "core/model/sampler.h"
#include "core/session/session.h"

namespace cortiq::session {

inline constexpr uint32_t kMaxTopLogprobs = 20;
inline constexpr size_t kMaxStopSequences = 16;
inline constexpr size_t kMaxStopBytes = 256;
inline constexpr size_t kMaxStopTokenIds = 16;
inline constexpr size_t kMaxLogitBias = model::kMaxLogitBias;  // 1024

// Which front end a generation came from: the engine passes it to its
// observer so the latency series carry frontend="grpc"|"http" (docs/METRICS.md).
// Not checked by PlanRequest (the front end sets it, never the client).
enum class Frontend : uint8_t { kGrpc = 0, kHttp = 1 };
inline constexpr size_t kNumFrontends = 2;
// "grpc" | "http": the label value.
std::string_view FrontendName(Frontend frontend);

// How soon the engine serves a request (GenerateRequest.priority, the HTTP
// front's "priority"): among the requests waiting for their prompt to be
// absorbed, a higher level is admitted and prefilled first; a waiting
// request rises one level per EngineOptions::aging_steps steps it waits, so
// a lower level is delayed, never starved (Engine, "Scheduling").
enum class Priority : uint8_t { kLow = 0, kNormal = 1, kHigh = 2 };
inline constexpr size_t kNumPriorities = 3;
// "low" | "normal" | "high": flags, the HTTP field and the metric label.
std::string_view PriorityName(Priority priority);
// The reverse; nullopt for anything else.
std::optional<Priority> ParsePriority(std::string_view name);

// What a caller asks the engine to do with a session. Checked by PlanRequest.
struct GenerationRequest {
  std::vector<int32_t> prompt;    // appended to the session's history; non-empty
  size_t max_tokens = 16;         // >= 1
  std::vector<std::string> stop;  // stop sequences (text)
  model::SamplingParams sampling;
  bool seed_given = true;  // false: a continued session keeps its RNG
  bool logprobs = false;
  uint32_t top_logprobs = 0;  // 0..kMaxTopLogprobs
  bool ignore_eos = false;
  // Sampling one of these also ends the call (finish reason stop); the token
  // is not streamed as text. At most kMaxStopTokenIds, each in the vocabulary.
  std::vector<int32_t> stop_token_ids;
  // End-of-sequence ids and stop_token_ids are masked for the first
  // min_tokens samples; 0 .. max_tokens.
  size_t min_tokens = 0;
  // Choices from one prefill (GenerateRequest.n): 1 .. PlanLimits::max_n.
  // Choice i samples with seed + i on its own fork of the session (see
  // Engine::Submit); choice 0 exactly as an n = 1 request would.
  size_t n = 1;
  // The prompt is the session's whole conversation (GenerateRequest.reuse_prefix):
  // the longest common prefix with its history is kept, only the rest prefilled.
  bool reuse_prefix = false;
  // Release the session when the job ends (a one-shot session): reason
  // cancelled when the job was cancelled, oneshot otherwise.
  bool release_at_end = false;
  Clock::time_point deadline = Clock::time_point::max();
  Frontend frontend = Frontend::kGrpc;  // who submitted it (metrics labels only)
  Priority priority = Priority::kNormal;  // scheduling level (not checked: an enum)
};

// The server's limits a request is checked against.
struct PlanLimits {
  size_t max_tokens = 0;   // max_tokens ∈ [1, this] (--max-tokens)
  size_t max_context = 0;  // positions a session may hold (Engine::max_context())
  size_t max_n = 1;        // choices per request (--max-n); at most the engine's max_batch
  // session_config.o1.m ∈ [kO1MinLandmarks, this] for a new session
  // (--max-o1-m): sealing a prompt costs O(m³) per head and a decoded token
  // O(m²), on the engine thread every stream shares.
  size_t max_o1_m = SIZE_MAX;
};

// The session a continuation runs on, as it stands before the call
// (SessionStore::Peek; SessionStore::PeekForReuse for a reuse_prefix call).
struct ExistingSession {
  size_t history = 0;    // tokens of its history
  SessionConfig config;  // fixed when it was created
  // reuse_prefix only: what the call keeps of the history (Session::
  // PlanReuse with the request's prompt), and the session's lease serial
  // then (SessionStore::Acquire(id, plan) refuses a session leased since:
  // its history may have changed without changing its length).
  std::optional<PrefixReuse> reuse{};
  uint64_t lease_serial = 0;
};

struct RequestPlan {
  SessionConfig config;  // the session's: a new one's (checked), or the existing one's
  // Positions. total = history + prompt + max_tokens ≤ the context: what the
  // session holds at the end of the call, what its caches reserve.
  // Tokens already in the session (0 for a new one); with reuse_prefix,
  // the history tokens the call keeps (reuse->kept).
  size_t history = 0;
  // request.prompt.size(); with reuse_prefix, the tokens appended after the
  // kept history (request.prompt.size() - reuse->kept).
  size_t prompt = 0;
  size_t max_tokens = 0;  // request.max_tokens
  size_t total = 0;
  // The session's projected peak by kind (ProjectedSessionMemory with
  // `total` positions, history + prompt of them prefilled); projected.total()
  // equals ProjectedSessionBytes and is what admission reserves.
  MemoryByKind projected;
  // reuse_prefix only: ExistingSession::reuse (a new session: all zero),
  // which the engine applies (Session::RewindForReuse), and the lease
  // serial it was planned at (0 for a new session).
  std::optional<PrefixReuse> reuse{};
  uint64_t lease_serial = 0;
};

// Plans a request on a new session of `config` (resolved: every field
// concrete). Checks the config (CheckSessionConfig), then the request.
absl::StatusOr<RequestPlan> PlanRequest(const GenerationRequest& request, const PlanLimits& limits,
                                        const model::ModelConfig& model,
                                        const SessionConfig& config);
// Plans a request continuing `session`. Its config is not checked again.
absl::StatusOr<RequestPlan> PlanRequest(const GenerationRequest& request, const PlanLimits& limits,
                                        const model::ModelConfig& model,
                                        const ExistingSession& session);

// The checks of the banner that need neither a session nor a session config:
// every one but the session config's and the context's, in the banner's
// order, with the same errors. PlanRequest runs them first; a caller that
// passes the request on rather than planning it (the HTTP front relaying a
// conversation to the node that holds it) runs them before it does.
// O(prompt + stop bytes); allocates only an error's message.
absl::Status CheckRequestFields(const GenerationRequest& request, const PlanLimits& limits,
                                const model::ModelConfig& model);

// The checks of a new session's resolved config (see the banner): the O(1)
// minimums (kv::CheckO1Minimums) and no mode size above `max_context`, so a
// request cannot make a session allocate more than a context's worth (the
// QSA launch scratch is budget × 4 bytes; the O(1) state holds m, w and sink
// rows). INVALID_ARGUMENT naming "session_config.<field>". Also what
// CreateSession (a session without a generation) checks.
absl::Status CheckSessionConfig(const SessionConfig& config, size_t max_context,
                                size_t max_o1_m = SIZE_MAX);

// ProjectedSessionBytes split by kind: the exact rows → kv_f32 or kv_int8 (by
// config.kv_mode), the O(1) query trace and sealed states → o1, the QSA
// indexer keys → qsa. O(layers).
MemoryByKind ProjectedSessionMemory(const model::ModelConfig& model, const SessionConfig& config,
                                    size_t positions, size_t prompt_positions);

}  // namespace cortiq::session
