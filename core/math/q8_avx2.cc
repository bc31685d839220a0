// core/math/q8_avx2.cc: MatMul on int8 weights (DType::kQ8_0) with AVX2.
// Compiled with -mavx2 -mfma -mf16c and reached only through the AVX2 and
// AVX-512 tables after CPUID says the CPU has them. No std:: templates and
// no inline code shared with other files (kernels_internal.h says why).
//
// Two kernels of one definition: Q8MatMulAvx2 over Q8_0 rows in place (this
// banner) and Q8LanesMatMulAvx2 over the lane-order copy the loaders make
// (its own banner, below), which is what models run: on a 2-vCPU Zen 4,
// `cortiq-bench-math Q8` with CORTIQ_ISA=avx2, 3072 x 1024, lanes against
// rows: batch 1 the same (the W stream), batch 8 1.3-1.6x faster, batch 512
// 1.5x (163 against 107 GFLOP/s).
//
// Contract: Q8MatMulAvx2 computes exactly what kernels.h defines and
// Q8MatMulScalar (kernels.cc) computes, bit for bit: for each output (W row r,
// x row b) and each 32-block j, the exact int32 block sum I_j = sum qw · qx,
// then acc = fma(float(I_j), dw_j · dx_j, acc) in block order from 0. SIMD
// lanes are 8 different outputs; no output's block order is ever changed.
//
// How one block sum is formed: VPMADDUBSW(|w| as u8, sign(x, w)) gives 16
// exact int16 pair sums (|w| <= 128, |x| <= 127, so a pair is at most 32512:
// no saturation, and w = -128 from a foreign file is fine); VPMADDWD with ones
// gives 8 int32 partials; a VPHADDD tree reduces 8 such vectors (8 outputs)
// into one vector of 8 block sums, then one cvt, one mul (dw · dx), one fma.
//
// Work split: W rows in tiles of 8 (kQ8Tile; the table's q8_row_block, so a
// thread's range starts on a tile). For each tile the batch runs in groups of
// 8, 4, 2, 1 x rows; a group of B x rows makes B accumulator vectors whose 8
// lanes are (8 / B W rows) x (B x rows). The tile (8 rows, at most 8 · cols
// / 32 · 34 bytes) is read from DRAM by the first group and from L1/L2 by the
// others, so every batch streams W once per call; while the first group
// works, the next tile of the range is prefetched as one linear stream.
//
// Cost: decode is bound by the W stream (the arithmetic is ~1 ns per 34-byte
// block at batch 1 on one core, well under its ~3.5 ns of DRAM time); from
// batch 8 on, ~0.6 ns per (W block, x row), i.e. ~105 GOP/s per core on the
// 2.6 GHz Xeon this was tuned on, bound by the three per-pair ops (sign,
// VPMADDUBSW, VPMADDWD). Tried and slower there: a shuffle/blend tree in
// place of VPHADDD (+10 %), and x transposed to 4-byte column groups with W
// dwords broadcast, which drops the tree but not the per-pair ops (+8 %).
// No allocation; the stack holds a few dozen floats. Thread-safe: reads a,
// writes only y[b][row_begin:row_end].
#include <immintrin.h>

#include "core/math/kernels_internal.h"

// Helpers must inline: an out-of-line call with vector arguments spills.
#define CORTIQ_INLINE inline __attribute__((always_inline))

namespace cortiq::math::internal {
namespace {

constexpr size_t kQ8Tile = kQ8Avx2RowBlock;  // W rows per tile = lanes per vector

CORTIQ_INLINE __m256i LoadBlock(const uint8_t* blk) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
}

CORTIQ_INLINE int ScaleBits(const uint8_t* blk) { return blk[0] | blk[1] << 8; }

// 8 int32 partial sums of one block's 32 products (see the banner).
CORTIQ_INLINE __m256i BlockPartials(__m256i w_abs, __m256i w, __m256i x, __m256i ones) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w_abs, _mm256_sign_epi8(x, w)), ones);
}

// Lane i = the sum of the 8 lanes of p[i] (exact: int32, no overflow since
// |block sum| <= 32 · 128 · 127).
CORTIQ_INLINE __m256i Sum8(const __m256i* p) {
  // h0123 = [low-half sums of p0..p3 | high-half sums of p0..p3].
  const __m256i h0123 =
      _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
  const __m256i h4567 =
      _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
  // [low halves of p0..3 | high halves of p4..7] + [high of p0..3 | low of p4..7]:
  // one cross-lane shuffle instead of two.
  return _mm256_add_epi32(_mm256_blend_epi32(h0123, h4567, 0xF0),
                          _mm256_permute2x128_si256(h0123, h4567, 0x21));
}

// The 8 rows' f16 block scales at byte offset `off`, widened.
CORTIQ_INLINE __m256 RowScales(const uint8_t* const* w, size_t off) {
  __m128i h = _mm_cvtsi32_si128(ScaleBits(w[0] + off));
  h = _mm_insert_epi16(h, ScaleBits(w[1] + off), 1);
  h = _mm_insert_epi16(h, ScaleBits(w[2] + off), 2);
  h = _mm_insert_epi16(h, ScaleBits(w[3] + off), 3);
  h = _mm_insert_epi16(h, ScaleBits(w[4] + off), 4);
  h = _mm_insert_epi16(h, ScaleBits(w[5] + off), 5);
  h = _mm_insert_epi16(h, ScaleBits(w[6] + off), 6);
  h = _mm_insert_epi16(h, ScaleBits(w[7] + off), 7);
  return _mm256_cvtph_ps(h);
}

// Activation scales of block j in lane order: lane l holds x row l % B's.
template <int B>
CORTIQ_INLINE __m256 LaneDx(const float* const* dx, size_t j) {
  if constexpr (B == 1) {
    return _mm256_broadcast_ss(dx[0] + j);
  } else if constexpr (B == 2) {
    const __m128 d = _mm_setr_ps(dx[0][j], dx[1][j], dx[0][j], dx[1][j]);
    return _mm256_set_m128(d, d);
  } else if constexpr (B == 4) {
    const __m128 d = _mm_setr_ps(dx[0][j], dx[1][j], dx[2][j], dx[3][j]);
    return _mm256_set_m128(d, d);
  } else {
    return _mm256_setr_ps(dx[0][j], dx[1][j], dx[2][j], dx[3][j], dx[4][j], dx[5][j], dx[6][j],
                          dx[7][j]);
  }
}

// One pass of a tile over all blocks for B x rows (b0 ..): B accumulator
// vectors; vector v, lane l is the output (W row v · 8/B + l / B, x row
// b0 + l % B). w[8]: the tile's row pointers (past the last row: repeats of
// it, computed and not stored). pf: the next tile (nullptr: none), read ahead
// as one stream of pf_bytes while this pass walks the tile.
template <int B>
void TilePass(const Q8Args& a, const uint8_t* const* w, size_t r0, size_t nrows, size_t b0,
              const uint8_t* pf, size_t pf_bytes) {
  constexpr int kRowsPerVec = static_cast<int>(kQ8Tile) / B;
  const size_t blocks = a.cols / kQ8Block;
  const int8_t* x[B];
  const float* dx[B];
  for (int b = 0; b < B; ++b) {
    x[b] = a.qx + (b0 + b) * a.cols;
    dx[b] = a.dx + (b0 + b) * blocks;
  }
  // Lane l of vector v reads row scale v · 8/B + l / B (B = 2, 4 only).
  __m256i dw_index[B];
  for (int v = 0; v < B; ++v) {
    alignas(32) int32_t idx[kQ8Tile];
    for (int l = 0; l < static_cast<int>(kQ8Tile); ++l) idx[l] = v * kRowsPerVec + l / B;
    dw_index[v] = _mm256_load_si256(reinterpret_cast<const __m256i*>(idx));
  }
  const __m256i ones = _mm256_set1_epi16(1);
  // Lines of the next tile to prefetch per block: its bytes over `blocks` steps.
  const size_t pf_step = pf == nullptr || blocks == 0 ? 0 : (pf_bytes + blocks - 1) / blocks;
  __m256 acc[B];
  for (int v = 0; v < B; ++v) acc[v] = _mm256_setzero_ps();
  for (size_t j = 0; j < blocks; ++j) {
    const size_t off = j * kQ8BlockBytes;
    if (pf_step != 0) {  // into L2: measured best (vs L1, NTA, per-row distances)
      const uint8_t* p = pf + j * pf_step;
      for (size_t k = 0; k < pf_step + 63; k += 64) _mm_prefetch(p + k, _MM_HINT_T1);
    }
    const __m256 dw = RowScales(w, off);
    alignas(32) float dw_row[kQ8Tile];
    if constexpr (B == 8) _mm256_store_ps(dw_row, dw);
    const __m256 dxv = LaneDx<B>(dx, j);
    __m256i xv[B];
#pragma GCC unroll 8
    for (int b = 0; b < B; ++b) {
      xv[b] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b] + j * kQ8Block));
    }
#pragma GCC unroll 8
    for (int v = 0; v < B; ++v) {
      __m256i p[kQ8Tile];
#pragma GCC unroll 8
      for (int rr = 0; rr < kRowsPerVec; ++rr) {
        const __m256i wv = LoadBlock(w[v * kRowsPerVec + rr] + off);
        const __m256i wa = _mm256_abs_epi8(wv);
#pragma GCC unroll 8
        for (int b = 0; b < B; ++b) p[rr * B + b] = BlockPartials(wa, wv, xv[b], ones);
      }
      __m256 s;
      if constexpr (B == 1) {
        s = _mm256_mul_ps(dw, dxv);
      } else if constexpr (B == 8) {
        s = _mm256_mul_ps(_mm256_broadcast_ss(dw_row + v), dxv);
      } else {
        s = _mm256_mul_ps(_mm256_permutevar8x32_ps(dw, dw_index[v]), dxv);
      }
      acc[v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(Sum8(p)), s, acc[v]);
    }
  }
  alignas(32) float out[kQ8Tile * B];
  for (int v = 0; v < B; ++v) _mm256_store_ps(out + v * kQ8Tile, acc[v]);
  for (int v = 0; v < B; ++v) {
    for (int l = 0; l < static_cast<int>(kQ8Tile); ++l) {
      const size_t rr = static_cast<size_t>(v * kRowsPerVec + l / B);
      if (rr < nrows) a.y[(b0 + l % B) * a.rows + r0 + rr] = out[v * kQ8Tile + l];
    }
  }
}


// ---- Lane-order W (PackQ8Lanes), the kAvx2 table's q8_lanes_matmul ----
//
// The layout VPDPBUSD reads (kernels.h): per 16-row group and block, 8
// vectors of 64 bytes, vector g lane l = bytes 4g .. 4g+3 of row l's block,
// stored as w ^ 0x80. A 256-bit half of such a vector holds 8 rows (lanes
// 0-7 or 8-15), so here a ymm lane is one W row and the x row is broadcast 4
// bytes at a time: the block sum of 8 outputs of one x row builds up in one
// vector, with no horizontal reduction (the row kernel above spends a
// VPHADDD tree per 8 outputs). Per (x row, 4 inputs, 8 rows): VPSIGNB,
// VPMADDUBSW, VPMADDWD, VPADDD; per (4 inputs, 8 rows) and x tile: one XOR
// (back to signed) and one VPABSB, shared by the tile's x rows. Exact as the
// row kernel (|w| <= 128, |x| <= 127: no saturation), and
//   acc = fma(float(I_j), dw_j * dx_j, acc)
// per lane in block order: bit for bit Q8LanesMatMulScalar.
//
// Work split, as q8_avx512_inl.h's: groups of x rows (as many as kLaneXCap
// (x row, block) scale pairs allow: the whole batch up to 256 rows at 1024
// columns), 16-row W groups within them, each half (8 rows) of a group in
// x tiles of kLaneTile rows. W is streamed once per x group; its half is
// reread from L1/L2 by the tiles after the first, which pulls the next
// group into L2 (the VNNI kernel's prefetch, measured needed there).
// Stack: 32 KiB of block-major activation scales. Thread-safe as above.

constexpr size_t kLaneRows = 16;   // rows per group (kernels.h kQ8LaneRows)
constexpr size_t kLaneHalf = 8;    // rows per ymm
constexpr int kLaneTile = 4;       // x rows per register tile
constexpr size_t kLaneXCap = 8192;  // (x row, block) pairs per x group

// The x side of one group [g0, g0 + rows): scales block-major ([block][row]).
struct LaneXGroup {
  alignas(32) float dx[kLaneXCap];
  size_t g0;
  size_t rows;
};

// Tile of BT x rows (b0 ..) against NH halves (8 rows each) of one group:
// W at `w` (half h at w + 32 h; lane vectors 64 bytes apart, blocks 512),
// scales at `dw` (half h at dw + 32 h; blocks 64 bytes apart). Writes
// y[b][r0 .. r0 + nrows) for the tile's x rows, nrows <= 8 NH. One half
// for tiles of 3 x rows or more (registers), both for 1 and 2: then the
// x broadcasts are shared and each line of W is used whole in one pass.
template <int BT, int NH>
void LaneTile(const Q8Args& a, const LaneXGroup& xg, const uint8_t* w, const uint8_t* dw,
              size_t r0, size_t nrows, size_t b0, const uint8_t* pf, size_t pf_step) {
  const size_t blocks = a.cols / kQ8Block;
  const int8_t* x[BT];
#pragma GCC unroll 8
  for (int b = 0; b < BT; ++b) x[b] = a.qx + (b0 + b) * a.cols;
  const float* dx = xg.dx + (b0 - xg.g0);
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x80));
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
    const uint8_t* wb = w + j * kLaneRows * kQ8Block;
    __m256i sum[NH][BT];
#pragma GCC unroll 2
    for (int h = 0; h < NH; ++h) {
#pragma GCC unroll 8
      for (int b = 0; b < BT; ++b) sum[h][b] = _mm256_setzero_si256();
    }
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) {
      __m256i wv[NH], wa[NH];
#pragma GCC unroll 2
      for (int h = 0; h < NH; ++h) {
        wv[h] = _mm256_xor_si256(
            _mm256_load_si256(reinterpret_cast<const __m256i*>(wb + g * 64 + h * 32)), bias);
        wa[h] = _mm256_abs_epi8(wv[h]);
      }
#pragma GCC unroll 8
      for (int b = 0; b < BT; ++b) {
        int32_t xi;
        __builtin_memcpy(&xi, x[b] + j * kQ8Block + 4 * g, sizeof xi);
        const __m256i xb = _mm256_set1_epi32(xi);
#pragma GCC unroll 2
        for (int h = 0; h < NH; ++h) {
          const __m256i p = _mm256_maddubs_epi16(wa[h], _mm256_sign_epi8(xb, wv[h]));
          sum[h][b] = _mm256_add_epi32(sum[h][b], _mm256_madd_epi16(p, ones));
        }
      }
    }
#pragma GCC unroll 2
    for (int h = 0; h < NH; ++h) {
      const __m256 dwv =
          _mm256_load_ps(reinterpret_cast<const float*>(dw + j * kLaneRows * 4 + h * 32));
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

using LaneTileFn = void (*)(const Q8Args&, const LaneXGroup&, const uint8_t*, const uint8_t*,
                            size_t, size_t, size_t, const uint8_t*, size_t);
// The rest of a half's tiles (1 .. kLaneTile - 1 x rows).
constexpr LaneTileFn kLaneTiles[kLaneTile] = {nullptr, LaneTile<1, 1>, LaneTile<2, 1>,
                                              LaneTile<3, 1>};

}  // namespace

void Q8MatMulAvx2(const Q8Args& a, size_t row_begin, size_t row_end) {
  const size_t row_bytes = a.cols / kQ8Block * kQ8BlockBytes;
  for (size_t r0 = row_begin; r0 < row_end; r0 += kQ8Tile) {
    const size_t nrows = row_end - r0 < kQ8Tile ? row_end - r0 : kQ8Tile;
    const uint8_t* w[kQ8Tile];
    for (size_t rr = 0; rr < kQ8Tile; ++rr) {
      w[rr] = a.w + (r0 + (rr < nrows ? rr : nrows - 1)) * row_bytes;
    }
    // The next tile of this range, prefetched by the first pass over this one.
    const size_t next = r0 + nrows;
    const uint8_t* pf = next < row_end ? a.w + next * row_bytes : nullptr;
    const size_t pf_bytes =
        pf == nullptr ? 0 : (row_end - next < kQ8Tile ? row_end - next : kQ8Tile) * row_bytes;
    size_t b = 0;
    for (; b + 8 <= a.batch; b += 8) {
      TilePass<8>(a, w, r0, nrows, b, b == 0 ? pf : nullptr, pf_bytes);
    }
    if (b + 4 <= a.batch) {
      TilePass<4>(a, w, r0, nrows, b, b == 0 ? pf : nullptr, pf_bytes);
      b += 4;
    }
    if (b + 2 <= a.batch) {
      TilePass<2>(a, w, r0, nrows, b, b == 0 ? pf : nullptr, pf_bytes);
      b += 2;
    }
    if (b < a.batch) TilePass<1>(a, w, r0, nrows, b, b == 0 ? pf : nullptr, pf_bytes);
  }
}

void Q8LanesMatMulAvx2(const Q8Args& a, size_t row_begin, size_t row_end) {
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
      for (size_t j = 0; j < blocks; ++j) xg.dx[j * xg.rows + b - g0] = a.dx[b * blocks + j];
    }
    for (size_t r0 = row_begin; r0 < row_end; r0 += kLaneRows) {
      const uint8_t* base = a.lanes + r0 / kLaneRows * group_bytes;
      const uint8_t* scales = base + blocks * kLaneRows * kQ8Block;
      const size_t nrows = row_end - r0 < kLaneRows ? row_end - r0 : kLaneRows;
      // The next group of the range, pulled into L2 by the first tile.
      const uint8_t* pf = r0 + 2 * kLaneRows <= row_end ? base + group_bytes : nullptr;
      if (xg.rows <= 2) {  // both halves at once
        (xg.rows == 1 ? LaneTile<1, 2> : LaneTile<2, 2>)(a, xg, base, scales, r0, nrows, g0, pf,
                                                          kQ8LaneBlockBytes);
        continue;
      }
      for (size_t h = 0; h * kLaneHalf < nrows; ++h) {
        const size_t hrows = nrows - h * kLaneHalf < kLaneHalf ? nrows - h * kLaneHalf : kLaneHalf;
        const uint8_t* w = base + h * 32;
        const uint8_t* dw = scales + h * 32;
        size_t b = g0;
        for (; b + kLaneTile <= g1; b += kLaneTile) {
          LaneTile<kLaneTile, 1>(a, xg, w, dw, r0 + h * kLaneHalf, hrows, b,
                                 h == 0 && b == g0 ? pf : nullptr, kQ8LaneBlockBytes);
        }
        if (b < g1) {
          kLaneTiles[g1 - b](a, xg, w, dw, r0 + h * kLaneHalf, hrows, b,
                             h == 0 && b == g0 ? pf : nullptr, kQ8LaneBlockBytes);
        }
      }
    }
  }
}

}  // namespace cortiq::math::internal
