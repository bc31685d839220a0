// Int8-weight MatMul on AVX-512 F/BW/VL/DQ without VNNI (the kAvx512 table):
// VPMADDWD on int16. No std:: templates (kernels_internal.h).
//
// The frame (16 W rows in the lanes, transposed in registers, x broadcast
// from its rows) is q8_avx512_inl.h's. VPMADDUBSW would add its u8 x s8
// pairs in int16 with saturation (255 * 128 * 2 overflows it, and the sign
// trick fails on the -128 a foreign file may hold), so both sides are
// widened to int16 and VPMADDWD adds each pair exactly into int32. Each
// packed dword of 4 W bytes (b0 b1 b2 b3) becomes two int16 pairs, (b0, b2)
// and (b1, b3) (two shifts each, no shuffle), and each x block is widened
// and permuted into the same pairing once per x row and block. Integer sums
// are exact in any order, so I_j is exact. Per x row and block: 16 VPMADDWD
// and 16 VPADDD for 16 W rows, then one convert, multiply and fma.
#include "core/math/q8_avx512_inl.h"

namespace cortiq::math::internal {
namespace {

struct Avx512Kernel {
  static constexpr size_t kVecs = 16;   // per block: 16 rows x 16 int16 pairs
  static constexpr size_t kChunk = 16;  // 17 KiB of packed W + scales
  static constexpr bool kCorr = false;  // signed x signed: no offset

  // out[2g] lane l: (int16 b0, int16 b2) of t[g]'s dword; out[2g + 1]: (b1, b3).
  static CORTIQ_INLINE void PackBlock(const __m512i t[8], __m512i* out) {
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) {
      _mm512_store_si512(out + 2 * g, _mm512_srai_epi16(_mm512_slli_epi16(t[g], 8), 8));
      _mm512_store_si512(out + 2 * g + 1, _mm512_srai_epi16(t[g], 8));
    }
  }

  template <int BT>
  static CORTIQ_INLINE void Block(const int8_t* const* x, const int32_t*, const __m512i* w,
                                  __m512i sum[BT]) {
    // Words 4g .. 4g + 3 of a widened block: x[4g], x[4g + 2], x[4g + 1],
    // x[4g + 3], so dword p pairs with packed vector p.
    const __m512i perm =
        _mm512_set_epi16(31, 29, 30, 28, 27, 25, 26, 24, 23, 21, 22, 20, 19, 17, 18, 16, 15, 13, 14,
                         12, 11, 9, 10, 8, 7, 5, 6, 4, 3, 1, 2, 0);
    alignas(64) int32_t xw[BT][16];
#pragma GCC unroll 8
    for (int b = 0; b < BT; ++b) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b]));
      _mm512_store_si512(xw[b], _mm512_permutexvar_epi16(perm, _mm512_cvtepi8_epi16(q)));
      sum[b] = _mm512_setzero_si512();
    }
#pragma GCC unroll 16
    for (int p = 0; p < 16; ++p) {
      const __m512i wp = _mm512_load_si512(w + p);
#pragma GCC unroll 8
      for (int b = 0; b < BT; ++b) {
        sum[b] = _mm512_add_epi32(sum[b], _mm512_madd_epi16(wp, _mm512_set1_epi32(xw[b][p])));
      }
    }
  }
};

}  // namespace

void Q8MatMulAvx512(const Q8Args& a, size_t row_begin, size_t row_end) {
  if (a.batch < kQ8FrameMinBatch) return Q8MatMulAvx2(a, row_begin, row_end);
  Q8Run<Avx512Kernel>(a, row_begin, row_end);
}

}  // namespace cortiq::math::internal
