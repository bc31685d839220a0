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
//  - ForwardUnary / ForwardUnaryCall / ForwardUnaryLater: one unary call.
//    The upstream status (code, message, details) comes back unchanged; the
//    owner's `x-cortiq-node` initial metadata goes into the server call's
//    initial metadata before the reply, so the client sees which node
//    served it.
//  - ForwardStream / ForwardStreamLater: a ServerWriteReactor that relays a
//    server-streaming method (Generate, ExportSession) over a generic bidi
//    call to the owner: the request goes up once, each upstream message is
//    written down, one message in flight each way (the next is read only
//    after the previous downstream write finished: a slow client slows the
//    owner; the relay never holds more than one message of a stream).
//
// Deferred start: the owner may not be known yet when the handler must
// return (the service's lookup of the peers runs asynchronously).
// ForwardStreamLater / ForwardUnaryLater set the relay up without a target
// and hand back a ForwardPending; the caller calls exactly one of
// Begin(target) (the upstream call starts then) or Fail(status) (the call
// ends with it, answered by this node) later, from any thread.
// ForwardStream / ForwardUnaryCall are Later + Begin at once.
//
// Retry: an upstream attempt that failed before anything of it went down to
// the client (unary: any failure, the reply is one message; stream: no
// message read from that attempt) is offered to ForwardOptions::retry. When
// it says yes, nothing is answered: the attempt is retired (its client
// context and reactor are never reused) and the same ForwardPending takes
// one more Begin (another node) or Fail. Only the answering attempt's
// `x-cortiq-node` reaches the client; a retried attempt's headers are
// dropped. The relay sets no bound on retries: the caller's retry does.
//
// Deadline: the upstream call gets the server call's deadline. Cancellation:
// a cancel of the server call (client cancel, deadline, disconnect)
// TryCancels the upstream call; one that comes while no upstream call runs
// (before Begin, or while a retry waits for its Begin) ends the call
// CANCELLED at once, and the Begin or Fail that follows only frees. A node
// that forwards must not add its own `x-cortiq-node` to a forwarded call's
// response: the relay puts the owner's there (and `x-cortiq-forwarded-by:
// <this node>` when asked). What the relay answers itself (Fail, a cancel
// with no upstream call running, a target without a channel) carries
// `x-cortiq-node: <this node>` (ForwardOptions::forwarded_by) instead.
//
// Upstream failures are the upstream call's status, unchanged: an
// unreachable owner is UNAVAILABLE ("failed to connect to all addresses"),
// its deadline DEADLINE_EXCEEDED; the caller maps them if it wants another
// message.
//
// Example (a raw server-streaming handler whose owner a lookup finds, and
// retries once elsewhere when that owner no longer has the session; a typed
// unary one whose owner is known). FindOwner(id, pending) ends with
// pending->Begin(owner) or pending->Fail(NOT_FOUND ...), on its own thread.
//   grpc::ServerWriteReactor<grpc::ByteBuffer>* Generate(
//       grpc::CallbackServerContext* call, const grpc::ByteBuffer* request) {
//     auto slot = std::make_shared<ForwardPending*>();
//     auto tries = std::make_shared<int>(0);  // retry runs once per ended attempt
//     ForwardOptions options{
//         .metadata = {{"x-cortiq-hops", "1"}}, .forwarded_by = name,
//         .retry = [=, this](const grpc::Status& s) {
//           if (s.error_code() != grpc::StatusCode::NOT_FOUND || ++*tries > 1) return false;
//           FindOwner(id, *slot);  // the handle takes one more Begin or Fail
//           return true;
//         }};
//     auto [reactor, pending] = ForwardStreamLater(
//         "/cortiq.v1.Inference/Generate", call, *request, std::move(options),
//         [](const grpc::Status& s, uint64_t messages) { ...log... });
//     *slot = pending;  // before FindOwner: retry runs only after a Begin
//     FindOwner(id, pending);
//     return reactor;
//   }
//   ForwardUnaryCall(owner, "/cortiq.v1.Inference/GetSession", call, reactor, options, {});
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
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
  // When set, the attempt to this target carries these instead of
  // ForwardOptions::metadata (e.g. the caller's own credentials and the hop
  // limit, for a call relayed to this very node: forwarding.h).
  std::optional<std::vector<std::pair<std::string, std::string>>> metadata{};
};

// Counters of the relays that share it (ForwardOptions::stats); atomics,
// read from any thread. `read - written` is the number of messages the
// stream relays hold now (read from an owner, not yet written down).
struct ForwardStats {
  std::atomic<uint64_t> streams{0};  // stream relays set up (Later or not)
  // Upstream calls started, unary and stream: one per Begin that found the
  // call still open and the target's channel set (a retry is one more).
  std::atomic<uint64_t> attempts{0};
  std::atomic<uint64_t> read{0};  // messages read from owners
  // Messages that left a relay: their downstream write ended (ok or not),
  // or they were dropped because the downstream call was already over.
  std::atomic<uint64_t> written{0};
  // The most messages one relay held at once: 1 by design (0 before any).
  std::atomic<uint64_t> max_held{0};
};

// Every member has a default, so a designated initializer may name any of
// them (-Wmissing-field-initializers stays quiet).
struct ForwardOptions {
  // Added to the upstream call as they are (lower-case keys): the bearer
  // token ("authorization", "Bearer ..."), "x-cortiq-hops", "traceparent", ...
  std::vector<std::pair<std::string, std::string>> metadata{};
  // This node's name: sent down as `x-cortiq-forwarded-by` with an owner's
  // answer, and as `x-cortiq-node` with the relay's own (Fail, a cancel while
  // no upstream call runs, no channel); "" sends none.
  std::string forwarded_by{};
  // Relays count into it when set (shared; may outlive the relay).
  std::shared_ptr<ForwardStats> stats{};
  // Asked, on a gRPC thread and without any lock of the relay held, when an
  // upstream attempt ends with a status other than OK and nothing of it went
  // down to the client (unary: always; stream: no message was read from
  // that attempt) while the client's call is still open (not cancelled, its
  // deadline not passed). true: the relay answers nothing and its
  // ForwardPending takes one more Begin or Fail (called from inside retry,
  // or later from any thread); false: the status goes down as it came, and
  // no Begin or Fail may have been called. Empty: never asked. Must not
  // block. Only the Later forms use it (the others have no handle to call
  // Begin again).
  std::function<bool(const grpc::Status&)> retry{};
  // Unary relays: the owner's answer is awaited at most this long after the
  // relay starts (the upstream call's deadline, and the client's answer
  // DEADLINE_EXCEEDED), when the client's own deadline is later or absent:
  // an owner that hangs with its connection open (frozen, overloaded) never
  // holds a relay for ever. 0: the client's deadline alone.
  std::chrono::milliseconds unary_limit{0};
};

// The handle on a relay set up before its owner was known (ForwardStreamLater,
// ForwardUnaryLater). Exactly one of Begin or Fail per handing out: once
// after the Later call, and once more after each retry that returned true.
// Either may be called from any thread, even before the handler has
// returned its reactor; neither blocks. The handle is owned by the relay and
// valid until that Begin or Fail is called: do not touch it afterwards
// (until a retry hands it out again).
class ForwardPending {
 public:
  // Starts the upstream call to `target` now (a new client context each
  // time). If the client's call has already ended (cancel, deadline), starts
  // nothing and only frees. A target without a channel ends the call
  // INTERNAL, naming its address.
  virtual void Begin(const ForwardTarget& target) = 0;
  // Ends the client's call with `status`, answered by this node (not
  // offered to retry); only frees if the call has already ended.
  virtual void Fail(const grpc::Status& status) = 0;

 protected:
  ~ForwardPending() = default;  // the relay frees itself
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
// ForwardUnaryCall, which does it in order. options.retry is not used.
ForwardCancel ForwardUnary(const ForwardTarget& target, std::string method_path,
                           grpc::CallbackServerContext* call, const grpc::ByteBuffer& request,
                           grpc::ByteBuffer* response, ForwardOptions options,
                           std::function<void(const grpc::Status&)> done);

// A unary relay for a call answered through `reactor` (server/
// call_util.h), its upstream call started later: the request and response
// are the reactor's bytes, and the reactor's cancel (OnCancelled) is wired
// here, before anything can reply. Each Begin starts one upstream attempt
// with its own client context and response buffer; the attempt that
// answers (OK, or a failure retry declined) has its reply bytes moved into
// the reactor's response and its `x-cortiq-node` into `call`'s metadata.
// A cancel while an attempt runs TryCancels it (it then ends CANCELLED and
// answers); one while none runs replies CANCELLED (DEADLINE_EXCEEDED past
// the deadline) at once. However the call ends, `done` (may be empty;
// logging) sees the status first, then reactor->ReplyRaw(status) finishes
// the call: once, on a gRPC thread or that of the Begin or Fail that
// answered. Call from the handler (or before anything else may finish
// `reactor`).
ForwardPending* ForwardUnaryLater(std::string method_path, grpc::CallbackServerContext* call,
                                  UnaryReactor* reactor, ForwardOptions options,
                                  std::function<void(const grpc::Status&)> done);

// ForwardUnaryLater(...)->Begin(target): the owner is known now.
// options.retry is not used (nothing could call Begin again).
void ForwardUnaryCall(const ForwardTarget& target, std::string method_path,
                      grpc::CallbackServerContext* call, UnaryReactor* reactor,
                      ForwardOptions options, std::function<void(const grpc::Status&)> done);

// The end of a stream relay: the status the client was given (on a cancel,
// CANCELLED, or DEADLINE_EXCEEDED when the call's deadline had passed) and
// how many messages went down. Runs once, on a gRPC thread, when the server
// call is done and no upstream attempt runs or can start (a Begin or Fail
// still awaited then only frees); must not block.
using ForwardStreamDone = std::function<void(const grpc::Status& status, uint64_t messages)>;

// A stream relay: the reactor to return from the raw handler, and the
// handle that starts (or fails) its upstream call.
struct ForwardStreamStart {
  grpc::ServerWriteReactor<grpc::ByteBuffer>* reactor;
  ForwardPending* pending;
};

// A reactor that relays the server-streaming call `call` to `method_path`
// (see the banner) on the target a later pending->Begin names. Each Begin
// starts one upstream attempt (a new client context and client reactor;
// retired ones are kept until the relay is freed). The answering attempt's
// status ends the server call with the same code, message and details; its
// `x-cortiq-node` (and `x-cortiq-forwarded-by` when options.forwarded_by is
// set) goes down before the first message. The reactor deletes itself once
// gRPC is done with the server call and every attempt, `done` has run, and
// no Begin or Fail is awaited.
ForwardStreamStart ForwardStreamLater(std::string method_path, grpc::CallbackServerContext* call,
                                      const grpc::ByteBuffer& request, ForwardOptions options,
                                      ForwardStreamDone done);

// ForwardStreamLater(...) whose pending->Begin(target) runs here: the owner
// is known now. options.retry is not used (nothing could call Begin again).
grpc::ServerWriteReactor<grpc::ByteBuffer>* ForwardStream(
    const ForwardTarget& target, std::string method_path, grpc::CallbackServerContext* call,
    const grpc::ByteBuffer& request, ForwardOptions options, ForwardStreamDone done);

}  // namespace cortiq::server
