// The int8 lane-order kernel on 256-bit registers, shared by the AVX2 table
// (q8_avx2.cc: VPSIGNB + VPMADDUBSW + VPMADDWD) and the AVX-VNNI table
// (q8_avxvnni.cc: VPDPBUSD), each compiled with its own flags. Internal
// linkage only (an anonymous namespace), as q8_avx512_inl.h: each including
// file gets its own copy, built for its own ISA (kernels_internal.h says why
// nothing inline may be shared across those files otherwise).
//
// The layout VPDPBUSD reads (kernels.h): per 16-row group and block, 8
// vectors of 64 bytes, vector g lane l = bytes 4g .. 4g+3 of row l's block,
// stored as w ^ 0x80, then the block's 16 f32 scales. A 256-bit half of such a vector holds 8 rows
// (lanes 0-7 or 8-15), so here a ymm lane is one W row and the x row is broadcast 4 bytes at a
// time: the block sum of 8 outputs of one x row builds up in one vector, with no horizontal
// reduction. What one (x dword, 8 W rows) step does is the Ops policy's:
//   Ops::W Ops::Load(p)          the 32 bytes of a half at p, in the form
//                                Accumulate reads (once per x tile);
//   __m256i Ops::Accumulate(s, w, xb)
//                                s plus the 8 rows' 4-byte products with the
//                                broadcast x dword xb;
//   bool Ops::kCorrected         whether each block sum starts from
//                                -128 · sum x (the products were taken on
//                                w + 128) instead of 0.
// Exact either way (no saturation), and
//   acc = fma(float(I_j), dw_j * dx_j, acc)
// per lane in block order: bit for bit Q8LanesMatMulScalar.
//
// Work split, as q8_avx512_inl.h's: groups of x rows (as many as kLaneXCap
// (x row, block) pairs allow: the whole batch up to 256 rows at 1024
// columns), 16-row W groups within them, each half (8 rows) of a group in
// x tiles of kLaneTile rows. W is streamed once per x group; its half is
// reread from L1/L2 by the tiles after the first, which pulls the next
// group into L2 (the VNNI kernel's prefetch, measured needed there).
// Stack: 64 KiB of block-major activation scales and corrections.
// Thread-safe: reads a, writes only y[b][row_begin:row_end].
#pragma once

#include <immintrin.h>

#include "core/math/kernels_internal.h"

namespace cortiq::math::internal {
namespace {

constexpr size_t kLaneRows = 16;    // rows per group (kernels.h kQ8LaneRows)
constexpr size_t kLaneHalf = 8;     // rows per ymm
constexpr int kLaneTile = 4;        // x rows per register tile
constexpr size_t kLaneXCap = 8192;  // (x row, block) pairs per x group

// The x side of one group [g0, g0 + rows), block-major ([block][row]): the
// scales and (Ops::kCorrected) the corrections -128 · sum qx.
struct LaneXGroup {
  alignas(32) float dx[kLaneXCap];
  alignas(32) int32_t corr[kLaneXCap];
  size_t g0;
  size_t rows;
};

// -128 · sum qx over the block of 32 at ux (Q8Args::ux = qx + 128), as
// q8_avx512_inl.h's Q8PrepareGroup forms it: one VPSADBW.
inline __attribute__((always_inline)) int32_t BlockCorrection(const uint8_t* ux) {
  const __m256i s = _mm256_sad_epu8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(ux)),
                                    _mm256_setzero_si256());
  const __m128i h = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  return 128 * (32 * 128 - (_mm_cvtsi128_si32(h) + _mm_extract_epi32(h, 2)));
}

// Tile of BT x rows (b0 ..) against NH halves (8 rows each) of one group:
// W at `w` (half h at w + 32 h; lane vectors 64 bytes apart, blocks
// kQ8LaneBlockBytes), scales at `dw` (half h at dw + 32 h; blocks
// kQ8LaneBlockBytes apart). Writes
// y[b][r0 .. r0 + nrows) for the tile's x rows, nrows <= 8 NH. One half
// for tiles of 3 x rows or more (registers), both for 1 and 2: then the
// x broadcasts are shared and each line of W is used whole in one pass.
template <class Ops, int BT, int NH>
void LaneTile(const Q8Args& a, const LaneXGroup& xg, const uint8_t* w, const uint8_t* dw, size_t r0,
              size_t nrows, size_t b0, const uint8_t* pf, size_t pf_step) {
  const size_t blocks = a.cols / kQ8Block;
  const int8_t* x[BT];
#pragma GCC unroll 8
  for (int b = 0; b < BT; ++b) x[b] = a.qx + (b0 + b) * a.cols;
  const float* dx = xg.dx + (b0 - xg.g0);
  const int32_t* corr = xg.corr + (b0 - xg.g0);
  __m256 acc[NH][BT];
#pragma GCC unroll 2
  for (int h = 0; h < NH; ++h) {
#pragma GCC unroll 8
    for (int b = 0; b < BT; ++b) acc[h][b] = _mm256_setzero_ps();
  }
  for (size_t j = 0; j < blocks; ++j) {
    if (pf != nullptr) {  // into L2, as the VNNI kernel
      for (size_t k = 0; k < pf_step; k += 64) _mm_prefetch(pf + k, _MM_HINT_T1);
      pf += pf_step;
    }
    const uint8_t* wb = w + j * kQ8LaneBlockBytes;
    __m256i sum[NH][BT];
#pragma GCC unroll 8
    for (int b = 0; b < BT; ++b) {
      const __m256i start =
          Ops::kCorrected ? _mm256_set1_epi32(corr[j * xg.rows + b]) : _mm256_setzero_si256();
#pragma GCC unroll 2
      for (int h = 0; h < NH; ++h) sum[h][b] = start;
    }
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) {
      typename Ops::W wv[NH];
#pragma GCC unroll 2
      for (int h = 0; h < NH; ++h) wv[h] = Ops::Load(wb + g * 64 + h * 32);
#pragma GCC unroll 8
      for (int b = 0; b < BT; ++b) {
        int32_t xi;
        __builtin_memcpy(&xi, x[b] + j * kQ8Block + 4 * g, sizeof xi);
        const __m256i xb = _mm256_set1_epi32(xi);
#pragma GCC unroll 2
        for (int h = 0; h < NH; ++h) sum[h][b] = Ops::Accumulate(sum[h][b], wv[h], xb);
      }
    }
#pragma GCC unroll 2
    for (int h = 0; h < NH; ++h) {
      const __m256 dwv =
          _mm256_load_ps(reinterpret_cast<const float*>(dw + j * kQ8LaneBlockBytes + h * 32));
#pragma GCC unroll 8
      for (int b = 0; b < BT; ++b) {
        const __m256 s = _mm256_mul_ps(dwv, _mm256_broadcast_ss(dx + j * xg.rows + b));
        acc[h][b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[h][b]), s, acc[h][b]);
      }
    }
  }
  alignas(32) float out[kLaneHalf * NH];
#pragma GCC unroll 8
  for (int b = 0; b < BT; ++b) {
#pragma GCC unroll 2
    for (int h = 0; h < NH; ++h) _mm256_store_ps(out + h * kLaneHalf, acc[h][b]);
    float* y = a.y + (b0 + b) * a.rows + r0;
    for (size_t l = 0; l < nrows; ++l) y[l] = out[l];
  }
}

// Q8Args::lanes times x, rows [row_begin, row_end) (row_begin a multiple of
// 16): the table's q8_lanes_matmul with Ops' inner product.
template <class Ops>
void Q8LanesMatMulYmm(const Q8Args& a, size_t row_begin, size_t row_end) {
  using TileFn = void (*)(const Q8Args&, const LaneXGroup&, const uint8_t*, const uint8_t*, size_t,
                          size_t, size_t, const uint8_t*, size_t);
  // The rest of a half's tiles (1 .. kLaneTile - 1 x rows).
  constexpr TileFn kRest[kLaneTile] = {nullptr, LaneTile<Ops, 1, 1>, LaneTile<Ops, 2, 1>,
                                       LaneTile<Ops, 3, 1>};
  const size_t blocks = a.cols / kQ8Block;
  if (blocks == 0 || blocks > kLaneXCap) return Q8LanesMatMulScalar(a, row_begin, row_end);
  const size_t group = kLaneXCap / blocks;
  const size_t group_bytes = blocks * kQ8LaneBlockBytes;
  LaneXGroup xg;
  for (size_t g0 = 0; g0 < a.batch; g0 += group) {
    const size_t g1 = a.batch - g0 < group ? a.batch : g0 + group;
    xg.g0 = g0;
    xg.rows = g1 - g0;
    for (size_t b = g0; b < g1; ++b) {
      for (size_t j = 0; j < blocks; ++j) {
        xg.dx[j * xg.rows + b - g0] = a.dx[b * blocks + j];
        if (Ops::kCorrected) {
          xg.corr[j * xg.rows + b - g0] = BlockCorrection(a.ux + b * a.cols + j * kQ8Block);
        }
      }
    }
    for (size_t r0 = row_begin; r0 < row_end; r0 += kLaneRows) {
      const uint8_t* base = a.lanes + r0 / kLaneRows * group_bytes;
      const uint8_t* scales = base + kQ8LaneValueBytes;
      const size_t nrows = row_end - r0 < kLaneRows ? row_end - r0 : kLaneRows;
      // The next group of the range, pulled into L2 by the first tile.
      const uint8_t* pf = r0 + 2 * kLaneRows <= row_end ? base + group_bytes : nullptr;
      if (xg.rows <= 2) {  // both halves at once
        (xg.rows == 1 ? LaneTile<Ops, 1, 2> : LaneTile<Ops, 2, 2>)(a, xg, base, scales, r0, nrows,
                                                                   g0, pf, kQ8LaneBlockBytes);
        continue;
      }
      for (size_t h = 0; h * kLaneHalf < nrows; ++h) {
        const size_t hrows = nrows - h * kLaneHalf < kLaneHalf ? nrows - h * kLaneHalf : kLaneHalf;
        const uint8_t* w = base + h * 32;
        const uint8_t* dw = scales + h * 32;
        size_t b = g0;
        for (; b + kLaneTile <= g1; b += kLaneTile) {
          LaneTile<Ops, kLaneTile, 1>(a, xg, w, dw, r0 + h * kLaneHalf, hrows, b,
                                      h == 0 && b == g0 ? pf : nullptr, kQ8LaneBlockBytes);
        }
        if (b < g1) {
          kRest[g1 - b](a, xg, w, dw, r0 + h * kLaneHalf, hrows, b,
                        h == 0 && b == g0 ? pf : nullptr, kQ8LaneBlockBytes);
        }
      }
    }
  }
}

}  // namespace
}  // namespace cortiq::math::internal
