// PackedWeights: the resident copies of a model's weight matrices in a
// kernel's own layout, and the one owner of them. Today that is the AMX tile
// order (PackAmxTiles: 16×32 bf16 blocks of one contiguous KiB each, read by
// MatMul through WeightView::amx_tiles); quantized copies are to join it.
//
// Pack() decides which views get a copy (the kAmx ISA is active and the view
// is bf16 weights with bf16 activations), lays every copy out in ONE 2 MiB-
// aligned mapping advised for huge pages (a decode step streams it end to
// end), each at a 4 KiB-aligned offset, packs them on the pool, points each
// view at its copy, and hands the pages of the views' file-backed sources
// back to the kernel (MADV_DONTNEED) so resident memory counts the weights
// once — except sources the caller still reads by rows (the embedding).
//
// Cost: one pass over the packed matrices at load, on the pool. If the
// mapping cannot be made, nothing is packed (a warning is logged) and MatMul
// reads the sources in place: slower, never wrong.
//
// Ownership and threads: owns the mapping; the views point into it, so it
// must outlive them (the Transformer holds both). Move-only. Immutable after
// Pack; MemoryBytes may be read from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "core/math/kernels.h"
#include "core/util/huge_buffer.h"
#include "core/util/thread_pool.h"

namespace cortiq::math {

class PackedWeights {
 public:
  PackedWeights() = default;
  PackedWeights(PackedWeights&&) = default;
  PackedWeights& operator=(PackedWeights&&) = default;

  // Packs the views the active kernels read packed (see the banner), sets
  // their amx_tiles, and returns the owner of the copies. `keep_sources`:
  // source pointers whose pages stay resident (read elsewhere).
  static PackedWeights Pack(std::span<WeightView* const> views,
                            std::span<const void* const> keep_sources, util::ThreadPool* pool);

  // Resident bytes of the copies (0 when nothing was packed).
  size_t MemoryBytes() const { return tiles_.MemoryBytes(); }

 private:
  // Each copy starts at a multiple of this many elements (4 KiB of bf16).
  static constexpr size_t kAlignElements = 2048;

  util::HugeBuffer<uint16_t> tiles_;  // every packed view's tiles
};

}  // namespace cortiq::math
