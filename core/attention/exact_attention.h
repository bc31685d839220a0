// Exact attention over a LayerKvCache (seed 001): every position's K/V row
// is kept (f32, or int8 with one scale per row: the cache's KvMode) and
// every query attends over all of them.
//
// The building blocks here are shared with the modes that keep exact rows
// beside their own state (O(1) while it collects its prompt, QSA):
//   AppendRows      the rows of a block, in position order
//   AttendCausal    a prefill block whose rows were just appended: row r
//                   sees positions <= its own. A long block of f32 rows runs
//                   as tiled matrix products (scores = Q·Kᵀ, out = P·V per
//                   tile of query rows and KV group), otherwise one task per
//                   (row, KV group) through LayerKvCache::AttendGroup.
//   AttendGroupTask one (row, KV group): the decode task.
// Bits: AttendGroupTask is AttendGroup (bit for bit Attend / AttentionHead);
// the tiled path sums in matrix-product order (within float rounding of the
// row path; see the Transformer tests).
#pragma once

#include <memory>
#include <string_view>

#include "core/attention/attention_scratch.h"
#include "core/attention/layer_attention_state.h"
#include "core/kv/layer_kv_cache.h"

namespace cortiq::attention {

// Prefill blocks of at least this many rows (f32 or int8 rows, no dead
// heads) run their attention as tiled matrix products, kTiledAttentionTile
// query rows per tile.
inline constexpr size_t kTiledAttentionMinRows = 16;
inline constexpr size_t kTiledAttentionTile = 32;

// Appends rows.k / rows.v of every row to `cache`, in order.
void AppendRows(kv::LayerKvCache& cache, const AttentionRows& rows, const AttentionGeometry& g);

// Causal attention of a prefill block already appended to `cache` (its rows
// are the cache's last rows.count positions). Runs on ctx.pool.
void AttendCausal(const kv::LayerKvCache& cache, const AttentionRows& rows, AttentionContext& ctx);

// Attention of block row `r` for KV group `g`, seeing every stored row but
// the `hidden_after` rows appended after it (0 in decode). Allocation-free
// once `slot` is warm.
void AttendGroupTask(const kv::LayerKvCache& cache, const AttentionRows& rows, size_t r, size_t g,
                     size_t hidden_after, const AttentionGeometry& geometry, ScratchSlot& slot);

// What every mode that keeps its rows in a LayerKvCache shares (exact,
// O(1), QSA): the cache, its position and bytes, rollback (refused on a
// sealed O(1) cache: the Nyström state cannot un-absorb a key) and the
// import of a cache from the wire (its positions must be the session's; a
// sealed O(1) cache only where the mode accepts one).
class CacheAttention : public LayerAttentionState {
 public:
  size_t position() const override { return cache_.seq_len(); }
  void Reserve(size_t positions) override { cache_.Reserve(positions); }
  void ReleaseUnused() override { cache_.ReleaseUnused(); }
  absl::Status CanTruncate(size_t n) const override;
  void TruncateLast(size_t n) override;
  void Release() override { cache_.Release(); }
  size_t MemoryBytes() const override { return cache_.MemoryBytes(); }
  const kv::LayerKvCache* cache() const override { return &cache_; }
  kv::LayerKvCache* journal_rows() override { return cache_.O1Sealed() ? nullptr : &cache_; }
  absl::Status InstallCache(kv::LayerKvCache cache, size_t positions) override;

 protected:
  CacheAttention(const AttentionGeometry& geometry, kv::KvMode mode, size_t layer,
                 bool accepts_sealed);

  const AttentionGeometry geometry_;
  const size_t layer_;
  kv::LayerKvCache cache_;

 private:
  const bool accepts_sealed_;
};

// The exact mode: a LayerKvCache and nothing else.
class ExactAttention final : public CacheAttention {
 public:
  ExactAttention(const AttentionGeometry& geometry, kv::KvMode mode, size_t layer = 0);

  std::string_view name() const override;
  absl::Status Prefill(const AttentionRows& rows, AttentionContext& ctx) override;
  absl::StatusOr<size_t> BeginDecode(const AttentionRows& row, AttentionContext& ctx) override;
  void DecodeTask(const AttentionRows& row, size_t task, ScratchSlot& slot) override;
  MemoryByKind Memory() const override;
  std::unique_ptr<LayerAttentionState> Copy() const override;
};

}  // namespace cortiq::attention
