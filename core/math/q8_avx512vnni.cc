// Int8-weight MatMul with AVX512_VNNI (VPDPBUSD), for the kAvx512Vnni,
// kAvx512Bf16 and kAmx tables. Compiled with the AVX-512 flags plus
// -mavx512vnni; no std:: templates (kernels_internal.h).
//
// The frame (16 W rows in the lanes, transposed in registers, x broadcast
// from its rows) is q8_avx512_inl.h's. VPDPBUSD multiplies unsigned bytes by
// signed ones and adds the four products of each dword into an int32 lane
// with no intermediate saturation. The unsigned side is W, packed as w + 128
// (w ^ 0x80: -128 included, 0 .. 255), the signed side the quantized x
// (-127 .. 127), broadcast 4 bytes at a time from its row straight into the
// instruction. So for one x row and block j the lanes get
//   sum (w + 128) * x = I_j + 128 * sum x,
// and start from -128 * sum x (one int32 per x row and block, computed once
// per x group, shared by every W row): the 8 instructions end on exactly I_j.
// Per x row and block: 8 VPDPBUSD for 16 W rows, then one convert, multiply
// and fma. (With W signed and x unsigned instead, x would have to be
// transposed into the lanes and the outputs transposed back; the correction
// 128 * sum w would be per W row. Measured no better: see the report.)
#include "core/math/q8_avx512_inl.h"

namespace cortiq::math::internal {
namespace {

struct VnniKernel {
  static constexpr size_t kVecs = 8;    // per block: 16 rows x 32 bytes
  static constexpr size_t kChunk = 32;  // 18 KiB of packed W + scales
  static constexpr bool kCorr = true;

  static CORTIQ_INLINE void PackBlock(const __m512i t[8], __m512i* out) {
    const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) _mm512_store_si512(out + g, _mm512_xor_si512(t[g], bias));
  }

  // Lanes start at -128 * sum x, so the 8 VPDPBUSD end on I_j exactly.
  template <int BT>
  static CORTIQ_INLINE void Block(const int8_t* const* x, const int32_t* corr, const __m512i* w,
                                  __m512i sum[BT]) {
#pragma GCC unroll 8
    for (int b = 0; b < BT; ++b) sum[b] = _mm512_set1_epi32(corr[b]);
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) {
      const __m512i wg = _mm512_load_si512(w + g);
#pragma GCC unroll 8
      for (int b = 0; b < BT; ++b) {
        sum[b] = _mm512_dpbusd_epi32(sum[b], wg, _mm512_set1_epi32(Q8LoadI32(x[b] + 4 * g)));
      }
    }
  }
};

}  // namespace

// Lane-order W (PackQ8Lanes): the layout VnniKernel::PackBlock writes, made
// once at load, so a call streams each 16-row group (blocks · 576 bytes,
// in order) straight into VPDPBUSD with no transpose: every batch, decode
// and prefill, runs at the speed of that stream or of the VPDPBUSDs.
void Q8LanesMatMulVnni(const Q8Args& a, size_t row_begin, size_t row_end) {
  const size_t blocks = a.cols / kQ8Block;
  if (blocks > kQ8GroupCap) return Q8LanesMatMulScalar(a, row_begin, row_end);
  const size_t group = kQ8GroupCap / blocks;
  Q8XGroup xs;
  for (size_t g0 = 0; g0 < a.batch; g0 += group) {
    const size_t g1 = a.batch - g0 < group ? a.batch : g0 + group;
    Q8PrepareGroup(a, g0, g1, VnniKernel::kCorr, &xs);
    for (size_t r0 = row_begin; r0 < row_end; r0 += kQ8Lanes) {
      const uint8_t* base = a.lanes + r0 / kQ8Lanes * blocks * kQ8LaneBlockBytes;
      static_assert(kQ8LaneBlockBytes == (VnniKernel::kVecs + 1) * 64);
      Q8Chunk ch;
      ch.w = reinterpret_cast<const __m512i*>(base);
      ch.c0 = 0;
      ch.nb = blocks;
      ch.r0 = r0;
      ch.mask = Mask16(MinSz(kQ8Lanes, row_end - r0));
      ch.first = true;
      // The next group of the range streams into L2 while this one runs,
      // one block's bytes per block (its first x tile issues them): without
      // it the hardware prefetcher left the stream short of memory speed,
      // most at batch 8 (docs/PERFORMANCE.md). Hints only.
      if (r0 + 2 * kQ8Lanes <= row_end) {
        ch.pf = reinterpret_cast<const char*>(base) + blocks * kQ8LaneBlockBytes;
        ch.pf_step = kQ8LaneBlockBytes;
      }
      Q8Tiles<VnniKernel>(a, xs, ch, g0, g1);
    }
  }
}

void Q8MatMulVnni(const Q8Args& a, size_t row_begin, size_t row_end) {
  if (a.batch < kQ8FrameMinBatch) return Q8MatMulAvx2(a, row_begin, row_end);
  Q8Run<VnniKernel>(a, row_begin, row_end);
}

}  // namespace cortiq::math::internal
