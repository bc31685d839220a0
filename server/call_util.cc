#include "server/call_util.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/util/status_macros.h"

namespace cortiq::server {

std::optional<std::string_view> ClientMetadata(const grpc::CallbackServerContext* call,
                                               std::string_view key) {
  const auto& md = call->client_metadata();
  auto it = md.find(grpc::string_ref(key.data(), key.size()));
  if (it == md.end()) return std::nullopt;
  return std::string_view(it->second.data(), it->second.size());
}

absl::StatusOr<Caller> Authenticate(const ServiceContext& ctx,
                                    const grpc::CallbackServerContext* call) {
  if (ctx.auth == nullptr) return absl::InternalError("no authenticator configured");
  return ctx.auth->Authenticate(ClientMetadata(call, "authorization"),
                                 ClientMetadata(call, kOnBehalfOfHeader));
}

absl::StatusOr<Caller> Authorize(const ServiceContext& ctx, const grpc::CallbackServerContext* call,
                                 std::string_view rpc) {
  CORTIQ_ASSIGN_OR_RETURN(Caller caller, Authenticate(ctx, call));
  CORTIQ_RETURN_IF_ERROR(CheckPermission(caller, rpc));
  return caller;
}

absl::Status CheckAuth(const ServiceContext& ctx, const grpc::CallbackServerContext* call) {
  return Authenticate(ctx, call).status();
}

// ---- the per-call log line ----

bool IsValidTraceparent(std::string_view v) {
  // "00-" trace id (32) "-" parent id (16) "-" flags (2): 55 characters.
  constexpr size_t kSize = 55, kTraceAt = 3, kParentAt = 36, kFlagsAt = 53;
  if (v.size() != kSize || v.substr(0, kTraceAt) != "00-" || v[kParentAt - 1] != '-' ||
      v[kFlagsAt - 1] != '-') {
    return false;
  }
  auto hex = [](std::string_view s) {
    return std::all_of(s.begin(), s.end(),
                       [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
  };
  auto nonzero = [](std::string_view s) {
    return std::any_of(s.begin(), s.end(), [](char c) { return c != '0'; });
  };
  const std::string_view trace = v.substr(kTraceAt, 32);
  const std::string_view parent = v.substr(kParentAt, 16);
  return hex(trace) && hex(parent) && hex(v.substr(kFlagsAt, 2)) && nonzero(trace) &&
         nonzero(parent);
}

void ForwardTraceContext(std::string_view traceparent, grpc::ClientContext& c) {
  if (IsValidTraceparent(traceparent)) c.AddMetadata("traceparent", std::string(traceparent));
}

CallLog::CallLog(ServiceContext* ctx, const grpc::CallbackServerContext* call, std::string_view rpc)
    : ctx_(ctx),
      rpc_(rpc),
      id_(ctx->next_request_id.fetch_add(1)),
      start_(Clock::now()),
      peer_(call->peer()) {
  if (const auto v = ClientMetadata(call, "traceparent"); v && IsValidTraceparent(*v)) {
    traceparent_ = std::string(*v);
  }
  if (absl::StatusOr<Caller> caller = Authenticate(*ctx, call); caller.ok()) {
    caller_ = *std::move(caller);
  }
}

void CallLog::Done(grpc::StatusCode code, std::string_view message, LogFields fields) {
  const double s = Seconds(Clock::now() - start_);
  if (ctx_->metrics) {
    ctx_->metrics->CountRequest(rpc_, static_cast<int>(code));
    ctx_->metrics->ObserveRequest(rpc_, s);
  }
  if (caller_) {
    fields.push_back({"tenant", caller_->tenant});
    fields.push_back({"role", std::string(RoleName(caller_->role))});
  }
  LogRequest({.request_id = id_,
              .rpc = rpc_,
              .code = GrpcCodeName(static_cast<int>(code)),
              .error = message,
              .duration_ms = s * 1e3,
              .peer = peer_,
              .traceparent = traceparent_,
              .fields = std::move(fields)});
}

// ---- conversions ----

v1::KvDtype ToProto(kv::KvMode m) {
  return m == kv::KvMode::kInt8 ? v1::KV_DTYPE_INT8 : v1::KV_DTYPE_F32;
}

std::string LayersSpec(const std::vector<size_t>& layers) {
  std::string s;
  for (size_t l : layers) absl::StrAppend(&s, s.empty() ? "" : ",", l);
  return s.empty() ? "none" : s;
}

void ToProto(const session::SessionConfig& c, v1::SessionConfig* out) {
  out->set_kv_dtype(ToProto(c.kv_mode));
  switch (c.attention) {
    case session::AttentionMode::kExact:
      out->set_attention(v1::ATTENTION_MODE_EXACT);
      break;
    case session::AttentionMode::kO1: {
      out->set_attention(v1::ATTENTION_MODE_O1);
      auto* o = out->mutable_o1();
      o->set_layers(LayersSpec(c.o1.layers));
      o->set_m(static_cast<uint32_t>(c.o1.m));
      o->set_window(static_cast<uint32_t>(c.o1.w));
      o->set_sink(static_cast<uint32_t>(c.o1.sink));
      o->set_rect(c.o1.rect == kv::O1Rect::kFm ? "fm" : "agg");
      break;
    }
    case session::AttentionMode::kQsa: {
      out->set_attention(v1::ATTENTION_MODE_QSA);
      auto* q = out->mutable_qsa();
      q->set_layers(LayersSpec(c.qsa.layers));
      q->set_ratio(static_cast<uint32_t>(c.qsa.ratio));
      q->set_budget(static_cast<uint32_t>(c.qsa.budget));
      break;
    }
    case session::AttentionMode::kWindow: {
      out->set_attention(v1::ATTENTION_MODE_WINDOW);
      auto* w = out->mutable_window();
      w->set_layers(LayersSpec(c.window.layers));
      w->set_sink(static_cast<uint32_t>(c.window.sink));
      w->set_window(static_cast<uint32_t>(c.window.window));
      break;
    }
  }
}

void ToProto(const session::MemoryByKind& m, v1::SessionMemory* out) {
  using session::MemoryKind;
  out->set_kv_f32_bytes(m[MemoryKind::kKvF32]);
  out->set_kv_int8_bytes(m[MemoryKind::kKvInt8]);
  out->set_o1_bytes(m[MemoryKind::kO1]);
  out->set_qsa_bytes(m[MemoryKind::kQsa]);
  out->set_total_bytes(m.total());
}

void ToProto(const session::SessionSnapshot& s, std::string_view node, v1::SessionInfo* out) {
  out->set_session_id(s.id);
  out->set_node(std::string(node));
  out->set_tenant(s.tenant);
  ToProto(s.config, out->mutable_config());
  out->set_tokens(s.tokens);
  out->set_cached_tokens(s.cached_tokens);
  ToProto(s.memory, out->mutable_memory());
  out->set_busy(s.busy);
  out->set_age_seconds(s.age_seconds);
  out->set_idle_seconds(s.idle_seconds);
  out->set_ttl_remaining_seconds(s.ttl_remaining_seconds);
  out->set_spilled(s.spilled);
  out->set_disk_bytes(s.disk_bytes);
  out->set_moving_to(s.moving_to);
}

v1::FinishReason ToProto(session::FinishReason r) {
  switch (r) {
    case session::FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case session::FinishReason::kStop:
      return v1::FINISH_REASON_STOP;
    case session::FinishReason::kEos:
      return v1::FINISH_REASON_EOS;
    case session::FinishReason::kCancelled:
      return v1::FINISH_REASON_CANCELLED;
    case session::FinishReason::kNone:
      break;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

v1::Priority ToProto(session::Priority p) {
  switch (p) {
    case session::Priority::kLow:
      return v1::PRIORITY_LOW;
    case session::Priority::kNormal:
      return v1::PRIORITY_NORMAL;
    case session::Priority::kHigh:
      return v1::PRIORITY_HIGH;
  }
  return v1::PRIORITY_NORMAL;
}

absl::StatusOr<session::Priority> PriorityFromProto(v1::Priority p) {
  switch (p) {
    case v1::PRIORITY_UNSPECIFIED:
    case v1::PRIORITY_NORMAL:
      return session::Priority::kNormal;
    case v1::PRIORITY_LOW:
      return session::Priority::kLow;
    case v1::PRIORITY_HIGH:
      return session::Priority::kHigh;
    default:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("priority: unknown value ", static_cast<int>(p),
                   " (PRIORITY_UNSPECIFIED = 0 (normal) | PRIORITY_LOW = 1 | PRIORITY_NORMAL = 2 | "
                   "PRIORITY_HIGH = 3)"));
}

void AddNodeMetadata(const ServiceContext& ctx, grpc::CallbackServerContext* call) {
  call->AddInitialMetadata(std::string(kNodeMetadata), ctx.node_name);
}

absl::Status CheckSessionId(const std::string& id) {
  if (id.empty()) return absl::InvalidArgumentError("session_id: empty");
  if (id.size() > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("session_id: ", id.size(), " bytes, at most 64"));
  }
  return absl::OkStatus();
}

absl::Status Unavailable(const ServiceContext& ctx) {
  if (ctx.draining.load()) {
    return session::SessionStore::DrainingRefusal();
  }
  return absl::OkStatus();
}

absl::Status SubmitReadBack(const ServiceContext& ctx, const std::string& id,
                            std::function<void()> task) {
  absl::Status st = ctx.read_back->Submit(std::move(task));
  if (st.ok() || absl::IsUnavailable(st)) return st;  // (UNAVAILABLE: stopping)
  return absl::ResourceExhaustedError(
      absl::StrCat("session '", id,
                   "' is spilled to disk and too many calls wait for theirs to be read back: ",
                   st.message()));
}

}  // namespace cortiq::server
