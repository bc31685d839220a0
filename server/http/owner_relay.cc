#include "server/http/owner_relay.h"

#include <condition_variable>
#include <deque>
#include <limits>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/session/request_plan.h"
#include "core/util/status_macros.h"
#include "core/util/strings.h"
#include "core/util/tsan_annotations.h"
#include "cortiq/v1/inference.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "server/call_util.h"
#include "server/forward.h"
#include "server/forwarding.h"
#include "server/peer_dialer.h"
#include "server/session_router.h"
#include "spdlog/spdlog.h"

namespace cortiq::server::http {

namespace {

using session::Clock;
using Metadata = std::vector<std::pair<std::string, std::string>>;
using SystemTime = std::chrono::system_clock::time_point;

// A lookup's answer outlasts its deadline by at most this: the router ends
// its peer calls at the deadline and answers then.
constexpr auto kLookupSlack = std::chrono::seconds(1);

SystemTime ToSystem(Clock::time_point t) {
  if (t == Clock::time_point::max()) return SystemTime::max();
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(t - Clock::now());
}

absl::Status FromGrpc(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

session::FinishReason FromProto(v1::FinishReason r) {
  switch (r) {
    case v1::FINISH_REASON_LENGTH:
      return session::FinishReason::kLength;
    case v1::FINISH_REASON_STOP:
      return session::FinishReason::kStop;
    case v1::FINISH_REASON_EOS:
      return session::FinishReason::kEos;
    case v1::FINISH_REASON_CANCELLED:
      return session::FinishReason::kCancelled;
    default:
      return session::FinishReason::kNone;
  }
}

// `value` as the wire's uint32 field `field`; INVALID_ARGUMENT above it
// (a cast would send another number: 2^32 + 5 as 5).
absl::StatusOr<uint32_t> Uint32Field(std::string_view field, size_t value) {
  if (value > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(util::Sv(field), ": ", value, " is above ",
                                                   std::numeric_limits<uint32_t>::max()));
  }
  return static_cast<uint32_t>(value);
}

}  // namespace

absl::StatusOr<v1::GenerateRequest> ToRelayedRequest(const session::GenerationRequest& g,
                                                     const GenerationTarget& t) {
  v1::GenerateRequest r;
  CORTIQ_ASSIGN_OR_RETURN(const uint32_t max_tokens, Uint32Field("max_tokens", g.max_tokens));
  CORTIQ_ASSIGN_OR_RETURN(const uint32_t min_tokens, Uint32Field("min_tokens", g.min_tokens));
  CORTIQ_ASSIGN_OR_RETURN(const uint32_t n, Uint32Field("n", g.n));
  r.mutable_prompt_tokens()->Assign(g.prompt.begin(), g.prompt.end());
  r.set_max_tokens(max_tokens);
  for (const std::string& s : g.stop) r.add_stop(s);
  v1::SamplingParams* s = r.mutable_sampling();
  s->set_temperature(g.sampling.temperature);
  s->set_top_k(g.sampling.top_k);
  s->set_top_p(g.sampling.top_p);
  s->set_min_p(g.sampling.min_p);
  s->set_repetition_penalty(g.sampling.repetition_penalty);
  // No seed: the owner's session keeps its generator running (seed_given).
  if (g.seed_given) s->set_seed(g.sampling.seed);
  s->set_presence_penalty(g.sampling.presence_penalty);
  s->set_frequency_penalty(g.sampling.frequency_penalty);
  for (const auto& [id, bias] : g.sampling.logit_bias) (*s->mutable_logit_bias())[id] = bias;
  r.set_logprobs(g.logprobs);
  r.set_top_logprobs(g.top_logprobs);
  r.set_ignore_eos(g.ignore_eos);
  r.mutable_stop_token_ids()->Assign(g.stop_token_ids.begin(), g.stop_token_ids.end());
  r.set_min_tokens(min_tokens);
  r.set_n(n);
  r.set_reuse_prefix(g.reuse_prefix);
  r.set_priority(ToProto(g.priority));
  r.set_session_id(t.session_id);
  r.set_create_if_missing(t.create_if_missing);
  r.set_keep_session(t.keep_session);
  *r.mutable_session_config() = t.session_config;
  return r;
}

namespace {

// One Generate call on the owner, read as a GenerationStream: every message
// is read as it comes (a token is a few bytes; a call holds at most its
// max_tokens x n of them) and queued for the HTTP worker.
class RemoteGeneration final : public GenerationStream,
                               public grpc::ClientReadReactor<v1::GenerateResponse> {
 public:
  RemoteGeneration(const std::shared_ptr<grpc::Channel>& channel, const v1::GenerateRequest& request,
                   const Metadata& metadata, SystemTime deadline)
      : stub_(v1::Inference::NewStub(channel)), request_(request) {
    for (const auto& [k, v] : metadata) context_.AddMetadata(k, v);
    if (deadline != SystemTime::max()) context_.set_deadline(deadline);
    stub_->async()->Generate(&context_, &request_, this);
    StartRead(&msg_);
    util::TsanRelease(this);  // the callbacks run on gRPC's threads (see below)
    StartCall();
  }
  // Cancels the call, and waits for gRPC's last callback (OnDone), which a
  // cancelled call runs at once: nothing of this object is used after.
  ~RemoteGeneration() override {
    context_.TryCancel();
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return done_; });
  }

  // Waits for the owner's first message or its answer (true); false at `until`.
  bool WaitStarted(Clock::time_point until) {
    std::unique_lock lock(mu_);
    return cv_.wait_until(lock, until, [&] { return started_ || done_; });
  }
  // The call's status when it ended before the owner sent anything (an
  // error: nothing generated), else OK.
  grpc::Status EndedEmpty() const {
    std::lock_guard lock(mu_);
    if (done_ && !started_) return status_;
    return grpc::Status::OK;
  }
  std::string node() const {
    std::lock_guard lock(mu_);
    return node_;
  }

  Next Wait(session::GenerationEvent* ev, Clock::time_point until) override {
    std::unique_lock lock(mu_);
    for (;;) {
      if (PopLocked(ev)) return Next::kEvent;
      if (done_) return Next::kDrained;
      if (!cv_.wait_until(lock, until, [&] { return !events_.empty() || done_; })) {
        return Next::kWaiting;
      }
    }
  }
  bool Pop(session::GenerationEvent* ev) override {
    std::lock_guard lock(mu_);
    return PopLocked(ev);
  }
  void Cancel() override { context_.TryCancel(); }
  const session::GenerationResult& result() const override { return result_; }

  // gRPC runs each callback after the operation this object started (the
  // call, each read): marked for ThreadSanitizer, which does not see gRPC's
  // own synchronisation (an uninstrumented library).
  void OnReadInitialMetadataDone(bool /*ok*/) override { util::TsanAcquire(this); }

  void OnReadDone(bool ok) override {
    util::TsanAcquire(this);
    if (!ok) return;  // the stream ended: OnDone follows
    {
      std::lock_guard lock(mu_);
      if (!started_) {
        // The owner's initial metadata came before its first message (and
        // OnReadInitialMetadataDone may run after this, on another thread).
        const auto& md = context_.GetServerInitialMetadata();
        auto it = md.find(std::string(kNodeMetadata));
        if (it != md.end()) node_.assign(it->second.data(), it->second.size());
      }
      started_ = true;
      if (msg_.has_token()) {
        const v1::GeneratedToken& t = msg_.token();
        session::GenerationEvent ev;
        ev.index = t.index();
        ev.token_id = t.token_id();
        ev.text = t.text();
        if (t.has_logprob()) {
          model::Logprobs lp;
          lp.chosen = {t.logprob().token_id(), t.logprob().logprob()};
          for (const auto& alt : t.top_logprobs()) lp.top.push_back({alt.token_id(), alt.logprob()});
          ev.logprobs = std::move(lp);
        }
        events_.push_back(std::move(ev));
      } else if (msg_.has_summary()) {
        Summary(msg_.summary());
      }
    }
    cv_.notify_all();
    util::TsanRelease(this);
    StartRead(&msg_);
  }

  void OnDone(const grpc::Status& status) override {
    util::TsanAcquire(this);
    std::lock_guard lock(mu_);
    status_ = status;
    if (status.error_code() == grpc::StatusCode::CANCELLED) {
      // Cancelled here (a client gone: nobody reads this; the server's
      // Stop): answered as a local job the server cancelled.
      result_.finish_reason = session::FinishReason::kCancelled;
    } else if (!status.ok()) {
      result_.status = FromGrpc(status);
    } else if (!summarised_) {
      result_.status = absl::InternalError("the owner's Generate stream ended without a summary");
    }
    done_ = true;
    // Under the lock: the destructor may free this object as soon as it
    // sees done_.
    cv_.notify_all();
  }

 private:
  bool PopLocked(session::GenerationEvent* ev) {
    if (events_.empty()) return false;
    *ev = std::move(events_.front());
    events_.pop_front();
    return true;
  }

  // One GenerateSummary (one per choice, index order) into result_.
  void Summary(const v1::GenerateSummary& s) {
    const size_t index = s.index();
    if (result_.choices.size() <= index) result_.choices.resize(index + 1);
    result_.choices[index] = {FromProto(s.finish_reason()), s.usage().completion_tokens()};
    result_.completion_tokens = 0;
    for (const auto& c : result_.choices) result_.completion_tokens += c.completion_tokens;
    if (index == 0) {
      result_.finish_reason = FromProto(s.finish_reason());
      result_.prompt_tokens = s.usage().prompt_tokens();
      result_.cached_tokens = s.usage().cached_tokens();
      result_.session_tokens = s.usage().session_tokens();
      result_.queue_seconds = s.timings().queue_seconds();
      result_.ttft_seconds = s.timings().time_to_first_token_seconds();
      result_.decode_tokens_per_second = s.timings().decode_tokens_per_second();
      result_.total_seconds = s.timings().total_seconds();
    }
    summarised_ = true;
  }

  std::unique_ptr<v1::Inference::Stub> stub_;
  const v1::GenerateRequest request_;
  grpc::ClientContext context_;
  v1::GenerateResponse msg_;  // the read in flight (one at a time)

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<session::GenerationEvent> events_;
  session::GenerationResult result_;  // complete once done_
  grpc::Status status_;
  std::string node_;
  bool started_ = false;     // a message arrived
  bool summarised_ = false;  // a summary arrived
  bool done_ = false;        // OnDone ran
};

// The router's lookup of `id`, waited for on this (HTTP worker) thread.
absl::StatusOr<std::string> LookupOwner(ServiceContext* ctx, const std::string& id,
                                        const Metadata& metadata, SystemTime deadline) {
  struct Answer {
    std::mutex mu;
    std::condition_variable cv;
    std::optional<absl::StatusOr<std::string>> owner;
  };
  auto answer = std::make_shared<Answer>();
  SessionRouter::LookupCall call;
  call.deadline = deadline;
  call.metadata = metadata;
  std::shared_ptr<SessionRouter::Pending> pending =
      ctx->router->Lookup(id, std::move(call), [answer](absl::StatusOr<std::string> owner) {
        std::lock_guard lock(answer->mu);
        answer->owner = std::move(owner);
        answer->cv.notify_all();
      });
  std::unique_lock lock(answer->mu);
  const SystemTime until = deadline == SystemTime::max()
                               ? std::chrono::system_clock::now() +
                                     ctx->config->peer_connect_timeout + kLookupSlack
                               : deadline + kLookupSlack;
  if (!answer->cv.wait_until(lock, until, [&] { return answer->owner.has_value(); })) {
    lock.unlock();
    if (pending) pending->Cancel();
    return absl::DeadlineExceededError(
        absl::StrCat("looking up the owner of session ", id, " outlived the request's deadline"));
  }
  return *std::move(answer->owner);
}

}  // namespace

bool ShouldRelay(const ServiceContext& ctx, const GenerationTarget& target, const Caller& caller) {
  if (target.session_id.empty() || ctx.router == nullptr || ctx.peers == nullptr) return false;
  if (!session::SessionStore::IsIdForm(target.session_id)) return false;
  if (ctx.store->Get(target.session_id, caller.sessions()).has_value()) return false;
  return !ctx.peers->Peers(PeerDialer::Wait::kNo).empty();
}

absl::StatusOr<std::optional<Relayed>> RelayToOwner(ServiceContext* ctx, const Caller& caller,
                                                    const session::GenerationRequest& g,
                                                    const GenerationTarget& target,
                                                    std::string_view traceparent) {
  // Checked here first, as a request run here is (PlanRequest's checks but
  // the context's, which needs the owner's session): the response is built
  // here for g.n choices, and the owner gets only what the wire can carry.
  CORTIQ_RETURN_IF_ERROR(session::CheckRequestFields(g, PlanLimitsOf(*ctx), ctx->model->config()));
  CORTIQ_ASSIGN_OR_RETURN(const v1::GenerateRequest request, ToRelayedRequest(g, target));
  const std::string& id = target.session_id;
  const Metadata on_behalf = OnBehalfMetadata(*ctx, caller, traceparent);
  Metadata call_metadata = on_behalf;
  call_metadata.emplace_back(kHopsHeader, "1");  // an HTTP request is a client's own call
  const SystemTime deadline = ToSystem(g.deadline);
  std::optional<std::string> owner = ctx->router->Known(id);
  bool known = owner.has_value();  // a record or the cache: may be stale, worth one retry
  bool retried = false;
  // A stale known owner: forgotten, and one fresh lookup (true); else false.
  auto retry = [&] {
    ctx->router->Stale(id, *owner);
    if (!known || retried) return false;
    retried = true;
    owner.reset();
    return true;
  };
  for (;;) {
    if (!owner) {
      absl::StatusOr<std::string> found = LookupOwner(ctx, id, on_behalf, deadline);
      if (absl::IsNotFound(found.status())) return std::nullopt;  // nowhere: create it here
      if (absl::IsUnavailable(found.status())) {
        // Not on any peer that answered, and some did not. An HTTP client
        // resends the whole conversation, so a session made here answers it
        // correctly (prefilling it all); refusing would make one dead peer
        // stop every new conversation. gRPC create_if_missing, whose callers
        // may rely on the session's state, refuses instead.
        // Asked again by the reaper until every peer answers: a copy a
        // silent peer turns out to hold wins, this one is released.
        spdlog::warn("session {}: created here, its owner unknown: {}", id,
                     std::string(found.status().message()));
        std::lock_guard lock(ctx->unsettled_mu);
        if (ctx->unsettled.size() < ServiceContext::kMaxUnsettled) ctx->unsettled.insert(id);
        return std::nullopt;
      }
      if (!found.ok()) return found.status();
      owner = *std::move(found);
      known = false;
    }
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = ctx->peers->Channel(*owner);
    if (!channel.ok()) {  // no longer a peer (a DNS peer that left)
      if (retry()) continue;
      return channel.status();
    }
    auto remote = std::make_unique<RemoteGeneration>(*channel, request, call_metadata, deadline);
    if (!remote->WaitStarted(g.deadline)) {
      return absl::DeadlineExceededError(
          absl::StrCat("session ", id, ": its owner ", *owner, " sent nothing before the deadline"));
    }
    if (const grpc::Status st = remote->EndedEmpty(); !st.ok()) {
      if (StaleOwner(st) && retry()) continue;
      return FromGrpc(st);
    }
    std::string node = remote->node();
    if (node.empty()) node = *owner;
    return std::optional<Relayed>(Relayed{.stream = std::move(remote), .node = std::move(node)});
  }
}

}  // namespace cortiq::server::http
