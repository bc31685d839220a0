// Helpers shared by the AVX-512 translation units (kernels_avx512.cc,
// kernels_avx512bf16.cc, kernels_amx.cc), all compiled with the AVX-512
// flags. Internal linkage only (static): each unit gets its
// own copy, so no AVX-512 code can leak into a unit built for another ISA
// (see kernels_internal.h).
#pragma once

// GCC 12's AVX-512 headers build some results from a self-initialised
// "undefined" register, which trips -Wuninitialized once inlined (GCC bug
// 105593, fixed in GCC 13): silence it for the header only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstddef>

#include "core/math/kernels_internal.h"

// Small helpers must inline: an out-of-line call with vector arguments makes
// the caller spill every live register (GCC otherwise declined for Exp and
// the transposes).
#define CORTIQ_INLINE inline __attribute__((always_inline))

namespace cortiq::math::internal {

static constexpr size_t kV = 16;  // floats per register

static CORTIQ_INLINE size_t MinSz(size_t a, size_t b) { return a < b ? a : b; }
static CORTIQ_INLINE size_t ElemSize(DType t) { return t == DType::kF32 ? 4 : 2; }
static CORTIQ_INLINE __mmask16 Mask16(size_t n) {
  return static_cast<__mmask16>(n >= 16 ? 0xFFFFu : (1u << n) - 1u);
}
static CORTIQ_INLINE __mmask32 Mask32(size_t n) {
  return static_cast<__mmask32>(n >= 32 ? 0xFFFFFFFFu : (1u << n) - 1u);
}

#if defined(__AVX512BF16__)
// The first min(n, 32) floats of src rounded to bf16 (nearest even), zeros
// past them, in natural order (element i from src[i]): one 64-byte row of
// the bf16 activation layouts (kernels_avx512bf16.cc, kernels_amx.cc).
static CORTIQ_INLINE __m512i RoundBf16x32(const float* src, size_t n) {
  const __m512 lo = _mm512_maskz_loadu_ps(Mask16(n), src);
  const __m512 hi = _mm512_maskz_loadu_ps(Mask16(n > 16 ? n - 16 : 0), src + 16);
  const __m512bh v = _mm512_cvtne2ps_pbh(hi, lo);
  return reinterpret_cast<const __m512i&>(v);
}
#endif

// In-register transpose of a 16x16 float block: r[i][j] -> r[j][i].
static CORTIQ_INLINE void Transpose16(__m512 r[16]) {
  __m512 t[16], u[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
#pragma GCC unroll 16
  for (int i = 0; i < 16; i += 4) {
    u[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
    u[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
// u[4g + c], lane L: column 4L + c of rows 4g..4g+3.
#pragma GCC unroll 16
  for (int h = 0; h < 16; h += 8) {
#pragma GCC unroll 16
    for (int c = 0; c < 4; ++c) {
      t[h + c] = _mm512_shuffle_f32x4(u[h + c], u[h + 4 + c], 0x88);
      t[h + 4 + c] = _mm512_shuffle_f32x4(u[h + c], u[h + 4 + c], 0xDD);
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xDD);
  }
}

// ---- The prefill GEMMs' blocking and loop (kernels_avx512.cc on f32 words,
// kernels_avx512bf16.cc on bf16 pairs) ----
// Micro-tile: kGemmMr rows of x (broadcast) times kGemmNr rows of W (two
// registers): 28 accumulators + 2 W registers + 1 broadcast of the 32 zmm
// registers. kGemmKc counts the words of a k block (columns, or pairs).
static constexpr size_t kGemmMr = 14;
static constexpr size_t kGemmNr = 32;
static constexpr size_t kGemmKc = 256;
static constexpr size_t kGemmNc = 512;

// M<kRows, kAccumulate>::Run(kc, a, b, c, ldc, m0, m1): c[0..kRows)[0..32)
// (+)= a[kc][kGemmMr]^T . b[kc][kGemmNr], columns masked by m0/m1. Indexed by
// the valid rows of the x panel (1..kGemmMr): the last panel runs only its
// own rows (a batch of 16 costs 16 rows of products, not 28).
template <template <int, bool> class M, bool kAcc>
static constexpr decltype(&M<1, kAcc>::Run) kGemmKernels[kGemmMr + 1] = {
    nullptr,          M<1, kAcc>::Run,  M<2, kAcc>::Run,  M<3, kAcc>::Run,  M<4, kAcc>::Run,
    M<5, kAcc>::Run,  M<6, kAcc>::Run,  M<7, kAcc>::Run,  M<8, kAcc>::Run,  M<9, kAcc>::Run,
    M<10, kAcc>::Run, M<11, kAcc>::Run, M<12, kAcc>::Run, M<13, kAcc>::Run, M<14, kAcc>::Run,
};
static_assert(kGemmMr == 14, "kGemmKernels lists one kernel per row count");

// A micro-tile's epilogue: c[i][0..32) = acc[i] (+ c[i] with kAccumulate),
// columns masked by m0/m1.
template <int kRows, bool kAccumulate>
static CORTIQ_INLINE void GemmStoreTile(__m512 (&acc)[kRows][2], float* c, size_t ldc,
                                        __mmask16 m0, __mmask16 m1) {
#pragma GCC unroll 14
  for (int i = 0; i < kRows; ++i) {
    float* ci = c + i * ldc;
    if (kAccumulate) {
      acc[i][0] = _mm512_add_ps(acc[i][0], _mm512_maskz_loadu_ps(m0, ci));
      acc[i][1] = _mm512_add_ps(acc[i][1], _mm512_maskz_loadu_ps(m1, ci + 16));
    }
    _mm512_mask_storeu_ps(ci, m0, acc[i][0]);
    _mm512_mask_storeu_ps(ci + 16, m1, acc[i][1]);
  }
}

// Loop order (BLIS style, per thread): W row block (kGemmNc) > k block
// (kGemmKc words), packed once into scratch by pack_w(n0, n_end, k0, kc,
// scratch) (~512 KiB, L2) > x panel (kGemmMr x kc words, stays in L1) > W
// panel (kc x kGemmNr words, streamed from L2). xp: [panel][kw][kGemmMr]
// words, kw of them per x row. Each k block after the first adds its sums
// to y's, in order.
template <template <int, bool> class M, typename T, typename PackW>
static CORTIQ_INLINE void GemmLoop(const GemmArgs& a, const T* xp, size_t kw, size_t row_begin,
                                   size_t row_end, T* scratch, PackW pack_w) {
  const size_t panels = (a.m + kGemmMr - 1) / kGemmMr;
  for (size_t jc = row_begin; jc < row_end; jc += kGemmNc) {
    const size_t jc_end = MinSz(row_end, jc + kGemmNc);
    for (size_t pc = 0; pc < kw; pc += kGemmKc) {
      const size_t kc = MinSz(kGemmKc, kw - pc);
      pack_w(jc, jc_end, pc, kc, scratch);
      for (size_t ip = 0; ip < panels; ++ip) {
        const T* ap = xp + (ip * kw + pc) * kGemmMr;
        const size_t rows = MinSz(kGemmMr, a.m - ip * kGemmMr);
        const auto kernel = pc == 0 ? kGemmKernels<M, false>[rows] : kGemmKernels<M, true>[rows];
        float* crow = a.y + ip * kGemmMr * a.n;
        for (size_t n0 = jc; n0 < jc_end; n0 += kGemmNr) {
          const size_t cols = jc_end - n0;
          kernel(kc, ap, scratch + (n0 - jc) * kc, crow + n0, a.n, Mask16(cols),
                 Mask16(cols > 16 ? cols - 16 : 0));
        }
      }
    }
  }
}

// Fixed-order reduction: ((a0 + a1) + (a2 + a3)), then the lane tree.
static CORTIQ_INLINE float Sum4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

// Horizontal sums of up to 16 accumulators at once. Each sum uses the same
// tree as _mm512_reduce_add_ps (i + i+8, then i + i+4, i + i+2, i + i+1), so a
// result does not depend on how many accumulators were reduced together:
// that keeps decode batch-invariant. Costs ~45 shuffles/adds for 16 vectors
// instead of ~8 dependent steps per vector.
template <int N>
static CORTIQ_INLINE void ReduceMany(const __m512* v, float* out) {
  static_assert(N >= 1 && N <= 16);
  __m512 s[8], t[4], u[2];
  const __m512 zero = _mm512_setzero_ps();
  auto at = [&](int i) { return i < N ? v[i] : zero; };
#pragma GCC unroll 8
  for (int k = 0; k < 8; ++k) {  // lanes 0-1: v[2k] folded to 8, lanes 2-3: v[2k+1]
    if (2 * k >= N) {
      s[k] = zero;
      continue;
    }
    const __m512 a = at(2 * k), b = at(2 * k + 1);
    s[k] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
  }
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {  // lane q: v[4k + q] folded to 4
    t[k] = _mm512_add_ps(_mm512_shuffle_f32x4(s[2 * k], s[2 * k + 1], 0x88),
                         _mm512_shuffle_f32x4(s[2 * k], s[2 * k + 1], 0xDD));
  }
#pragma GCC unroll 2
  for (int k = 0; k < 2; ++k) {  // lane q: [v[8k+q] x2, v[8k+4+q] x2]
    u[k] = _mm512_add_ps(_mm512_shuffle_ps(t[2 * k], t[2 * k + 1], 0x44),
                         _mm512_shuffle_ps(t[2 * k], t[2 * k + 1], 0xEE));
  }
  // Element 4q + e: the sum of v[4e + q].
  const __m512 w =
      _mm512_add_ps(_mm512_shuffle_ps(u[0], u[1], 0x88), _mm512_shuffle_ps(u[0], u[1], 0xDD));
  alignas(64) float tmp[16];
  _mm512_store_ps(tmp, w);
#pragma GCC unroll 16
  for (int i = 0; i < N; ++i) out[i] = tmp[(i % 4) * 4 + i / 4];
}

}  // namespace cortiq::math::internal
