#include "core/model/sequence_kv.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/attention/qsa_attention.h"
#include "core/util/status_macros.h"

namespace cortiq::model {

attention::AttentionGeometry GeometryOf(const ModelConfig& config) {
  attention::AttentionGeometry g;
  g.hidden = static_cast<size_t>(config.hidden_size);
  g.num_q_heads = static_cast<size_t>(config.num_attention_heads);
  g.num_kv_heads = static_cast<size_t>(config.num_key_value_heads);
  g.head_dim = static_cast<size_t>(config.head_dim);
  g.max_positions = static_cast<size_t>(config.max_position_embeddings);
  g.scale = 1.0f / std::sqrt(static_cast<float>(config.head_dim));
  return g;
}

SequenceKv::SequenceKv(const ModelConfig& config, kv::KvMode mode) : geometry_(GeometryOf(config)) {
  config_.rows = mode;
  layers_.resize(static_cast<size_t>(config.num_hidden_layers));
  Remake();
}

void SequenceKv::Remake() {
  for (size_t l = 0; l < layers_.size(); ++l) {
    layers_[l] = attention::MakeLayerState(config_, l, geometry_);
  }
}

void SequenceKv::Reserve(size_t positions) {
  for (auto& l : layers_) l->Reserve(positions);
}

void SequenceKv::ReleaseUnused() {
  for (auto& l : layers_) l->ReleaseUnused();
}

absl::Status SequenceKv::CanTruncate(size_t n) const {
  if (n > position()) {
    return absl::InvalidArgumentError(
        absl::StrCat("truncate: ", n, " positions requested, the sequence holds ", position()));
  }
  for (const auto& l : layers_) CORTIQ_RETURN_IF_ERROR(l->CanTruncate(n));
  return absl::OkStatus();
}

absl::Status SequenceKv::TruncateLast(size_t n) {
  CORTIQ_RETURN_IF_ERROR(CanTruncate(n));
  for (auto& l : layers_) l->TruncateLast(n);
  return absl::OkStatus();
}

void SequenceKv::Release() {
  for (auto& l : layers_) l->Release();
}

size_t SequenceKv::MemoryBytes() const {
  size_t total = 0;
  for (const auto& l : layers_) total += l->MemoryBytes();
  return total;
}

attention::MemoryByKind SequenceKv::Memory() const {
  attention::MemoryByKind m;
  for (const auto& l : layers_) m += l->Memory();
  return m;
}

SequenceKv SequenceKv::Copy() const {
  SequenceKv out;
  out.geometry_ = geometry_;
  out.config_ = config_;
  out.layers_.reserve(layers_.size());
  for (const auto& l : layers_) out.layers_.push_back(l->Copy());
  return out;
}

absl::Status SequenceKv::CheckFresh(const char* mode) const {
  if (position() == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(mode, ": the sequence already holds ", position(), " positions; ", mode,
                   " attention is chosen before the first prefill"));
}

namespace {

// `config` with its layer list sorted and unique.
template <typename Config>
Config Normalised(Config config) {
  std::sort(config.layers.begin(), config.layers.end());
  config.layers.erase(std::unique(config.layers.begin(), config.layers.end()), config.layers.end());
  return config;
}

}  // namespace

template <typename Config>
absl::Status SequenceKv::Enable(std::optional<Config> attention::AttentionConfig::*field,
                                const Config& config, const char* mode) {
  CORTIQ_RETURN_IF_ERROR(CheckFresh(mode));
  attention::AttentionConfig next = config_;
  if (config.Enabled()) {
    next.*field = Normalised(config);
  } else {
    (next.*field).reset();
  }
  // The whole configuration is checked before anything changes.
  CORTIQ_RETURN_IF_ERROR(next.Validate(layers_.size()));
  config_ = std::move(next);
  Remake();
  return absl::OkStatus();
}

absl::Status SequenceKv::EnableO1(const kv::O1Config& config) {
  return Enable(&attention::AttentionConfig::o1, config, "o1");
}

absl::Status SequenceKv::EnableQsa(const QsaConfig& config) {
  return Enable(&attention::AttentionConfig::qsa, config, "qsa");
}

absl::Status SequenceKv::EnableWindow(const WindowConfig& config) {
  return Enable(&attention::AttentionConfig::window, config, "window");
}

absl::Status SequenceKv::Bind(const std::shared_ptr<attention::QsaRuntime>& runtime) {
  for (auto& l : layers_) CORTIQ_RETURN_IF_ERROR(l->Bind(runtime));
  return absl::OkStatus();
}

bool SequenceKv::AwaitsPromptEnd() const {
  return std::any_of(layers_.begin(), layers_.end(),
                     [](const auto& l) { return l->AwaitsPromptEnd(); });
}

size_t SequenceKv::CompletePrompt(size_t num_q_heads) {
  size_t done = 0;
  for (auto& l : layers_) done += l->CompletePrompt(num_q_heads) ? 1 : 0;
  return done;
}

const qsa::QsaSeqState* SequenceKv::qsa_state(size_t layer) const {
  if (layer >= layers_.size()) return nullptr;
  const auto* q = dynamic_cast<const attention::QsaAttention*>(layers_[layer].get());
  return q != nullptr ? q->state() : nullptr;
}

}  // namespace cortiq::model
