// LayerKvCache: the exact KV cache of one transformer layer for one session
// (seed 001), plus AttentionHead, the plain per-head attention it must match.
//
// Contract
//   * Storage is head-major: per KV head one contiguous block of
//     [capacity × head_dim] keys and one of values — f32 rows (KvMode::kF32)
//     or int8 rows with one f32 symmetric scale per row (KvMode::kInt8). The
//     mode is fixed at construction (chosen per session).
//   * No allocation per decode step: Reserve(prompt + max_tokens) at admission
//     sizes every block once; Append past capacity grows geometrically (×2,
//     amortised), never per token. Attend / AttendGroup never allocate: every
//     output and scratch buffer is the caller's. Two optional pieces of state
//     are allocated lazily, once per conversation: the importance buffer (first
//     AccumulateImp) and the alive log (first Append with a dead head).
//   * MemoryBytes() is the exact heap bytes this object holds (what is
//     allocated, capacity-based, including scales, bookkeeping, importance and
//     the alive log). A fresh or Release()d cache holds 0 bytes.
//     Allocations are zero-filled, so the bytes counted are also resident.
//   * Dead heads: a KV head whose alive[h] is false at Append stores nothing
//     for that position. seq_len() counts every position appended;
//     HeadLen(h) counts the rows head h actually stored (<= seq_len()).
//
// Ownership: owns all its buffers; move-only, deep copies are explicit (Copy()).
//
// Thread-safety: const methods (Attend, AttendGroup, accessors, MemoryBytes,
// Copy) touch no member state and may run concurrently with each other — in
// particular AttendGroup on different kv_heads from different threads, as long
// as each call has its own out/probs/imp_acc buffers. Mutating methods need
// exclusive access (the session lease provides it).
//
// Example (decode step, one layer, GQA group of 4 Q heads per KV head):
//   LayerKvCache cache(/*num_kv_heads=*/8, /*head_dim=*/128);
//   cache.Reserve(prompt_len + max_tokens);           // the only allocation
//   ...
//   cache.Append(k_new, v_new);                       // [8 × 128] each
//   std::vector<float> probs(cache.GroupProbsSize(4));  // per thread, once
//   cache.AttendGroup(q.subspan(g * 4 * 128, 4 * 128), g, 4,
//                     out.subspan(g * 4 * 128, 4 * 128), probs, {}, {});
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>

#include "core/util/aligned_buffer.h"

namespace cortiq::kv {

enum class KvMode : uint8_t {
  kF32 = 0,   // rows stored as f32: exact
  kInt8 = 1,  // rows stored as int8 + one f32 scale per row (~4× smaller)
};
const char* KvModeName(KvMode mode);

// Score options shared by Attend, AttendGroup and AttentionHead.
struct AttendOptions {
  // Logit scale; 0 → 1/sqrt(head_dim) (the architecture may override it).
  float scale = 0.0f;
  // Earliest visible stored row: rows [0, first) get probability exactly 0
  // (sliding-window layers pass stored − window). first >= stored → every
  // probability is 0 and the output is 0.
  size_t first = 0;
  // One past the last visible stored row: rows [end, stored) are ignored as if
  // never appended (a causal prefill chunk appends every row first, then row
  // i attends with end = its position + 1). Default: every stored row.
  size_t end = SIZE_MAX;
  // > 0: Gemma-style soft cap, logit = softcap · tanh(logit / softcap), applied
  // after scaling and before softmax. 0 = off.
  float softcap = 0.0f;
};

// Plain attention of one query head over slices — the reference the f32
// branch of Attend / AttendGroup equals bit for bit (same kernels, same order):
//   logit[t] = cap(scale · Dot(q, keys[t]))  for t in [first, len)
//   p = Softmax(logit[first..len)),  p[t < first] = 0
//   out = Σ_t p[t] · values[t]  (Axpy, t ascending, from out = 0)
// q: [head_dim]; keys, values: [len × head_dim]; out: [head_dim];
// probs: [>= len], receives p. Allocates nothing.
void AttentionHead(std::span<const float> q, std::span<const float> keys,
                   std::span<const float> values, size_t head_dim, const AttendOptions& options,
                   std::span<float> out, std::span<float> probs);

class LayerKvCache {
 public:
  // Allocates nothing; storage comes with Reserve / the first Append.
  LayerKvCache(size_t num_kv_heads, size_t head_dim, KvMode mode = KvMode::kF32);
  LayerKvCache(LayerKvCache&& other) noexcept;
  LayerKvCache& operator=(LayerKvCache&& other) noexcept;
  LayerKvCache(const LayerKvCache&) = delete;
  LayerKvCache& operator=(const LayerKvCache&) = delete;
  ~LayerKvCache() = default;

  // Deep copy, same capacity (the copy decodes on without allocating).
  // O(MemoryBytes()).
  LayerKvCache Copy() const;

  // Exact MemoryBytes() of a fresh cache of this geometry after
  // Reserve(positions) (without the lazily allocated importance / alive log):
  // what admission checks against the memory budget.
  static size_t ProjectedBytes(size_t num_kv_heads, size_t head_dim, KvMode mode, size_t positions);

  // ---- geometry and sizes (O(1)) ----
  KvMode mode() const { return mode_; }
  size_t num_kv_heads() const { return num_kv_heads_; }
  size_t head_dim() const { return head_dim_; }
  // Positions appended so far (dead heads included).
  size_t seq_len() const { return seq_len_; }
  // Positions every head block can hold without reallocating.
  size_t capacity() const { return capacity_; }
  // Rows actually stored for kv_head (0 for a head dead at every Append).
  size_t HeadLen(size_t kv_head) const;
  // True once any Append marked a head dead (since the last Clear / Release).
  bool HasDeadHeads() const { return !alive_log_.empty(); }

  // ---- capacity ----
  // Grows capacity to at least `positions` in one reallocation (no-op if it
  // is already large enough). Call at admission with prompt + max_tokens.
  void Reserve(size_t positions);
  // Reallocates to exactly seq_len() positions (0 → releases the storage).
  void ShrinkToFit();

  // ---- mutation ----
  // Appends one position. k_new, v_new: [num_kv_heads × head_dim]. Heads
  // with alive[h] == false store nothing for it. Allocates only when
  // seq_len() == capacity() (geometric growth), or the first time a head is
  // dead (the alive log, [capacity × num_kv_heads] bytes, once).
  void Append(std::span<const float> k_new, std::span<const float> v_new);
  void Append(std::span<const float> k_new, std::span<const float> v_new,
              std::span<const bool> alive);  // alive: [num_kv_heads]
  // Rolls back the last n_drop positions (speculative-decode reject); each
  // head loses exactly the rows it stored for them. Appending the same
  // positions again yields the state that never having appended them gives.
  // Importance of rows no longer stored by any head is zeroed. n_drop must
  // be <= seq_len(). Never allocates.
  void TruncateLast(size_t n_drop);
  // Adds probs[t] to the importance of stored row t, t < probs.size() <=
  // seq_len() (call once per Q head: the sum over heads). The first call
  // allocates the [capacity] importance buffer.
  void AccumulateImp(std::span<const float> probs);
  // New conversation: forgets every position, the importance and the alive
  // log; KEEPS the K/V capacity (a reused session does not reallocate).
  void Clear();
  // Frees every buffer: MemoryBytes() == 0. The cache stays usable.
  void Release();

  // Importance per stored row: [capacity] once AccumulateImp has run (rows
  // beyond the longest head are 0); wire v1 refuses to export it.
  bool HasImportance() const { return !importance_.empty(); }
  std::span<const float> Importance() const { return {importance_.data(), importance_.size()}; }

  // ---- attention (const, allocation-free) ----
  // One query head over kv_head's stored rows; n = HeadLen(kv_head).
  // q: [head_dim]; out: [head_dim]; probs: [>= n], receives the n
  // probabilities. kF32: bit-for-bit AttentionHead over HeadKeys/HeadValues.
  // kInt8: logit = cap(scale · (s_k[t] · DotI8(q, k_q[t]))), out = Σ_t
  // AxpyI8(p[t] · s_v[t], v_q[t]), f32 accumulation throughout.
  void Attend(std::span<const float> q, size_t kv_head, std::span<float> out,
              std::span<float> probs, const AttendOptions& options = {}) const;

  // Floats AttendGroup needs in `probs` for n_q_heads at the current
  // capacity (size a per-thread buffer once after Reserve).
  size_t GroupProbsSize(size_t n_q_heads) const { return n_q_heads * capacity_; }
  // All n_q_heads query heads of one GQA group over kv_head: ONE pass over the
  // stored K rows (each row scored for every head) and ONE pass over the V
  // rows. Each head's logits, softmax and V accumulation order are identical
  // to Attend, so each head's output and probs are bit-for-bit Attend's.
  // q_group, out: [n_q_heads × head_dim] (the group's heads, contiguous);
  // probs: [>= n_q_heads × n], receives head j's probabilities at [j × n, (j+1)
  // × n) with n = HeadLen(kv_head); imp_acc: empty or [>= n] — imp_acc[t] +=
  // p_j[t] for every head j in order (the caller's per-head Attend +
  // accumulate loop, bit for bit).
  void AttendGroup(std::span<const float> q_group, size_t kv_head, size_t n_q_heads,
                   std::span<float> out, std::span<float> probs, std::span<float> imp_acc,
                   const AttendOptions& options = {}) const;

  // ---- stored rows of one head (views, valid until the next mutation) ----
  // kF32 only (empty in kInt8): [HeadLen × head_dim].
  std::span<const float> HeadKeys(size_t kv_head) const;
  std::span<const float> HeadValues(size_t kv_head) const;
  // kInt8 only (empty in kF32): rows [HeadLen × head_dim] and their
  // dequantisation scales [HeadLen] (row t ≈ scale[t] · q[t]).
  std::span<const int8_t> HeadKeysI8(size_t kv_head) const;
  std::span<const int8_t> HeadValuesI8(size_t kv_head) const;
  std::span<const float> HeadKeyScales(size_t kv_head) const;
  std::span<const float> HeadValueScales(size_t kv_head) const;

  // Exact heap bytes held (see the banner). O(1).
  size_t MemoryBytes() const;

  // Next (own issues; not implemented here):
  //  * the O(1) Nyström override of seed 001/002 — O1Begin / O1PushQ /
  //    O1Seal / O1Sealed / O1Step / O1MemoryBytes, an optional member that,
  //    once sealed, replaces this layer's K/V rows (seal needs kF32 rows and
  //    no dead heads); MemoryBytes() will add its bytes.
  //  * ExportWire / ImportWire (absl::Status / StatusOr): refuse kInt8 rows,
  //    importance, dead heads or an O(1) override; validate geometry before
  //    installing anything.

 private:
  // Reallocates every per-position buffer to new_capacity (>= seq_len_),
  // keeping stored rows. The only place storage is (re)allocated.
  void Reallocate(size_t new_capacity);
  void ResetScalars();
  // Offsets of head h's blocks.
  size_t RowBase(size_t kv_head) const { return kv_head * capacity_ * head_dim_; }
  size_t ScaleBase(size_t kv_head) const { return kv_head * capacity_; }

  KvMode mode_;
  size_t num_kv_heads_;
  size_t head_dim_;
  size_t capacity_ = 0;  // positions per head block
  size_t seq_len_ = 0;   // positions appended (dead heads included)

  util::AlignedBuffer<size_t> head_len_;  // [num_kv_heads]; with storage
  // kF32 storage (empty in kInt8):
  util::AlignedBuffer<float> k_f32_;  // [num_kv_heads × capacity × head_dim]
  util::AlignedBuffer<float> v_f32_;  // [num_kv_heads × capacity × head_dim]
  // kInt8 storage (empty in kF32):
  util::AlignedBuffer<int8_t> k_i8_;    // [num_kv_heads × capacity × head_dim]
  util::AlignedBuffer<int8_t> v_i8_;    // [num_kv_heads × capacity × head_dim]
  util::AlignedBuffer<float> k_scale_;  // [num_kv_heads × capacity]
  util::AlignedBuffer<float> v_scale_;  // [num_kv_heads × capacity]
  // Lazily allocated:
  util::AlignedBuffer<float> importance_;  // [capacity], per stored row
  // [capacity × num_kv_heads]: 1 if head h stored position p. Exists only once
  // a head has been dead; without it every head stored every position.
  util::AlignedBuffer<uint8_t> alive_log_;
};

}  // namespace cortiq::kv
