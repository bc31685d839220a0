// Transformer: the Qwen3-family decoder forward pass (qwen3, qwen2, llama).
//
//   x = embed(tokens)
//   per layer:  h = x + o_proj(attn(rope(qk_norm(q_proj(n(x)))), rope(k..), v))
//               x = h + down(silu(gate(n(h))) * up(n(h)))
//   logits = lm_head(norm(x))            (lm_head = embed_tokens when tied)
//
// Weights stay in the memory-mapped checkpoint (f32, bf16 or f16) and are read
// through math::MatMul; only norms and biases are copied to f32 at load. On
// AMX, with bf16 weights and bf16 activations, the projections and lm_head
// are copied once into AMX tile order (math::PackAmxTiles) and read from
// there, and their checkpoint pages are handed back (AmxTileBytes()).
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
// QSA block-sparse attention (seed 004, core/qsa, docs/QSA.md), optional per
// sequence (SequenceKv::EnableQsa with a QsaConfig):
//   * the Transformer owns one qsa::CpuBackend (on its pool) and, built on
//     first use per (ratio, budget, layer), one qsa::QsaIndexer per QSA layer
//     (LoadIndexerWeights: checkpoint indexer tensors, else derived from the
//     layer's q/k projections). Both live in a shared QsaRuntime that every
//     QSA sequence and ForwardScratch also holds, so they outlive the last
//     state or scratch that frees through them;
//   * the first forward call of a QSA sequence binds it: one QsaSeqState per
//     QSA layer. Every row of a QSA layer is ingested (its normed input); a
//     prefill row at a position >= InertBound() = budget · ratio gets its
//     attention context replaced by attention over its selected blocks
//     (PrefillSelect); a decode row past the bound skips dense attention and
//     attends over its DecodeSelect selection. Rows below the bound are the
//     dense output, bit for bit. Exact K/V rows stay (QSA reads them);
//   * SequenceKv owns its states: Release() and the destructor free them
//     through the shared runtime (a QsaSeqState dropped unreleased would leak).
//
// Thread-safety: after Load() the Transformer is immutable and may be shared;
// a forward call mutates only the SequenceKv(s) and the ForwardScratch passed
// in, so concurrent calls need distinct ones. Math runs on the ThreadPool
// given at load (the engine's pool), never on the caller's other threads.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/kv/layer_kv_cache.h"
#include "core/kv/o1_config.h"
#include "core/math/kernels.h"
#include "core/model/checkpoint.h"
#include "core/model/model_config.h"
#include "core/qsa/cpu_backend.h"
#include "core/qsa/kv_pool.h"
#include "core/qsa/qsa_indexer.h"
#include "core/util/aligned_buffer.h"
#include "core/util/huge_buffer.h"
#include "core/util/thread_pool.h"

namespace cortiq::model {

// Which layers of a sequence run QSA sparse attention, and its geometry.
struct QsaConfig {
  std::vector<size_t> layers;  // sorted, unique layer indices; empty = off
  size_t ratio = 64;           // tokens per indexer block (>= 1)
  size_t budget = 16;          // blocks attended per query (>= 2: sink + current)

  bool Enabled() const { return !layers.empty(); }
  bool IsQsaLayer(size_t layer) const;
  // e.g. "qsa: layers=[2,3] ratio=64 budget=16" or "qsa: off".
  std::string DebugString() const;
};

// Builds a QsaConfig from a layer spec (kv::ParseLayerSpec: all | deepN |
// i,j,k | off). InvalidArgument naming the field for a bad spec, ratio < 1 or
// budget < 2.
absl::StatusOr<QsaConfig> MakeQsaConfig(std::string_view layer_spec, size_t ratio, size_t budget,
                                        size_t num_layers);

// The QSA backend and indexers of one Transformer, shared (shared_ptr) with
// every sequence and scratch that holds memory on the backend, so frees
// always have a live backend. Indexers are created on first use under `mu`
// and never removed, so a raw QsaIndexer* stays valid while the runtime lives.
struct QsaRuntime {
  explicit QsaRuntime(util::ThreadPool* pool) : backend(pool) {}
  qsa::CpuBackend backend;  // declared first: destroyed after the indexers
  std::mutex mu;
  // (ratio, budget) → one indexer per model layer (null until requested).
  std::map<std::pair<size_t, size_t>, std::vector<std::unique_ptr<qsa::QsaIndexer>>> indexers;
};

// One sequence's QSA states (one per QSA layer), owning their backend bytes:
// Release() and the destructor free them (idempotent). Move-only.
class QsaSeqStates {
 public:
  QsaSeqStates() = default;
  QsaSeqStates(QsaSeqStates&& o) noexcept;
  QsaSeqStates& operator=(QsaSeqStates&& o) noexcept;
  QsaSeqStates(const QsaSeqStates&) = delete;
  QsaSeqStates& operator=(const QsaSeqStates&) = delete;
  ~QsaSeqStates();

  bool bound() const { return runtime_ != nullptr; }
  // Frees every state's bytes (the states stay bound and reusable).
  void Release();
  size_t MemoryBytes() const;

 private:
  friend class SequenceKv;
  friend class Transformer;
  std::shared_ptr<QsaRuntime> runtime_;          // null until bound
  std::vector<const qsa::QsaIndexer*> indexer_;  // [num_layers], null for non-QSA layers
  std::vector<qsa::QsaSeqState> state_;          // [num_layers], empty for non-QSA layers
};

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
  // (sealed O(1) layers hold no rows: no-op for them), bound QSA states too.
  void Reserve(size_t positions);
  // Speculative rollback of the last n positions in every layer.
  // InvalidArgument when n > position(); FailedPrecondition when any layer
  // is sealed (the Nyström state cannot un-absorb a key). QSA states are
  // truncated with the rows (QsaIndexer::Truncate). Nothing changes on error.
  absl::Status TruncateLast(size_t n);
  // Frees every buffer (MemoryBytes() == 0 afterwards), O(1) overrides
  // included; the O(1) configuration stays (a released sequence starts over
  // at position 0 and arms again on its next first Prefill). QSA states are
  // freed too (every backend byte); the QSA configuration stays. Idempotent.
  // The destructor releases the QSA states as well.
  void Release();
  // Exact heap bytes of all layers, O(1) traces and states and QSA states
  // included.
  size_t MemoryBytes() const;
  // The part of MemoryBytes() held by O(1) overrides (metrics kind "o1").
  size_t O1MemoryBytes() const;
  // The part of MemoryBytes() held by QSA states (metrics kind "qsa").
  size_t QsaMemoryBytes() const;
  // Explicit deep copy (sessions are never copied by accident), O(1)
  // configuration and overrides included. QSA states are deep-copied through
  // their aux blob (SnapshotAux → RestoreAux into new states); that can fail
  // only on backend allocation, which aborts with a message like any other
  // out-of-memory here.
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

  // ---- QSA sparse attention (see the Transformer banner) ----
  // Selects the layers (and ratio, budget) that run QSA. Only on a fresh
  // sequence (position() == 0; FailedPrecondition otherwise). InvalidArgument
  // naming the field for a layer out of range, ratio < 1, budget < 2, or when
  // O(1) is enabled on this sequence (the two modes do not compose: a sealed
  // O(1) layer keeps no K/V rows for QSA to read). A config with no layers
  // disables the mode. Allocates nothing: the states are bound by the first
  // forward call (Transformer).
  absl::Status EnableQsa(const QsaConfig& config);
  const std::optional<QsaConfig>& qsa_config() const { return qsa_config_; }
  // The states of a QSA layer (null when `layer` is not QSA or not yet bound).
  const qsa::QsaSeqState* qsa_state(size_t layer) const;
  // The aux blob of a QSA layer's state (QsaIndexer::SnapshotAux: it IS the
  // state), for session export. FailedPrecondition when `layer` is not a
  // bound QSA layer of this sequence.
  absl::StatusOr<std::vector<uint8_t>> QsaSnapshotAux(size_t layer) const;

 private:
  friend class Transformer;
  SequenceKv() = default;
  kv::KvMode mode_ = kv::KvMode::kF32;
  std::vector<kv::LayerKvCache> layers_;
  std::optional<kv::O1Config> o1_config_;
  std::optional<QsaConfig> qsa_config_;
  QsaSeqStates qsa_;  // bound on the first forward call of a QSA sequence
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
  // QSA (only when a QSA sequence runs): the runtime first, so the launch
  // scratch (freed through its backend) is destroyed before it.
  std::shared_ptr<QsaRuntime> qsa_runtime;
  std::unique_ptr<qsa::QsaScratch> qsa_scratch;
  qsa::LayerKvPool qsa_pool;
  std::vector<qsa::QsaSelection> qsa_sel;  // [rows] decode selections, reused
};

struct LoadOptions {
  util::ThreadPool* pool = nullptr;  // runs the math; nullptr = the default pool
  // bf16 weights: round activations to bf16 at every projection's input and
  // compute exact products with f32 accumulation (math::WeightView::
  // bf16_activations), as bf16 inference does elsewhere; with AVX512_BF16 this
  // is what keeps batched decode bound by the weight stream. false: f32
  // activations (W widened to f32). No effect on f32 / f16 weights.
  bool bf16_activations = true;
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
  // Bytes of the AMX tile-order copy of the projections (mapped at load when
  // the kAmx ISA is active and activations are bf16; 0 otherwise). With it,
  // every batch runs on AMX tiles and the checkpoint's projection pages are
  // handed back to the kernel.
  size_t AmxTileBytes() const { return amx_tiles_.MemoryBytes(); }

  // ---- QSA ----
  // Binds `kv`'s QSA states (creating the indexers it needs on first use)
  // when it has a QSA config and is not bound yet; no-op otherwise. Called by
  // Prefill / DecodeBatch; public for tools that synthesise state. Each state
  // gets room for the layer cache's capacity.
  absl::Status BindQsa(SequenceKv& kv) const;
  // Benchmarks only: ingests `rows` normed hidden rows (f32 [rows × hidden])
  // into layer `layer`'s QSA state at positions [ingested, ingested + rows),
  // for K/V rows the caller appended to the cache directly. FailedPrecondition
  // when the layer is not a bound QSA layer.
  absl::Status QsaIngestRows(SequenceKv& kv, size_t layer, const float* normed, size_t rows) const;
  // Session import: binds `kv`'s QSA states if needed and restores layer
  // `layer`'s from an aux blob (QsaIndexer::RestoreAux). FailedPrecondition
  // when the layer is not a QSA layer of `kv`; DATA_LOSS for a blob that
  // disagrees with the geometry (the state is then untouched).
  absl::Status QsaRestoreAux(SequenceKv& kv, size_t layer, std::span<const uint8_t> blob) const;
  // The QSA backend's live allocations (weights + states + scratches).
  qsa::BackendStats QsaBackendStats() const { return qsa_->backend.stats(); }
  // Backend bytes of every indexer built so far (their uploaded weights).
  size_t QsaWeightBytes() const;

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
  // AMX: a tile-order copy of every bf16-activation projection (lm_head
  // included), WeightView::amx_tiles, packed on the pool.
  void PackAmxTiles();
  absl::Status CheckTokens(std::span<const int32_t> tokens) const;
  void EnsureScratch(ForwardScratch& s, size_t rows, size_t max_len) const;
  // Fills scratch.rope rows with cos/sin for positions[i].
  void RopeTables(ForwardScratch& s, std::span<const size_t> positions) const;
  // The shared layer stack over `rows` tokens; seq_of(i)/pos_of(i) map a row
  // to its sequence and position.
  // Errors come only from QSA layers (backend allocation or misuse); the
  // sequences are then partially extended and should be released.
  absl::Status RunLayers(ForwardScratch& s, size_t rows, std::span<SequenceKv* const> seq_of_row,
                         bool causal_chunk) const;
  // QSA on layer l after dense attention: ingest + select for the run of
  // prefill rows [i0, i0 + n) of one sequence.
  // Causal attention of a prefill chunk of one sequence (rows [0, rows) of
  // s.q, already appended to `cache`) as tiled matrix products: per KV group
  // and tile of query rows, scores = Q·Kᵀ and out = P·V through math::MatMul
  // instead of one Dot/Axpy pass per row. f32 rows, every head dense.
  void PrefillAttentionTiled(ForwardScratch& s, const kv::LayerKvCache& cache, size_t rows) const;
  absl::Status QsaPrefillLayer(ForwardScratch& s, size_t l, SequenceKv& kv, size_t i0,
                               size_t n) const;
  absl::StatusOr<const qsa::QsaIndexer*> QsaIndexerFor(size_t layer, size_t ratio,
                                                       size_t budget) const;
  qsa::QsaScratch& QsaScratchOf(ForwardScratch& s) const;
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
  util::HugeBuffer<uint16_t> amx_tiles_;  // PackAmxTiles (AMX only): every view's tiles
  std::shared_ptr<QsaRuntime> qsa_;       // set by Load; indexers built on demand
};

}  // namespace cortiq::model
