// Decode GEMV with bf16 activations on bf16 weights, on AMX (TDPBF16PS).
// Compiled with the AVX-512 flags plus -mamx-tile -mamx-bf16 and reached only
// through the kAmx table (kernels_avx512.cc), after CPUID says the CPU has
// AMX-BF16 and the kernel has granted this process the tile state
// (EnableAmxForProcess). No std:: templates here (see kernels_internal.h).
//
// Why: batched decode with f32 FMAs is compute-bound from batch ~4 up (two
// FMAs and a widening per 32 weights and batch row). One TDPBF16PS multiplies
// a 16 x 32 block of W by 32 x 16 activations (8192 multiply-adds) and runs
// at ~6x the FMA rate of a core, so decode of up to 16 sequences streams W at
// memory speed.
//
// Layout. y^T = W . x^T: the A tile is 16 rows x 32 columns of W, loaded in
// place (stride = the row length); the B tile is 32 columns x 16 batch rows
// of x in the VNNI pair layout, packed once per call by GemvAmxPackX; the C
// tile is 16 rows x 16 batch rows of f32 sums. The tile shape never depends
// on the batch (missing batch rows are zero), and every (row, batch row) sum
// runs through the same TDPBF16PS sequence over the column blocks, so decode
// is batch-invariant and independent of how rows are split over threads.
// Ragged edges (rows % 16, cols % 32) go through a zero-padded copy.
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>

#include "core/math/kernels_avx512_inl.h"
#include "core/math/kernels_internal.h"

namespace cortiq::math::internal {
namespace {

constexpr size_t kTileRows = kAmxTileRows;  // W rows per A / C tile
constexpr size_t kTileCols = kAmxTileCols;  // W columns (bf16) per A tile = 64 bytes
constexpr size_t kTileBatch = 16;           // batch rows per B / C tile
constexpr size_t kPrefetchBlocks = 4;       // software prefetch distance, in column blocks

// The 64-byte tile configuration (palette 1).
struct alignas(64) TileConfig {
  uint8_t palette;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// The tile configuration is per thread and stays loaded (releasing and
// reloading it costs ~10 us a call); AmxConfigure (kernels_internal.h)
// loads a shape only when this thread's tiles hold another one.
CORTIQ_INLINE void EnsureTilesConfigured() { AmxConfigure(AmxTileShape::kBf16); }

// C tile (16 rows x 16 batch rows, f32) into y for the rows and batch rows
// that exist.
CORTIQ_INLINE void StoreC(const GemvArgs& a, const float* c, size_t r0, size_t b0) {
  const size_t nr = a.rows - r0 < kTileRows ? a.rows - r0 : kTileRows;
  const size_t nb = a.batch - b0 < kTileBatch ? a.batch - b0 : kTileBatch;
  for (size_t b = 0; b < nb; ++b) {
    float* y = a.y + (b0 + b) * a.rows + r0;
    for (size_t r = 0; r < nr; ++r) y[r] = c[r * kTileBatch + b];
  }
}

// Where an A tile comes from: W in place when the block is whole, else a
// zero-padded copy of the rows and columns that exist.
CORTIQ_INLINE const void* SourceA(const GemvArgs& a, size_t r0, size_t c0, uint16_t* pad,
                                  size_t* stride) {
  const size_t row_bytes = a.cols * sizeof(uint16_t);
  const char* w = static_cast<const char*>(a.w) + r0 * row_bytes + c0 * sizeof(uint16_t);
  const size_t nr = a.rows - r0 < kTileRows ? a.rows - r0 : kTileRows;
  const size_t nc = a.cols - c0 < kTileCols ? a.cols - c0 : kTileCols;
  *stride = row_bytes;
  if (nr == kTileRows && nc == kTileCols) return w;
  const __mmask32 m = Mask32(nc);
  for (size_t r = 0; r < kTileRows; ++r) {
    const __m512i v =
        r < nr ? _mm512_maskz_loadu_epi16(m, w + r * row_bytes) : _mm512_setzero_si512();
    _mm512_store_si512(pad + r * kTileCols, v);
  }
  *stride = kTileCols * sizeof(uint16_t);
  return pad;
}

// One 16-row block from r0 for batch rows [b0, b0 + 16). Column block kb
// accumulates into C tile kb % 2, with its own B tile (two independent
// TDPBF16PS chains, and no B tile reloaded while a product still reads it),
// summed at the end. The A tiles load straight from W; the rows' lines
// are prefetched a few blocks ahead, row by row. (Measured on one core: ~14
// GB/s of W from DRAM, the core's share of the memory bandwidth, at any batch
// up to 16.)
void Block(const GemvArgs& a, size_t r0, size_t b0, const uint16_t* xb, size_t kblocks,
           uint16_t* pad) {
  const size_t row_bytes = a.cols * sizeof(uint16_t);
  const char* w = static_cast<const char*>(a.w) + r0 * row_bytes;
  const bool whole_rows = a.rows - r0 >= kTileRows;
  const size_t whole = whole_rows ? a.cols / kTileCols : 0;  // blocks loaded in place
  constexpr size_t kX = kTileCols * kTileBatch;              // elements per B tile
  _tile_zero(0);
  _tile_zero(1);
  size_t kb = 0;
  for (; kb + 2 <= whole; kb += 2) {
    const char* p = w + kb * kTileCols * sizeof(uint16_t);
    // Each row's lines kPrefetchBlocks column blocks ahead. Without this a
    // core waits on every tile load's 16 misses, and two cores together get
    // no more than one (measured: 12 GB/s for 1 or 2 threads; with it, 19).
    // Near the end of the rows, the next 16-row block's first lines (past
    // the end of W a prefetch is a harmless no-op).
    const size_t kpf = kb + kPrefetchBlocks;
    const char* ahead =
        kpf < whole ? w + kpf * kTileCols * sizeof(uint16_t)
                    : w + kTileRows * row_bytes + (kpf - whole) * kTileCols * sizeof(uint16_t);
    for (size_t r = 0; r < kTileRows; ++r) {
      _mm_prefetch(ahead + r * row_bytes, _MM_HINT_T0);
      _mm_prefetch(ahead + r * row_bytes + 64, _MM_HINT_T0);
    }
    _tile_loadd(2, xb + kb * kX, 64);
    _tile_loadd(4, p, row_bytes);
    _tile_dpbf16ps(0, 4, 2);
    _tile_loadd(3, xb + (kb + 1) * kX, 64);
    _tile_loadd(5, p + kTileCols * sizeof(uint16_t), row_bytes);
    _tile_dpbf16ps(1, 5, 3);
  }
  for (; kb < kblocks; ++kb) {  // a last odd block, ragged ones padded
    size_t stride;
    const void* at = SourceA(a, r0, kb * kTileCols, pad, &stride);
    if (kb % 2 == 0) {
      _tile_loadd(2, xb + kb * kX, 64);
      _tile_loadd(4, at, stride);
      _tile_dpbf16ps(0, 4, 2);
    } else {
      _tile_loadd(3, xb + kb * kX, 64);
      _tile_loadd(5, at, stride);
      _tile_dpbf16ps(1, 5, 3);
    }
  }
  alignas(64) float c[2][kTileRows * kTileBatch];
  _tile_stored(0, c[0], 64);
  _tile_stored(1, c[1], 64);
  for (size_t i = 0; i < kTileRows * kTileBatch; i += 16) {
    _mm512_store_ps(c[0] + i, _mm512_add_ps(_mm512_load_ps(c[0] + i), _mm512_load_ps(c[1] + i)));
  }
  StoreC(a, c[0], r0, b0);
}

size_t KBlocks(size_t cols) { return (cols + kTileCols - 1) / kTileCols; }

}  // namespace

bool EnableAmxForProcess() {
  // Linux: the AMX tile data state must be requested before first use
  // (ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18); once granted it
  // holds for every thread of the process.
  return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
}

// kBf16: all eight tiles 16 rows x 64 bytes. GemvAmx (W in place): 0-1 C
// (16 x 16 f32), 2-3 B (16 pair-rows x 16 batch x 2 bf16), 4-5 A (16 rows x
// 32 bf16). AmxTiledMatMul (tile-order W): 0-3 C, 4-5 A (x), 6-7 B (W).
// kInt8 (q8_amx.cc): 0-3 C (16 x rows x 16 int32), 4-5 A (16 x rows x 32
// int8: one Q8_0 block), 6-7 B (8 rows x 64 bytes: one lane-order block).
void AmxConfigure(AmxTileShape shape) {
  thread_local AmxTileShape loaded = AmxTileShape::kNone;
  if (loaded == shape) return;
  TileConfig cfg;
  std::memset(&cfg, 0, sizeof(cfg));
  cfg.palette = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  if (shape == AmxTileShape::kInt8) {
    cfg.colsb[4] = cfg.colsb[5] = 32;
    cfg.rows[6] = cfg.rows[7] = 8;
  }
  _tile_loadconfig(&cfg);
  loaded = shape;
}

size_t GemvAmxPackedSize(size_t batch, size_t cols) {
  const size_t groups = (batch + kTileBatch - 1) / kTileBatch;
  return groups * KBlocks(cols) * kTileCols * kTileBatch;
}

// x [batch][cols] f32 -> per group of 16 batch rows, per 32-column block, a B
// tile: pair-row p holds (x[b][2p], x[b][2p + 1]) for b = 0..15, rounded to
// bf16 (nearest even); zeros past the batch and past the columns.
void GemvAmxPackX(const float* x, size_t batch, size_t cols, uint16_t* out) {
  const size_t kblocks = KBlocks(cols);
  // Missing batch rows and columns are zero; then each real row's pairs are
  // scattered into their column (a decode batch is usually far below 16).
  std::memset(out, 0, GemvAmxPackedSize(batch, cols) * sizeof(uint16_t));
  for (size_t row = 0; row < batch; ++row) {
    const size_t g = row / kTileBatch, b = row % kTileBatch;
    for (size_t kb = 0; kb < kblocks; ++kb) {
      uint32_t* tile =
          reinterpret_cast<uint32_t*>(out + (g * kblocks + kb) * kTileCols * kTileBatch);
      const size_t c0 = kb * kTileCols;
      // 32 bf16 of this batch row, natural order: pair p = columns 2p, 2p + 1.
      alignas(64) uint32_t pairs[kTileCols / 2];
      _mm512_store_si512(pairs, RoundBf16x32(x + row * cols + c0, cols - c0));
      for (size_t p = 0; p < kTileCols / 2; ++p) tile[p * kTileBatch + b] = pairs[p];
    }
  }
}

void GemvAmx(const GemvArgs& a, size_t row_begin, size_t row_end) {
  EnsureTilesConfigured();
  alignas(64) uint16_t pad[kTileRows * kTileCols];
  const size_t kblocks = KBlocks(a.cols);
  const size_t groups = (a.batch + kTileBatch - 1) / kTileBatch;
  for (size_t r = row_begin; r < row_end; r += kTileRows) {
    for (size_t g = 0; g < groups; ++g) {
      Block(a, r, g * kTileBatch, a.xb + g * kblocks * kTileCols * kTileBatch, kblocks, pad);
    }
  }
}

// ---- Tile-order weights (kernels.h PackAmxTiles): y = x . W^T ----
//
// Here x is the A operand (16 rows of x x 32 bf16, row-major: one tile load
// at the row stride) and W the B operand: each 16-row x 32-column block of W
// is one contiguous KiB already in the VNNI pair layout, so W streams as a
// sequential read (the in-place kernel above loads 64 bytes from each of 16
// rows per tile, which the hardware prefetcher does not follow). C tiles are
// 16 rows of x x 16 rows of W, stored straight into y.
//
// Every C tile sums its k-blocks in order, one TDPBF16PS chain, whatever the
// batch, the tiling around it or the thread split: an output depends only on
// its row of x and its row of W, so decode is batch-invariant and one long
// prefill, chunked prefill and token-by-token decode compute the same
// projections bit for bit.
namespace {

constexpr size_t kTileElems = kAmxTileElems;  // bf16 per tile (1 KiB)
// x blocks (16 rows each) per pass over the W blocks: 128 rows of x stay in
// L2 (<= 768 KiB for 3072 columns) while each W pair is reused from L2.
constexpr size_t kMChunkBlocks = 8;
// Software prefetch along each W stream. The AMX unit runs its tile loads in
// order, so a W tile load that misses stalls every later tile instruction:
// the tiles must be in L1 before their load issues. The lines in flight are
// bounded by the core's L1 fill buffers, so fetching every line from DRAM by
// software prefetch alone leaves bandwidth unused; instead one line of the
// tile kFarTiles ahead goes to L2 (PREFETCHT2), which keeps the L2
// streamer running ahead on that page, and the whole tile kNearTiles ahead
// is pulled into L1 from there. Measured in the model (decode, batch 1, two
// threads, each config alternating with the others next to its own
// bandwidth probe): the weight stream at 90-94 % of the probe, against
// 79-90 % for whole tiles 4 ahead into L1 (the best of T0/T1/T2 hints at
// 2-16 tiles, and of vector-load touches), and 80-88 % for far distances of
// 6-12 or 24-48 tiles. Double-buffered A/B tiles and one or four W streams
// per thread (instead of two) were slower too.
constexpr size_t kNearTiles = 2;
constexpr size_t kFarTiles = 16;

// (Addresses past the end of W are formed as integers: a prefetch there is a
// harmless no-op, a pointer there would not be valid C++.)
CORTIQ_INLINE void PrefetchStream(const uint16_t* w, size_t kb) {
  const uintptr_t base = reinterpret_cast<uintptr_t>(w);
  const uintptr_t near = base + (kb + kNearTiles) * kTileElems * sizeof(uint16_t);
  for (int l = 0; l < 16; ++l)
    _mm_prefetch(reinterpret_cast<const char*>(near + 64 * l), _MM_HINT_T0);
  _mm_prefetch(
      reinterpret_cast<const char*>(base + (kb + kFarTiles) * kTileElems * sizeof(uint16_t)),
      _MM_HINT_T2);
}

// C tile (x block mb, W block nb) into y, clipped to the rows that exist:
// WholeC says whether it can go straight there, CopyC copies the clipped
// part of a stored tile. (_tile_stored needs a literal tile number: GCC's
// intrinsics are macros that paste it into the asm.)
CORTIQ_INLINE float* WholeC(const AmxArgs& a, size_t mb, size_t nb) {
  const size_t m0 = mb * kTileRows, n0 = nb * kTileRows;
  return m0 + kTileRows <= a.m && n0 + kTileRows <= a.rows ? a.y + m0 * a.rows + n0 : nullptr;
}
CORTIQ_INLINE void CopyC(const AmxArgs& a, const float* c, size_t mb, size_t nb) {
  const size_t m0 = mb * kTileRows, n0 = nb * kTileRows;
  const size_t nm = MinSz(kTileRows, a.m - m0), nn = MinSz(kTileRows, a.rows - n0);
  for (size_t i = 0; i < nm; ++i) {
    std::memcpy(a.y + (m0 + i) * a.rows + n0, c + i * kTileRows, nn * sizeof(float));
  }
}
#define CORTIQ_STORE_C(T, a, mb, nb)                    \
  do {                                                  \
    if (float* dst = WholeC(a, mb, nb)) {               \
      _tile_stored(T, dst, (a).rows * sizeof(float));   \
    } else {                                            \
      alignas(64) float clip[kTileRows * kTileRows];    \
      _tile_stored(T, clip, kTileRows * sizeof(float)); \
      CopyC(a, clip, mb, nb);                           \
    }                                                   \
  } while (0)

// x blocks (mb, mb + 1) times W blocks (nb, nb + 1): up to four C tiles, each
// its own chain over the k-blocks. kTwoM / kTwoN: the second block exists.
// `prefetch`: this is the first pass over the W pair (later x blocks find it
// in cache).
template <bool kTwoM, bool kTwoN>
void TileQuad(const AmxArgs& a, size_t mb, size_t nb, bool prefetch) {
  const size_t kbn = a.kblocks;
  const size_t xs = a.x_stride * sizeof(uint16_t);
  const uint16_t* x0 = a.xb + mb * kTileRows * a.x_stride;
  const uint16_t* x1 = x0 + kTileRows * a.x_stride;
  const uint16_t* w0 = a.w + nb * kbn * kTileElems;
  const uint16_t* w1 = w0 + kbn * kTileElems;
  _tile_zero(0);
  if constexpr (kTwoN) _tile_zero(1);
  if constexpr (kTwoM) _tile_zero(2);
  if constexpr (kTwoM && kTwoN) _tile_zero(3);
  for (size_t kb = 0; kb < kbn; ++kb) {
    if (prefetch) {
      // Past the end of a block this runs into the next one (the stream's
      // continuation); past the end of W a prefetch is a harmless no-op.
      PrefetchStream(w0, kb);
      if constexpr (kTwoN) PrefetchStream(w1, kb);
    }
    _tile_loadd(4, x0 + kb * kTileCols, xs);
    _tile_loadd(6, w0 + kb * kTileElems, 64);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (kTwoN) {
      _tile_loadd(7, w1 + kb * kTileElems, 64);
      _tile_dpbf16ps(1, 4, 7);
    }
    if constexpr (kTwoM) {
      _tile_loadd(5, x1 + kb * kTileCols, xs);
      _tile_dpbf16ps(2, 5, 6);
      if constexpr (kTwoN) _tile_dpbf16ps(3, 5, 7);
    }
  }
  CORTIQ_STORE_C(0, a, mb, nb);
  if constexpr (kTwoN) CORTIQ_STORE_C(1, a, mb, nb + 1);
  if constexpr (kTwoM) CORTIQ_STORE_C(2, a, mb + 1, nb);
  if constexpr (kTwoM && kTwoN) CORTIQ_STORE_C(3, a, mb + 1, nb + 1);
}

}  // namespace

#undef CORTIQ_STORE_C

void AmxPackX(const float* x, size_t m, size_t cols, uint16_t* out, size_t row_begin,
              size_t row_end) {
  const size_t stride = KBlocks(cols) * kTileCols;
  for (size_t r = row_begin; r < row_end && r < m; ++r) {
    uint16_t* o = out + r * stride;
    const float* src = x + r * cols;
    for (size_t c0 = 0; c0 < stride; c0 += kTileCols) {
      _mm512_store_si512(o + c0, RoundBf16x32(src + c0, cols - c0));
    }
  }
}

void AmxTiledMatMul(const AmxArgs& a, size_t row_begin, size_t row_end) {
  EnsureTilesConfigured();
  const size_t nb0 = row_begin / kTileRows, nb1 = (row_end + kTileRows - 1) / kTileRows;
  const size_t mblocks = (a.m + kTileRows - 1) / kTileRows;
  for (size_t mc = 0; mc < mblocks; mc += kMChunkBlocks) {
    const size_t mend = MinSz(mc + kMChunkBlocks, mblocks);
    for (size_t nb = nb0; nb < nb1; nb += 2) {
      const bool two_n = nb + 1 < nb1;
      for (size_t mb = mc; mb < mend; mb += 2) {
        const bool two_m = mb + 1 < mend;
        const bool prefetch = mb == mc;
        if (two_m && two_n) {
          TileQuad<true, true>(a, mb, nb, prefetch);
        } else if (two_m) {
          TileQuad<true, false>(a, mb, nb, prefetch);
        } else if (two_n) {
          TileQuad<false, true>(a, mb, nb, prefetch);
        } else {
          TileQuad<false, false>(a, mb, nb, prefetch);
        }
      }
    }
  }
}

}  // namespace cortiq::math::internal
