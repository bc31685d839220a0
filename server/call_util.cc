#include "server/call_util.h"

#include "absl/strings/str_cat.h"

namespace cortiq::server {

namespace {

bool ConstantTimeEqual(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

absl::Status CheckAuth(const ServiceContext& ctx, const grpc::CallbackServerContext* call) {
  const std::string& token = ctx.config->auth_token;
  if (token.empty()) return absl::OkStatus();
  const auto& md = call->client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) {
    return absl::UnauthenticatedError("missing 'authorization: Bearer <token>' metadata");
  }
  std::string_view value(it->second.data(), it->second.size());
  constexpr std::string_view kBearer = "Bearer ";
  if (value.substr(0, kBearer.size()) != kBearer ||
      !ConstantTimeEqual(value.substr(kBearer.size()), token)) {
    return absl::UnauthenticatedError("invalid bearer token");
  }
  return absl::OkStatus();
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

void ToProto(const session::SessionSnapshot& s, v1::SessionInfo* out) {
  out->set_session_id(s.id);
  ToProto(s.config, out->mutable_config());
  out->set_tokens(s.tokens);
  out->set_cached_tokens(s.cached_tokens);
  ToProto(s.memory, out->mutable_memory());
  out->set_busy(s.busy);
  out->set_age_seconds(s.age_seconds);
  out->set_idle_seconds(s.idle_seconds);
  out->set_ttl_remaining_seconds(s.ttl_remaining_seconds);
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
    return absl::UnavailableError("server is draining: no new sessions or generations");
  }
  return absl::OkStatus();
}

}  // namespace cortiq::server
