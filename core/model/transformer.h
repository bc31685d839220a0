// Transformer: the Qwen3-family decoder forward pass (qwen3, qwen2, llama).
//
//   x = embed(tokens)
//   per layer:  h = x + o_proj(attn(rope(qk_norm(q_proj(n(x)))), rope(k..), v))
//               x = h + down(silu(gate(n(h))) * up(n(h)))
//   logits = lm_head(norm(x))            (lm_head = embed_tokens when tied)
//
// Weights stay in the memory-mapped checkpoint (f32, bf16 or f16) and are read
// through math::MatMul; only norms and biases are copied to f32 at load.
// Attention goes through kv::LayerKvCache::AttendGroup, one GQA group at a
// time, so every attention mode plugs in at the cache.
//
// O(1) Nyström attention (seed 002), optional per sequence
// (SequenceKv::EnableO1 with a kv::O1Config the caller resolved):
//   1. the FIRST Prefill of the fresh sequence (position 0) arms the selected
//      layers (LayerKvCache::O1Begin); every prefill row then records its
//      rotated queries (O1PushQ, next to the row's Append in the layer loop,
//      so one long prefill and a chunked one feed the same trace) while
//      attention stays exact;
//   2. the prompt is complete when the caller says so — SealO1(kv) — or, at
//      the latest, when the sequence's first DecodeBatch step runs, which
//      seals first. Each armed layer O1Seal()s: its exact K/V is freed and
//      it holds one NystromState per KV group. A layer whose seal is refused
//      (int8 rows, ...) stays exact, logged once per process;
//   3. on a sealed layer a position appends nothing to the exact cache:
//      LayerKvCache::O1Step inserts (k, v) and attends for all Q heads of
//      every group. A Prefill on a sealed sequence (a later turn) streams its
//      rows through O1Step in order. Layers not selected stay exact.
//
// Thread-safety: after Load() the Transformer is immutable and may be shared;
// a forward call mutates only the SequenceKv(s) and the ForwardScratch passed
// in, so concurrent calls need distinct ones. Math runs on the ThreadPool
// given at load (the engine's pool), never on the caller's other threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/kv/layer_kv_cache.h"
#include "core/kv/o1_config.h"
#include "core/math/kernels.h"
#include "core/model/checkpoint.h"
#include "core/model/model_config.h"
#include "core/util/aligned_buffer.h"
#include "core/util/thread_pool.h"

namespace cortiq::model {

// The attention state of one sequence: one LayerKvCache per layer, all in the
// same KvMode. Owned by a session; the forward pass extends it.
class SequenceKv {
 public:
  SequenceKv(const ModelConfig& config, kv::KvMode mode);
  SequenceKv(SequenceKv&&) = default;
  SequenceKv& operator=(SequenceKv&&) = default;

  // Tokens absorbed so far (the next token's position). Sealed O(1) layers
  // count their positions like exact ones.
  size_t position() const { return layers_.empty() ? 0 : layers_[0].seq_len(); }
  kv::KvMode mode() const { return mode_; }
  std::vector<kv::LayerKvCache>& layers() { return layers_; }
  const std::vector<kv::LayerKvCache>& layers() const { return layers_; }

  // Grows every exact layer to hold `positions` without further allocation
  // (sealed O(1) layers hold no rows: no-op for them).
  void Reserve(size_t positions);
  // Speculative rollback of the last n positions in every layer.
  // InvalidArgument when n > position(); FailedPrecondition when any layer
  // is sealed (the Nyström state cannot un-absorb a key). Nothing changes on
  // error.
  absl::Status TruncateLast(size_t n);
  // Frees every buffer (MemoryBytes() == 0 afterwards), O(1) overrides
  // included; the O(1) configuration stays (a released sequence starts over
  // at position 0 and arms again on its next first Prefill).
  void Release();
  // Exact heap bytes of all layers, O(1) traces and states included.
  size_t MemoryBytes() const;
  // The part of MemoryBytes() held by O(1) overrides (metrics kind "o1").
  size_t O1MemoryBytes() const;
  // Explicit deep copy (sessions are never copied by accident), O(1)
  // configuration and overrides included.
  SequenceKv Copy() const;

  // ---- O(1) Nyström attention (see the Transformer banner) ----
  // Selects the layers (and m, w, sink, rect) that switch to the O(1) kernel
  // once the prompt is absorbed. Only on a fresh sequence (position() == 0;
  // FailedPrecondition otherwise). InvalidArgument naming the field for a
  // layer index >= the model's layer count, m < 4 or w < 1. A config with no
  // layers disables the mode. Allocates nothing in the caches.
  absl::Status EnableO1(const kv::O1Config& config);
  // The configuration set by EnableO1 (nullopt: exact attention everywhere).
  const std::optional<kv::O1Config>& o1_config() const { return o1_config_; }
  // True while any layer records its prompt's query trace (armed, not sealed).
  bool O1Collecting() const;

 private:
  SequenceKv() = default;
  kv::KvMode mode_ = kv::KvMode::kF32;
  std::vector<kv::LayerKvCache> layers_;
  std::optional<kv::O1Config> o1_config_;
};

// Activations of one forward call, grown to the largest batch/chunk seen and
// then reused: a decode step with a warm scratch performs no allocation.
// Layouts are row-major; `rows` = tokens in the call (prefill chunk length, or
// the decode batch size).
struct ForwardScratch {
  util::AlignedBuffer<float> x;       // [rows × hidden] residual stream
  util::AlignedBuffer<float> xn;      // [rows × hidden] normed input
  util::AlignedBuffer<float> q;       // [rows × n_heads × head_dim]
  util::AlignedBuffer<float> k;       // [rows × n_kv × head_dim]
  util::AlignedBuffer<float> v;       // [rows × n_kv × head_dim]
  util::AlignedBuffer<float> att;     // [rows × n_heads × head_dim]
  util::AlignedBuffer<float> gate;    // [rows × intermediate]
  util::AlignedBuffer<float> up;      // [rows × intermediate]
  util::AlignedBuffer<float> rope;    // [rows × head_dim] (cos | sin halves)
  util::AlignedBuffer<float> scores;  // [threads × heads_per_kv × max_len]
  size_t rows = 0;
  size_t score_len = 0;
};

class Transformer {
 public:
  // Opens the checkpoint in `model_dir` and binds every tensor; errors name
  // the file and tensor. `pool` runs the math (nullptr = the default pool).
  static absl::StatusOr<std::unique_ptr<Transformer>> Load(const std::string& model_dir,
                                                           util::ThreadPool* pool = nullptr);

  const ModelConfig& config() const { return config_; }
  const Checkpoint& checkpoint() const { return *checkpoint_; }
  util::ThreadPool* pool() const { return pool_; }

  // Runs `tokens` (positions kv.position() ...) through the model as batched
  // matrix products, extending `kv`. Writes the last position's logits to
  // `last_logits` ([vocab]) and, when `all_logits` is non-null, every
  // position's logits to it ([tokens × vocab]). Either may be null.
  // Errors (nothing changed): empty input, token id ≥ vocab, context overflow.
  // With O(1) enabled, the first Prefill at position 0 arms query collection
  // and later chunks keep recording until SealO1 (see the banner).
  absl::Status Prefill(std::span<const int32_t> tokens, SequenceKv& kv, ForwardScratch& scratch,
                       float* last_logits, float* all_logits = nullptr) const;

  // One decode step for B independent sequences: tokens[b] is appended to
  // *kvs[b] at its own position. Every weight is read once for the batch.
  // logits: [B × vocab]. A sequence still collecting its O(1) query trace is
  // sealed first (SealO1): its prompt is complete once it decodes.
  absl::Status DecodeBatch(std::span<const int32_t> tokens, std::span<SequenceKv* const> kvs,
                           ForwardScratch& scratch, float* logits) const;

  // Marks the prompt of `kv` complete: every layer collecting its O(1) query
  // trace seals (LayerKvCache::O1Seal with this model's query-head count),
  // freeing its exact K/V. A refused seal leaves that layer exact (the first
  // refusal in the process is logged as a warning, later ones at debug).
  // Returns the number of layers sealed by this call; 0 when nothing was
  // collecting. Allocates the states; O(prompt · layers).
  size_t SealO1(SequenceKv& kv) const;

  // Bytes of weights one decode step reads (the roofline numerator).
  size_t WeightBytesPerStep() const;

 private:
  struct LayerWeights {
    math::WeightView q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj;
    std::vector<float> q_bias, k_bias, v_bias;  // [n_heads·hd], [n_kv·hd] (qwen2)
    std::vector<float> o_bias;                  // [hidden] (rare)
    std::vector<float> input_norm;              // [hidden]
    std::vector<float> post_attn_norm;          // [hidden]
    std::vector<float> q_norm, k_norm;          // [head_dim] (qwen3)
  };

  Transformer() = default;
  absl::Status Bind();
  absl::Status CheckTokens(std::span<const int32_t> tokens) const;
  void EnsureScratch(ForwardScratch& s, size_t rows, size_t max_len) const;
  // Fills scratch.rope rows with cos/sin for positions[i].
  void RopeTables(ForwardScratch& s, std::span<const size_t> positions) const;
  // The shared layer stack over `rows` tokens; seq_of(i)/pos_of(i) map a row
  // to its sequence and position.
  void RunLayers(ForwardScratch& s, size_t rows, std::span<SequenceKv* const> seq_of_row,
                 bool causal_chunk) const;
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
};

}  // namespace cortiq::model
