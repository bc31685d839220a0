#include "core/session/session.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/session/request_plan.h"
#include "core/util/status_macros.h"

namespace cortiq::session {

std::string_view AttentionModeName(AttentionMode mode) {
  switch (mode) {
    case AttentionMode::kExact:
      return "exact";
    case AttentionMode::kO1:
      return "o1";
    case AttentionMode::kQsa:
      return "qsa";
    case AttentionMode::kWindow:
      return "window";
  }
  return "unknown";
}

Session::Session(std::string id, const model::ModelConfig& config,
                 const SessionConfig& session_config)
    : id_(std::move(id)),
      config_(session_config),
      created_(Clock::now()),
      kv_(config, session_config.kv_mode),
      num_attention_heads_(config.num_attention_heads),
      vocab_size_(config.vocab_size) {}

absl::StatusOr<std::unique_ptr<Session>> Session::Create(std::string id,
                                                         const model::Transformer& model,
                                                         const SessionConfig& config) {
  std::unique_ptr<Session> s(new Session(std::move(id), model.config(), config));
  switch (config.attention) {
    case AttentionMode::kExact:
      break;
    case AttentionMode::kO1:
      CORTIQ_RETURN_IF_ERROR(s->kv_.EnableO1(config.o1));
      break;
    case AttentionMode::kQsa:
      CORTIQ_RETURN_IF_ERROR(s->kv_.EnableQsa(config.qsa));
      break;
    case AttentionMode::kWindow:
      CORTIQ_RETURN_IF_ERROR(s->kv_.EnableWindow(config.window));
      break;
  }
  return s;
}

void Session::PublishMemory() {
  const MemoryByKind m = MemoryOf(kv_);
  for (size_t i = 0; i < kNumMemoryKinds; ++i) {
    memory_[i].store(m.bytes[i], std::memory_order_relaxed);
  }
  published_tokens_.store(tokens_.size(), std::memory_order_relaxed);
  published_cached_.store(kv_.position(), std::memory_order_relaxed);
}

void Session::ReleaseState() {
  kv_.Release();
  PublishMemory();
}

MemoryByKind Session::Memory() const {
  MemoryByKind m;
  for (size_t i = 0; i < kNumMemoryKinds; ++i) {
    m.bytes[i] = memory_[i].load(std::memory_order_relaxed);
  }
  return m;
}

size_t ProjectedSessionBytes(const model::ModelConfig& model, const SessionConfig& config,
                             size_t positions, size_t prompt_positions) {
  return ProjectedSessionMemory(model, config, positions, prompt_positions).total();
}

}  // namespace cortiq::session
