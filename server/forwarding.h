// Forwarding: a call that names a session this node does not hold goes to
// the node that holds it, and the cluster-wide ListSessions.
//
// The service's handlers ask ShouldForward first: a call is forwarded when
// it names a session id this node does not hold for the caller (another
// tenant's session here is treated as absent, so the answer cannot tell the
// two apart), the call has not reached the hop limit (kMaxForwardHops: at
// the limit a node answers from its own sessions only), and the node has
// peers. Then ForwardUnaryToOwner / ForwardStreamToOwner find the owner
// (SessionRouter: a forwarding record, a cached owner, or a lookup of the
// peers) and relay the call there (server/forward.h): same bytes, same
// status, deadline and cancellation passed through.
//
// create_if_missing (Generate): a session that no peer holds — every peer
// answered the lookup NOT_FOUND — is created on this node, not NOT_FOUND:
// the relay's attempt goes to this node itself (ServiceContext::
// self_channel) with the caller's own credentials and the hop limit, so
// this node serves it as a local call and creates the session. A session
// a peer holds is forwarded as any other; silent peers (UNAVAILABLE) are
// not taken for absent: the session may be on one of them. Two nodes
// asked at once for the same new id may each create it (the lookup is not
// a lock); and an id another tenant holds on a peer is not seen by the
// lookup, so this node creates its own session under it.
//
// The forwarded call carries the peer token as its bearer token, the
// caller's tenant and role (x-cortiq-on-behalf-of: the owner applies the
// same permissions and tenant filter), the hop count plus one and the
// caller's traceparent. An owner that turns out stale — unreachable before
// it answered, or answering NOT_FOUND because the session moved on — is
// forgotten, and the call is retried once through a fresh lookup; only an
// attempt that sent nothing down to the client is retried, so a retried
// call was never half-served.
//
// Threads: everything here runs on gRPC's threads and never blocks; the
// lookups and the relays complete on gRPC's client callback threads.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "server/auth.h"
#include "server/call_util.h"
#include "server/service.h"
#include "server/session_router.h"

namespace cortiq::server {

// The hop count a call arrived with (x-cortiq-hops; 0 from a client).
int CallHops(const grpc::CallbackServerContext* call);

// What every call this node makes on `caller`'s behalf carries: the peer
// token as its bearer token, the caller's tenant and role
// (x-cortiq-on-behalf-of), and `traceparent` when it is a valid one. The
// gRPC forwarding and the HTTP front's relay (server/http/owner_relay.h).
std::vector<std::pair<std::string, std::string>> OnBehalfMetadata(const ServiceContext& ctx,
                                                                  const Caller& caller,
                                                                  std::string_view traceparent);

// An attempt's answer that says the owner it went to was stale: it could
// not be reached before answering, or it no longer holds the session (it
// moved on, or the node restarted). Nothing was served: safe to retry.
bool StaleOwner(const grpc::Status& status);

// True when a call naming `id` should go to another node (see the banner).
bool ShouldForward(const ServiceContext& ctx, const grpc::CallbackServerContext* call,
                   const std::string& id, const Caller& caller);

// Relays the unary call `rpc` (its request is reactor->request_bytes()) to
// the owner of `id` and replies on `reactor`: the owner's answer, or the
// lookup's NOT_FOUND / UNAVAILABLE. `nowhere`, when set, answers instead of
// the lookup's NOT_FOUND: it writes the call's response into
// reactor->response_bytes(), and the call ends OK (ReleaseSession:
// released = false, as for any unknown id: release is idempotent).
// Logs the call as `rpc` with the owner's address.
grpc::ServerUnaryReactor* ForwardUnaryToOwner(ServiceContext* ctx,
                                              grpc::CallbackServerContext* call,
                                              UnaryReactor* reactor, std::string_view rpc,
                                              const std::string& id, const Caller& caller,
                                              std::function<void()> nowhere = nullptr);

// The reactor that relays the server-streaming call `rpc` (Generate,
// ExportSession) with request bytes `request` to the owner of `id`. With
// `serve_here_if_nowhere` (a Generate with create_if_missing), a lookup
// that finds `id` nowhere relays the call to this node instead (see the
// banner).
grpc::ServerWriteReactor<grpc::ByteBuffer>* ForwardStreamToOwner(
    ServiceContext* ctx, grpc::CallbackServerContext* call, const grpc::ByteBuffer& request,
    std::string_view rpc, const std::string& id, const Caller& caller,
    bool serve_here_if_nowhere = false);

// Whether a request asks for its session to be created when no node holds
// it (GenerateRequest.create_if_missing); false for other requests.
inline bool CreatesIfMissing(const v1::GenerateRequest& request) {
  return request.create_if_missing();
}
template <typename Request>
bool CreatesIfMissing(const Request&) {
  return false;
}

// For a server-streaming call of the raw API (Generate, ExportSession):
// the relay to the owner when the request names a session another node
// holds (ShouldForward), else nullptr (this node serves the call, and
// answers any error: a request that does not parse, a caller not allowed).
template <typename Request>
grpc::ServerWriteReactor<grpc::ByteBuffer>* MaybeForwardStream(ServiceContext* ctx,
                                                               grpc::CallbackServerContext* call,
                                                               const grpc::ByteBuffer& bytes,
                                                               std::string_view rpc) {
  if (ctx->router == nullptr || CallHops(call) >= kMaxForwardHops) return nullptr;
  Request request;
  grpc::ByteBuffer copy(bytes);  // shares the slices; Deserialize consumes its buffer
  if (!grpc::SerializationTraits<Request>::Deserialize(&copy, &request).ok()) return nullptr;
  if (request.session_id().empty()) return nullptr;
  absl::StatusOr<Caller> caller = Authorize(*ctx, call, rpc);
  if (!caller.ok() || !ShouldForward(*ctx, call, request.session_id(), *caller)) return nullptr;
  return ForwardStreamToOwner(ctx, call, bytes, rpc, request.session_id(), *caller,
                              CreatesIfMissing(request));
}

// ListSessions with cluster = true: this node's sessions (`local`, already
// in *response) plus every peer's, asked in parallel (each answering its
// own, at the hop limit) within --peer-connect-timeout and the call's
// deadline; a peer that does not answer is named in unreachable_peers.
// Replies on `reactor` once all have answered; logs as ListSessions.
grpc::ServerUnaryReactor* ListClusterSessions(ServiceContext* ctx,
                                              grpc::CallbackServerContext* call,
                                              UnaryReactor* reactor,
                                              v1::ListSessionsResponse* response,
                                              const Caller& caller);

}  // namespace cortiq::server
