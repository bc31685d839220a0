// SequenceKv: the attention state of one sequence — one LayerAttentionState
// per layer (core/attention), each made by the registered mode that claims
// its layer under the sequence's attention::AttentionConfig (exact f32 or
// int8 rows, O(1) Nyström, QSA, sink + window). Owned by a session; the
// forward pass (Transformer) extends it through the states' interface.
//
// Configuration: the row type at construction; one optional mode chosen by
// EnableO1 / EnableQsa / EnableWindow on a fresh sequence (position 0),
// which re-makes the layers' states. Modes do not compose (InvalidArgument).
//
// Ownership: owns its states; move-only, deep copies are explicit (Copy()).
// Thread-safety: one thread at a time (the session lease).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/attention/layer_attention_state.h"
#include "core/attention/qsa_runtime.h"
#include "core/attention/registry.h"
#include "core/kv/layer_kv_cache.h"
#include "core/kv/o1_config.h"
#include "core/model/model_config.h"
#include "core/qsa/qsa_indexer.h"

namespace cortiq::model {

using attention::QsaConfig;
using attention::WindowConfig;

// The attention geometry of `config`'s layers.
attention::AttentionGeometry GeometryOf(const ModelConfig& config);

class SequenceKv {
 public:
  // Every layer exact on `mode` rows. Allocates the state objects only.
  SequenceKv(const ModelConfig& config, kv::KvMode mode);
  SequenceKv(SequenceKv&&) = default;
  SequenceKv& operator=(SequenceKv&&) = default;

  // Tokens absorbed so far (the next token's position).
  size_t position() const { return layers_.empty() ? 0 : layers_[0]->position(); }
  kv::KvMode mode() const { return config_.rows; }
  size_t num_layers() const { return layers_.size(); }
  attention::LayerAttentionState& layer(size_t l) { return *layers_[l]; }
  const attention::LayerAttentionState& layer(size_t l) const { return *layers_[l]; }
  const attention::AttentionGeometry& geometry() const { return geometry_; }
  const attention::AttentionConfig& attention_config() const { return config_; }

  // Grows every layer to hold `positions` without further allocation.
  void Reserve(size_t positions);
  // Every layer gives back what it holds past position() (see
  // LayerAttentionState::ReleaseUnused).
  void ReleaseUnused();
  // Speculative rollback of the last n positions in every layer, all or
  // nothing: InvalidArgument when n > position(); FailedPrecondition, naming
  // the layer, when any layer cannot roll back (sealed O(1), a window that
  // dropped rows, a QSA state behind its rows).
  absl::Status TruncateLast(size_t n);
  // Whether TruncateLast(n) would succeed: its errors, nothing changed.
  // O(layers).
  absl::Status CanTruncate(size_t n) const;
  // Frees every byte of every layer (MemoryBytes() == 0); the configuration
  // stays (a released sequence starts over at position 0). Idempotent.
  void Release();
  // Exact heap bytes of all layers, and their split by kind.
  size_t MemoryBytes() const;
  attention::MemoryByKind Memory() const;
  size_t O1MemoryBytes() const { return Memory()[attention::MemoryKind::kO1]; }
  size_t QsaMemoryBytes() const { return Memory()[attention::MemoryKind::kQsa]; }
  // Explicit deep copy, configuration included.
  SequenceKv Copy() const;

  // ---- configuration (fresh sequence only: FailedPrecondition otherwise) ----
  // InvalidArgument naming the field: a layer out of range, a value under
  // its minimum, or another mode already enabled. A config with no layers
  // disables the mode. Allocates no rows.
  absl::Status EnableO1(const kv::O1Config& config);
  absl::Status EnableQsa(const QsaConfig& config);
  absl::Status EnableWindow(const WindowConfig& config);
  const std::optional<kv::O1Config>& o1_config() const { return config_.o1; }
  const std::optional<QsaConfig>& qsa_config() const { return config_.qsa; }
  const std::optional<WindowConfig>& window_config() const { return config_.window; }

  // ---- the forward pass's calls ----
  // Binds what the states hold outside themselves (QSA: indexer states on
  // `runtime`'s backend). No-op once bound.
  absl::Status Bind(const std::shared_ptr<attention::QsaRuntime>& runtime);
  // True while any layer waits for the end of the prompt (O(1) collecting).
  bool AwaitsPromptEnd() const;
  bool O1Collecting() const { return AwaitsPromptEnd(); }
  // The prompt is complete: every waiting layer finishes it (O(1) seals;
  // a refused seal leaves that layer exact). Returns the layers sealed.
  size_t CompletePrompt(size_t num_q_heads);

  // ---- QSA, for tests and the wire ----
  // The QSA state of `layer` (null when not a bound QSA layer).
  const qsa::QsaSeqState* qsa_state(size_t layer) const;

 private:
  SequenceKv() = default;
  // Re-makes every layer's state for config_ (position must be 0).
  void Remake();
  absl::Status CheckFresh(const char* mode) const;
  template <typename Config>
  absl::Status Enable(std::optional<Config> attention::AttentionConfig::*field,
                      const Config& config, const char* mode);

  attention::AttentionGeometry geometry_;
  attention::AttentionConfig config_;
  std::vector<std::unique_ptr<attention::LayerAttentionState>> layers_;
};

}  // namespace cortiq::model
