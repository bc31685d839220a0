// Transformer: the Qwen3-family decoder forward pass (qwen3, qwen2, llama).
//
//   x = embed(tokens)
//   per layer:  h = x + o_proj(attn(rope(qk_norm(q_proj(n(x)))), rope(k..), v))
//               x = h + down(silu(gate(n(h))) * up(n(h)))
//   logits = lm_head(norm(x))            (lm_head = embed_tokens when tied)
//
// Weights stay in the memory-mapped checkpoint (f32, bf16 or f16, or Q8_0 from
// a GGUF file; Checkpoint converts Q4_0/Q4_K/Q6_K to Q8_0 at Open into memory
// it owns) and are read through math::MatMul; only norms and biases are
// copied to f32 at load. With LoadOptions::weights = kInt8 every projection,
// lm_head and the embedding are quantized once to Q8_0 (math::PackedWeights)
// and the checkpoint's pages are handed back. On
// AMX, with bf16 weights and bf16 activations, the projections and lm_head
// are copied once into AMX tile order and read from there, and their
// checkpoint pages are handed back (math::PackedWeights, AmxTileBytes()).
// Attention goes through each layer's attention::LayerAttentionState (one
// per layer of a SequenceKv, core/attention): the forward pass computes
// q, k, v and hands them to the state — Prefill for a block of one
// sequence, BeginDecode / DecodeTask / EndDecode for a decode batch — and
// never asks which mode (exact f32 / int8, O(1), QSA, sink + window) it runs.
// The Transformer owns the model's QSA runtime (backend + indexers, built on
// first use from the checkpoint) and lends it to the sequences it runs.
//
// Thread-safety: after Load() the Transformer is immutable and may be shared;
// a forward call mutates only the SequenceKv(s) and the ForwardScratch passed
// in, so concurrent calls need distinct ones. Math runs on the ThreadPool
// given at load (the engine's pool), never on the caller's other threads.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/attention/qsa_runtime.h"
#include "core/kv/layer_kv_cache.h"
#include "core/kv/o1_config.h"
#include "core/math/kernels.h"
#include "core/math/packed_weights.h"
#include "core/model/checkpoint.h"
#include "core/model/forward_scratch.h"
#include "core/model/model_config.h"
#include "core/model/sequence_kv.h"
#include "core/util/thread_pool.h"

namespace cortiq::model {

using attention::MakeQsaConfig;
using attention::QsaRuntime;

struct LoadOptions {
  util::ThreadPool* pool = nullptr;  // runs the math; nullptr = the default pool
  // bf16 weights: round activations to bf16 at every projection's input and
  // compute exact products with f32 accumulation (math::WeightView::
  // bf16_activations), as bf16 inference does elsewhere; with AVX512_BF16 this
  // is what keeps batched decode bound by the weight stream. false: f32
  // activations (W widened to f32). No effect on f32 / f16 weights.
  bool bf16_activations = true;
  // The weight format the projections, lm_head and embeddings are read in:
  // kCheckpoint = the checkpoint's own dtype (bf16/f16/f32, or Q8_0 in place
  // from a GGUF file); kInt8 = quantized once at load to Q8_0 blocks
  // (math::PackedWeights, `--weights int8`), the checkpoint's pages handed
  // back. A matrix whose input size is not a multiple of 32 stays in the
  // checkpoint's dtype (logged).
  enum class Weights { kCheckpoint, kInt8 };
  Weights weights = Weights::kCheckpoint;
};
// "checkpoint" / "int8" (flags and logs), and the reverse (nullopt if unknown).
const char* WeightsName(LoadOptions::Weights w);
std::optional<LoadOptions::Weights> ParseWeights(std::string_view name);

// One source of rows in a Transformer::Step: a decode row, or a chunk of a
// prompt.
struct StepSegment {
  SequenceKv* kv = nullptr;
  std::span<const int32_t> tokens;  // decode: one token; a chunk: its tokens
  bool decode = false;              // a decode row (the sequence's prompt is complete)
  bool logits = false;              // write the logits of its last row
};

class Transformer {
 public:
  // Opens the checkpoint in `model_dir` and binds every tensor; errors name
  // the file and tensor. `pool` runs the math (nullptr = the default pool).
  static absl::StatusOr<std::unique_ptr<Transformer>> Load(const std::string& model_dir,
                                                           util::ThreadPool* pool = nullptr);
  static absl::StatusOr<std::unique_ptr<Transformer>> Load(const std::string& model_dir,
                                                           const LoadOptions& options);
  // Whether the projections round activations to bf16 (bf16 weights and
  // LoadOptions::bf16_activations).
  bool bf16_activations() const { return lm_head_.bf16_activations; }

  const ModelConfig& config() const { return config_; }
  const Checkpoint& checkpoint() const { return *checkpoint_; }
  util::ThreadPool* pool() const { return pool_; }

  // Runs `tokens` (positions kv.position() ...) through the model as batched
  // matrix products, extending `kv`. Writes the last position's logits to
  // `last_logits` ([vocab]) and, when `all_logits` is non-null, every
  // position's logits to it ([tokens × vocab]). Either may be null.
  // Errors (nothing changed): empty input, token id ≥ vocab, context overflow.
  // With O(1) enabled, the first Prefill at position 0 arms query collection
  // and later chunks keep recording until SealO1.
  absl::Status Prefill(std::span<const int32_t> tokens, SequenceKv& kv, ForwardScratch& scratch,
                       float* last_logits, float* all_logits = nullptr) const;

  // One decode step for B independent sequences: tokens[b] is appended to
  // *kvs[b] at its own position. Every weight is read once for the batch.
  // logits: [B × vocab]. A sequence still collecting its O(1) query trace is
  // sealed first (SealO1): its prompt is complete once it decodes.
  absl::Status DecodeBatch(std::span<const int32_t> tokens, std::span<SequenceKv* const> kvs,
                           ForwardScratch& scratch, float* logits) const;

  // One engine step: decode rows and prompt chunks of several sequences in
  // ONE forward, every weight matrix read once for all of them
  // (math::MatMulSplit). Decode segments come first; the chunks of one
  // sequence are consecutive and in order (each continues the last); a
  // sequence is not both decoded and prefilled in a step. logits: one row of
  // [vocab] per segment with `logits`, in segment order.
  // Bits: a decode row is what DecodeBatch gives it in any batch; a chunk is
  // what Prefill(chunk) gives it (same kernels: chunks of fewer than
  // math::ChunkGemmMinRows rows with the decode rows, longer ones on the GEMM),
  // so a sequence's outputs do not depend on what shares its step.
  // Errors (nothing changed): as Prefill / DecodeBatch, and segments out of
  // that order.
  absl::Status Step(std::span<const StepSegment> segments, ForwardScratch& scratch,
                    float* logits) const;

  // Marks the prompt of `kv` complete: every layer collecting its O(1) query
  // trace seals (LayerKvCache::O1Seal with this model's query-head count),
  // freeing its exact K/V. A refused seal leaves that layer exact (the first
  // refusal in the process is logged as a warning, later ones at debug).
  // Returns the number of layers sealed by this call; 0 when nothing was
  // collecting. Allocates the states; O(prompt · layers).
  size_t SealO1(SequenceKv& kv) const;

  // Bytes of weights one decode step reads (the roofline numerator): every
  // projection and lm_head in the format MatMul reads them in.
  size_t WeightBytesPerStep() const;
  // The weight format in use: kInt8 when the projections or lm_head are
  // int8 (quantized at load, or Q8_0 in a GGUF file; a matrix whose input
  // size is not a multiple of 32 may stay in the checkpoint's dtype).
  LoadOptions::Weights weights() const;
  // Bytes of the int8 copy made at load (0 without --weights int8, and for
  // weights that are Q8_0 in the file: those are read in place).
  size_t Int8CopyBytes() const { return packed_.Int8Bytes(); }
  // Bytes of the checkpoint's weight matrices still read in place (those not
  // replaced by a copy; their pages were handed back): the embedding and
  // lm_head once when tied.
  size_t CheckpointWeightBytesInUse() const;
  // Bytes of the AMX tile-order copy of the projections (mapped at load when
  // the kAmx ISA is active and activations are bf16; 0 otherwise). With it,
  // every batch runs on AMX tiles and the checkpoint's projection pages are
  // handed back to the kernel.
  size_t AmxTileBytes() const { return packed_.AmxTileBytes(); }

  // ---- QSA ----
  // Binds `kv`'s per-sequence state outside the layers (QSA indexer states,
  // built on this model's runtime; each gets room for its cache's
  // capacity); no-op when bound or without QSA. Called by Prefill /
  // DecodeBatch; public for tools that synthesise state and for imports.
  absl::Status BindQsa(SequenceKv& kv) const { return kv.Bind(qsa_); }
  // Benchmarks only: ingests `rows` normed hidden rows (f32 [rows × hidden])
  // into layer `layer`'s QSA state at positions [ingested, ingested + rows),
  // for K/V rows the caller appended to the cache directly. FailedPrecondition
  // when the layer is not a bound QSA layer.
  absl::Status QsaIngestRows(SequenceKv& kv, size_t layer, const float* normed, size_t rows) const;
  // The model's QSA runtime (session import restores aux blobs on it).
  const std::shared_ptr<QsaRuntime>& qsa_runtime() const { return qsa_; }
  // The QSA backend's live allocations (weights + states + scratches).
  qsa::BackendStats QsaBackendStats() const { return qsa_->backend.stats(); }
  // Backend bytes of every indexer built so far (their uploaded weights).
  size_t QsaWeightBytes() const { return qsa_->WeightBytes(); }

 private:
  struct LayerWeights {
    math::WeightView q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj;
    // The seven projections, in that order.
    std::array<math::WeightView*, 7> Projections() {
      return {&q_proj, &k_proj, &v_proj, &o_proj, &gate_proj, &up_proj, &down_proj};
    }
    std::array<const math::WeightView*, 7> Projections() const {
      return {&q_proj, &k_proj, &v_proj, &o_proj, &gate_proj, &up_proj, &down_proj};
    }
    std::vector<float> q_bias, k_bias, v_bias;  // [n_heads·hd], [n_kv·hd] (qwen2)
    std::vector<float> o_bias;                  // [hidden] (rare)
    std::vector<float> input_norm;              // [hidden]
    std::vector<float> post_attn_norm;          // [hidden]
    std::vector<float> q_norm, k_norm;          // [head_dim] (qwen3)
  };

  Transformer() = default;
  absl::Status Bind();
  absl::Status CheckTokens(std::span<const int32_t> tokens) const;
  void EnsureScratch(ForwardScratch& s, size_t rows) const;
  // Fills scratch.rope rows with cos/sin for s.positions[i], i < rows.
  void RopeTables(ForwardScratch& s, size_t rows) const;
  // The layer stack over `rows` tokens whose embeddings are in s.x; each
  // layer's attention is `attend(l)` (after q, k, v, before o_proj). On
  // return s.x holds the final hidden states (pre-norm). Errors come only
  // from attention states (backend allocation or misuse); the sequences are
  // then partially extended and should be released.
  // Rows [0, gemv_rows) take the decode kernels (math::MatMulSplit).
  template <typename Attend>
  absl::Status RunLayers(ForwardScratch& s, size_t rows, size_t gemv_rows, Attend&& attend) const;
  // Step over `count` segments, segment i being at(i) (DecodeBatch builds
  // them on the fly: no allocation).
  template <typename SegmentAt>
  absl::Status RunStep(size_t count, SegmentAt&& at, ForwardScratch& s, float* logits) const;
  // A decode step's attention on layer l: one row per sequence, every
  // state's tasks in one parallel region.
  absl::Status DecodeAttention(ForwardScratch& s, size_t l, std::span<SequenceKv* const> kvs) const;
  // Row block `rows` of layer l's activations in s, at position `start`.
  attention::AttentionRows RowsOf(ForwardScratch& s, size_t l, size_t first_row, size_t count,
                                  size_t start) const;
  void Embed(std::span<const int32_t> tokens, float* x) const;
  void Logits(const float* xn, size_t rows, float* out) const;

  ModelConfig config_;
  std::optional<Checkpoint> checkpoint_;  // set by Load
  util::ThreadPool* pool_ = nullptr;
  math::WeightView embed_;    // [vocab × hidden]
  math::WeightView lm_head_;  // [vocab × hidden] (== embed_ when tied)
  std::vector<float> final_norm_;
  std::vector<float> inv_freq_;  // [head_dim / 2], f64-derived
  std::vector<LayerWeights> layers_;
  attention::AttentionGeometry geometry_;  // of every layer
  math::PackedWeights packed_;  // the views' packed copies (AMX tile order)
  std::shared_ptr<QsaRuntime> qsa_;        // set by Load; indexers built on demand
};

}  // namespace cortiq::model
