// Int8-weight MatMul on AMX-INT8 (TDPBSUD), for the kAmx table's
// q8_lanes_amx. Compiled with the AVX-512 flags plus -mamx-tile -mamx-int8
// and reached only through the kAmx table, after CPUID says the CPU has
// AMX-INT8 and the OS has granted the tile state (EnableAmxForProcess). No
// std:: templates here (see kernels_internal.h).
//
// Why: a VPDPBUSD does 64 multiply-adds; one TDPBSUD over a Q8_0 block does
// 16 x rows x 16 W rows x 32 = 8192. Prefill on int8 weights is bound by
// the integer products on VNNI; here it is bound by the f32 block-scale
// arithmetic that every tier does anyway (below).
//
// The lane order (PackQ8Lanes) is already the B operand's layout: block j of
// a 16-row group is 8 rows of 64 bytes (then its 16 f32 scales), row v holding bytes 4v..4v+3 of
// each W row's block (w + 128, unsigned). So B loads in place (512 contiguous bytes), and the A
// operand is 16 rows of the quantized x, one block (32 signed bytes) each, loaded in place at the
// row stride. TDPBSUD multiplies signed A by unsigned B with exact int32 sums:
//   C[b][l] = sum over the block of qx[b] * (w[l] + 128) = I_j + 128 * sum qx,
// and Q8Args::corr holds -128 * sum qx per (x row, block). One block per
// product, because every block has its own scales: per x row, block and W
// row the f32 step is exactly kernels.h's
//   acc = fma(float(C + corr), dw_j * dx_j, acc)
// in block order (C stored, then one add, convert, multiply and fma per 16
// lanes), so every output is bit-identical to Q8MatMulScalar, whatever the
// batch, the x-row tiling or the row split over threads.
//
// Schedule. x rows are taken kXRows (32: two A tiles) at a time against one
// 16-row W group, the blocks in order, two banks of C tiles alternating: the
// products of block j issue before the f32 step of block j - 1 runs on the
// stored C of the other bank, so the AMX unit and the vector units overlap.
// Over a prefill batch, W groups are the middle loop and x passes the inner
// one inside an outer chunk of kXChunkRows x rows (<= 768 KiB of qx at
// 3072 columns, kept in L2 while each W group is reused from L1 / L2). The
// first pass over a W group (the one that reads it from memory) prefetches
// its stream as the bf16 tile kernel does: the AMX unit runs its tile loads
// in order, so a load that misses stalls every later tile instruction.
#include "core/math/kernels_avx512_inl.h"
#include "core/math/kernels_internal.h"

namespace cortiq::math::internal {
namespace {

constexpr size_t kLanes = kQ8LaneRows;            // W rows per group = lanes of C
constexpr size_t kXTile = 16;                     // x rows per A / C tile
constexpr size_t kXRows = 2 * kXTile;             // x rows per pass (two A tiles)
constexpr size_t kXChunkRows = 256;               // x rows per outer chunk
constexpr size_t kLaneBlock = kQ8LaneBlockBytes;  // one block of a group: B tile + scales
constexpr size_t kNearBlocks = 4;  // whole blocks prefetched into L1 ahead (2.25 KiB)
constexpr size_t kFarBlocks = 32;  // one line this far ahead into L2 (18 KiB)

// The products of block j (W block at wb, x rows from x) into C bank K
// (tiles 2K, 2K + 1; B tile 6 + K). kTwo: the second A tile has rows.
// (GCC's tile intrinsics are macros that paste the tile number into the
// asm, so each bank spells its tiles out.)
#define CORTIQ_Q8_AMX_ISSUE(C0, C1, B)                 \
  do {                                                 \
    _tile_loadd(B, wb, 64);                            \
    _tile_zero(C0);                                    \
    _tile_loadd(4, x, x_stride);                       \
    _tile_dpbsud(C0, 4, B);                            \
    if constexpr (kTwo) {                              \
      _tile_zero(C1);                                  \
      _tile_loadd(5, x + kXTile * x_stride, x_stride); \
      _tile_dpbsud(C1, 5, B);                          \
    }                                                  \
  } while (0)
template <int K, bool kTwo>
CORTIQ_INLINE void Issue(const uint8_t* wb, const int8_t* x, size_t x_stride) {
  if constexpr (K == 0) {
    CORTIQ_Q8_AMX_ISSUE(0, 1, 6);
  } else {
    CORTIQ_Q8_AMX_ISSUE(2, 3, 7);
  }
}
#undef CORTIQ_Q8_AMX_ISSUE

template <int K, bool kTwo>
CORTIQ_INLINE void Drain(int32_t* c) {
  if constexpr (K == 0) {
    _tile_stored(0, c, 64);
    if constexpr (kTwo) _tile_stored(1, c + kXTile * kLanes, 64);
  } else {
    _tile_stored(2, c, 64);
    if constexpr (kTwo) _tile_stored(3, c + kXTile * kLanes, 64);
  }
}

// The f32 step of block j for x rows [0, nx) of a pass: c [nx][16] int32
// sums, acc [nx][16] floats, corr / dx the pass's first row's [row][block],
// dw the group's block 0 scales (block j's kLaneBlock bytes further on).
CORTIQ_INLINE void Accumulate(const int32_t* c, size_t nx, const int32_t* corr, const float* dx,
                              size_t blocks, size_t j, const uint8_t* dw, float* acc) {
  const __m512 w = _mm512_load_ps(reinterpret_cast<const float*>(dw + j * kLaneBlock));
  for (size_t b = 0; b < nx; ++b) {
    const __m512i s = _mm512_add_epi32(_mm512_load_si512(c + b * kLanes),
                                       _mm512_set1_epi32(corr[b * blocks + j]));
    const __m512 scale = _mm512_mul_ps(w, _mm512_set1_ps(dx[b * blocks + j]));
    _mm512_store_ps(acc + b * kLanes, _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), scale,
                                                      _mm512_load_ps(acc + b * kLanes)));
  }
}

// The lines of the group's stream ahead of block j (a block's values and
// scales are one run; past the group this runs on into the next: addresses
// formed as integers, a prefetch past the end is a no-op).
CORTIQ_INLINE void Prefetch(uintptr_t base, size_t j) {
  const uintptr_t near = base + (j + kNearBlocks) * kLaneBlock;
  for (size_t l = 0; l < kLaneBlock; l += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(near + l), _MM_HINT_T0);
  }
  _mm_prefetch(reinterpret_cast<const char*>(base + (j + kFarBlocks) * kLaneBlock), _MM_HINT_T2);
}

// One pass: x rows [x0, x0 + nx) (nx <= kXRows) against the W group at
// `group` (rows r0 .. r0 + 15, `mask` of them stored).
template <bool kTwo>
void Pass(const Q8Args& a, const uint8_t* group, size_t r0, __mmask16 mask, size_t x0, size_t nx,
          bool prefetch) {
  const size_t blocks = a.cols / kQ8Block;
  const uint8_t* dw = group + kQ8LaneValueBytes;
  const int8_t* x = a.qx + x0 * a.cols;
  const int32_t* corr = a.corr + x0 * blocks;
  const float* dx = a.dx + x0 * blocks;
  const uintptr_t base = reinterpret_cast<uintptr_t>(group);
  alignas(64) int32_t c[2][kXRows * kLanes];
  alignas(64) float acc[kXRows * kLanes];
  for (size_t i = 0; i < nx * kLanes; i += 16) _mm512_store_ps(acc + i, _mm512_setzero_ps());
  // Block pairs: j on bank 0, j + 1 on bank 1; each bank's f32 step runs
  // after the other bank's products have issued.
  size_t j = 0;
  for (; j + 2 <= blocks; j += 2) {
    if (prefetch) Prefetch(base, j);
    Issue<0, kTwo>(group + j * kLaneBlock, x + j * kQ8Block, a.cols);
    if (j > 0) {
      Drain<1, kTwo>(c[1]);
      Accumulate(c[1], nx, corr, dx, blocks, j - 1, dw, acc);
    }
    if (prefetch) Prefetch(base, j + 1);
    Issue<1, kTwo>(group + (j + 1) * kLaneBlock, x + (j + 1) * kQ8Block, a.cols);
    Drain<0, kTwo>(c[0]);
    Accumulate(c[0], nx, corr, dx, blocks, j, dw, acc);
  }
  if (j < blocks) {  // an odd last block, on bank 0
    if (prefetch) Prefetch(base, j);
    Issue<0, kTwo>(group + j * kLaneBlock, x + j * kQ8Block, a.cols);
    if (j > 0) {
      Drain<1, kTwo>(c[1]);
      Accumulate(c[1], nx, corr, dx, blocks, j - 1, dw, acc);
    }
    Drain<0, kTwo>(c[0]);
    Accumulate(c[0], nx, corr, dx, blocks, j, dw, acc);
  } else {
    Drain<1, kTwo>(c[1]);
    Accumulate(c[1], nx, corr, dx, blocks, j - 1, dw, acc);
  }
  for (size_t b = 0; b < nx; ++b) {
    _mm512_mask_storeu_ps(a.y + (x0 + b) * a.rows + r0, mask, _mm512_load_ps(acc + b * kLanes));
  }
}

}  // namespace

void Q8LanesMatMulAmx(const Q8Args& a, size_t row_begin, size_t row_end) {
  AmxConfigure(AmxTileShape::kInt8);
  const size_t blocks = a.cols / kQ8Block;
  for (size_t xc = 0; xc < a.batch; xc += kXChunkRows) {
    const size_t xc_end = MinSz(a.batch, xc + kXChunkRows);
    for (size_t r0 = row_begin; r0 < row_end; r0 += kLanes) {
      const uint8_t* group = a.lanes + r0 / kLanes * blocks * kQ8LaneBlockBytes;
      const __mmask16 mask = Mask16(MinSz(kLanes, row_end - r0));
      for (size_t x0 = xc; x0 < xc_end; x0 += kXRows) {
        const size_t nx = MinSz(kXRows, xc_end - x0);
        if (nx > kXTile) {
          Pass<true>(a, group, r0, mask, x0, nx, x0 == xc);
        } else {
          Pass<false>(a, group, r0, mask, x0, nx, x0 == xc);
        }
      }
    }
  }
}

}  // namespace cortiq::math::internal
