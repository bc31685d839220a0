// PackedWeights: the resident copies of a model's weight matrices in a
// kernel's own layout, and the one owner of them:
//  * int8 (PackOptions::int8, `--weights int8`): every bf16/f16/f32 view is
//    quantized once into Q8_0 blocks (math::QuantizeQ8_0, exactly as
//    llama.cpp quantizes) and the view is pointed at its copy with dtype
//    kQ8_0; views that share a source (tied embeddings: embed_tokens and
//    lm_head) share one copy. Views already kQ8_0 (a GGUF file) stay in place.
//  * int8 lane order (PackQ8Lanes, where the ISA multiplies it natively:
//    AVX512_VNNI): every multiplied Q8_0 view — a GGUF's, or under int8 a
//    float one quantized straight into it — gets a 16-row lane-order copy
//    (WeightView::q8_lanes) that a decode step streams with no transpose; a
//    float view then keeps no Q8_0 rows (data = nullptr). The row-read view
//    (PackOptions::rows_only: the embedding) keeps Q8_0 rows when untied,
//    and reads the lm_head's lane-order copy when tied (Q8LaneRowToF32).
//  * AMX tile order (PackAmxTiles: 16×32 bf16 blocks of one contiguous KiB
//    each, read by MatMul through WeightView::amx_tiles).
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

#include "absl/status/statusor.h"
#include "core/math/kernels.h"
#include "core/util/huge_buffer.h"
#include "core/util/thread_pool.h"

namespace cortiq::math {

struct PackOptions {
  // Quantize every non-int8 view to Q8_0 (the views' cols must be multiples
  // of 32: the caller checks, naming the tensor).
  bool int8 = false;
  // The view read by rows rather than multiplied (the embedding): untied,
  // it keeps Q8_0 rows under `int8` and gets no lane-order copy; tied to a
  // multiplied view, it shares that view's lane-order copy.
  const WeightView* rows_only = nullptr;
};

class PackedWeights {
 public:
  PackedWeights() = default;
  PackedWeights(PackedWeights&&) = default;
  PackedWeights& operator=(PackedWeights&&) = default;

  // Makes the copies the options and the active kernels call for (see the
  // banner), points the views at them, and returns their owner.
  // `keep_sources`: source pointers whose pages stay resident (read
  // elsewhere), and every source that is not a file mapping (anonymous
  // memory would read back as zeros). Errors: the int8 copy could not be
  // mapped (RESOURCE_EXHAUSTED, naming the size; nothing changed). A tile copy
  // that cannot be mapped is skipped with a warning (MatMul reads the
  // sources: slower, never wrong).
  static absl::StatusOr<PackedWeights> Pack(std::span<WeightView* const> views,
                                            std::span<const void* const> keep_sources,
                                            util::ThreadPool* pool,
                                            const PackOptions& options = {});

  // Resident bytes of the AMX tile copy (0 when none was made).
  size_t AmxTileBytes() const { return tiles_.MemoryBytes(); }
  // Resident bytes of the int8 copies, Q8_0 rows and lane order (0: none).
  size_t Int8Bytes() const { return int8_.MemoryBytes() + lanes_.MemoryBytes(); }
  // Every copy.
  size_t MemoryBytes() const { return AmxTileBytes() + Int8Bytes(); }
  // Whether p points into one of the copies.
  bool Owns(const void* p) const;

 private:
  // Each copy starts at a multiple of this many elements (4 KiB of bf16).
  static constexpr size_t kAlignElements = 2048;

  // Quantizes the non-int8 views into int8_ (PackOptions::int8).
  // `only`: copy only that view's source (the others get lane order).
  absl::Status QuantizeInt8(std::span<WeightView* const> views,
                            std::span<const void* const> keep_sources, util::ThreadPool* pool,
                            bool lanes, const WeightView* only);
  // Lane-order copies (PackQ8Lanes) of every multiplied Q8_0 view, and of
  // every float view straight from its source under options.int8.
  // `rows_only`: a view that keeps its rows (untied embedding); `int8`:
  // float views are quantized into lanes too.
  absl::Status PackLanes(std::span<WeightView* const> views,
                         std::span<const void* const> keep_sources, util::ThreadPool* pool,
                         const WeightView* rows_only, bool int8);

  util::HugeBuffer<uint16_t> tiles_;  // every packed view's tiles
  util::HugeBuffer<uint8_t> int8_;    // every quantized view's Q8_0 rows
  util::HugeBuffer<uint8_t> lanes_;   // every lane-order view (Q8LanesUsed)
};

}  // namespace cortiq::math
