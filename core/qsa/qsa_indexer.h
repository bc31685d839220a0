// QsaIndexer / QsaSeqState: the block-pooled sparse-attention indexer of one
// layer (seed 004), re-created on a Backend (backend.h).
//
// What it computes (docs/QSA.md has the reasoning):
//   * Projection. From the layer's normed input x (input_layernorm output):
//       q_j(t) = RoPE_rot(RmsNorm_qn(W_q,j·x_t + b)),  j < n_heads   [hd] each
//       k(t)   = RoPE_rot(RmsNorm_kn(W_k·x_t + b))                    [hd], one key head
//     (RoPE on the first `rot` dims, rotate-half, base theta; a norm is
//     skipped when its weight is absent).
//   * Park + pool. k(t) is parked raw in bf16; each completed block of `ratio`
//     tokens is mean-pooled into one block key k̄_b (f32 sum, /ratio, bf16).
//   * Score. The query at position p scores every complete block before its
//     own: s(p, b) = Σ_j max(0, q_j(p) · k̄_b)  (DeepSeek lightning-indexer
//     style, equal head weights).
//   * Select. Block 0 (sink) and the current block cur = p / ratio (causal:
//     its positions ≤ p) always; plus the budget − 2 best-scoring blocks of
//     [1, cur) (score descending, the lower block on ties); all blocks when
//     cur < budget.
//   * Inert bound = budget · ratio. A query at position p < bound sees at
//     most budget blocks, so its selection is every visible position and
//     sparse attention == dense attention exactly; at p >= bound the selection
//     is a strict subset. Rows below the bound are never touched.
//   * Attend. Attention of every query head over exactly the selected
//     positions, read from the paged KV pool through the block table, with
//     the operations of kv::LayerKvCache::AttendGroup (backend.h: AttendArgs),
//     so that attending over every position reproduces dense bit for bit.
//   Weights come from indexer_weights.h (checkpoint tensors, or derived from
//   the layer's q/k projections); the pool is kv_pool.h's view of the exact
//   LayerKvCache (identity block table) or any paged pool.
//
// Lifecycle of one sequence (per QSA layer):
//   st = NewSeqState(capacity)            nothing, or one allocation pair
//   prefill chunk [s, s+n):  PrefillIngest(st, x, n, s)  (s == 0 resets)
//                            ... dense attention writes attn_ctx ...
//                            PrefillSelect(st, x, q, attn_ctx, pool, table, s, n)
//   decode at pos:           DecodeSelect(st, x, pos, &sel)      (ingests pos)
//                            sel.active ? AttendSelection(sel, q, ctx, ...) : dense
//   SnapshotAux / RestoreAux   prefix-cache aux blob
//   ReleaseSeqState(st)        explicit: frees every byte (idempotent)
//
// Memory: a state holds raw keys bf16 [capacity × hd] and block keys bf16
// [capacity / ratio × hd] on the backend, each allocation rounded up to 64
// bytes; MemoryBytes() is exactly that and what the backend counts. States
// grow geometrically (×2) when a sequence outruns its capacity.
//
// Ownership: QsaSeqState holds bare DevicePtrs — destroying it frees NOTHING
// (the backend is not at hand); it logs a warning if it still held bytes.
// ReleaseSeqState is the one way to free them. The indexer owns its uploaded
// weights (freed by ~QsaIndexer) and must outlive its states; the backend
// must outlive both. QsaScratch (launch scratch) is caller-owned and RAII.
//
// Thread-safety: after New the indexer is immutable; all methods are const
// and thread-safe for distinct (state, scratch) pairs. A state or scratch is
// used by one thread at a time (the session lease / the engine thread).
//
// Errors: INVALID_ARGUMENT for bad arguments (the field is named),
// FAILED_PRECONDITION for calls out of order (select before ingest, a gap in
// positions), DATA_LOSS for a malformed aux blob; backend errors pass through.
//
// Example:
//   CORTIQ_ASSIGN_OR_RETURN(auto indexer, QsaIndexer::New(&backend, weights, geometry));
//   CORTIQ_ASSIGN_OR_RETURN(QsaSeqState st, indexer->NewSeqState(prompt + max_tokens));
//   QsaScratch scratch(&backend);
//   CORTIQ_RETURN_IF_ERROR(indexer->PrefillIngest(st, x, n, 0, scratch));
//   ... dense attention into ctx ...
//   CORTIQ_RETURN_IF_ERROR(indexer->PrefillSelect(st, x, q, ctx, pool, table, 0, n, nq, scale,
//   scratch));
//   ...
//   CORTIQ_RETURN_IF_ERROR(indexer->ReleaseSeqState(st));
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/qsa/backend.h"
#include "core/qsa/indexer_weights.h"

namespace cortiq::qsa {

class QsaIndexer;

// Geometry of one layer's indexer (the seed's New parameters).
struct QsaGeometry {
  size_t n_heads = 0;      // indexer query heads
  size_t hd = 0;           // indexer head dim (queries and key)
  size_t ratio = 0;        // tokens per block (>= 1)
  size_t budget = 0;       // blocks selected per query (>= 2: sink + current)
  size_t rot = 0;          // RoPE'd leading dims per indexer head (even, <= hd; 0 = none)
  double theta = 10000.0;  // RoPE base (double: the transformer's tables are f64-derived)
  float eps = 1e-6f;       // RmsNorm epsilon
  size_t hidden = 0;       // width of the layer input
  size_t nkv_attn = 0;     // the layer's KV heads
  size_t hd_attn = 0;      // the layer's attention head dim
};

// One sequence's indexer carry (per QSA layer). Move-only; see the banner
// for why dropping it frees nothing.
class QsaSeqState {
 public:
  QsaSeqState() = default;
  QsaSeqState(QsaSeqState&& o) noexcept;
  QsaSeqState& operator=(QsaSeqState&& o) noexcept;
  QsaSeqState(const QsaSeqState&) = delete;
  QsaSeqState& operator=(const QsaSeqState&) = delete;
  ~QsaSeqState();

  // Tokens whose keys are parked ([0, ingested) are positions 0..).
  size_t ingested() const { return ingested_; }
  // Blocks pooled (always ingested / ratio once a call returns OK).
  size_t pooled() const { return pooled_; }
  // Tokens the raw-key buffer holds without growing.
  size_t capacity() const { return capacity_; }
  // Exact backend bytes held (0 for a fresh or released state). O(1).
  size_t MemoryBytes() const { return raw_bytes_ + block_bytes_; }
  // The device buffers (null when not allocated): raw keys bf16 [capacity ×
  // hd], block keys bf16 [capacity / ratio × hd]. For tests and diagnostics.
  DevicePtr raw_keys() const { return raw_keys_; }
  DevicePtr block_keys() const { return block_keys_; }

 private:
  friend class QsaIndexer;
  const QsaIndexer* owner_ = nullptr;
  DevicePtr raw_keys_;
  DevicePtr block_keys_;
  size_t raw_bytes_ = 0;
  size_t block_bytes_ = 0;
  size_t capacity_ = 0;
  size_t ingested_ = 0;
  size_t pooled_ = 0;
};

// A decode query's selection (DecodeSelect's output, AttendSelection's input).
// Reuse one object across steps: `blocks` keeps its capacity, so a warm
// decode step does not allocate.
struct QsaSelection {
  bool active = false;           // false: inside the inert bound, attend densely
  size_t position = 0;           // the query's position (position + 1 visible)
  std::vector<uint32_t> blocks;  // logical indexer blocks, ascending
};

// Caller-owned launch scratch on the backend (one per concurrent forward
// pass), grown on demand by the indexer calls (×2, never shrunk until
// Release). Freed by the destructor (a failure is logged).
class QsaScratch {
 public:
  explicit QsaScratch(Backend* backend) : backend_(backend) {}
  ~QsaScratch();
  QsaScratch(const QsaScratch&) = delete;
  QsaScratch& operator=(const QsaScratch&) = delete;

  // Ensures at least `bytes` bytes (contents are not preserved on growth).
  absl::Status Reserve(size_t bytes);
  absl::Status Release();
  DevicePtr data() const { return data_; }
  size_t MemoryBytes() const { return bytes_; }
  Backend* backend() const { return backend_; }

 private:
  Backend* backend_;
  DevicePtr data_;
  size_t bytes_ = 0;
};

class QsaIndexer {
 public:
  // Validates `geometry` against itself and `weights` (each mismatch names
  // the field), uploads the weights and the RoPE table to `backend` (which
  // must outlive the indexer). The indexer owns those buffers.
  static absl::StatusOr<std::unique_ptr<QsaIndexer>> New(Backend* backend,
                                                         const IndexerWeights& weights,
                                                         const QsaGeometry& geometry);
  ~QsaIndexer();
  QsaIndexer(const QsaIndexer&) = delete;
  QsaIndexer& operator=(const QsaIndexer&) = delete;

  const QsaGeometry& geometry() const { return g_; }
  Backend* backend() const { return backend_; }
  // The largest visible prefix whose selection is provably all-visible:
  // budget · ratio. Queries at positions < InertBound() are dense-exact.
  size_t InertBound() const { return g_.budget * g_.ratio; }
  // Backend bytes of the uploaded weights.
  size_t WeightBytes() const { return weight_bytes_; }
  // Exact MemoryBytes() of a state after NewSeqState(capacity_tokens): what
  // admission checks against the budget.
  size_t StateBytes(size_t capacity_tokens) const;
  // Scratch bytes a call over `rows` query rows with `visible` positions needs.
  size_t ScratchBytes(size_t rows, size_t visible) const;

  // ---- per-sequence state ----
  // A state for this indexer with room for capacity_tokens (0: allocate on
  // first ingest).
  absl::StatusOr<QsaSeqState> NewSeqState(size_t capacity_tokens = 0) const;
  // Frees the state's buffers. Idempotent: each pointer is nulled BEFORE its
  // Free is issued, so a second call (or a call after a partial failure) can
  // never double-free; a failure on one buffer still frees the other, and the
  // first error is returned (the buffer whose Free failed is the backend's
  // to account for). Afterwards MemoryBytes() == 0 and the counters are 0;
  // the state may be used again (it reallocates on the next ingest).
  absl::Status ReleaseSeqState(QsaSeqState& st) const;
  // Grows the state to hold `tokens` positions (no-op when it already does).
  absl::Status Reserve(QsaSeqState& st, size_t tokens, Stream stream = kDefaultStream) const;
  // Gives back the capacity past ingested(): the state then holds exactly
  // what an import of its aux blob allocates (RestoreAux), so a session's
  // bytes are the same before and after it moves to another node. An
  // allocation failure leaves the state as it was.
  absl::Status ShrinkToFit(QsaSeqState& st, Stream stream = kDefaultStream) const;
  // Speculative rollback: keeps the first `tokens` ingested positions (must be
  // <= ingested()); blocks past them are re-pooled when re-ingested.
  absl::Status Truncate(QsaSeqState& st, size_t tokens) const;

  // ---- prefill ----
  // Ingests num_tokens positions starting at seq_start: projects their keys
  // from normed (f32 [num_tokens × hidden]), parks them in bf16, pools every
  // block they complete. seq_start == 0 resets the sequence; otherwise
  // seq_start must equal ingested() (FAILED_PRECONDITION names both).
  absl::Status PrefillIngest(QsaSeqState& st, DevicePtr normed, size_t num_tokens, size_t seq_start,
                             QsaScratch& scratch, Stream stream = kDefaultStream) const;
  // Overwrites the attention context of every chunk row whose position
  // (seq_start + row) is >= InertBound() with attention over exactly its
  // selected positions; rows below keep the dense output already in attn_ctx.
  // normed: f32 [num_tokens × hidden]; q_roped, attn_ctx: f32 [num_tokens ×
  // nq × hd_attn] (the layer's roped queries; the pre-o_proj context).
  // The pool must already hold positions [0, seq_start + num_tokens) (the
  // chunk's K/V are appended before attention) and PrefillIngest must have
  // run for the chunk. inv_sqrt_d: the layer's logit scale (0 → 1/sqrt(hd_attn)).
  absl::Status PrefillSelect(const QsaSeqState& st, DevicePtr normed, DevicePtr q_roped,
                             DevicePtr attn_ctx, const KvPool& pool, const BlockTable& table,
                             size_t seq_start, size_t num_tokens, size_t nq, float inv_sqrt_d,
                             QsaScratch& scratch, Stream stream = kDefaultStream) const;

  // ---- decode ----
  // Ingests the token at `pos` (== ingested(); normed: f32 [hidden]) and
  // selects for it: out->active = false inside the inert bound (dense is
  // exact), else out->blocks = the selection.
  absl::Status DecodeSelect(QsaSeqState& st, DevicePtr normed, size_t pos, QsaScratch& scratch,
                            QsaSelection* out, Stream stream = kDefaultStream) const;
  // Attention of one query row over exactly sel's positions (blocks
  // ascending, each <= position / ratio; any number of them), writing
  // attn_ctx (f32 [nq × hd_attn]) from q_roped (same shape). With every block
  // of [0, position / ratio] this is dense attention bit for bit.
  absl::Status AttendSelection(const QsaSelection& sel, DevicePtr q_roped, DevicePtr attn_ctx,
                               const KvPool& pool, const BlockTable& table, size_t nq,
                               float inv_sqrt_d, QsaScratch& scratch,
                               Stream stream = kDefaultStream) const;

  // ---- prefix-cache aux blob ----
  // [ingested u64 LE][pooled u64 LE][raw keys bf16, ingested × hd]. Raw keys
  // are a deterministic function of the prefix, so this IS the state; block
  // keys are re-pooled on restore rather than serialised.
  absl::StatusOr<std::vector<uint8_t>> SnapshotAux(const QsaSeqState& st,
                                                   Stream stream = kDefaultStream) const;
  // Uploads the raw keys (growing the state as needed), resets the counters
  // and re-pools the block keys. A blob whose length or counters disagree
  // with this geometry → DATA_LOSS, state untouched.
  absl::Status RestoreAux(QsaSeqState& st, std::span<const uint8_t> blob,
                          Stream stream = kDefaultStream) const;
  // The raw keys of tokens [from, from + count) (hd · 2 bytes each, as in
  // the aux blob) copied to dst: what a journal record carries of the aux
  // state (only the new tokens). OUT_OF_RANGE past ingested.
  absl::Status CopyRawKeys(const QsaSeqState& st, size_t from, size_t count, uint8_t* dst,
                           Stream stream = kDefaultStream) const;

  // ---- diagnostics ----
  // The block scores the selection of a query at `pos` (< ingested()) ranks:
  // [pos / ratio] floats, entry b = s(pos, b) for b in [1, pos / ratio); entry
  // 0 (the sink, never scored) is NaN.
  absl::StatusOr<std::vector<float>> BlockScores(const QsaSeqState& st, DevicePtr normed_row,
                                                 size_t pos, QsaScratch& scratch,
                                                 Stream stream = kDefaultStream) const;

 private:
  // Offsets (bytes) of the scratch regions of one call.
  struct Layout {
    size_t keys = 0, q = 0, scores = 0, selected = 0, counts = 0, total = 0;
  };
  QsaIndexer(Backend* backend, const QsaGeometry& g) : backend_(backend), g_(g) {}
  // New buffers for exactly `cap` tokens, the ingested keys and pooled
  // blocks copied over; the old ones freed. On a failure the state keeps
  // its old buffers.
  absl::Status Resize(QsaSeqState& st, size_t cap, Stream stream) const;
  Layout ScratchLayout(size_t rows, size_t num_blocks, size_t sel_ld) const;
  absl::Status CheckOwner(const QsaSeqState& st, const char* what) const;
  absl::Status CheckPool(const KvPool& pool, const BlockTable& table, size_t positions, size_t nq,
                         const char* what) const;
  absl::Status Upload(const void* host, size_t bytes, DevicePtr* out);
  // Projection of rows [pos0, pos0 + rows): query heads or the key head.
  ProjectArgs QueryProjection(DevicePtr x, size_t rows, size_t pos0, DevicePtr out) const;
  ProjectArgs KeyProjection(DevicePtr x, size_t rows, size_t pos0, DevicePtr out) const;
  absl::Status PoolUpTo(QsaSeqState& st, Stream stream) const;
  // Scores + selects rows [pos0, pos0 + rows) from projected queries in scratch.
  absl::Status ScoreAndSelect(const QsaSeqState& st, DevicePtr scratch, const Layout& l,
                              size_t rows, size_t pos0, size_t num_blocks, Stream stream) const;

  Backend* backend_;
  QsaGeometry g_;
  math::DType w_dtype_ = math::DType::kF32;
  DevicePtr w_;         // w_dtype [(n_heads + 1) · hd × hidden]
  DevicePtr bias_;      // null or f32 [(n_heads + 1) · hd]
  DevicePtr q_norm_;    // null or f32 [hd]
  DevicePtr k_norm_;    // null or f32 [hd]
  DevicePtr inv_freq_;  // null (rot == 0) or f32 [rot / 2]
  size_t weight_bytes_ = 0;
};

}  // namespace cortiq::qsa
