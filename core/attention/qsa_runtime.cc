#include "core/attention/qsa_runtime.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/attention/layer_list.h"
#include "core/kv/o1_config.h"
#include "core/util/status_macros.h"

namespace cortiq::attention {

bool QsaConfig::IsQsaLayer(size_t layer) const { return ContainsLayer(layers, layer); }

std::string QsaConfig::DebugString() const {
  if (!Enabled()) return "qsa: off";
  return absl::StrCat("qsa: layers=", LayerListString(layers), " ratio=", ratio,
                      " budget=", budget);
}

absl::Status QsaConfig::Validate(size_t num_layers) const {
  CORTIQ_RETURN_IF_ERROR(CheckLayersInRange(layers, num_layers, "qsa.layers"));
  if (ratio < kMinRatio) {
    return absl::InvalidArgumentError(absl::StrCat("qsa.ratio must be at least ", kMinRatio));
  }
  if (budget < kMinBudget) {
    return absl::InvalidArgumentError(
        absl::StrCat("qsa.budget = ", budget, " < ", kMinBudget, " (the sink and current blocks)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<QsaConfig> MakeQsaConfig(std::string_view layer_spec, size_t ratio, size_t budget,
                                        size_t num_layers) {
  QsaConfig c;
  CORTIQ_ASSIGN_OR_RETURN(c.layers, kv::ParseLayerSpec(layer_spec, num_layers));
  c.ratio = ratio;
  c.budget = budget;
  CORTIQ_RETURN_IF_ERROR(c.Validate(num_layers));
  return c;
}

absl::StatusOr<const qsa::QsaIndexer*> QsaRuntime::IndexerFor(size_t layer, size_t ratio,
                                                              size_t budget) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& per_layer = indexers_[{ratio, budget}];
  if (per_layer.empty()) per_layer.resize(model.num_layers);
  if (layer >= per_layer.size()) {
    return absl::InvalidArgumentError(absl::StrCat("qsa: layer ", layer, " is out of range"));
  }
  if (per_layer[layer] == nullptr) {
    CORTIQ_ASSIGN_OR_RETURN(qsa::IndexerWeights w, model.load_weights(layer));
    qsa::QsaGeometry g;
    g.n_heads = w.n_heads;
    g.hd = w.hd;
    g.ratio = ratio;
    g.budget = budget;
    g.rot = w.hd;  // full-width RoPE, as the layer's own heads (derived: exact)
    g.theta = model.rope_theta;
    g.eps = model.rms_norm_eps;
    g.hidden = model.geometry.hidden;
    g.nkv_attn = model.geometry.num_kv_heads;
    g.hd_attn = model.geometry.head_dim;
    CORTIQ_ASSIGN_OR_RETURN(per_layer[layer], qsa::QsaIndexer::New(&backend, w, g));
  }
  return per_layer[layer].get();
}

size_t QsaRuntime::WeightBytes() {
  std::lock_guard<std::mutex> lock(mu_);
  size_t total = 0;
  for (const auto& [key, per_layer] : indexers_) {
    for (const auto& ix : per_layer) total += ix != nullptr ? ix->WeightBytes() : 0;
  }
  return total;
}

}  // namespace cortiq::attention
