// Decode GEMV with bf16 activations on bf16 weights, on AVX512_BF16
// (VDPBF16PS). Compiled with the AVX-512 flags plus -mavx512bf16 and reached
// only through the kAvx512Bf16 table (kernels_avx512.cc), after CPUID says the
// CPU has AVX512_BF16. No std:: templates here (see kernels_internal.h).
//
// Why: at batch 8 the f32 decode GEMV is compute-bound. Per 32 weights and
// batch row it runs two FMAs, plus a shift and an AND per weight row to widen
// bf16 to f32; one VDPBF16PS does the 32 multiply-adds with no widening. Where
// the core issues it at the FMA rate that halves the work; Sapphire Rapids
// issues it at half that rate (measured: ~1 per cycle against 2 FMAs), so
// there it only saves the widening, and CPUs with AMX take kernels_amx.cc.

// Arithmetic: lane i of an accumulator gets, per 32-column block, the exact
// products w[2i+1]·x[2i+1] then w[2i]·x[2i] added with f32 rounding (what
// VDPBF16PS does; subnormal inputs read as zero). Every (row, batch row)
// accumulator sees the same instruction sequence whatever the tile shape and
// is reduced with the same tree (ReduceMany), so decode stays batch-invariant.

#include "core/math/kernels_avx512_inl.h"
#include "core/math/kernels_internal.h"

namespace cortiq::math::internal {
namespace {

constexpr size_t kBlock = 32;  // columns per VDPBF16PS (16 lanes x 2)
// Rows ahead whose next line each tile prefetches. Rows are contiguous, so
// this runs ~8 rows' worth of bytes ahead of the loads: far enough to cover
// DRAM latency at the rate one core consumes the stream.
constexpr size_t kPrefetchRows = 8;

CORTIQ_INLINE __m512bh AsBh(__m512i v) { return reinterpret_cast<__m512bh&>(v); }

// y[b0 .. b0+B) x rows [r0, r0 + R): whole rows, accumulators in registers.
template <int R, int B>
void Tile(const GemvArgs& a, size_t r0, size_t b0) {
  const size_t row_bytes = a.cols * sizeof(uint16_t);
  const char* w0 = static_cast<const char*>(a.w) + r0 * row_bytes;
  const uint16_t* x0 = a.xb + b0 * a.x_stride;
  __m512 acc[R][B];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int b = 0; b < B; ++b) acc[r][b] = _mm512_setzero_ps();
  }
  const size_t full = a.cols / kBlock * kBlock;
  // The batch-1 tile (decode): the next R rows, one contiguous run, are
  // pulled into L2 a slice per block, so the DRAM stream never waits on the
  // R row streams' own misses (as kernels_avx2.cc does); batch tiles, which
  // find the rows in cache after their first batch rows, prefetch each row
  // kPrefetchRows ahead. Prefetch hints only: the results are unchanged.
  const size_t blocks = full / kBlock;
  const bool ahead = R == 8 && B == 1 && blocks > 0 && r0 + 2 * R <= a.rows;
  const char* pf = w0 + R * row_bytes;
  const size_t pf_step = ahead ? (R * row_bytes + blocks - 1) / blocks : 0;
  size_t c = 0;
  for (; c < full; c += kBlock) {
    for (size_t k = 0; k < pf_step; k += 64) _mm_prefetch(pf + k, _MM_HINT_T1);
    pf += pf_step;
    __m512bh w[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const char* p = w0 + r * row_bytes + c * sizeof(uint16_t);
      if (!ahead) _mm_prefetch(p + kPrefetchRows * row_bytes, _MM_HINT_T0);
      w[r] = AsBh(_mm512_loadu_si512(p));
    }
#pragma GCC unroll 8
    for (int b = 0; b < B; ++b) {
      const __m512bh xv = AsBh(_mm512_load_si512(x0 + b * a.x_stride + c));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r][b] = _mm512_dpbf16_ps(acc[r][b], w[r], xv);
    }
  }
  if (c < a.cols) {  // the ragged end: W masked, x is zero-padded by the pack
    const __mmask32 m = Mask32(a.cols - c);
    __m512bh w[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      w[r] = AsBh(_mm512_maskz_loadu_epi16(m, w0 + r * row_bytes + c * sizeof(uint16_t)));
    }
#pragma GCC unroll 8
    for (int b = 0; b < B; ++b) {
      const __m512bh xv = AsBh(_mm512_load_si512(x0 + b * a.x_stride + c));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r][b] = _mm512_dpbf16_ps(acc[r][b], w[r], xv);
    }
  }
  float sums[R * B];
  ReduceMany<R * B>(&acc[0][0], sums);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int b = 0; b < B; ++b) a.y[(b0 + b) * a.rows + r0 + r] = sums[r * B + b];
  }
}

// Rows [r0, r0 + R) for the whole batch, in batch tiles of up to 8.
template <int R>
void RowBlock(const GemvArgs& a, size_t r0) {
  size_t b = 0;
  for (; b + 8 <= a.batch; b += 8) Tile<R, 8>(a, r0, b);
  switch (a.batch - b) {
    case 7:
      return Tile<R, 7>(a, r0, b);
    case 6:
      return Tile<R, 6>(a, r0, b);
    case 5:
      return Tile<R, 5>(a, r0, b);
    case 4:
      return Tile<R, 4>(a, r0, b);
    case 3:
      return Tile<R, 3>(a, r0, b);
    case 2:
      return Tile<R, 2>(a, r0, b);
    case 1:
      return Tile<R, 1>(a, r0, b);
    default:
      return;
  }
}

}  // namespace

size_t GemvBf16PackedSize(size_t batch, size_t cols) {
  return batch * ((cols + kBlock - 1) / kBlock * kBlock);
}

void GemvBf16PackX(const float* x, size_t batch, size_t cols, uint16_t* out) {
  const size_t stride = (cols + kBlock - 1) / kBlock * kBlock;
  for (size_t b = 0; b < batch; ++b) {
    const float* src = x + b * cols;
    uint16_t* dst = out + b * stride;
    for (size_t c = 0; c < stride; c += kBlock) {
      _mm512_store_si512(dst + c, RoundBf16x32(src + c, c < cols ? cols - c : 0));
    }
  }
}

void GemvBf16(const GemvArgs& a, size_t row_begin, size_t row_end) {
  size_t r = row_begin;
  if (a.batch == 1) {
    for (; r + 8 <= row_end; r += 8) Tile<8, 1>(a, r, 0);
  } else {
    for (; r + 2 <= row_end; r += 2) RowBlock<2>(a, r);
  }
  for (; r < row_end; ++r) RowBlock<1>(a, r);
}

}  // namespace cortiq::math::internal
