// The HTTP front's relay of a conversation to the node that owns its session.
//
// An HTTP generation that names a conversation (x-cortiq-session, or the user
// field with --session-from-user) continues one session. When this node has
// peers and does not hold that session, the owner is found as the gRPC
// forwarding finds it (server/forwarding.h, SessionRouter: a forwarding
// record, a cached owner, or GetSession asked of every peer at once, within
// --peer-connect-timeout and the request's deadline) and the generation runs
// THERE, through a gRPC Generate call: the session's history is not prefilled
// again on this node, and no second copy of the session is made here.
//
// The call: the PeerDialer's channel to the owner, the peer token as its
// bearer token, the caller's tenant and role (x-cortiq-on-behalf-of: the
// owner applies the same permissions and tenant), x-cortiq-hops 1, the HTTP
// request's traceparent, the request's deadline; the request is the prepared
// session::GenerationRequest as a GenerateRequest (prompt_tokens, sampling
// with penalties and logit_bias, stop, stop_token_ids, min_tokens, n,
// logprobs / top_logprobs, ignore_eos, reuse_prefix, priority) with session_id,
// create_if_missing and keep_session. Its events come back as a
// GenerationStream, so the answer is written as a local one is.
//
// No node holds the session (every peer answered NOT_FOUND): nullopt, the
// caller creates it here as without peers. Some peers silent (UNAVAILABLE):
// nullopt too, with a warning — the session may be on one of them, but an
// HTTP client resends the whole conversation, so a session made here answers
// it correctly (prefilled whole), where refusing would let one dead peer stop
// every new conversation (the gRPC create_if_missing, whose callers may
// depend on the session's own state, refuses instead). A known owner (record, cache) that proves stale — UNAVAILABLE or
// NOT_FOUND before it sent anything — is forgotten and one fresh lookup
// runs, as the gRPC forwarding does.
//
// Threads: RelayToOwner blocks the calling HTTP worker (not a gRPC callback
// thread) for the lookup and until the owner's first message or answer, at
// most the deadline. The stream's events arrive on gRPC's client callback
// threads, which never block; destroying the stream cancels the call and
// waits for gRPC's last callback (immediate once cancelled).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "cortiq/v1/inference.pb.h"
#include "server/auth.h"
#include "server/generation.h"
#include "server/http/generation_stream.h"
#include "server/service.h"

namespace cortiq::server::http {

struct Relayed {
  std::unique_ptr<GenerationStream> stream;
  std::string node;  // the owner's name (its x-cortiq-node), else its address
};

// True when the HTTP generation for `target` should run on another node:
// it names a session (a conversation), this node has peers, and the session
// is not here for `caller` (another tenant's is taken as absent).
bool ShouldRelay(const ServiceContext& ctx, const GenerationTarget& target, const Caller& caller);

// Runs `g` on the owner of target.session_id (see the banner): the relayed
// stream; nullopt when no node holds the session (serve it here); or the
// error that ended it before anything was generated: INVALID_ARGUMENT from
// session::CheckRequestFields against this node's limits (every check of a
// request run here but the context's, made before any peer is asked), the
// lookup's UNAVAILABLE / RESOURCE_EXHAUSTED / DEADLINE_EXCEEDED, the owner's
// answer (INVALID_ARGUMENT, ABORTED, ...). Call only when ShouldRelay.
absl::StatusOr<std::optional<Relayed>> RelayToOwner(ServiceContext* ctx, const Caller& caller,
                                                    const session::GenerationRequest& g,
                                                    const GenerationTarget& target,
                                                    std::string_view traceparent);

// `g` and `t` as the owner's GenerateRequest; INVALID_ARGUMENT naming
// max_tokens, min_tokens or n when one is above what the wire's uint32
// holds (RelayToOwner's checks refuse those first). Pure.
absl::StatusOr<v1::GenerateRequest> ToRelayedRequest(const session::GenerationRequest& g,
                                                     const GenerationTarget& t);

}  // namespace cortiq::server::http
