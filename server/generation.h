// The one path from a checked generation request to a job on the engine,
// shared by the front ends (the gRPC Generate reactor, server/service.cc, and
// the HTTP endpoints, server/http/): the prompt size check, the plan
// (session::PlanRequest, the only validation of the request's fields), the
// session (leased or created by the plan's bytes) and Engine::Submit.
//
// A request that fails anywhere here changes nothing: the plan is made before
// anything is leased or created, and admission reserves the plan's bytes in
// the same step as it leases.
//
// Threads: any thread. Peek / Acquire may block the calling thread while a
// session's previous call is ending, at most --lease-wait and the request's
// deadline (see SessionStore), never longer.
//
// Example:
//   CORTIQ_RETURN_IF_ERROR(CheckPromptBytes(ctx, "prompt", text.size()));
//   g.prompt = ctx.tokenizer->Encode(text);
//   CORTIQ_ASSIGN_OR_RETURN(SubmittedGeneration s,
//                           SubmitGeneration(ctx, caller, std::move(g), {}));
//   ... pop s.job's events; s.session_id names its session
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/session/engine.h"
#include "core/util/in_flight.h"
#include "cortiq/v1/inference.pb.h"
#include "server/auth.h"
#include "server/service.h"

namespace cortiq::server {

// Where a generation runs.
struct GenerationTarget {
  std::string session_id;            // "" = a new session
  v1::SessionConfig session_config;  // a new session's (unset fields: the server's defaults)
  bool keep_session = false;         // a new session outlives the call
  // session_id names a session to create when there is none (kept after the
  // call, of session_config, the caller's tenant): GenerateRequest.
  // create_if_missing, an HTTP conversation's first turn.
  bool create_if_missing = false;
  // A spilled session_id is read back on the calling thread (kInline), or
  // refused with session::SpilledRefusal, nothing changed (kRefuse: the
  // caller is a gRPC callback and submits again from ServiceContext::
  // read_back).
  session::ReadBack read_back = session::ReadBack::kInline;
};

struct SubmittedGeneration {
  std::shared_ptr<session::Job> job;
  std::string session_id;
};

// INVALID_ARGUMENT "<field>: N bytes, the limit is L (--max-prompt-bytes)"
// when `bytes` exceeds --max-prompt-bytes.
absl::Status CheckPromptBytes(const ServiceContext& ctx, std::string_view field, size_t bytes);
// INVALID_ARGUMENT naming `field` when `ids` token ids exceed
// --max-prompt-bytes / 4.
absl::Status CheckPromptIds(const ServiceContext& ctx, std::string_view field, size_t ids);

// The limits a generation is planned against here: --max-tokens, the
// engine's context, --max-n.
session::PlanLimits PlanLimitsOf(const ServiceContext& ctx);

// UNAVAILABLE while draining; then plans `g` (session::PlanRequest against
// --max-tokens, --max-n and the engine's context), leases the session
// `target` names (Peek — PeekForReuse for reuse_prefix — → plan → Acquire,
// in `caller`'s tenant; with create_if_missing, a missing one is created
// under that id, and one created meanwhile continued, once) or creates one
// (the resolved session config; one-shot unless keep_session), creates the
// n - 1 forks of n > 1 (all or nothing), and submits. Every error
// of the plan, the store and the engine as they give it (INVALID_ARGUMENT,
// UNIMPLEMENTED, NOT_FOUND, ABORTED, RESOURCE_EXHAUSTED, UNAVAILABLE).
absl::StatusOr<SubmittedGeneration> SubmitGeneration(const ServiceContext& ctx,
                                                     const Caller& caller,
                                                     session::GenerationRequest g,
                                                     const GenerationTarget& target);

// For a consumer that is going away (a finished gRPC stream, an HTTP
// response written or abandoned): replaces the job's notify (ClearNotify
// first: no earlier callback runs after this returns) with one that releases
// `token` — the job's place in ServiceContext::jobs_in_flight — once the
// engine has finished the job, and releases it now when it has.
void ReleaseWhenFinished(const std::shared_ptr<session::Job>& job,
                         const std::shared_ptr<util::InFlight::Token>& token);

}  // namespace cortiq::server
