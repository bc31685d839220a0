// core/math/q8_avxvnni.cc: MatMul on int8 weights in lane order with AVX-VNNI
// (the VEX-encoded VPDPBUSD on ymm registers: Intel client cores from Alder
// Lake, the E-core Xeons from Sierra Forest, which have no AVX-512, and the
// big Xeons and Zen 5 beside their AVX-512). Compiled with -mavx2 -mfma -mf16c
// -mavxvnni and reached only through the kAvxVnni table after CPUID says the
// CPU has AVX-VNNI. No std:: templates and no inline code shared with other
// files but q8_lanes_avx2_inl.h's (internal linkage; kernels_internal.h says
// why).
//
// That header's lane kernel (the AVX2 table's) with its inner product
// replaced: where AVX2 spends four instructions per (x dword, 8 W rows) — VPSIGNB,
// VPMADDUBSW, VPMADDWD, VPADDD — this spends one VPDPBUSD. The unsigned side
// is W as the lane order stores it (w + 128, i.e. w ^ 0x80), the signed side
// the broadcast x dword, so each lane accumulates sum (w + 128) · x = I_j +
// 128 · sum x over the block; it starts from -128 · sum x (one int32 per x
// row and block, computed once per call) and ends on I_j exactly, with no
// intermediate saturation (|(w + 128) · x| <= 255 · 127, 32 of them).
//
// Contract: bit for bit what kernels.h defines and Q8MatMulScalar computes
// (exact int32 block sums, then acc = fma(float(I_j), dw_j · dx_j, acc) in
// block order), so int8 MatMul stays bit-identical across ISAs, batches and
// thread counts.
#include <immintrin.h>

#include "core/math/kernels_internal.h"
#include "core/math/q8_lanes_avx2_inl.h"

namespace cortiq::math::internal {
namespace {

struct AvxVnniLaneOps {
  struct W {
    __m256i v;  // w + 128, as stored
  };
  static constexpr bool kCorrected = true;
  static inline __attribute__((always_inline)) W Load(const uint8_t* p) {
    return {_mm256_load_si256(reinterpret_cast<const __m256i*>(p))};
  }
  static inline __attribute__((always_inline)) __m256i Accumulate(__m256i sum, const W& w,
                                                                  __m256i xb) {
    return _mm256_dpbusd_avx_epi32(sum, w.v, xb);
  }
};

}  // namespace

void Q8LanesMatMulAvxVnni(const Q8Args& a, size_t row_begin, size_t row_end) {
  Q8LanesMatMulYmm<AvxVnniLaneOps>(a, row_begin, row_end);
}

}  // namespace cortiq::math::internal
