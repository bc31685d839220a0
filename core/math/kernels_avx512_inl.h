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
