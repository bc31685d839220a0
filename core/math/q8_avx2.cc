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
#include "core/math/q8_lanes_avx2_inl.h"

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
// q8_lanes_avx2_inl.h's kernel with this inner product per (x dword, 8 W
// rows): VPSIGNB, VPMADDUBSW, VPMADDWD, VPADDD, on the weights turned back
// to signed (one XOR) with their magnitudes (one VPABSB), both shared by the
// tile's x rows. Exact as the row kernel (|w| <= 128, |x| <= 127: no
// saturation).
struct Avx2LaneOps {
  struct W {
    __m256i v;  // w (signed)
    __m256i a;  // |w|
  };
  static constexpr bool kCorrected = false;
  static CORTIQ_INLINE W Load(const uint8_t* p) {
    const __m256i v = _mm256_xor_si256(_mm256_load_si256(reinterpret_cast<const __m256i*>(p)),
                                       _mm256_set1_epi8(static_cast<char>(0x80)));
    return {v, _mm256_abs_epi8(v)};
  }
  static CORTIQ_INLINE __m256i Accumulate(__m256i sum, const W& w, __m256i xb) {
    const __m256i p = _mm256_maddubs_epi16(w.a, _mm256_sign_epi8(xb, w.v));
    __m256i r = _mm256_add_epi32(sum, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
    // One accumulator per (x row, half), added to in order: without this GCC
    // reassociates the chain into a tree whose partial sums spill to the stack.
    __asm__("" : "+x"(r));
    return r;
  }
};

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
  Q8LanesMatMulYmm<Avx2LaneOps>(a, row_begin, row_end);
}

}  // namespace cortiq::math::internal
