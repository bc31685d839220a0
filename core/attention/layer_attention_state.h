// LayerAttentionState: the attention state of ONE layer of ONE sequence, and
// the one interface through which the forward pass reaches it. Every
// attention mode is one implementation (one file each, registered in
// registry.cc):
//
//   exact f32 / exact int8   exact_attention.h   LayerKvCache rows (seed 001)
//   O(1) Nyström             o1_attention.h      exact prompt, sealed to per-
//                                                group NystromStates (seed 002)
//   QSA block-sparse         qsa_attention.h     exact rows + QsaSeqState (seed 004)
//   sink + sliding window    window_attention.h  the first S and last W rows
//
// The forward pass (model::Transformer) computes q, k, v of a layer for a
// block of rows and hands them over; it never asks which mode a state runs.
//
//   prefill (rows of one sequence, consecutive positions):
//     state.Prefill(rows, ctx)                absorbs and attends, all of it
//   decode (one row per sequence, B sequences in one step):
//     n_b = state_b.BeginDecode(row_b, ctx)   serial: absorb the row
//     state_b.DecodeTask(row_b, t, slot)      parallel: every (b, t < n_b) of
//                                             the batch in ONE pool region
//     state_b.EndDecode(row_b, ctx)           serial: what follows (QSA)
//
// Decode is split in three so that a batch of sequences shares one parallel
// region (weights and pool hand-offs are per step, not per sequence); the
// tasks of one state are independent of each other (typically one per KV
// group).
//
// Costs and allocation: no call allocates once the state is reserved
// (Reserve at admission) and the scratch is warm, except where a mode says
// otherwise (an O(1) seal allocates its states once).
//
// Thread-safety: a state belongs to one sequence, used by one thread at a
// time (the session lease), except DecodeTask: distinct tasks of one
// BeginDecode may run concurrently on the pool's threads.
//
// Errors: Prefill / BeginDecode / EndDecode return a status only for
// failures of a backend (QSA allocation) or misuse; the sequence is then
// partially extended and should be released.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/kv/layer_kv_cache.h"

namespace cortiq::util {
class ThreadPool;
}

namespace cortiq::attention {

class AttentionScratch;
struct ScratchSlot;
struct QsaRuntime;

// The kinds of state the metrics report (label kind="kv_f32|kv_int8|o1|qsa").
enum class MemoryKind : uint8_t { kKvF32 = 0, kKvInt8 = 1, kO1 = 2, kQsa = 3 };
inline constexpr size_t kNumMemoryKinds = 4;
std::string_view MemoryKindName(MemoryKind kind);

// Heap bytes by kind; the parts of one state sum to its MemoryBytes().
struct MemoryByKind {
  std::array<size_t, kNumMemoryKinds> bytes{};
  size_t operator[](MemoryKind k) const { return bytes[static_cast<size_t>(k)]; }
  size_t& operator[](MemoryKind k) { return bytes[static_cast<size_t>(k)]; }
  size_t total() const;
  MemoryByKind& operator+=(const MemoryByKind& o);
};

// The kind exact rows of `mode` are reported under (kv_f32 | kv_int8).
inline MemoryKind RowsKind(kv::KvMode mode) {
  return mode == kv::KvMode::kInt8 ? MemoryKind::kKvInt8 : MemoryKind::kKvF32;
}

// The attention geometry of the model's layers.
struct AttentionGeometry {
  size_t hidden = 0;         // width of the layer input (QSA indexes it)
  size_t num_q_heads = 0;    // query heads
  size_t num_kv_heads = 0;   // key/value heads (GQA groups)
  size_t head_dim = 0;       // per head
  size_t max_positions = 0;  // the model's context
  float scale = 0.0f;        // logit scale, 1/sqrt(head_dim)

  size_t heads_per_kv() const { return num_q_heads / num_kv_heads; }
  size_t q_width() const { return num_q_heads * head_dim; }
  size_t kv_width() const { return num_kv_heads * head_dim; }
};

// One layer's inputs and output for a block of rows of one sequence at
// consecutive positions [start, start + count). Row-major, row r at r·width.
struct AttentionRows {
  size_t layer = 0;
  size_t start = 0;           // position of the first row
  size_t count = 0;           // rows (1 in a decode step)
  size_t batch_row = 0;       // decode: the row's index in the step's batch
  const float* xn = nullptr;  // [count × hidden] the layer's normed input
  const float* q = nullptr;   // [count × num_q_heads × head_dim], rotated
  const float* k = nullptr;   // [count × num_kv_heads × head_dim], rotated
  const float* v = nullptr;   // [count × num_kv_heads × head_dim]
  float* out = nullptr;       // [count × num_q_heads × head_dim] attention context
};

// What a forward call lends the states: geometry, the pool that runs the
// math, and the call's scratch (attention_scratch.h).
struct AttentionContext {
  const AttentionGeometry& geometry;
  util::ThreadPool* pool;
  AttentionScratch& scratch;
};

class LayerAttentionState {
 public:
  virtual ~LayerAttentionState() = default;
  LayerAttentionState(const LayerAttentionState&) = delete;
  LayerAttentionState& operator=(const LayerAttentionState&) = delete;

  // The registered name of the mode ("exact_f32", "o1", ...): logs and tests.
  virtual std::string_view name() const = 0;
  // Positions absorbed so far (the next row's position).
  virtual size_t position() const = 0;

  // ---- forward ----
  // Binds per-sequence resources that live outside the state (QSA: its
  // indexer and backend state). Called before every forward call; no-op
  // once bound. Default: nothing to bind.
  virtual absl::Status Bind(const std::shared_ptr<QsaRuntime>& runtime);
  // Absorbs rows.count rows at positions [position(), ...) and writes their
  // attention outputs; row r attends causally (positions <= its own).
  virtual absl::Status Prefill(const AttentionRows& rows, AttentionContext& ctx) = 0;
  // Absorbs one row (rows.count == 1) and returns how many DecodeTasks its
  // attention has (0: EndDecode does all of it).
  virtual absl::StatusOr<size_t> BeginDecode(const AttentionRows& row, AttentionContext& ctx) = 0;
  // Task `task` < BeginDecode's count. `slot` is the calling thread's
  // scratch (attention_scratch.h). Distinct tasks may run concurrently.
  virtual void DecodeTask(const AttentionRows& row, size_t task, ScratchSlot& slot) = 0;
  // After every task of the batch ran. Default: nothing.
  virtual absl::Status EndDecode(const AttentionRows& row, AttentionContext& ctx);
  // The prompt is complete (the first decode step follows). O(1): seals the
  // layer (allocates its states, frees the exact rows); returns whether this
  // call sealed it. Default: nothing to do, false.
  virtual bool CompletePrompt(size_t num_q_heads);
  // True while the state waits for CompletePrompt (O(1): collecting).
  virtual bool AwaitsPromptEnd() const { return false; }

  // ---- capacity and lifetime ----
  // Grows to hold `positions` without further allocation (no-op where the
  // state is constant-size or already large enough).
  virtual void Reserve(size_t positions) = 0;
  // Gives back what Reserve committed past position() (a call that ended
  // early), without a copy; the next Reserve commits it again. Default:
  // nothing (constant-size states).
  virtual void ReleaseUnused() {}
  // Whether TruncateLast(n) would succeed (FailedPrecondition naming why,
  // e.g. a sealed O(1) layer cannot un-absorb a key). Changes nothing.
  virtual absl::Status CanTruncate(size_t n) const = 0;
  // Rolls back the last n positions. The caller checked CanTruncate(n)
  // (SequenceKv::TruncateLast does, for every layer, before any changes).
  virtual void TruncateLast(size_t n) = 0;
  // Frees every byte (MemoryBytes() == 0); the state starts over at
  // position 0 with its configuration. Idempotent.
  virtual void Release() = 0;
  // Exact heap bytes held, and their split by kind.
  virtual size_t MemoryBytes() const = 0;
  virtual MemoryByKind Memory() const = 0;
  // Deep copy (sessions are never copied by accident).
  virtual std::unique_ptr<LayerAttentionState> Copy() const = 0;

  // ---- wire (session export / import) ----
  // The exact rows this state keeps as a LayerKvCache (the session wire's
  // layer section is its CQKV blob), or null when the mode keeps none in
  // that form (then ExportRows builds one). InstallCache takes a blob's.
  virtual const kv::LayerKvCache* cache() const { return nullptr; }
  // The rows of a mode that keeps them in another form (sink + window:
  // the held rows, ascending), as a LayerKvCache built for the wire.
  // Default (and for modes whose cache() is non-null): FailedPrecondition.
  virtual absl::StatusOr<kv::LayerKvCache> ExportRows() const;
  // Installs an imported cache (with any O(1) override it carries) as this
  // state's rows, for a sequence at `positions`. InvalidArgument when the
  // cache disagrees with `positions` or the mode (a sealed O(1) cache on a
  // layer that is not O(1), ...); the state is then unchanged.
  virtual absl::Status InstallCache(kv::LayerKvCache cache, size_t positions);
  // Extra per-layer state that travels beside the rows (QSA: the indexer's
  // aux blob). Default: none (empty).
  virtual bool HasAux() const { return false; }
  virtual absl::StatusOr<std::vector<uint8_t>> SnapshotAux() const;
  virtual absl::Status RestoreAux(const std::shared_ptr<QsaRuntime>& runtime,
                                  std::span<const uint8_t> blob);
  // Positions the aux state has absorbed (must equal position() after an
  // import); position() where there is no aux.
  virtual size_t AuxPositions() const { return position(); }

  // ---- the journal (core/session/session_journal) ----
  // A state whose positions are exact rows only ever appended or rolled
  // back (exact, QSA, an O(1) layer before its seal) lends its cache here:
  // a journal record carries the rows appended since the last one, and a
  // restore appends them back (LayerKvCache::FillNext). nullptr for a state
  // a record carries whole (a sealed O(1) layer, sink + window: both
  // bounded in size).
  virtual kv::LayerKvCache* journal_rows() { return nullptr; }
  const kv::LayerKvCache* journal_rows() const {
    return const_cast<LayerAttentionState*>(this)->journal_rows();
  }
  // The aux state's bytes per position (QSA: the indexer's raw bf16 key,
  // hd · 2), 0 without aux; AuxRows copies positions [from, from + count)
  // of them to dst (from + count <= AuxPositions()). With SnapshotAux's
  // header they make its blob, so a record carries only the new positions.
  virtual size_t AuxRowBytes() const { return 0; }
  virtual absl::Status AuxRows(size_t from, size_t count, uint8_t* dst) const;

 protected:
  LayerAttentionState() = default;
};

}  // namespace cortiq::attention
