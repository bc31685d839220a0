// Indexer weights: where one layer's QSA indexer gets its parameters.
//
// One code path either way: LoadIndexerWeights returns the same host struct
// (IndexerWeights) whether the checkpoint carries trained indexer tensors or
// the indexer is derived from the layer's own attention projections; the
// caller hands it to QsaIndexer::New, which uploads it.
//
// 1. From the checkpoint, when it has them (layer L, prefix
//    "model.layers.L.self_attn.indexer."):
//      qk_proj.weight  [(n_heads + 1) · hd, hidden]   query heads, then the key head
//      q_norm.weight   [hd]                           RMSNorm weight of each query head
//      k_norm.weight   [hd]                           RMSNorm weight of the key
//      qk_proj.bias    [(n_heads + 1) · hd]           optional
//    hd is q_norm's length and n_heads = rows / hd − 1. f32, bf16 or f16.
//    Any indexer tensor present makes the first three mandatory (a partial
//    indexer is refused, never half-derived).
// 2. Derived, when the layer has no "indexer." tensors: the indexer of GQA
//    group 0 — its n_heads = num_q_heads / num_kv_heads query heads are rows
//    [0, n_heads · head_dim) of self_attn.q_proj.weight, its key is rows
//    [0, head_dim) of self_attn.k_proj.weight (KV head 0), biases the same
//    slices of q_proj.bias / k_proj.bias when present, norms the layer's
//    self_attn.q_norm / k_norm (qwen3) or none (qwen2, llama); hd = head_dim.
//    Bytes are copied in the checkpoint's dtype (both converted to f32 when
//    q_proj and k_proj differ, or are Q8_0). With rot = head_dim and theta = the model's
//    rope_theta (what `derived` suggests) the indexer's q·k is then exactly
//    group 0's own pre-softmax logit (times sqrt(head_dim)), so a block's
//    score is the sum over that group's heads of its mean logit, clipped at
//    0. It is a proxy for the whole layer's attention (the other groups are
//    not looked at): trained indexer tensors are better where available.
//
// Thread-safety: plain functions and value types.
//
// Example (model side; Checkpoint adapts to TensorSource in a few lines):
//   CORTIQ_ASSIGN_OR_RETURN(qsa::IndexerWeights w,
//       qsa::LoadIndexerWeights(source, layer, {hidden, nq, nkv, head_dim}));
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/math/kernels.h"

namespace cortiq::qsa {

// A tensor in host memory (not owned): e.g. a view into a mapped checkpoint.
struct HostTensor {
  const void* data = nullptr;
  math::DType dtype = math::DType::kF32;
  std::vector<int64_t> shape;
};

// Read-only tensor lookup by name (model::Checkpoint adapts to it: Has → Has,
// Get → GetAnyShape). Keeps core/qsa independent of core/model.
class TensorSource {
 public:
  virtual ~TensorSource() = default;
  virtual bool Has(std::string_view name) const = 0;
  // NOT_FOUND when absent; any shape (the caller checks).
  virtual absl::StatusOr<HostTensor> Get(std::string_view name) const = 0;
};

// The attention geometry of the layer the indexer serves.
struct AttentionGeometry {
  size_t hidden = 0;
  size_t num_q_heads = 0;
  size_t num_kv_heads = 0;
  size_t head_dim = 0;
};

enum class IndexerOrigin : uint8_t { kCheckpoint = 0, kDerived = 1 };

// One layer's indexer parameters in host memory (owned copies).
struct IndexerWeights {
  size_t n_heads = 0;                     // indexer query heads
  size_t hd = 0;                          // indexer head dim (queries and key)
  size_t hidden = 0;                      // input width
  math::DType dtype = math::DType::kF32;  // of qk_proj
  // dtype [(n_heads + 1) · hd × hidden] (nn.Linear layout): rows [0, n_heads ·
  // hd) are the query heads, the last hd rows the key head.
  std::vector<uint8_t> qk_proj;
  std::vector<float> qk_bias;  // empty or [(n_heads + 1) · hd]
  std::vector<float> q_norm;   // empty (no norm) or [hd]; k_norm likewise
  std::vector<float> k_norm;
  IndexerOrigin origin = IndexerOrigin::kCheckpoint;

  // Bytes the weights occupy once uploaded (QsaIndexer::WeightBytes).
  size_t Bytes() const;
};

// "model.layers.<layer>.self_attn.indexer.<what>".
std::string IndexerTensorName(size_t layer, std::string_view what);

// Resolves layer `layer`'s indexer weights (see the banner). Errors: a partial
// indexer or a missing attention tensor → NOT_FOUND naming it; a shape that
// does not fit `geometry` → INVALID_ARGUMENT naming the tensor and shapes.
absl::StatusOr<IndexerWeights> LoadIndexerWeights(const TensorSource& source, size_t layer,
                                                  const AttentionGeometry& geometry);

}  // namespace cortiq::qsa
