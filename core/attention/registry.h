// The attention modes, registered: which state each layer of a sequence
// gets. A sequence's AttentionConfig names, per optional mode, the layers it
// runs on; the first registered mode that claims a layer makes its state,
// and a layer no mode claims runs exact attention on the configured rows.
//
// Adding a mode: one file (its LayerAttentionState), one optional field in
// AttentionConfig, and one entry in registry.cc's table (claim + make).
// window_attention.h is the example.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "core/attention/layer_attention_state.h"
#include "core/attention/qsa_runtime.h"
#include "core/attention/window_attention.h"
#include "core/kv/layer_kv_cache.h"
#include "core/kv/o1_config.h"

namespace cortiq::attention {

// One sequence's attention configuration. The optional modes do not
// compose: at most one is set (Validate).
struct AttentionConfig {
  kv::KvMode rows = kv::KvMode::kF32;  // exact rows: f32 or int8
  std::optional<kv::O1Config> o1;      // O(1) Nyström on its layers
  std::optional<QsaConfig> qsa;        // QSA sparse on its layers
  std::optional<WindowConfig> window;  // sink + sliding window on its layers

  // InvalidArgument naming the field: each set mode's own checks (layers in
  // range, its minimums) and that no two are set.
  absl::Status Validate(size_t num_layers) const;
  // e.g. "rows=f32 o1: layers=[0,1] m=32 ...".
  std::string DebugString() const;
};

// The state of layer `layer` of a fresh sequence configured as `config`
// (validated). Allocates the state object only.
std::unique_ptr<LayerAttentionState> MakeLayerState(const AttentionConfig& config, size_t layer,
                                                    const AttentionGeometry& geometry);

}  // namespace cortiq::attention
