// The relay: forwards one call this node received to the node that can
// answer it (another cortiq node), transparently — same bytes, same status,
// deadline and cancellation passed through. Finding the owner is the
// caller's business (the service's lookup); this file only relays.
//
// Requests and responses stay bytes (gRPC's generic stub, TemplatedGeneric
// Stub<ByteBuffer, ByteBuffer>): nothing is parsed or re-serialised, so the
// relay works for every method and never changes a message.
//
// Both shapes run on gRPC's callback client API and never block the calling
// thread:
//  - ForwardUnary / ForwardUnaryCall: one unary call. The upstream status
//    (code, message, details) comes back unchanged; the owner's
//    `x-cortiq-node` initial metadata goes into the server call's initial
//    metadata before the reply, so the client sees which node served it.
//  - ForwardStream: a ServerWriteReactor that relays a server-streaming
//    method (Generate, ExportSession) over a generic bidi call to the owner:
//    the request goes up once, each upstream message is written down, one
//    message in flight each way (the next is read only after the previous
//    downstream write finished: a slow client slows the owner; the relay
//    never holds more than one message of a stream).
//
// Deadline: the upstream call gets the server call's deadline. Cancellation:
// a cancel of the server call (client cancel, deadline, disconnect)
// TryCancels the upstream call. A node that forwards must not add its own
// `x-cortiq-node` to a forwarded call's response: the relay puts the
// owner's there (and `x-cortiq-forwarded-by: <this node>` when asked).
//
// Upstream failures are the upstream call's status, unchanged: an
// unreachable owner is UNAVAILABLE ("failed to connect to all addresses"),
// its deadline DEADLINE_EXCEEDED; the caller maps them if it wants another
// message.
//
// Example (a raw server-streaming handler, and a typed unary one):
//   grpc::ServerWriteReactor<grpc::ByteBuffer>* Generate(
//       grpc::CallbackServerContext* call, const grpc::ByteBuffer* request) {
//     return ForwardStream(owner, "/cortiq.v1.Inference/Generate", call, *request,
//                          {.metadata = {{"x-cortiq-hops", "1"}}, .forwarded_by = name},
//                          [](const grpc::Status& s, uint64_t messages) { ...log... });
//   }
//   ForwardUnaryCall(owner, "/cortiq.v1.Inference/GetSession", call, reactor, options, {});
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "grpcpp/grpcpp.h"

namespace cortiq::server {

class UnaryReactor;  // server/call_util.h

// Response metadata: the node that served the call; and, on a forwarded
// call, the node that relayed it.
inline constexpr std::string_view kNodeMetadata = "x-cortiq-node";
inline constexpr std::string_view kForwardedByMetadata = "x-cortiq-forwarded-by";

// The node a call goes to: `channel` to it (shared; gRPC reconnects it as
// needed; a null one fails the call INTERNAL, naming `address`) and
// `address`, its name for messages (the relay does not dial it).
struct ForwardTarget {
  std::shared_ptr<grpc::Channel> channel;
  std::string address;
};

// Counters of the stream relays that share it (ForwardOptions::stats);
// atomics, read from any thread. `read - written` is the number of messages
// the relays hold now (read from an owner, not yet written down).
struct ForwardStats {
  std::atomic<uint64_t> streams{0};  // stream relays started
  std::atomic<uint64_t> read{0};     // messages read from owners
  // Messages that left a relay: their downstream write ended (ok or not),
  // or they were dropped because the downstream call was already over.
  std::atomic<uint64_t> written{0};
  // The most messages one relay held at once: 1 by design (0 before any).
  std::atomic<uint64_t> max_held{0};
};

struct ForwardOptions {
  // Added to the upstream call as they are (lower-case keys): the bearer
  // token ("authorization", "Bearer ..."), "x-cortiq-hops", "traceparent", ...
  std::vector<std::pair<std::string, std::string>> metadata;
  // This node's name: sent down as `x-cortiq-forwarded-by`; "" sends none.
  std::string forwarded_by;
  // Stream relays count into it when set (shared; may outlive the relay).
  std::shared_ptr<ForwardStats> stats;
};

// Cancels one forwarded unary call. Cancel() TryCancels the upstream call:
// thread-safe, idempotent, and safe at any time — before the call has
// started, while it runs, after it completed (then it does nothing). A copy
// refers to the same call; a default-constructed handle cancels nothing.
// Holds the call's client context until the last copy goes.
class ForwardCancel {
 public:
  ForwardCancel() = default;
  explicit ForwardCancel(std::shared_ptr<grpc::ClientContext> upstream)
      : upstream_(std::move(upstream)) {}
  void Cancel() const;

 private:
  std::shared_ptr<grpc::ClientContext> upstream_;
};

// Forwards one unary call: sends `request` (the server call's request bytes)
// to `method_path` ("/cortiq.v1.Inference/GetSession") on `target` with
// `call`'s deadline and `options.metadata`; the reply's bytes go into
// `*response` (the server call's response buffer), the owner's
// `x-cortiq-node` (and `x-cortiq-forwarded-by`) into `call`'s initial
// metadata, and then `done(status)` runs with the upstream status as it
// came. Returns at once; `done` runs exactly once, on a gRPC thread (it must
// not block), possibly before ForwardUnary returns.
//
// The caller finishes the server call from `done` (UnaryReactor::ReplyRaw),
// never before: `*response` and `call` are written until `done` runs. To
// pass a cancel through, the server call's OnCancel calls the returned
// handle's Cancel(); the upstream call then ends CANCELLED and `done` runs.
// Register that before the reply can free what OnCancel uses: in the
// handler (gRPC runs no reaction before the handler returns), or use
// ForwardUnaryCall, which does it in order.
ForwardCancel ForwardUnary(const ForwardTarget& target, std::string method_path,
                           grpc::CallbackServerContext* call, const grpc::ByteBuffer& request,
                           grpc::ByteBuffer* response, ForwardOptions options,
                           std::function<void(const grpc::Status&)> done);

// ForwardUnary for a call answered through `reactor` (server/call_util.h):
// the request and response are the reactor's bytes; the reactor's cancel
// (OnCancelled) is wired to the upstream call before the call starts; when
// the upstream call ends, `done` (may be empty; logging) sees its status and
// then reactor->ReplyRaw(status) finishes the call. Safe from any thread,
// in the handler or later.
void ForwardUnaryCall(const ForwardTarget& target, std::string method_path,
                      grpc::CallbackServerContext* call, UnaryReactor* reactor,
                      ForwardOptions options, std::function<void(const grpc::Status&)> done);

// The end of a stream relay: the status the client was given (on a cancel,
// CANCELLED, or DEADLINE_EXCEEDED when the call's deadline had passed) and
// how many messages went down. Runs once, on a gRPC thread, when both calls
// are done; must not block.
using ForwardStreamDone = std::function<void(const grpc::Status& status, uint64_t messages)>;

// A reactor that relays the server-streaming call `call` to `method_path`
// on `target` (see the banner); return it from the raw handler. The upstream
// call starts here. The upstream's status ends the server call with the same
// code, message and details; `x-cortiq-node` from the owner's initial
// metadata (and `x-cortiq-forwarded-by` when options.forwarded_by is set)
// goes down before the first message. The reactor deletes itself once gRPC
// is done with both calls (after `done`).
grpc::ServerWriteReactor<grpc::ByteBuffer>* ForwardStream(
    const ForwardTarget& target, std::string method_path, grpc::CallbackServerContext* call,
    const grpc::ByteBuffer& request, ForwardOptions options, ForwardStreamDone done);

}  // namespace cortiq::server
