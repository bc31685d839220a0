// O1Override: one layer's O(1) Nyström override (seeds 001/002, the seed's
// `o1: Option<O1State>`), on its own: the query trace collected during the
// exact prompt pass, then, once sealed, one NystromState per KV group that
// decodes in O(1) per token. LayerKvCache holds an optional one and drives
// it through its O1* methods; the exact rows it seals from are a KvRows it
// only reads.
//
// Lifecycle (two states, one way):
//   Collect(...)            collecting: PushQ one row of queries per prompt
//                           position (TruncateTrace follows a rollback)
//   Seal(num_heads, rows)   builds every group's state from the trace and
//                           the f32 rows, then frees the trace: sealed
//   Step(...)               sealed: one decode position through every group
// FromStates(...) makes a sealed override directly (e.g. from a wire format).
//
// Contract
//   * Allocation: the trace grows geometrically (amortised, never per token:
//     PushQ reserves `reserve_rows` positions at once); Seal allocates the
//     states and a [hpk × t × head_dim] scratch; Step allocates nothing
//     unless a group is exact-only (a short prompt: its window grows,
//     amortised).
//   * Costs: PushQ amortised O(num_heads · head_dim); Seal
//     O(t·(m·d + d)·num_heads + m³·num_heads); Step per group
//     O((sink + w)·d + m·(d + m)) per Q head.
//   * MemoryBytes() is exact: the trace's capacity while collecting, the
//     states (vector capacity plus each state's MemoryBytes) once sealed.
//   * Errors: FailedPrecondition / InvalidArgument as stated per method;
//     wrong sizes and calls in the wrong state are programmer errors (abort,
//     "kv check failed").
//
// Ownership: owns the trace and the states; move-only (moving leaves the
// source valid but unspecified: its owner drops it), deep copies explicit
// (Copy()).
//
// Thread-safety: const methods touch no mutable state; mutating methods
// need exclusive access (LayerKvCache's session lease provides it).
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/kv/nystrom.h"

namespace cortiq::kv {

class KvRows;

class O1Override {
 public:
  // A collecting override for heads of head_dim: InvalidArgument for m < 4,
  // w < 1 or an unknown rectifier (kv::O1Config clamps them), naming
  // O1Begin (the seed-facing call that makes one). Allocates nothing.
  static absl::StatusOr<O1Override> Collect(size_t head_dim, size_t m, size_t w, size_t sink,
                                            O1Rect rect);
  // A sealed override from states that have absorbed `positions` positions,
  // one per KV head: every state checked before anything is kept
  // (InvalidArgument naming the group): num_kv_heads states, prefilled,
  // d == dv == head_dim, the same Q-head count, m, w, sink and exact-only
  // mode in every group, and sink_len + win_len + far_len == positions.
  static absl::StatusOr<O1Override> FromStates(std::vector<NystromState> states,
                                               size_t num_kv_heads, size_t head_dim,
                                               size_t positions);

  O1Override(O1Override&&) noexcept = default;
  O1Override& operator=(O1Override&&) noexcept = default;
  O1Override(const O1Override&) = delete;
  O1Override& operator=(const O1Override&) = delete;
  ~O1Override() = default;
  // Deep copy: the same trace capacity (the copy pushes on without
  // allocating sooner) or the same states. O(MemoryBytes()).
  O1Override Copy() const;

  // ---- state (O(1)) ----
  bool sealed() const { return sealed_; }
  // Collecting: query positions pushed so far (0 once sealed).
  size_t trace_rows() const { return trace_rows_; }
  // Sealed: the layer's Q heads (fan-out × num_kv_heads); 0 while collecting.
  size_t num_heads() const { return num_heads_; }
  // Sealed: positions absorbed by the states (Seal's prompt, then one per
  // Step); 0 while collecting.
  size_t positions() const { return positions_; }
  // Sealed: the per-group states, [num_kv_heads]; empty while collecting.
  std::span<const NystromState> states() const { return states_; }

  // ---- collecting ----
  // Records one position's rotated queries, q_all: [num_heads × head_dim]
  // (every Q head, head-major). The head count is fixed by the first push; a
  // different size afterwards is a programmer error. The trace doubles when
  // it must grow, so it holds at most NextPow2(prompt positions) rows, as
  // the request plan projects (the exact rows' capacity, which it used to
  // reserve, also holds the call's max_tokens).
  void PushQ(std::span<const float> q_all);
  // Keeps only the first `rows` pushed positions (a rollback; no-op when
  // fewer were pushed). Keeps the capacity; never allocates.
  void TruncateTrace(size_t rows);
  // Freezes the trace and `rows` (the layer's exact rows, read only) into
  // one NystromState per KV group; on success the override is sealed, the
  // trace freed, and `rows` no longer needed (the caller frees them). Refused
  // with FailedPrecondition, "o1 seal refused (the layer stays exact): "
  // and the reason, the override unchanged (the caller drops it), unless:
  // kF32 rows, num_heads a non-zero multiple of num_kv_heads, a full trace
  // (one pushed row of num_heads heads per stored position, seq_len() > 0)
  // and every KV head densely stored (no dead head). Collecting only.
  absl::Status Seal(size_t num_heads, const KvRows& rows);

  // ---- sealed ----
  // One decode position: per KV group g, inserts the group's (k, v) once and
  // writes every Q head's output (head h in group h / (num_heads /
  // num_kv_heads)). q_all, out: [num_heads × head_dim]; k_new, v_new:
  // [num_kv_heads × head_dim]; num_heads must be num_heads(). positions()
  // advances by one.
  void Step(std::span<const float> q_all, std::span<const float> k_new,
            std::span<const float> v_new, size_t num_heads, std::span<float> out);
  // Device views of the groups (valid until the next mutation), or nullopt
  // when any group is exact-only. Allocates the returned vector.
  std::optional<std::vector<O1DeviceView>> Views() const;

  // Exact heap bytes held (see the banner). O(num_kv_heads).
  size_t MemoryBytes() const;

 private:
  O1Override() = default;

  // What the seal builds the states with (Collect's arguments; FromStates
  // reads them back from the states).
  struct Settings {
    size_t head_dim = 0;
    size_t m = 0, w = 0, sink = 0;
    O1Rect rect = kO1DefaultRect;
  };
  Settings settings_;
  bool sealed_ = false;
  // Collecting:
  std::vector<float> trace_;  // [trace_rows × trace_heads × head_dim]
  size_t trace_heads_ = 0;    // Q heads per pushed row (set by the first push)
  size_t trace_rows_ = 0;     // positions pushed
  // Sealed:
  size_t num_heads_ = 0;              // Q heads of the layer
  size_t positions_ = 0;              // positions absorbed
  std::vector<NystromState> states_;  // [num_kv_heads]
};

}  // namespace cortiq::kv
