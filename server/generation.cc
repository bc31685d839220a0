#include "server/generation.h"

#include "absl/strings/str_cat.h"
#include "core/session/request_plan.h"
#include "core/util/status_macros.h"
#include "core/util/strings.h"
#include "server/call_util.h"

namespace cortiq::server {

absl::Status CheckPromptBytes(const ServiceContext& ctx, std::string_view field, size_t bytes) {
  const size_t limit = ctx.config->max_prompt_bytes;
  if (bytes <= limit) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      util::Sv(field), ": ", bytes, " bytes, the limit is ", limit, " (--max-prompt-bytes)"));
}

absl::Status CheckPromptIds(const ServiceContext& ctx, std::string_view field, size_t ids) {
  const size_t limit = ctx.config->max_prompt_bytes / sizeof(int32_t);
  if (ids <= limit) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(util::Sv(field), ": ", ids, " ids, the limit is ",
                                                 limit, " (--max-prompt-bytes / 4)"));
}

session::PlanLimits PlanLimitsOf(const ServiceContext& ctx) {
  return {.max_tokens = ctx.config->max_tokens_limit,
          .max_context = ctx.engine->max_context(),
          .max_n = ctx.config->max_n,
          .max_o1_m = ctx.config->max_o1_m};
}

namespace {

// Plans `g` on the existing session `id` and leases it (Peek → PlanRequest
// → Acquire). Peek and Acquire block this thread (on a condition variable)
// only while the session's previous call is ending — a cancelled job returns
// its lease at the engine's next step, milliseconds — and at most
// --lease-wait and the request's deadline. Bounded and rare, that is simpler
// and safer than parking the request and resuming it from the engine thread
// when the lease returns. A session whose holder is still generating is
// refused (ABORTED) at once, without waiting. A reuse_prefix call peeks with
// its conversation: the plan knows what the session keeps. A spilled session
// is read back here, O(its file), unless target.read_back refuses it (a gRPC
// callback thread, which then submits again from ServiceContext::read_back).
absl::Status LeaseNamed(const ServiceContext& ctx, const GenerationTarget& target,
                        const session::GenerationRequest& g, const session::PlanLimits& limits,
                        const Caller& caller, session::RequestPlan* plan,
                        session::SessionStore::Lease* lease) {
  session::SessionStore& store = *ctx.store;
  const std::string& id = target.session_id;
  CORTIQ_ASSIGN_OR_RETURN(
      session::ExistingSession existing,
      g.reuse_prefix
          ? store.PeekForReuse(id, g.prompt, g.deadline, caller.sessions(), target.read_back)
          : store.Peek(id, g.deadline, caller.sessions(), target.read_back));
  CORTIQ_ASSIGN_OR_RETURN(*plan, session::PlanRequest(g, limits, ctx.model->config(), existing));
  CORTIQ_ASSIGN_OR_RETURN(
      *lease, store.Acquire(id, *plan, g.deadline, caller.sessions(), target.read_back));
  return absl::OkStatus();
}

// create_if_missing: a new session under the target's id, of its
// session_config and the caller's tenant, kept after the call.
// ALREADY_EXISTS when the id was taken meanwhile.
absl::Status CreateNamed(const ServiceContext& ctx, const GenerationTarget& target,
                         const session::GenerationRequest& g, const session::PlanLimits& limits,
                         const Caller& caller, session::RequestPlan* plan,
                         session::SessionStore::Lease* lease) {
  CORTIQ_ASSIGN_OR_RETURN(session::SessionConfig config,
                          ResolveSessionConfig(target.session_config, ctx));
  CORTIQ_ASSIGN_OR_RETURN(*plan, session::PlanRequest(g, limits, ctx.model->config(), config));
  CORTIQ_ASSIGN_OR_RETURN(
      *lease, ctx.store->CreateNamed(*ctx.model, *plan, target.session_id, caller.tenant));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SubmittedGeneration> SubmitGeneration(const ServiceContext& ctx,
                                                     const Caller& caller,
                                                     session::GenerationRequest g,
                                                     const GenerationTarget& target) {
  CORTIQ_RETURN_IF_ERROR(Unavailable(ctx));
  // One plan, made before anything is leased or created: a bad request
  // changes nothing. Admission reserves the plan's bytes; the engine
  // trusts it.
  const session::PlanLimits limits = PlanLimitsOf(ctx);
  const auto& mcfg = ctx.model->config();
  // The request's own fields first: a bad one is INVALID_ARGUMENT before a
  // named session is looked up, waited for or read back from disk.
  CORTIQ_RETURN_IF_ERROR(session::CheckRequestFields(g, limits, mcfg));
  session::RequestPlan plan;
  session::SessionStore::Lease lease;
  // n > 1: the other choices' sessions, created here before anything runs,
  // each admitted with the plan's bytes (all or nothing).
  std::vector<session::SessionStore::Lease> forks;
  if (!target.session_id.empty()) {
    CORTIQ_RETURN_IF_ERROR(CheckSessionId(target.session_id));
    absl::Status st = LeaseNamed(ctx, target, g, limits, caller, &plan, &lease);
    bool created = false;
    if (st.code() == absl::StatusCode::kNotFound && target.create_if_missing) {
      st = CreateNamed(ctx, target, g, limits, caller, &plan, &lease);
      created = st.ok();
      // Created meanwhile by another call (or another tenant's id): continue
      // it, once; another tenant's answers NOT_FOUND as any unknown id.
      if (st.code() == absl::StatusCode::kAlreadyExists) {
        st = LeaseNamed(ctx, target, g, limits, caller, &plan, &lease);
      }
    }
    CORTIQ_RETURN_IF_ERROR(st);
    if (g.n > 1) {
      // Refused: the acquired lease returns unused, nothing changed (a
      // session this call created goes with it).
      absl::StatusOr<std::vector<session::SessionStore::Lease>> more =
          ctx.store->CreateMany(*ctx.model, plan, g.n - 1, caller.tenant);
      if (!more.ok()) {
        if (created) lease.ReleaseOnReturn(session::ReleaseReason::kCancelled);
        return more.status();
      }
      forks = *std::move(more);
    }
  } else {
    CORTIQ_ASSIGN_OR_RETURN(session::SessionConfig config,
                            ResolveSessionConfig(target.session_config, ctx));
    CORTIQ_ASSIGN_OR_RETURN(plan, session::PlanRequest(g, limits, mcfg, config));
    CORTIQ_ASSIGN_OR_RETURN(std::vector<session::SessionStore::Lease> leases,
                            ctx.store->CreateMany(*ctx.model, plan, g.n, caller.tenant));
    lease = std::move(leases[0]);
    forks.assign(std::make_move_iterator(leases.begin() + 1),
                 std::make_move_iterator(leases.end()));
    g.release_at_end = !target.keep_session;
  }
  SubmittedGeneration out;
  out.session_id = lease->id();
  CORTIQ_ASSIGN_OR_RETURN(
      out.job, ctx.engine->Submit(std::move(lease), std::move(forks), std::move(g), plan));
  return out;
}

void ReleaseWhenFinished(const std::shared_ptr<session::Job>& job,
                         const std::shared_ptr<util::InFlight::Token>& token) {
  job->ClearNotify();
  job->SetNotify([j = job.get(), token] {
    if (j->finished()) token->Release();
  });
  if (job->finished()) token->Release();
}

}  // namespace cortiq::server
