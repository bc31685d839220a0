#include "core/session/session.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
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

namespace {

size_t RoundUp64(size_t n) { return (n + 63) / 64 * 64; }

size_t NextPow2(size_t n) {
  size_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

}  // namespace

size_t ProjectedSessionBytes(const model::ModelConfig& model, const SessionConfig& config,
                             size_t positions, size_t prompt_positions) {
  const size_t layers = static_cast<size_t>(model.num_hidden_layers);
  const size_t kv_heads = static_cast<size_t>(model.num_key_value_heads);
  const size_t heads = static_cast<size_t>(model.num_attention_heads);
  const size_t hd = static_cast<size_t>(model.head_dim);
  const size_t exact = kv::LayerKvCache::ProjectedBytes(kv_heads, hd, config.kv_mode, positions);
  size_t total = 0;
  for (size_t l = 0; l < layers; ++l) {
    if (config.attention == AttentionMode::kWindow && config.window.IsWindowLayer(l)) {
      total += config.window.LayerBytes(kv_heads, hd);  // constant: sink + window rows
      continue;
    }
    total += exact;
    if (config.attention == AttentionMode::kO1 && config.o1.IsO1Layer(l)) {
      // Peak while sealing: the prompt's query trace (grown geometrically)
      // and the new states are held next to the exact rows.
      const size_t m = config.o1.m, w = config.o1.w, sink = config.o1.sink;
      total += NextPow2(prompt_positions) * heads * hd * sizeof(float);
      const size_t group = ((w + sink + 8) * 2 * hd + m * hd) * sizeof(float);
      const size_t head = (2 * m * hd + m * m + 4 * m) * sizeof(double);
      total += kv_heads * group + heads * head;
    } else if (config.attention == AttentionMode::kQsa && config.qsa.IsQsaLayer(l)) {
      // Raw keys bf16 [capacity × hd] + block keys bf16 [capacity / ratio × hd].
      const size_t ratio = std::max<size_t>(config.qsa.ratio, 1);
      total += RoundUp64(positions * hd * 2) + RoundUp64((positions / ratio + 1) * hd * 2);
    }
  }
  return total;
}

}  // namespace cortiq::session
