// LayerKvCache: the KV cache of one transformer layer for one session (seed
// 001), the seed-named type that composes three parts kept apart:
//   * KvRows (kv_rows.h): the exact rows and their bookkeeping — storage,
//     seq_len, per-head lengths, dead heads, importance;
//   * the attention math (attend.h): free functions over a read-only
//     HeadRowsView of one head's rows; AttentionHead, the plain reference;
//   * O1Override (o1_override.h): the optional O(1) Nyström override.
// The wire format (layer_wire.h) reads and builds caches through the public
// API below only.
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
//   * Optional O(1) Nyström override (seeds 001/002, the O1* methods below,
//     one O1Override). Once sealed, the layer's exact K/V rows are FREED and
//     decode runs through one NystromState per KV group (O1Step); the
//     exact path is then closed: Append, Attend, AttendGroup and
//     AccumulateImp CHECK-fail, Reserve / ShrinkToFit are no-ops,
//     TruncateLast is refused (FailedPrecondition), HeadLen() is 0.
//     seq_len() keeps counting (O1Step advances it). Clear / Release drop
//     the override.
//   * Wire format (ExportWire / ImportWire, implemented in layer_wire.cc,
//     layout in docs/WIRE_FORMAT.md; piece by piece: layer_wire.h): one
//     self-checking blob per layer; export refuses state the requested
//     version does not describe (with a typed reason, wire_refusal.h),
//     import validates everything before it touches the cache.
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
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/kv/attend.h"
#include "core/kv/head_rows.h"
#include "core/kv/kv_rows.h"
#include "core/kv/nystrom.h"
#include "core/kv/o1_override.h"

namespace cortiq::kv {

// Wire versions this build writes and reads (ExportWire / ImportWire).
inline constexpr uint32_t kWireVersionMin = 1;
inline constexpr uint32_t kWireVersionMax = 2;

struct WireOptions {
  uint32_t version = kWireVersionMax;  // 1: the seed's format (exact f32 only)
  bool f16 = false;                    // f32 rows travel as f16 (lossy, half the bytes)
};

// What the importing side's model says about the layer beyond the geometry
// the cache was constructed with (num_kv_heads, head_dim, mode).
struct WireImportExpect {
  size_t num_q_heads = 0;    // the layer's query heads: a sealed O(1) blob must match
  size_t max_positions = 0;  // context limit: a longer seq_len is refused, capacity clamped
};

class LayerKvCache {
 public:
  // Allocates nothing; storage comes with Reserve / the first Append.
  LayerKvCache(size_t num_kv_heads, size_t head_dim, KvMode mode = KvMode::kF32);
  // A cache over `rows` (e.g. a wire importer's, filled through
  // KvRows::Fill + SetDenseRows), without an O(1) override. O(1), no
  // allocation.
  explicit LayerKvCache(KvRows rows) : rows_(std::move(rows)) {}
  // Move leaves the source empty (Release()d), same geometry.
  LayerKvCache(LayerKvCache&& other) noexcept;
  LayerKvCache& operator=(LayerKvCache&& other) noexcept;
  LayerKvCache(const LayerKvCache&) = delete;
  LayerKvCache& operator=(const LayerKvCache&) = delete;
  ~LayerKvCache() = default;

  // Deep copy, same capacity (the copy decodes on without allocating), the
  // O(1) override included (trace or sealed states). O(MemoryBytes()).
  LayerKvCache Copy() const;

  // Exact MemoryBytes() of a fresh cache of this geometry after
  // Reserve(positions) (without the lazily allocated importance / alive log):
  // what admission checks against the memory budget.
  static size_t ProjectedBytes(size_t num_kv_heads, size_t head_dim, KvMode mode,
                               size_t positions) {
    return KvRows::ProjectedBytes(num_kv_heads, head_dim, mode, positions);
  }

  // Moves the exact rows out (e.g. a cache reserved ahead, handed to a wire
  // importer); *this is left as Release() leaves it, its O(1) override
  // dropped too. O(1), no allocation.
  KvRows TakeRows();

  // ---- geometry and sizes (O(1)) ----
  KvMode mode() const { return rows_.mode(); }
  size_t num_kv_heads() const { return rows_.num_kv_heads(); }
  size_t head_dim() const { return rows_.head_dim(); }
  // Positions appended so far (dead heads included; on a sealed O(1) layer,
  // positions absorbed by the Nyström states).
  size_t seq_len() const { return O1Sealed() ? o1_->positions() : rows_.seq_len(); }
  // Positions every head block can hold without reallocating (0 on a sealed
  // O(1) layer).
  size_t capacity() const { return rows_.capacity(); }
  // Rows actually stored for kv_head (0 for a head dead at every Append, and
  // 0 on a sealed O(1) layer: its rows are freed). kv_head < num_kv_heads()
  // (checked).
  size_t HeadLen(size_t kv_head) const { return rows_.HeadLen(kv_head); }
  // True once any Append marked a head dead (since the last Clear / Release).
  bool HasDeadHeads() const { return rows_.HasDeadHeads(); }

  // ---- capacity ----
  // Grows capacity to at least `positions` in one reallocation (no-op if it
  // is already large enough). Call at admission with prompt + max_tokens.
  void Reserve(size_t positions);
  // Reallocates to exactly seq_len() positions (0 → releases the storage).
  void ShrinkToFit();
  // Gives the row capacity past seq_len() back to the OS without a copy
  // (KvRows::ReleaseUnused); no-op once sealed.
  void ReleaseUnused();

  // ---- a journal's restore (core/session/session_journal) ----
  // KvRows::FillNext / AppendDenseRows on the exact rows: `rows` stored
  // positions appended as written (f32 rows, or int8 rows with their
  // scales), without quantising again. A cache with an O(1) override
  // (collecting or sealed) has no rows to append to (checked).
  HeadRowsFill FillNext(size_t kv_head, size_t rows);
  void AppendDenseRows(size_t rows);

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
  // Importance of rows no longer stored by any head is zeroed; a query trace
  // being collected (O1Begin) loses the same positions. n_drop must be <=
  // seq_len() (programmer invariant). FailedPrecondition, nothing changed, on
  // a sealed O(1) layer: the Nyström state cannot un-absorb a key. Never
  // allocates.
  absl::Status TruncateLast(size_t n_drop);
  // Adds probs[t] to the importance of stored row t, t < probs.size() <=
  // seq_len() (call once per Q head: the sum over heads). The first call
  // allocates the [capacity] importance buffer.
  void AccumulateImp(std::span<const float> probs);
  // New conversation: forgets every position, the importance, the alive log
  // and any O(1) override; KEEPS the K/V capacity (a reused session does not
  // reallocate; a sealed layer has none left).
  void Clear();
  // Frees every buffer, the O(1) override included: MemoryBytes() == 0. The
  // cache stays usable.
  void Release();

  // Importance per stored row: [capacity] once AccumulateImp has run (rows
  // beyond the longest head are 0); wire v1 refuses to export it.
  bool HasImportance() const { return rows_.HasImportance(); }
  std::span<const float> Importance() const { return rows_.Importance(); }

  // ---- attention (const, allocation-free) ----
  // One query head over kv_head's stored rows; n = HeadLen(kv_head).
  // q: [head_dim]; out: [head_dim]; probs: [>= n], receives the n
  // probabilities. kv::Attend over HeadRows(kv_head) (attend.h): kF32 is
  // bit-for-bit AttentionHead over HeadKeys/HeadValues; kInt8: logit =
  // cap(scale · (s_k[t] · DotI8(q, k_q[t]))), out = Σ_t AxpyI8(p[t] · s_v[t],
  // v_q[t]), f32 accumulation throughout. CHECK-fails on a sealed layer.
  void Attend(std::span<const float> q, size_t kv_head, std::span<float> out,
              std::span<float> probs, const AttendOptions& options = {}) const;

  // Floats AttendGroup needs in `probs` for n_q_heads at the current
  // capacity (size a per-thread buffer once after Reserve).
  size_t GroupProbsSize(size_t n_q_heads) const { return n_q_heads * capacity(); }
  // All n_q_heads query heads of one GQA group over kv_head: ONE pass over the
  // stored K rows (each row scored for every head) and ONE pass over the V
  // rows. Each head's logits, softmax and V accumulation order are identical
  // to Attend, so each head's output and probs are bit-for-bit Attend's.
  // q_group, out: [n_q_heads × head_dim] (the group's heads, contiguous);
  // probs: [>= n_q_heads × n], receives head j's probabilities at [j × n, (j+1)
  // × n) with n = HeadLen(kv_head); imp_acc: empty or [>= n] — imp_acc[t] +=
  // p_j[t] for every head j in order (the caller's per-head Attend +
  // accumulate loop, bit for bit). kv::AttendGroup over HeadRows(kv_head);
  // CHECK-fails on a sealed layer.
  void AttendGroup(std::span<const float> q_group, size_t kv_head, size_t n_q_heads,
                   std::span<float> out, std::span<float> probs, std::span<float> imp_acc,
                   const AttendOptions& options = {}) const;

  // ---- stored rows of one head (views, valid until the next mutation) ----
  // All of kv_head's HeadLen rows in one read-only view (head_rows.h): what
  // the attention functions and a wire exporter read. O(1), no allocation;
  // kv_head < num_kv_heads() (checked). The accessors below are its spans.
  HeadRowsView HeadRows(size_t kv_head) const { return rows_.Head(kv_head); }
  // kF32 only (empty in kInt8): [HeadLen × head_dim].
  std::span<const float> HeadKeys(size_t kv_head) const { return HeadRows(kv_head).keys; }
  std::span<const float> HeadValues(size_t kv_head) const { return HeadRows(kv_head).values; }
  // kInt8 only (empty in kF32): rows [HeadLen × head_dim] and their
  // dequantisation scales [HeadLen] (row t ≈ scale[t] · q[t]).
  std::span<const int8_t> HeadKeysI8(size_t kv_head) const { return HeadRows(kv_head).keys_i8; }
  std::span<const int8_t> HeadValuesI8(size_t kv_head) const { return HeadRows(kv_head).values_i8; }
  std::span<const float> HeadKeyScales(size_t kv_head) const {
    return HeadRows(kv_head).key_scales;
  }
  std::span<const float> HeadValueScales(size_t kv_head) const {
    return HeadRows(kv_head).value_scales;
  }

  // Exact heap bytes held (see the banner), O1MemoryBytes() included.
  // O(num_kv_heads) with a sealed override, O(1) otherwise.
  size_t MemoryBytes() const { return rows_.MemoryBytes() + O1MemoryBytes(); }

  // ---- O(1) Nyström override (seeds 001/002) ----
  // Lifecycle, driven by the forward pass:
  //   O1Begin(m, w, sink, rect)         on an empty cache: arm query collection
  //   per prompt position: Append(k, v) + O1PushQ(q_all)   (exact attention as usual)
  //   O1Seal(num_heads)                 freeze the prompt: one NystromState per
  //                                     KV group, then free the exact K/V
  //   per decode position: O1Step(q_all, k, v, num_heads, out)
  // Positions are counted by seq_len() throughout. Costs: O1PushQ amortised
  // O(num_heads·head_dim) (the trace grows geometrically, following the exact
  // capacity); O1Seal O(t·(m·d + d)·num_heads + m³·num_heads), allocating the
  // states; O1Step per group O((sink + w)·d + m·(d + m)) per Q head and, in
  // skeleton mode, no allocation.

  // Arms query collection for a fresh prompt pass. FailedPrecondition when
  // the cache holds positions (seq_len() > 0) or is sealed; InvalidArgument
  // for m < 4 or w < 1 (kv::O1Config clamps them). Re-arming an empty,
  // collecting cache starts over with the new settings. Allocates nothing.
  absl::Status O1Begin(size_t m, size_t w, size_t sink, O1Rect rect);
  // Records one position's rotated queries, q_all: [num_heads × head_dim]
  // (every Q head of the position, head-major as the forward pass lays them
  // out). No-op unless collecting. The head count is fixed by the first push;
  // a different size afterwards is a programmer error (CHECK).
  void O1PushQ(std::span<const float> q_all);
  // True between O1Begin and O1Seal (or a refused seal / Clear / Release).
  bool O1Collecting() const { return o1_.has_value() && !o1_->sealed(); }
  bool O1Sealed() const { return o1_.has_value() && o1_->sealed(); }
  // Query positions recorded so far (0 unless collecting).
  size_t O1TraceRows() const { return O1Collecting() ? o1_->trace_rows() : 0; }

  // Freezes the prompt into per-KV-group Nyström states and frees this
  // layer's exact K/V (and the trace). Preconditions, each refused with
  // FailedPrecondition naming it: collecting (O1Begin ran; "no query trace"
  // otherwise), kF32 rows, num_heads a non-zero multiple of num_kv_heads, a
  // full trace (one pushed row of num_heads heads per stored position,
  // seq_len() > 0) and every KV head densely stored (HeadLen(h) ==
  // seq_len(): no dead head). A refused seal drops the trace and leaves the
  // layer exact with its K/V untouched; sealing a sealed layer is refused
  // and changes nothing.
  absl::Status O1Seal(size_t num_heads);

  // One decode position on a sealed layer: per KV group g, inserts the
  // group's (k, v) ONCE and writes every Q head's output; seq_len() advances
  // by one. Head h belongs to group h / (num_heads / num_kv_heads), so a
  // group's Q heads are contiguous in q_all / out — the same layout
  // AttendGroup reads. q_all, out: [num_heads × head_dim]; k_new, v_new:
  // [num_kv_heads × head_dim]. num_heads must be the sealed fan-out; calling
  // it on an unsealed layer or with wrong sizes is a programmer error
  // (CHECK). No allocation unless a group is exact-only (short prompt:
  // its window grows, amortised).
  void O1Step(std::span<const float> q_all, std::span<const float> k_new,
              std::span<const float> v_new, size_t num_heads, std::span<float> out);

  // Device views of the sealed groups (valid until the next mutation), or
  // nullopt when the layer is not sealed or any group is exact-only (the
  // degenerate short-prompt mode a device path does not carry).
  std::optional<std::vector<O1DeviceView>> O1Views() const;

  // Heap bytes held by the override: the query trace (capacity) while
  // collecting, the per-group states once sealed; 0 without an override.
  // Included in MemoryBytes(). O(num_kv_heads).
  size_t O1MemoryBytes() const { return o1_.has_value() ? o1_->MemoryBytes() : 0; }

  // The sealed per-group states, [num_kv_heads] (empty unless sealed): what
  // a wire format reads (NystromState::group() / heads()).
  std::span<const NystromState> O1States() const {
    return O1Sealed() ? o1_->states() : std::span<const NystromState>();
  }
  // The sealed layer's Q heads (fan-out × num_kv_heads; what a wire format
  // records beside the states), 0 unless sealed. O(1).
  size_t O1NumHeads() const { return O1Sealed() ? o1_->num_heads() : 0; }
  // Installs sealed states (e.g. rebuilt with NystromState::FromParts from a
  // wire format) as this layer's O(1) override; the layer then decodes
  // exactly as the layer they were read from. `seq_len` is the number of
  // positions they have absorbed. Requires an empty, un-overridden kF32 cache
  // (FailedPrecondition otherwise); every state is checked before anything
  // is installed (InvalidArgument naming the group): one state per KV head,
  // prefilled, d == dv == head_dim, the same Q-head count, m, w, sink and
  // mode in every group, and sink_len + win_len + far_len == seq_len. Frees
  // any exact capacity the cache still holds.
  absl::Status O1Install(std::vector<NystromState> states, size_t seq_len);

  // ---- wire format (seed 001 export_wire / import_wire; layer_wire.cc) ----
  // One self-checking "CQKV" blob per layer, laid out byte by byte in
  // docs/WIRE_FORMAT.md ("Layer blob (CQKV)"). Version 1 is the seed's
  // format: exact f32 rows (optionally as f16). Version 2 also carries int8
  // rows with their scales and a sealed O(1) layer (every NystromState field
  // of every group and head), so int8 and O(1) sessions migrate too.

  // Serialises this layer. O(MemoryBytes()) time; allocates the returned
  // string once (exact size). Only the seq_len() stored rows travel, plus
  // capacity() as a reservation hint. options.f16 sends f32 rows as f16
  // (round to nearest even; relative error <= 2^-11 per element in f16's
  // normal range, absolute <= 2^-25 below 2^-14): the caller's explicit,
  // lossy choice, which halves the rows. It applies to f32 rows only: int8
  // rows and O(1) state always travel exact (the flag is then ignored and
  // not set in the blob). Refuses, FailedPrecondition naming the reason and
  // carrying it typed (WireRefusalOf, wire_refusal.h), state the requested
  // version does not describe, rather than shipping a cache that would
  // answer differently: "O(1) trace being collected" (kO1Collecting),
  // "accumulated importance" (kImportance), "dead heads" (kDeadHeads), in
  // any version; "int8 rows" (kInt8Rows) and "O(1) overlay" (kO1Overlay) in
  // version 1; with f16, a finite value beyond f16's range, which would
  // arrive as inf (kF16Range). InvalidArgument for a version this build does
  // not write. Const: may run concurrently with the other const methods.
  absl::StatusOr<std::string> ExportWire(const WireOptions& options = {}) const;

  // Installs a peer's blob (version 1 or 2) over this layer, replacing
  // whatever it held. The geometry must match the model both sides hold,
  // and it is checked, not assumed: the blob's num_kv_heads, head_dim and
  // KV mode against this cache's own (construct it from the model config
  // you hold), a sealed blob's Q-head count against expect.num_q_heads, its
  // seq_len against expect.max_positions. VALIDATES EVERYTHING BEFORE
  // TOUCHING *this: on any error *this is unchanged. Errors: DataLoss for a
  // corrupt blob (truncated, bad magic, length mismatch, bad checksum,
  // impossible field values); FailedPrecondition for an unknown version
  // ("version 7: this build reads 1..2") or a geometry mismatch (naming
  // both values). Lengths are checked against buf.size() before anything is
  // allocated. On success the cache holds exactly the exporter's state and
  // decodes on as the exporter would, bit for bit (f16 blobs: on the
  // rounded rows): exact rows byte for byte with capacity() = the
  // exporter's (clamped to expect.max_positions, never below seq_len()),
  // hence the same MemoryBytes(); sealed states field for field (the same
  // MemoryBytes() too, except an exact-only group's spare window capacity,
  // which does not travel). O(buf.size()) plus the reserved capacity; holds
  // both the old and the new state while it runs.
  absl::Status ImportWire(std::string_view buf, const WireImportExpect& expect);

 private:
  KvRows rows_;  // the exact rows; Release()d once sealed
  // The O(1) override (seed: `o1: Option<O1State>`); nullopt = plain cache.
  std::optional<O1Override> o1_;
};

}  // namespace cortiq::kv
