// KvRows: the exact K/V rows of one transformer layer and their bookkeeping —
// head-major storage plus which rows each head holds (seq_len, per-head
// lengths, the alive log of dead heads, per-row importance). No attention
// math (attend.h reads a HeadRowsView of it), no O(1) state
// (o1_override.h), no wire format (layer_wire.h fills it through the
// importer section below). LayerKvCache composes it; on its own it is what a
// wire importer builds before it becomes a cache.
//
// Contract
//   * Storage is head-major: per KV head one contiguous block of
//     [capacity × head_dim] keys and one of values — f32 rows (KvMode::kF32)
//     or int8 rows with one f32 symmetric scale per row (KvMode::kInt8). The
//     mode is fixed at construction.
//   * Allocation: Reserve sizes every block once; Append past capacity grows
//     geometrically (×2, from 16), never per token. Large row buffers (1 MiB
//     and more at the capacity: AlignedBuffer's own mappings) are "paged":
//     each head block starts on a page and spans a stride of rows with
//     half again of room ahead of the capacity (from the first Reserve: an
//     address space reservation), of which only the pages
//     under capacity() rows are committed (resident and counted). So a kept
//     session's next turn, reserving a few more positions, commits their
//     pages instead of copying every row to a new buffer (it did: 510 MB a
//     turn at 2,200 positions of the 0.6B shape). Not with
//     CORTIQ_HUGE_PAGES=1, whose buffers are whole huge pages. Two optional pieces are
//     allocated lazily, once per conversation: the importance buffer (first
//     AccumulateImp) and the alive log (first Append with a dead head). Every
//     other method allocates nothing.
//   * MemoryBytes() is the exact heap bytes held (capacity-based, 64-byte
//     rounded per buffer: rows, scales, head lengths, importance, alive
//     log; a paged row buffer counts each head's committed pages). A fresh or Release()d store
//     holds 0 bytes. Allocations are zero-filled, so the bytes counted are also resident.
//     ReleaseUnused gives the pages of each head block beyond seq_len() back to the OS and
//     MemoryBytes() stops counting them, until Reserve / Append commits them again (zero-filled, so
//     again resident).
//   * Dead heads: a KV head whose alive[h] is false at Append stores nothing
//     for that position. seq_len() counts every position appended;
//     HeadLen(h) counts the rows head h actually stored (<= seq_len()).
//   * Errors: wrong sizes and out-of-range heads are programmer errors
//     (abort, "kv check failed"); nothing here takes client input.
//
// Ownership: owns all its buffers; move-only (a moved-from store is empty:
// Release()d, same geometry), deep copies are explicit (Copy()).
//
// Thread-safety: const methods touch no mutable state and may run
// concurrently with each other; mutating methods need exclusive access.
//
// Example:
//   KvRows rows(/*num_kv_heads=*/8, /*head_dim=*/128, KvMode::kF32);
//   rows.Reserve(prompt_len + max_tokens);  // the only allocation
//   rows.Append(k_new, v_new, {});          // [8 × 128] each
//   kv::AttendGroup(rows.Head(g), q_group, 4, out, probs, {}, {});
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "core/kv/head_rows.h"
#include "core/util/aligned_buffer.h"

namespace cortiq::kv {

class KvRows {
 public:
  // Allocates nothing. num_kv_heads, head_dim > 0 (programmer invariant).
  KvRows(size_t num_kv_heads, size_t head_dim, KvMode mode);
  KvRows(KvRows&& other) noexcept;
  KvRows& operator=(KvRows&& other) noexcept;
  KvRows(const KvRows&) = delete;
  KvRows& operator=(const KvRows&) = delete;
  ~KvRows() = default;

  // Deep copy at the same capacity (the copy appends on without
  // allocating). O(MemoryBytes()).
  KvRows Copy() const;

  // Exact MemoryBytes() of a fresh store of this geometry after
  // Reserve(positions), without the lazy importance / alive log. O(1).
  static size_t ProjectedBytes(size_t num_kv_heads, size_t head_dim, KvMode mode, size_t positions);

  // ---- geometry and sizes (O(1)) ----
  KvMode mode() const { return mode_; }
  size_t num_kv_heads() const { return num_kv_heads_; }
  size_t head_dim() const { return head_dim_; }
  // Positions appended so far (dead heads included).
  size_t seq_len() const { return seq_len_; }
  // Positions every head block can hold without reallocating.
  size_t capacity() const { return capacity_; }
  // Rows stored for kv_head (< num_kv_heads(), checked).
  size_t HeadLen(size_t kv_head) const;
  // True once any Append marked a head dead (since the last Clear / Release).
  bool HasDeadHeads() const { return !alive_log_.empty(); }
  // Importance per stored row: [capacity] once AccumulateImp has run (rows
  // beyond the longest head are 0).
  bool HasImportance() const { return !importance_.empty(); }
  std::span<const float> Importance() const { return {importance_.data(), importance_.size()}; }

  // kv_head's HeadLen stored rows, read-only (see head_rows.h; valid until
  // the next mutation). O(1), no allocation.
  HeadRowsView Head(size_t kv_head) const;

  // ---- capacity ----
  // Grows capacity to at least `positions` in one reallocation per buffer
  // (no-op if it is already large enough), keeping every stored row; rows
  // up to `positions` given back by ReleaseUnused are committed again.
  void Reserve(size_t positions);
  // Reallocates to exactly seq_len() positions (0 → frees every buffer).
  void ShrinkToFit();
  // Gives back the unused tail of every head block — the whole pages past
  // seq_len() rows — with madvise(MADV_DONTNEED): no copy, capacity() and
  // every stored row unchanged, and MemoryBytes() drops by the bytes given
  // back. Preferred over ShrinkToFit at the end of a call: a kept session
  // that continues re-commits the pages it needs (Reserve, zero-filled, a
  // memset) instead of copying every row twice. The rows' buffers are
  // private anonymous memory (glibc's mmap path for big blocks, else its
  // heap), where MADV_DONTNEED frees the pages and later reads see zeros.
  // O(num_kv_heads) system calls; allocates nothing.
  void ReleaseUnused();

  // ---- mutation ----
  // Appends one position. k_new, v_new: [num_kv_heads × head_dim]; alive:
  // empty (every head stores it) or [num_kv_heads]. Allocates only when
  // seq_len() == capacity() (geometric growth), or the first time a head is
  // dead (the alive log, [capacity × num_kv_heads] bytes, once). kInt8
  // quantises each row (math::QuantizeRowI8). O(num_kv_heads × head_dim).
  void Append(std::span<const float> k_new, std::span<const float> v_new,
              std::span<const bool> alive);
  // Rolls back the last n_drop positions (n_drop <= seq_len(), checked):
  // each head loses exactly the rows it stored for them, and the importance
  // of rows no longer stored by any head is zeroed. Appending the same
  // positions again yields the state never having appended them gives.
  // O(num_kv_heads × n_drop). Never allocates.
  void TruncateLast(size_t n_drop);
  // Adds probs[t] to the importance of stored row t, t < probs.size() <=
  // seq_len() (checked). The first call allocates the [capacity] buffer.
  void AccumulateImp(std::span<const float> probs);
  // Forgets every position, the importance and the alive log; KEEPS the
  // row capacity (a reused session does not reallocate).
  void Clear();
  // Frees every buffer: MemoryBytes() == 0, seq_len() == 0. Stays usable.
  void Release();

  // Exact heap bytes held (see the banner). O(1).
  size_t MemoryBytes() const;

  // ---- importer (a wire format filling a fresh store) ----
  // The first `rows` slots of kv_head's blocks, writable (rows <=
  // capacity(), checked; Reserve first). O(1), no allocation. What is
  // written there is not stored until SetDenseRows counts it.
  HeadRowsFill Fill(size_t kv_head, size_t rows);
  // Declares the first `seq_len` slots of every head stored, as written
  // through Fill: seq_len() and every HeadLen() become seq_len. Requires a
  // store holding no position, no importance and no alive log, and
  // seq_len <= capacity() (checked). O(num_kv_heads), no allocation.
  void SetDenseRows(size_t seq_len);
  // The `rows` slots after the stored positions of kv_head's blocks
  // ([seq_len(), seq_len() + rows)), writable: what a journal's restore
  // appends (core/session/session_journal). Reserve(seq_len() + rows)
  // first (checked). O(1), no allocation; nothing is stored until
  // AppendDenseRows counts it.
  HeadRowsFill FillNext(size_t kv_head, size_t rows);
  // Declares the `rows` slots after seq_len() of every head stored, as
  // written through FillNext. Requires every head dense (no alive log) and
  // seq_len() + rows <= capacity() (checked). O(num_kv_heads), no
  // allocation.
  void AppendDenseRows(size_t rows);

 private:
  // Reallocates every per-position buffer to new_capacity (>= seq_len_),
  // keeping stored rows; 0 frees them all. The only place storage is
  // (re)allocated, apart from the lazy importance / alive log.
  // A paged store's blocks keep their stride unless `exact` (ShrinkToFit)
  // or the capacity outgrows it.
  void Reallocate(size_t new_capacity, bool exact = false);
  // Makes rows [committed_, rows) of every head block resident again
  // (zero-filled) and recounts the pages still given back. rows <= capacity_.
  void CommitRows(size_t rows);
  // Bytes of the whole pages inside rows [from, capacity_) of every head
  // block, summed over the row buffers; with `drop`, madvise(MADV_DONTNEED)
  // gives them back first.
  size_t TailPageBytes(size_t from, bool drop);
  // Paged row buffers (see the banner): the bytes of one row, whether a row
  // buffer of `rows` rows per head is paged, the stride such a buffer gets
  // for `rows` (page-aligned head blocks), and its counted bytes.
  static size_t RowBytes(size_t head_dim, KvMode mode);
  static bool PagedAt(size_t num_kv_heads, size_t row_bytes, size_t rows);
  static size_t PagedStride(size_t row_bytes, size_t rows);
  static size_t RowBufferBytes(size_t num_kv_heads, size_t row_bytes, size_t rows);
  // Offsets of head h's blocks.
  size_t RowBase(size_t kv_head) const { return kv_head * stride_ * head_dim_; }
  size_t ScaleBase(size_t kv_head) const { return kv_head * capacity_; }

  KvMode mode_;
  size_t num_kv_heads_;
  size_t head_dim_;
  size_t capacity_ = 0;  // positions per head block
  // Rows per head block of the row buffers: capacity_, or for paged ones
  // (paged_) page-aligned and grown ahead of it.
  size_t stride_ = 0;
  bool paged_ = false;
  size_t seq_len_ = 0;  // positions appended (dead heads included)
  // Rows per head block that are resident (seq_len_ <= committed_ <=
  // capacity_); the whole pages past them were given back (ReleaseUnused)
  // and are the dropped_bytes_ MemoryBytes() does not count (a paged row
  // buffer counts its committed pages instead: dropped_bytes_ is then the
  // scales' alone).
  size_t committed_ = 0;
  size_t dropped_bytes_ = 0;

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
