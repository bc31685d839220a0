// Shared by the service's handlers: the bearer-token check, the per-call log
// line and request metrics, common validation, and proto conversions.
#pragma once

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "cortiq/v1/inference.grpc.pb.h"
#include "core/session/engine.h"
#include "core/session/session_store.h"
#include "core/util/log_escape.h"
#include "server/service.h"
#include "server/status_util.h"
#include "spdlog/spdlog.h"

namespace cortiq::server {

using session::Clock;
using session::Seconds;

// UNAUTHENTICATED unless the call carries "authorization: Bearer <token>"
// (constant-time comparison) when the server has a token.
absl::Status CheckAuth(const ServiceContext& ctx, const grpc::CallbackServerContext* call);
// UNAVAILABLE while the server drains.
absl::Status Unavailable(const ServiceContext& ctx);
// INVALID_ARGUMENT for an empty or oversize session id.
absl::Status CheckSessionId(const std::string& id);

v1::KvDtype ToProto(kv::KvMode m);
std::string LayersSpec(const std::vector<size_t>& layers);
void ToProto(const session::SessionConfig& c, v1::SessionConfig* out);
void ToProto(const session::MemoryByKind& m, v1::SessionMemory* out);
void ToProto(const session::SessionSnapshot& s, v1::SessionInfo* out);
v1::FinishReason ToProto(session::FinishReason r);

// ---- one log line and the request metrics per call ----

class CallLog {
 public:
  CallLog(ServiceContext* ctx, std::string_view rpc)
      : ctx_(ctx), rpc_(rpc), id_(ctx->next_request_id.fetch_add(1)), start_(Clock::now()) {}

  uint64_t id() const { return id_; }

  // `message` and `detail` may quote what a client sent: both are escaped
  // (util::EscapeForLog), so no client string can forge or split a line.
  void Done(grpc::StatusCode code, std::string_view message, std::string_view detail = {}) {
    const double s = Seconds(Clock::now() - start_);
    if (ctx_->metrics) {
      ctx_->metrics->CountRequest(rpc_, static_cast<int>(code));
      ctx_->metrics->ObserveRequest(rpc_, s);
    }
    if (code == grpc::StatusCode::OK) {
      spdlog::info("req={} rpc={} code=OK{}{} dur_ms={:.1f}", id_, rpc_, detail.empty() ? "" : " ",
                   util::EscapeForLog(detail), s * 1e3);
    } else {
      spdlog::info("req={} rpc={} code={}{}{} dur_ms={:.1f} error=\"{}\"", id_, rpc_,
                   GrpcCodeName(static_cast<int>(code)), detail.empty() ? "" : " ",
                   util::EscapeForLog(detail), s * 1e3, util::EscapeForLog(message));
    }
  }

 private:
  ServiceContext* ctx_;
  std::string_view rpc_;
  uint64_t id_;
  Clock::time_point start_;
};

// Runs a unary handler body with auth, logging and metrics around it.
template <typename Body>
grpc::ServerUnaryReactor* Unary(ServiceContext* ctx, grpc::CallbackServerContext* call,
                                std::string_view rpc, Body&& body) {
  CallLog log(ctx, rpc);
  absl::Status st = CheckAuth(*ctx, call);
  if (st.ok()) st = body();
  grpc::Status gs = ToGrpcStatus(st);
  log.Done(gs.error_code(), gs.error_message());
  grpc::ServerUnaryReactor* reactor = call->DefaultReactor();
  reactor->Finish(gs);
  return reactor;
}

}  // namespace cortiq::server
