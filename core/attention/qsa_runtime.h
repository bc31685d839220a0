// QSA's per-model runtime: its configuration type, the CPU backend and the
// indexers (seed 004, core/qsa, docs/QSA.md).
//
// One QsaRuntime per loaded model (model::Transformer makes it at load). It
// is shared (shared_ptr) with every QSA state and every scratch that holds
// memory on its backend, so their frees always find a live backend.
// Indexers are built on first use per (ratio, budget, layer) under a mutex
// and never removed: a const QsaIndexer* stays valid while the runtime lives.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/attention/layer_attention_state.h"
#include "core/qsa/cpu_backend.h"
#include "core/qsa/indexer_weights.h"
#include "core/qsa/qsa_indexer.h"
#include "core/util/thread_pool.h"

namespace cortiq::attention {

// Which layers of a sequence run QSA sparse attention, and its geometry.
struct QsaConfig {
  static constexpr size_t kMinRatio = 1;   // tokens per block
  static constexpr size_t kMinBudget = 2;  // the sink block and the current block

  std::vector<size_t> layers;  // sorted, unique layer indices; empty = off
  size_t ratio = 64;           // tokens per indexer block (>= kMinRatio)
  size_t budget = 16;          // blocks attended per query (>= kMinBudget)

  bool Enabled() const { return !layers.empty(); }
  bool IsQsaLayer(size_t layer) const;
  // e.g. "qsa: layers=[2,3] ratio=64 budget=16" or "qsa: off".
  std::string DebugString() const;
  // InvalidArgument naming the field: a layer >= num_layers, ratio or
  // budget below its minimum. The one check of a QsaConfig.
  absl::Status Validate(size_t num_layers) const;
};

// Builds a QsaConfig from a layer spec (kv::ParseLayerSpec: all | deepN |
// i,j,k | off), sorted and unique, and validates it (QsaConfig::Validate).
absl::StatusOr<QsaConfig> MakeQsaConfig(std::string_view layer_spec, size_t ratio, size_t budget,
                                        size_t num_layers);

// What an indexer is built from: the layer's weights (a callback into the
// model's checkpoint) and the model geometry.
struct QsaModelInfo {
  size_t num_layers = 0;
  AttentionGeometry geometry;  // of every layer
  double rope_theta = 0;
  float rms_norm_eps = 0;
  // Loads layer `l`'s indexer weights (checkpoint tensors, else derived).
  std::function<absl::StatusOr<qsa::IndexerWeights>(size_t layer)> load_weights;
};

struct QsaRuntime {
  QsaRuntime(util::ThreadPool* pool, QsaModelInfo info) : backend(pool), model(std::move(info)) {}

  // The indexer of `layer` at (ratio, budget), built on first use.
  // Errors: loading the weights or uploading them to the backend.
  absl::StatusOr<const qsa::QsaIndexer*> IndexerFor(size_t layer, size_t ratio, size_t budget);
  // Backend bytes of every indexer built so far (their uploaded weights).
  size_t WeightBytes();

  qsa::CpuBackend backend;  // declared first: destroyed after the indexers
  const QsaModelInfo model;

 private:
  std::mutex mu_;
  // (ratio, budget) → one indexer per model layer (null until requested).
  std::map<std::pair<size_t, size_t>, std::vector<std::unique_ptr<qsa::QsaIndexer>>> indexers_;
};

}  // namespace cortiq::attention
