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

// One 32-column block of R loaded W rows against B x rows (x0: the tile's
// first, x_stride apart) into acc.
template <int R, int B>
CORTIQ_INLINE void DotBlock(const __m512bh* w, const uint16_t* x0, size_t x_stride, size_t c,
                            __m512 (&acc)[R][B]) {
#pragma GCC unroll 8
  for (int b = 0; b < B; ++b) {
    const __m512bh xv = AsBh(_mm512_load_si512(x0 + b * x_stride + c));
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[r][b] = _mm512_dpbf16_ps(acc[r][b], w[r], xv);
  }
}

// The ragged end (columns [c, a.cols), c < a.cols): W masked, x zero-padded
// by the pack; then the sums to y[b0 ..][r0 ..].
template <int R, int B>
CORTIQ_INLINE void FinishTile(const GemvArgs& a, size_t r0, size_t b0, size_t c,
                              __m512 (&acc)[R][B]) {
  const size_t row_bytes = a.cols * sizeof(uint16_t);
  const char* w0 = static_cast<const char*>(a.w) + r0 * row_bytes;
  if (c < a.cols) {
    const __mmask32 m = Mask32(a.cols - c);
    __m512bh w[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      w[r] = AsBh(_mm512_maskz_loadu_epi16(m, w0 + r * row_bytes + c * sizeof(uint16_t)));
    }
    DotBlock<R, B>(w, a.xb + b0 * a.x_stride, a.x_stride, c, acc);
  }
  float sums[R * B];
  ReduceMany<R * B>(&acc[0][0], sums);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int b = 0; b < B; ++b) a.y[(b0 + b) * a.rows + r0 + r] = sums[r * B + b];
  }
}

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
  // The DRAM stream runs ahead as one contiguous run pulled into L2 a slice
  // per block, so it never waits on the row streams' own misses (as
  // kernels_avx2.cc does): the batch-1 tile (decode) pulls the next R rows;
  // a row block's first batch tile pulls its R rows' successors
  // kPrefetchRows ahead (its other batch tiles find its rows in cache, and
  // prefetch each row into L1). The batch tiles' run took a batch-8 call on
  // a cold 3072 x 1024 matrix from ~2x a batch-1 call's time to ~1x
  // (docs/PERFORMANCE.md). Prefetch hints only: the results are unchanged.
  const size_t blocks = full / kBlock;
  constexpr size_t kAheadRows = B == 1 ? R : kPrefetchRows;  // where the run starts
  const bool ahead = (B == 1 ? R == 8 : b0 == 0) && blocks > 0 && r0 + kAheadRows + R <= a.rows;
  const char* pf = w0 + kAheadRows * row_bytes;
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
    DotBlock<R, B>(w, x0, a.x_stride, c, acc);
  }
  FinishTile<R, B>(a, r0, b0, c, acc);
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

// ---- Batch tiles over long rows: a column chunk of x in L1 ----
// A batch tile of B x rows reads all of x once per row pair: at 8 rows of
// 3072 columns (the down projection) that is 48 KiB, beyond L1, so every
// pair re-streamed x from L2 and a batch-8 call cost ~2x a batch-1 call. So
// where a tile's x exceeds kChunkedMinXBytes, groups of kGroupRows W rows
// run one column chunk (kChunkCols: 8 KiB of x at B = 8) at a time, pair by
// pair, the accumulators kept in a stack buffer between chunks. Each
// accumulator still sees the same VDPBF16PS sequence (blocks in column
// order, the masked ragged end last) and the same ReduceMany tree, so the
// results are bit-identical to Tile's. The first batch tile pulls the next
// group's same columns into L2, a line per row and block.
constexpr size_t kChunkCols = 512;
constexpr size_t kGroupRows = 16;
constexpr size_t kChunkedMinXBytes = 24 * 1024;

// Tile<R, B> over columns [c0, c1) (c0 a multiple of kChunkCols; c1 a
// multiple of it or a.cols): accumulators from zero (c0 == 0) or `io`
// ([R][B]), to y (c1 == a.cols) or back to `io`. pf: prefetch the same
// columns kGroupRows rows below.
template <int R, int B>
void TileChunk(const GemvArgs& a, size_t r0, size_t b0, size_t c0, size_t c1, __m512* io,
               bool pf) {
  const size_t row_bytes = a.cols * sizeof(uint16_t);
  const char* w0 = static_cast<const char*>(a.w) + r0 * row_bytes;
  const uint16_t* x0 = a.xb + b0 * a.x_stride;
  __m512 acc[R][B];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int b = 0; b < B; ++b) acc[r][b] = c0 == 0 ? _mm512_setzero_ps() : io[r * B + b];
  }
  const size_t full = a.cols / kBlock * kBlock;
  const size_t end = MinSz(c1, full);
  size_t c = c0;
  for (; c < end; c += kBlock) {
    __m512bh w[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const char* p = w0 + r * row_bytes + c * sizeof(uint16_t);
      if (pf) _mm_prefetch(p + kGroupRows * row_bytes, _MM_HINT_T1);
      w[r] = AsBh(_mm512_loadu_si512(p));
    }
    DotBlock<R, B>(w, x0, a.x_stride, c, acc);
  }
  if (c1 < a.cols) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
      for (int b = 0; b < B; ++b) io[r * B + b] = acc[r][b];
    }
    return;
  }
  FinishTile<R, B>(a, r0, b0, c, acc);
}

using TileChunkFn = void (*)(const GemvArgs&, size_t, size_t, size_t, size_t, __m512*, bool);
template <int R>
constexpr TileChunkFn kTileChunks[9] = {nullptr,          TileChunk<R, 1>, TileChunk<R, 2>,
                                        TileChunk<R, 3>, TileChunk<R, 4>, TileChunk<R, 5>,
                                        TileChunk<R, 6>, TileChunk<R, 7>, TileChunk<R, 8>};

void GemvBf16Chunked(const GemvArgs& a, size_t row_begin, size_t row_end) {
  alignas(64) __m512 io[kGroupRows * 8];  // [row in group][up to 8 batch rows]
  for (size_t g0 = row_begin; g0 < row_end; g0 += kGroupRows) {
    const size_t g1 = MinSz(row_end, g0 + kGroupRows);
    const bool next = g1 + kGroupRows <= a.rows;  // the next group lies within W
    for (size_t b0 = 0; b0 < a.batch; b0 += 8) {
      const size_t bt = MinSz(8, a.batch - b0);
      for (size_t c0 = 0; c0 < a.cols; c0 += kChunkCols) {
        const size_t c1 = MinSz(a.cols, c0 + kChunkCols);
        size_t r = g0;
        for (; r + 2 <= g1; r += 2) {
          kTileChunks<2>[bt](a, r, b0, c0, c1, io + (r - g0) * 8, next && b0 == 0);
        }
        if (r < g1) kTileChunks<1>[bt](a, r, b0, c0, c1, io + (r - g0) * 8, next && b0 == 0);
      }
    }
  }
}

// ---- Prefill GEMM (gemm_bf16) ----
// The f32 GEMM's blocking and loop (kernels_avx512_inl.h), on pairs of columns: one
// VDPBF16PS takes 16 W rows x 2 columns against one x row's pair (a 32-bit
// broadcast), 32 multiply-adds where an f32 FMA does 16, and W stays bf16 in
// the packed panels (half the bytes per column).
// Arithmetic: output (i, n) accumulates, pair by pair in column order, the
// exact products w[n][2p+1]·x[i][2p+1] then w[n][2p]·x[i][2p] with f32
// rounding (subnormal inputs read as zero), then adds each kc block's sum to
// the previous blocks' in order. That sequence is fixed by the column
// count alone: a row's outputs do not depend on m, on its panel or on the
// other rows (a prefill chunk gives the same rows whatever shares its step).
constexpr size_t kMr = kGemmMr;
constexpr size_t kNr = kGemmNr;

// Packs W rows [n0, n_end) x pairs [q0, q0 + kq) into bp: [panel][kq][kNr]
// 32-bit pairs, rows past n_end and columns past k zero.
void GemmBf16PackW(const GemmArgs& a, size_t n0, size_t n_end, size_t q0, size_t kq,
                   uint32_t* bp) {
  const size_t row_bytes = a.k * sizeof(uint16_t);
  const char* w = static_cast<const char*>(a.w);
  for (size_t p0 = n0; p0 < n_end; p0 += kNr) {
    uint32_t* out = bp + (p0 - n0) * kq;
    const size_t rows = MinSz(kNr, n_end - p0);
    for (size_t qq = 0; qq < kq; qq += 16) {
      const size_t qn = MinSz(16, kq - qq);
      const size_t col = 2 * (q0 + qq);  // first column of this 16-pair slice
      const __mmask32 lm = Mask32(MinSz(32, a.k - col));
      for (size_t h = 0; h < kNr; h += 16) {
        __m512 r[16];
#pragma GCC unroll 16
        for (size_t i = 0; i < 16; ++i) {
          r[i] = h + i < rows ? _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(
                                    lm, w + (p0 + h + i) * row_bytes + col * sizeof(uint16_t)))
                              : _mm512_setzero_ps();
        }
        Transpose16(r);
#pragma GCC unroll 16
        for (size_t j = 0; j < 16; ++j) {
          if (j < qn) _mm512_store_ps(reinterpret_cast<float*>(out + (qq + j) * kNr + h), r[j]);
        }
      }
    }
  }
}

// Two VDPBF16PS per (x row, pair of columns) (kGemmKernels).
template <int kRows, bool kAccumulate>
struct MicroKernel {
  static void Run(size_t kq, const uint32_t* a, const uint32_t* b, float* c, size_t ldc,
                  __mmask16 m0, __mmask16 m1) {
    __m512 acc[kRows][2];
#pragma GCC unroll 14
    for (int i = 0; i < kRows; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    for (size_t q = 0; q < kq; ++q) {
      const __m512bh b0 = AsBh(_mm512_load_si512(b + q * kNr));
      const __m512bh b1 = AsBh(_mm512_load_si512(b + q * kNr + 16));
#pragma GCC unroll 14
      for (int i = 0; i < kRows; ++i) {
        const __m512bh ai = AsBh(_mm512_set1_epi32(static_cast<int>(a[q * kMr + i])));
        acc[i][0] = _mm512_dpbf16_ps(acc[i][0], b0, ai);
        acc[i][1] = _mm512_dpbf16_ps(acc[i][1], b1, ai);
      }
    }
    GemmStoreTile<kRows, kAccumulate>(acc, c, ldc, m0, m1);
  }
};

}  // namespace

void GemmBf16PackX(const float* x, size_t m, size_t k, uint32_t* xp, size_t pb, size_t pe) {
  const size_t pairs = (k + 1) / 2;
  const __mmask16 store_mask = Mask16(kMr);
  for (size_t p = pb; p < pe; ++p) {
    const size_t m0 = p * kMr;
    const size_t rows = MinSz(kMr, m - m0);
    uint32_t* out = xp + p * pairs * kMr;
    for (size_t k0 = 0; k0 < k; k0 += 32) {
      const size_t kn = MinSz(32, k - k0);
      __m512 r[16];
#pragma GCC unroll 16
      for (size_t i = 0; i < 16; ++i) {
        r[i] = i < rows ? _mm512_castsi512_ps(RoundBf16x32(x + (m0 + i) * k + k0, kn))
                        : _mm512_setzero_ps();
      }
      Transpose16(r);
      const size_t qn = (kn + 1) / 2;
#pragma GCC unroll 16
      for (size_t j = 0; j < 16; ++j) {
        if (j < qn) {
          _mm512_mask_storeu_ps(reinterpret_cast<float*>(out + (k0 / 2 + j) * kMr), store_mask,
                                r[j]);
        }
      }
    }
  }
}

// The f32 GEMM's loop (GemmLoop) on pairs: scratch holds kGemmKc * kGemmNc
// words, as gemm_kc * gemm_nc floats.
void GemmBf16(const GemmArgs& a, size_t row_begin, size_t row_end, float* scratch) {
  GemmLoop<MicroKernel>(a, reinterpret_cast<const uint32_t*>(a.xp), (a.k + 1) / 2, row_begin,
                        row_end, reinterpret_cast<uint32_t*>(scratch),
                        [&](size_t n0, size_t n_end, size_t q0, size_t kq, uint32_t* bp) {
                          GemmBf16PackW(a, n0, n_end, q0, kq, bp);
                        });
}

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
  } else if (MinSz(a.batch, 8) * a.cols * sizeof(uint16_t) > kChunkedMinXBytes) {
    return GemvBf16Chunked(a, row_begin, row_end);
  } else {
    for (; r + 2 <= row_end; r += 2) RowBlock<2>(a, r);
  }
  for (; r < row_end; ++r) RowBlock<1>(a, r);
}

}  // namespace cortiq::math::internal
