// LayerKvPool: kv::LayerKvCache seen as the QSA "paged KV pool".
//
// The selected-set attention (QsaIndexer::PrefillSelect / AttendSelection)
// reads K/V through a pool + block table (backend.h: KvPool, BlockTable),
// the layout a paged device cache has. Our exact cache is head-major: per KV
// head one contiguous block of rows (f32, or int8 with one f32 scale per
// row), head h's block S rows after head h-1's, where S is the capacity for
// a plain buffer and the page-aligned stride for a paged one (kv_rows.h: row
// buffers of 1 MiB and up). Those rows ARE the pool: with block size B the
// identity table maps logical block b to physical block b, and
//   strides.block = B · head_dim, strides.row = head_dim,
//   strides.head  = S · head_dim
// (scale_strides: B, 1, the scale buffers' own S). So position t of head h
// is row t of head h's block, exactly the row LayerKvCache::AttendGroup
// reads. A real paged pool later supplies its own strides and table; the
// indexer does not change.
//
// Contract: Bind() reads S off the cache's views and checks the layout it
// relies on (every head's rows h · S rows from head 0's, keys and values
// alike, S at least the capacity), else INTERNAL; it refuses a cache it
// cannot describe: no storage yet, or a dead head (then positions no longer
// map 1:1 to rows) → FAILED_PRECONDITION. The view is
// valid until the cache next reallocates (Reserve growth, Append past
// capacity, ShrinkToFit, Release): bind after the layer's Appends (the
// transformer Reserves the whole chunk first, so one Bind per layer call).
//
// Host memory only: the DevicePtrs are host addresses, for a backend whose
// HostAddressable() is true (the CPU backend).
//
// Ownership: owns the identity table (grown, never shrunk, so re-binding per
// layer call does not allocate once warm). Move-only. Thread-compatible.
//
// Example:
//   qsa::LayerKvPool pool;                      // per forward scratch
//   CORTIQ_RETURN_IF_ERROR(pool.Bind(cache, indexer.geometry().ratio));
//   indexer.PrefillSelect(st, ..., pool.pool(), pool.table(), ...);
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "core/kv/layer_kv_cache.h"
#include "core/qsa/backend.h"

namespace cortiq::qsa {

class LayerKvPool {
 public:
  LayerKvPool() = default;
  LayerKvPool(LayerKvPool&&) = default;
  LayerKvPool& operator=(LayerKvPool&&) = default;
  LayerKvPool(const LayerKvPool&) = delete;
  LayerKvPool& operator=(const LayerKvPool&) = delete;

  // (Re)binds to `cache` with pool blocks of `block_size` (> 0) positions; the
  // table covers ceil(capacity / block_size) blocks.
  absl::Status Bind(const kv::LayerKvCache& cache, size_t block_size);

  const KvPool& pool() const { return pool_; }
  BlockTable table() const { return BlockTable{DevicePtr::FromHost(table_.data()), num_blocks_}; }

 private:
  KvPool pool_;
  std::vector<uint32_t> table_;  // identity: table_[b] == b
  size_t num_blocks_ = 0;
};

}  // namespace cortiq::qsa
