#include "core/attention/registry.h"

#include "absl/strings/str_cat.h"
#include "core/attention/exact_attention.h"
#include "core/attention/layer_list.h"
#include "core/attention/o1_attention.h"
#include "core/attention/qsa_attention.h"
#include "core/attention/window_attention.h"
#include "core/util/status_macros.h"

namespace cortiq::attention {
namespace {

// One registered mode: whether it runs on a layer, and its state.
struct Mode {
  const char* name;
  bool (*claims)(const AttentionConfig& c, size_t layer);
  std::unique_ptr<LayerAttentionState> (*make)(const AttentionConfig& c, size_t layer,
                                               const AttentionGeometry& g);
};

constexpr Mode kModes[] = {
    {"o1", [](const AttentionConfig& c, size_t l) { return c.o1 && c.o1->IsO1Layer(l); },
     [](const AttentionConfig& c, size_t l,
        const AttentionGeometry& g) -> std::unique_ptr<LayerAttentionState> {
       return std::make_unique<O1Attention>(g, c.rows, l, *c.o1);
     }},
    {"qsa", [](const AttentionConfig& c, size_t l) { return c.qsa && c.qsa->IsQsaLayer(l); },
     [](const AttentionConfig& c, size_t l,
        const AttentionGeometry& g) -> std::unique_ptr<LayerAttentionState> {
       return std::make_unique<QsaAttention>(g, c.rows, l, *c.qsa);
     }},
    {"window",
     [](const AttentionConfig& c, size_t l) { return c.window && c.window->IsWindowLayer(l); },
     [](const AttentionConfig& c, size_t l,
        const AttentionGeometry& g) -> std::unique_ptr<LayerAttentionState> {
       return std::make_unique<WindowAttention>(g, l, *c.window);
     }},
};

}  // namespace

absl::Status AttentionConfig::Validate(size_t num_layers) const {
  if (o1) {
    CORTIQ_RETURN_IF_ERROR(CheckLayersInRange(o1->layers, num_layers, "o1.layers"));
    CORTIQ_RETURN_IF_ERROR(kv::CheckO1Minimums(o1->m, o1->w, "o1.m", "o1.w"));
  }
  if (qsa) CORTIQ_RETURN_IF_ERROR(qsa->Validate(num_layers));
  if (window) {
    CORTIQ_RETURN_IF_ERROR(window->Validate(num_layers));
    if (rows != kv::KvMode::kF32) {
      return absl::InvalidArgumentError(
          "window: sink + window attention keeps f32 rows; it does not run on int8 rows");
    }
  }
  const int set = int(o1.has_value()) + int(qsa.has_value()) + int(window.has_value());
  if (set > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attention: ", DebugString(),
        ": O(1), QSA and window attention do not compose (a sealed O(1) layer keeps no K/V rows "
        "for QSA to read; a window layer keeps only its window); choose one"));
  }
  return absl::OkStatus();
}

std::string AttentionConfig::DebugString() const {
  std::string s = absl::StrCat("rows=", kv::KvModeName(rows));
  if (o1) absl::StrAppend(&s, " ", o1->DebugString());
  if (qsa) absl::StrAppend(&s, " ", qsa->DebugString());
  if (window) absl::StrAppend(&s, " ", window->DebugString());
  return s;
}

std::unique_ptr<LayerAttentionState> MakeLayerState(const AttentionConfig& config, size_t layer,
                                                    const AttentionGeometry& geometry) {
  for (const Mode& m : kModes) {
    if (m.claims(config, layer)) return m.make(config, layer, geometry);
  }
  return std::make_unique<ExactAttention>(geometry, config.rows, layer);
}

}  // namespace cortiq::attention
