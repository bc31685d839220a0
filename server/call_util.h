// Shared by the service's handlers: who the caller is and what it may call
// (server/auth.h), the per-call log line and request metrics, the typed
// view of the raw (byte) API, common validation, and proto conversions.
//
// Authorization has one gate per kind of call: ServeUnary for every unary
// RPC (before the request is parsed or any handler runs), the Generate,
// ExportSession and ImportSession reactors at their start. Each asks
// Authorize(ctx, call, rpc) and hands the Caller on; the session RPCs pass
// Caller::sessions() to the store, whose lookups hide other tenants'
// sessions.
#pragma once

#include <chrono>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/session/engine.h"
#include "core/session/session_store.h"
#include "core/util/strings.h"
#include "core/util/tsan_annotations.h"
#include "cortiq/v1/inference.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "server/auth.h"
#include "server/forward.h"
#include "server/log_format.h"
#include "server/service.h"
#include "server/status_util.h"

namespace cortiq::server {

using session::Clock;
using session::Seconds;

// The call's caller from its "authorization: Bearer <token>" and
// x-cortiq-on-behalf-of metadata (Authenticator::Authenticate: admin of
// tenant "" when the server has no token; UNAUTHENTICATED for a missing or
// unknown token; constant-time lookup).
absl::StatusOr<Caller> Authenticate(const ServiceContext& ctx,
                                    const grpc::CallbackServerContext* call);
// Authenticate, then CheckPermission(caller, rpc): PERMISSION_DENIED naming
// the RPC and the role when the role may not call it.
absl::StatusOr<Caller> Authorize(const ServiceContext& ctx, const grpc::CallbackServerContext* call,
                                 std::string_view rpc);
// Authenticate's status: UNAUTHENTICATED or OK. The permission is checked
// by the gates (see the banner); this is for a handler behind one.
absl::Status CheckAuth(const ServiceContext& ctx, const grpc::CallbackServerContext* call);
// The value of the call's metadata `key` (lower case), nullopt when absent;
// valid while the call is.
std::optional<std::string_view> ClientMetadata(const grpc::CallbackServerContext* call,
                                               std::string_view key);

// Adds kNodeMetadata (server/forward.h) = this node's name to the call's initial metadata: every
// call this node serves itself (a call it forwards carries the owner's).
// Before the call's first write or its finish.
void AddNodeMetadata(const ServiceContext& ctx, grpc::CallbackServerContext* call);

// UNAVAILABLE while the server drains.
absl::Status Unavailable(const ServiceContext& ctx);

// Queues `task`, the set-up of a call on the spilled session `id`, on
// ctx.read_back. OK when queued; else what the call answers: UNAVAILABLE
// once the server is stopping, RESOURCE_EXHAUSTED naming the session when
// the queue is full.
absl::Status SubmitReadBack(const ServiceContext& ctx, const std::string& id,
                            std::function<void()> task);
// INVALID_ARGUMENT for an empty or oversize session id.
absl::Status CheckSessionId(const std::string& id);

v1::KvDtype ToProto(kv::KvMode m);
std::string LayersSpec(const std::vector<size_t>& layers);
void ToProto(const session::SessionConfig& c, v1::SessionConfig* out);
void ToProto(const session::MemoryByKind& m, v1::SessionMemory* out);
// `node`: the node that holds the session (SessionInfo.node).
void ToProto(const session::SessionSnapshot& s, std::string_view node, v1::SessionInfo* out);
v1::FinishReason ToProto(session::FinishReason r);
v1::Priority ToProto(session::Priority p);
// GenerateRequest.priority: UNSPECIFIED is kNormal; a value outside the enum
// (a newer client's, or a forged one) is INVALID_ARGUMENT naming the field
// and the allowed values.
absl::StatusOr<session::Priority> PriorityFromProto(v1::Priority p);

// ---- one log line and the request metrics per call ----

// True when `v` is a W3C trace context traceparent of version 00:
// "00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>", lowercase, ids
// not all zero. Anything else is not logged and not forwarded.
bool IsValidTraceparent(std::string_view v);

// Adds `traceparent` (a call's CallLog::traceparent()) to an outgoing call to
// a peer made on that call's behalf, so the peer logs the same trace. The
// value is passed through unchanged (the server opens no span of its own);
// an empty or invalid one adds nothing.
void ForwardTraceContext(std::string_view traceparent, grpc::ClientContext& c);

class CallLog {
 public:
  // Starts the call's clock; keeps the caller's address (call->peer()), its
  // "traceparent" metadata when valid (IsValidTraceparent), and its tenant
  // and role when it authenticates (Authenticate: one SHA-256 of the token
  // and a compare per configured token; never the token itself).
  CallLog(ServiceContext* ctx, const grpc::CallbackServerContext* call, std::string_view rpc);

  uint64_t id() const { return id_; }
  // The caller's traceparent, or "" when it sent none or an invalid one.
  const std::string& traceparent() const { return traceparent_; }

  // Counts the call in the request metrics and writes its line (LogRequest,
  // in --log-format). `message` and the string fields may quote what a
  // client sent: they are escaped for the format, so no client string can
  // forge or split a line. Call once, when the call ends.
  void Done(grpc::StatusCode code, std::string_view message, LogFields fields = {});

 private:
  ServiceContext* ctx_;
  std::string_view rpc_;
  uint64_t id_;
  Clock::time_point start_;
  std::string peer_;
  std::string traceparent_;
  std::optional<Caller> caller_;  // nullopt: the call did not authenticate
};

// ---- the raw (byte) API, seen typed ----
//
// Every method of the service is registered on gRPC's raw callback API, so
// that a request which does not parse reaches the server's code (gRPC's
// typed handlers answer it UNIMPLEMENTED, unlogged) and gets
// INVALID_ARGUMENT, logged and counted like any other error. The handlers
// stay typed: ServeUnary parses the request and serialises the response.

// Parses a request that arrived as bytes. One that does not parse is
// INVALID_ARGUMENT naming the RPC and the message type, unless the call
// fails Authorize(rpc), which answers first (UNAUTHENTICATED,
// PERMISSION_DENIED).
template <typename Request>
absl::StatusOr<Request> ParseRequest(const ServiceContext& ctx,
                                     const grpc::CallbackServerContext* call, std::string_view rpc,
                                     const grpc::ByteBuffer& bytes) {
  Request request;
  grpc::ByteBuffer copy(bytes);  // shares the slices; Deserialize consumes its buffer
  if (grpc::SerializationTraits<Request>::Deserialize(&copy, &request).ok()) return request;
  absl::StatusOr<Caller> auth = Authorize(ctx, call, rpc);
  if (!auth.ok()) return auth.status();
  return absl::InvalidArgumentError(absl::StrCat(util::Sv(rpc), ": the request is not a ",
                                                 Request::descriptor()->full_name(), " (",
                                                 bytes.Length(), " bytes do not parse)"));
}

// The reactor of a unary call, as its typed handler sees it. Reply
// serialises the typed response into the call's bytes (when `status` is OK)
// and finishes the call; ReplyRaw finishes it with the bytes already in
// response_bytes() (a relay wrote them: server/forward.h). Exactly one Reply
// or ReplyRaw per call, from any thread.
class UnaryReactor : public grpc::ServerUnaryReactor {
 public:
  virtual void Reply(const grpc::Status& status) = 0;
  // Finishes the call without serialising: the response is whatever
  // response_bytes() holds (sent only when `status` is OK).
  virtual void ReplyRaw(const grpc::Status& status) = 0;
  // The call's request as it arrived, and its response buffer; both owned by
  // gRPC, valid until the call is finished (Reply/ReplyRaw).
  virtual const grpc::ByteBuffer& request_bytes() const = 0;
  virtual grpc::ByteBuffer* response_bytes() = 0;

  // The authorized caller: ServeUnary sets it before the typed handler
  // runs (the only way a handler gets this reactor).
  const Caller& caller() const { return caller_; }
  void set_caller(Caller caller) { caller_ = std::move(caller); }

  // Runs `cancel` when the caller cancels the call or its deadline passes
  // (on a gRPC thread: it must not block), or at once if that has happened.
  void OnCancelled(std::function<void()> cancel) {
    {
      std::lock_guard lock(cancel_mu_);
      if (!cancelled_) {
        on_cancel_ = std::move(cancel);
        return;
      }
    }
    cancel();
  }
  void OnCancel() override {
    util::TsanAcquire(this);  // after the handler's return (ServeUnary)
    std::function<void()> cancel;
    {
      std::lock_guard lock(cancel_mu_);
      cancelled_ = true;
      cancel = std::move(on_cancel_);
    }
    if (cancel) cancel();
  }

 private:
  std::mutex cancel_mu_;
  bool cancelled_ = false;
  std::function<void()> on_cancel_;
  Caller caller_;
};

// Owns a unary call's typed request and response until gRPC is done with
// the call (OnDone deletes it), so a handler that answers later (on the
// background workers) may keep pointers to both until it has replied.
template <typename Request, typename Response>
class TypedUnaryReactor final : public UnaryReactor {
 public:
  TypedUnaryReactor(const ServiceContext& ctx, grpc::CallbackServerContext* call,
                    const grpc::ByteBuffer* request_bytes, grpc::ByteBuffer* response_bytes)
      : ctx_(ctx), call_(call), request_bytes_(request_bytes), response_bytes_(response_bytes) {}

  // Served here: the reply names this node (AddNodeMetadata).
  void Reply(const grpc::Status& status) override {
    AddNodeMetadata(ctx_, call_);
    if (status.ok()) {
      bool own = false;
      // Fails only for a message over 2 GiB, which no response comes near.
      const grpc::Status s =
          grpc::SerializationTraits<Response>::Serialize(response, response_bytes_, &own);
      if (!s.ok()) {
        util::TsanRelease(this);
        Finish(s);
        return;
      }
    }
    util::TsanRelease(this);  // OnDone (another thread) destroys what Reply wrote
    Finish(status);
  }
  void ReplyRaw(const grpc::Status& status) override {
    util::TsanRelease(this);
    Finish(status);
  }
  const grpc::ByteBuffer& request_bytes() const override { return *request_bytes_; }
  grpc::ByteBuffer* response_bytes() override { return response_bytes_; }
  void OnDone() override {
    util::TsanAcquire(this);
    delete this;
  }

  Request request;
  Response response;

 private:
  const ServiceContext& ctx_;
  grpc::CallbackServerContext* call_;
  const grpc::ByteBuffer* request_bytes_;  // the call's request, owned by gRPC
  grpc::ByteBuffer* response_bytes_;       // the call's response, owned by gRPC
};

// Serves one unary call of the raw API with a typed handler
// `handler(call, const Request*, Response*, UnaryReactor*)`, which returns
// the reactor and replies on it (now or later). The gate of every unary
// RPC: a caller that is not authorized for `rpc` (Authorize), or a request
// that does not parse, is answered here, logged and counted as `rpc`; the
// handler runs with reactor->caller() set.
template <typename Request, typename Response, typename Handler>
grpc::ServerUnaryReactor* ServeUnary(ServiceContext* ctx, grpc::CallbackServerContext* call,
                                     std::string_view rpc, const grpc::ByteBuffer* request_bytes,
                                     grpc::ByteBuffer* response_bytes, Handler&& handler) {
  auto* reactor = new TypedUnaryReactor<Request, Response>(*ctx, call, request_bytes, response_bytes);
  absl::StatusOr<Caller> caller = Authorize(*ctx, call, rpc);
  absl::Status refused = caller.status();
  if (refused.ok()) {
    absl::StatusOr<Request> request = ParseRequest<Request>(*ctx, call, rpc, *request_bytes);
    if (request.ok()) {
      reactor->set_caller(*std::move(caller));
      reactor->request = *std::move(request);
      // OnCancel (another thread, after the handler returns) reads what was
      // written above: TSan cannot see gRPC's handoff. Released here, not
      // after the handler: a handler that replied has finished the call, and
      // OnDone may have deleted the reactor by the time the handler returns.
      // What the handler writes for OnCancel it writes under the reactor's
      // lock (OnCancelled); what it writes for OnDone, Reply releases.
      util::TsanRelease(static_cast<UnaryReactor*>(reactor));
      return handler(call, &reactor->request, &reactor->response, reactor);
    }
    refused = request.status();
  }
  CallLog log(ctx, call, rpc);
  const grpc::Status gs = ToGrpcStatus(refused);
  log.Done(gs.error_code(), gs.error_message());
  reactor->Reply(gs);
  return reactor;
}

// Runs a unary handler body `body(const Caller&)` with logging and metrics
// around it, and replies on `reactor` (ServeUnary authorized the caller);
// `fields` go into the call's log line.
template <typename Body>
grpc::ServerUnaryReactor* Unary(ServiceContext* ctx, grpc::CallbackServerContext* call,
                                UnaryReactor* reactor, std::string_view rpc, Body&& body,
                                LogFields fields = {}) {
  CallLog log(ctx, call, rpc);
  absl::Status st = body(reactor->caller());
  grpc::Status gs = ToGrpcStatus(st);
  log.Done(gs.error_code(), gs.error_message(), std::move(fields));
  reactor->Reply(gs);
  return reactor;
}

}  // namespace cortiq::server
