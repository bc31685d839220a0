// AVX2 + FMA + F16C kernels. Compiled with -mavx2 -mfma -mf16c and reached
// only through the dispatch table after CPUID says the CPU has them. No std::
// templates here (see kernels_internal.h for why).
//
// Tails use masked loads/stores for f32 data and small zero-padded stack
// copies for 8- and 16-bit data (AVX2 has no masked loads for those), so every
// element sees the same operations whatever n is; the order of a reduction
// depends only on n.
#include <immintrin.h>

#include "core/math/kernels_internal.h"

// Small helpers must inline: an out-of-line call with vector arguments makes
// the caller spill every live register (GCC otherwise declined for Exp and
// the transposes).
#define CORTIQ_INLINE inline __attribute__((always_inline))

namespace cortiq::math::internal {
namespace {

constexpr size_t kV = 8;  // floats per register

CORTIQ_INLINE size_t MinSz(size_t a, size_t b) { return a < b ? a : b; }
CORTIQ_INLINE size_t ElemSize(DType t) { return t == DType::kF32 ? 4 : 2; }

// Lane mask with the first n (0..8) lanes set, for maskload / maskstore.
alignas(64) const int32_t kMaskTable[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
CORTIQ_INLINE __m256i TailMask(size_t n) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kMaskTable + 8 - (n > 8 ? 8 : n)));
}
CORTIQ_INLINE __m256 LoadTail(const float* p, size_t n) {
  return _mm256_maskload_ps(p, TailMask(n));
}
CORTIQ_INLINE void StoreTail(float* p, size_t n, __m256 v) {
  _mm256_maskstore_ps(p, TailMask(n), v);
}

CORTIQ_INLINE float HSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}
CORTIQ_INLINE float HMax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}
CORTIQ_INLINE float Sum4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
  return HSum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
}

// ---- Level 1 ----
float Dot(const float* a, const float* b, size_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  size_t i = 0;
  for (; i + 4 * kV <= n; i += 4 * kV) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
    s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
  }
  for (; i + kV <= n; i += kV)
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  if (i < n) s1 = _mm256_fmadd_ps(LoadTail(a + i, n - i), LoadTail(b + i, n - i), s1);
  return Sum4(s0, s1, s2, s3);
}

void Axpy(float alpha, const float* x, float* y, size_t n) {
  const __m256 va = _mm256_set1_ps(alpha);
  size_t i = 0;
  for (; i + kV <= n; i += kV) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  }
  if (i < n)
    StoreTail(y + i, n - i, _mm256_fmadd_ps(va, LoadTail(x + i, n - i), LoadTail(y + i, n - i)));
}

void Scale(float* x, float alpha, size_t n) {
  const __m256 va = _mm256_set1_ps(alpha);
  size_t i = 0;
  for (; i + kV <= n; i += kV) _mm256_storeu_ps(x + i, _mm256_mul_ps(va, _mm256_loadu_ps(x + i)));
  if (i < n) StoreTail(x + i, n - i, _mm256_mul_ps(va, LoadTail(x + i, n - i)));
}

CORTIQ_INLINE __m256 LoadI8(const int8_t* p) {
  return _mm256_cvtepi32_ps(
      _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
CORTIQ_INLINE __m256 LoadI8Tail(const int8_t* p, size_t n) {
  alignas(16) int8_t buf[16] = {};
  for (size_t k = 0; k < n; ++k) buf[k] = p[k];
  return LoadI8(buf);
}

// Two accumulators, 16 columns a step (not Dot's four): an int8 row costs
// its widening, and two accumulators per (head, row) leave DotRowsI8 the
// registers to score two rows at once (kernels.h: the order is each ISA's own).
float DotI8(const float* a, const int8_t* b, size_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0;
  size_t i = 0;
  for (; i + 2 * kV <= n; i += 2 * kV) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), LoadI8(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), LoadI8(b + i + 8), s1);
  }
  if (i + kV <= n) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), LoadI8(b + i), s0);
    i += kV;
  }
  if (i < n) s1 = _mm256_fmadd_ps(LoadTail(a + i, n - i), LoadI8Tail(b + i, n - i), s1);
  return HSum(_mm256_add_ps(s0, s1));
}

void AxpyI8(float alpha, const int8_t* x, float* y, size_t n) {
  const __m256 va = _mm256_set1_ps(alpha);
  size_t i = 0;
  for (; i + kV <= n; i += kV) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, LoadI8(x + i), _mm256_loadu_ps(y + i)));
  }
  if (i < n)
    StoreTail(y + i, n - i, _mm256_fmadd_ps(va, LoadI8Tail(x + i, n - i), LoadTail(y + i, n - i)));
}

// ---- Attention rows (kernels.h DotRows / AxpyRows and their int8 forms) ----
// Register-blocked forms of the per-row loops (kernels_rows_inl.h): a cached
// row is loaded (an int8 row widened, the dearest part of it) once for up to
// 2 query heads in the scores and 4 in the outputs, where the loops load it
// once per head. Every (head, row) value goes through exactly the operations
// Dot / DotI8 / Axpy / AxpyI8 apply to it (same accumulators, same order,
// same tails), so the results are bit-for-bit the loops'. At 16k positions of
// int8 K/V (`cortiq-tool bench-context --modes int8`), the loops made a
// decode step 2.2x the AVX-512 tier's, which has had these blocks.
// int8 rows go further (on a Zen 1 they are bound by the widening and the
// pipes, not by memory): scores take two rows at a time, and the outputs
// stay in registers across a tile of rows, one column chunk at a time. With
// both, a 16k-position int8 decode step went from 210-211 ms to 178-184 ms
// there (docs/PERFORMANCE.md, 2026-12-07, fourth session).

// Software prefetch of the cached rows, ~4 KiB ahead along the pass (the
// hardware streamer restarts on every 4 KiB page; kernels_avx512.cc measured
// this). Past the last row it runs into the next head's block or is a no-op;
// the address is formed as an integer.
constexpr size_t kRowPrefetchBytes = 4096;
CORTIQ_INLINE size_t RowsAhead(size_t row_stride_bytes) {
  if (row_stride_bytes == 0) return 0;
  return row_stride_bytes >= kRowPrefetchBytes ? 1 : kRowPrefetchBytes / row_stride_bytes;
}
CORTIQ_INLINE void PrefetchBytes(const void* p, size_t offset, size_t bytes) {
  const uintptr_t c = reinterpret_cast<uintptr_t>(p) + offset;
  for (size_t b = 0; b < bytes; b += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(c + b), _MM_HINT_T0);
  }
}

// Heads [j, j + NJ) for NJ = kMax, then the rest (kMax = 2 or 4).
template <int kMax, typename Block>
CORTIQ_INLINE void HeadBlocks(size_t nq, Block&& block) {
  size_t j = 0;
  for (; j + kMax <= nq; j += kMax) block.template operator()<kMax>(j);
  if constexpr (kMax == 4) {
    if (nq - j == 3) return block.template operator()<3>(j);
  }
  if (nq - j >= 2) {
    block.template operator()<2>(j);
    j += 2;
  }
  if (nq - j == 1) block.template operator()<1>(j);
}

// Scores of NJ heads (NJ <= 2: 4 accumulators each, in registers) against n
// f32 rows: Dot's accumulation per (head, row). (int8 rows: DotRowsI8Block.)
template <int NJ>
void DotRowsBlock(const float* q, size_t q_stride, const float* rows, size_t n, size_t row_stride,
                  size_t d, float* out, size_t out_stride) {
  const size_t ahead = RowsAhead(row_stride * sizeof(float)) * row_stride * sizeof(float);
  for (size_t t = 0; t < n; ++t) {
    const float* r = rows + t * row_stride;
    PrefetchBytes(r, ahead, d * sizeof(float));
    __m256 s[NJ][4];
#pragma GCC unroll 2
    for (int j = 0; j < NJ; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 4 * kV <= d; i += 4 * kV) {
      const __m256 x0 = _mm256_loadu_ps(r + i), x1 = _mm256_loadu_ps(r + i + 8),
                   x2 = _mm256_loadu_ps(r + i + 16), x3 = _mm256_loadu_ps(r + i + 24);
#pragma GCC unroll 2
      for (int j = 0; j < NJ; ++j) {
        const float* qj = q + j * q_stride + i;
        s[j][0] = _mm256_fmadd_ps(_mm256_loadu_ps(qj), x0, s[j][0]);
        s[j][1] = _mm256_fmadd_ps(_mm256_loadu_ps(qj + 8), x1, s[j][1]);
        s[j][2] = _mm256_fmadd_ps(_mm256_loadu_ps(qj + 16), x2, s[j][2]);
        s[j][3] = _mm256_fmadd_ps(_mm256_loadu_ps(qj + 24), x3, s[j][3]);
      }
    }
    for (; i + kV <= d; i += kV) {
      const __m256 x = _mm256_loadu_ps(r + i);
#pragma GCC unroll 2
      for (int j = 0; j < NJ; ++j) {
        s[j][0] = _mm256_fmadd_ps(_mm256_loadu_ps(q + j * q_stride + i), x, s[j][0]);
      }
    }
    if (i < d) {
      const __m256 x = LoadTail(r + i, d - i);
#pragma GCC unroll 2
      for (int j = 0; j < NJ; ++j) {
        s[j][1] = _mm256_fmadd_ps(LoadTail(q + j * q_stride + i, d - i), x, s[j][1]);
      }
    }
#pragma GCC unroll 2
    for (int j = 0; j < NJ; ++j) out[j * out_stride + t] = Sum4(s[j][0], s[j][1], s[j][2], s[j][3]);
  }
}

void DotRows(const float* q, size_t nq, size_t q_stride, const float* rows, size_t n,
             size_t row_stride, size_t d, float* out, size_t out_stride) {
  HeadBlocks<2>(nq, [&]<int NJ>(size_t j) {
    DotRowsBlock<NJ>(q + j * q_stride, q_stride, rows, n, row_stride, d, out + j * out_stride,
                     out_stride);
  });
}

// Scores of NJ heads (NJ <= 2) against NR rows (NR <= 2) of int8 from r:
// DotI8's accumulation per (head, row), 2 x 2 x 2 accumulators in registers;
// out[j * out_stride + k] for head j, row k.
template <int NJ, int NR>
CORTIQ_INLINE void DotI8Tile(const float* q, size_t q_stride, const int8_t* r, size_t row_stride,
                             size_t d, float* out, size_t out_stride) {
  __m256 s[NR][NJ][2];
#pragma GCC unroll 2
  for (int k = 0; k < NR; ++k) {
#pragma GCC unroll 2
    for (int j = 0; j < NJ; ++j) s[k][j][0] = s[k][j][1] = _mm256_setzero_ps();
  }
  size_t i = 0;
  for (; i + 2 * kV <= d; i += 2 * kV) {
    __m256 x[NR][2];
#pragma GCC unroll 2
    for (int k = 0; k < NR; ++k) {
      x[k][0] = LoadI8(r + k * row_stride + i);
      x[k][1] = LoadI8(r + k * row_stride + i + kV);
    }
#pragma GCC unroll 2
    for (int j = 0; j < NJ; ++j) {
      const __m256 q0 = _mm256_loadu_ps(q + j * q_stride + i);
      const __m256 q1 = _mm256_loadu_ps(q + j * q_stride + i + kV);
#pragma GCC unroll 2
      for (int k = 0; k < NR; ++k) {
        s[k][j][0] = _mm256_fmadd_ps(q0, x[k][0], s[k][j][0]);
        s[k][j][1] = _mm256_fmadd_ps(q1, x[k][1], s[k][j][1]);
      }
    }
  }
  if (i + kV <= d) {
#pragma GCC unroll 2
    for (int k = 0; k < NR; ++k) {
      const __m256 x = LoadI8(r + k * row_stride + i);
#pragma GCC unroll 2
      for (int j = 0; j < NJ; ++j) {
        s[k][j][0] = _mm256_fmadd_ps(_mm256_loadu_ps(q + j * q_stride + i), x, s[k][j][0]);
      }
    }
    i += kV;
  }
  if (i < d) {
#pragma GCC unroll 2
    for (int k = 0; k < NR; ++k) {
      const __m256 x = LoadI8Tail(r + k * row_stride + i, d - i);
#pragma GCC unroll 2
      for (int j = 0; j < NJ; ++j) {
        s[k][j][1] = _mm256_fmadd_ps(LoadTail(q + j * q_stride + i, d - i), x, s[k][j][1]);
      }
    }
  }
#pragma GCC unroll 2
  for (int k = 0; k < NR; ++k) {
#pragma GCC unroll 2
    for (int j = 0; j < NJ; ++j)
      out[j * out_stride + k] = HSum(_mm256_add_ps(s[k][j][0], s[k][j][1]));
  }
}

// Two rows at a time: the two rows' widening and products interleave, where
// one row's dependent chains and horizontal sums left a Zen 1's pipes idle
// (a standalone copy: 33.4 -> 26.7 ns per row, 2 heads, d 128, hot).
template <int NJ>
void DotRowsI8Block(const float* q, size_t q_stride, const int8_t* rows, size_t n,
                    size_t row_stride, size_t d, float* out, size_t out_stride) {
  const size_t ahead = RowsAhead(row_stride) * row_stride;
  size_t t = 0;
  for (; t + 2 <= n; t += 2) {
    const int8_t* r = rows + t * row_stride;
    PrefetchBytes(r, ahead, d);
    PrefetchBytes(r + row_stride, ahead, d);
    DotI8Tile<NJ, 2>(q, q_stride, r, row_stride, d, out + t, out_stride);
  }
  if (t < n) {
    const int8_t* r = rows + t * row_stride;
    PrefetchBytes(r, ahead, d);
    DotI8Tile<NJ, 1>(q, q_stride, r, row_stride, d, out + t, out_stride);
  }
}

void DotRowsI8(const float* q, size_t nq, size_t q_stride, const int8_t* rows, size_t n,
               size_t row_stride, size_t d, float* out, size_t out_stride) {
  HeadBlocks<2>(nq, [&]<int NJ>(size_t j) {
    DotRowsI8Block<NJ>(q + j * q_stride, q_stride, rows, n, row_stride, d, out + j * out_stride,
                       out_stride);
  });
}

// f32 rows: outputs of NJ heads (NJ <= 4), row by row as the loop, each row
// loaded 32 columns at a time once for the NJ heads: per element
// y = fma(p[j][t], row[t], y), t ascending: Axpy's operations.
template <int NJ>
void AxpyRowsByRow(const float* p, size_t p_stride, const float* rows, size_t n, size_t row_stride,
                   size_t d, float* out, size_t out_stride) {
  const size_t ahead = RowsAhead(row_stride * sizeof(float)) * row_stride * sizeof(float);
  for (size_t t = 0; t < n; ++t) {
    const float* r = rows + t * row_stride;
    PrefetchBytes(r, ahead, d * sizeof(float));
    __m256 va[NJ];
#pragma GCC unroll 4
    for (int j = 0; j < NJ; ++j) va[j] = _mm256_set1_ps(p[j * p_stride + t]);
    size_t i = 0;
    for (; i + 4 * kV <= d; i += 4 * kV) {
      __m256 x[4];
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) x[k] = _mm256_loadu_ps(r + i + size_t(k) * kV);
#pragma GCC unroll 4
      for (int j = 0; j < NJ; ++j) {
        float* y = out + j * out_stride + i;
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k) {
          _mm256_storeu_ps(y + k * kV, _mm256_fmadd_ps(va[j], x[k], _mm256_loadu_ps(y + k * kV)));
        }
      }
    }
    for (; i + kV <= d; i += kV) {
      const __m256 x = _mm256_loadu_ps(r + i);
#pragma GCC unroll 4
      for (int j = 0; j < NJ; ++j) {
        float* y = out + j * out_stride + i;
        _mm256_storeu_ps(y, _mm256_fmadd_ps(va[j], x, _mm256_loadu_ps(y)));
      }
    }
    if (i < d) {
      const __m256 x = LoadTail(r + i, d - i);
#pragma GCC unroll 4
      for (int j = 0; j < NJ; ++j) {
        float* y = out + j * out_stride + i;
        StoreTail(y, d - i, _mm256_fmadd_ps(va[j], x, LoadTail(y, d - i)));
      }
    }
  }
}

// int8 rows: outputs of NJ heads (NJ <= 4), per element
// y = fma(p[j][t] * row_scale[t], row[t], y), t ascending: AxpyI8's
// operations, in their order for every element.
// The rows go in tiles of ~8 KiB; within a tile, one column chunk at a time
// (CW registers of 8 columns per head) keeps the NJ heads' outputs in
// registers across the tile's rows, where the loop loaded and stored every
// output once per row (on a Zen 1, two 128-bit stores per register: the
// stores bounded the loop). The first chunk's pass reads the rows from
// memory (with the ~4 KiB row prefetch); the later chunks find them in L1.
template <int NJ>
void AxpyRowsTiled(const float* p, size_t p_stride, const float* row_scale, const int8_t* rows,
                   size_t n, size_t row_stride, size_t d, float* out, size_t out_stride) {
  constexpr int CW = NJ <= 2 ? 4 : 2;  // registers per head per chunk: NJ * CW + CW <= 12
  constexpr size_t kTileBytes = 8 * 1024, kMaxTile = 128;
  const size_t row_bytes = d;
  size_t tile = row_bytes == 0 ? kMaxTile : kTileBytes / row_bytes;
  tile = tile < 8 ? 8 : tile > kMaxTile ? kMaxTile : tile;
  const size_t ahead = RowsAhead(row_stride) * row_stride;
  alignas(32) float alpha[NJ][kMaxTile];
  for (size_t t0 = 0; t0 < n; t0 += tile) {
    const size_t tn = n - t0 < tile ? n - t0 : tile;
    const int8_t* r0 = rows + t0 * row_stride;
    for (size_t t = 0; t < tn; ++t) {
#pragma GCC unroll 4
      for (int j = 0; j < NJ; ++j) {
        alpha[j][t] = p[j * p_stride + t0 + t] * row_scale[t0 + t];
      }
    }
    size_t i = 0;
    for (; i + CW * kV <= d; i += CW * kV) {
      __m256 acc[NJ][CW];
#pragma GCC unroll 4
      for (int j = 0; j < NJ; ++j) {
#pragma GCC unroll 4
        for (int k = 0; k < CW; ++k) acc[j][k] = _mm256_loadu_ps(out + j * out_stride + i + k * kV);
      }
      for (size_t t = 0; t < tn; ++t) {
        const int8_t* r = r0 + t * row_stride;
        if (i == 0) PrefetchBytes(r, ahead, row_bytes);
        __m256 x[CW];
#pragma GCC unroll 4
        for (int k = 0; k < CW; ++k) x[k] = LoadI8(r + i + size_t(k) * kV);
#pragma GCC unroll 4
        for (int j = 0; j < NJ; ++j) {
          const __m256 va = _mm256_broadcast_ss(&alpha[j][t]);
#pragma GCC unroll 4
          for (int k = 0; k < CW; ++k) acc[j][k] = _mm256_fmadd_ps(va, x[k], acc[j][k]);
        }
      }
#pragma GCC unroll 4
      for (int j = 0; j < NJ; ++j) {
#pragma GCC unroll 4
        for (int k = 0; k < CW; ++k) _mm256_storeu_ps(out + j * out_stride + i + k * kV, acc[j][k]);
      }
    }
    for (; i + kV <= d; i += kV) {
      __m256 acc[NJ];
#pragma GCC unroll 4
      for (int j = 0; j < NJ; ++j) acc[j] = _mm256_loadu_ps(out + j * out_stride + i);
      for (size_t t = 0; t < tn; ++t) {
        const int8_t* r = r0 + t * row_stride;
        if (i == 0) PrefetchBytes(r, ahead, row_bytes);
        const __m256 x = LoadI8(r + i);
#pragma GCC unroll 4
        for (int j = 0; j < NJ; ++j) {
          acc[j] = _mm256_fmadd_ps(_mm256_broadcast_ss(&alpha[j][t]), x, acc[j]);
        }
      }
#pragma GCC unroll 4
      for (int j = 0; j < NJ; ++j) _mm256_storeu_ps(out + j * out_stride + i, acc[j]);
    }
    if (i < d) {
      __m256 acc[NJ];
#pragma GCC unroll 4
      for (int j = 0; j < NJ; ++j) acc[j] = LoadTail(out + j * out_stride + i, d - i);
      for (size_t t = 0; t < tn; ++t) {
        const int8_t* r = r0 + t * row_stride;
        if (i == 0) PrefetchBytes(r, ahead, row_bytes);
        const __m256 x = LoadI8Tail(r + i, d - i);
#pragma GCC unroll 4
        for (int j = 0; j < NJ; ++j) {
          acc[j] = _mm256_fmadd_ps(_mm256_broadcast_ss(&alpha[j][t]), x, acc[j]);
        }
      }
#pragma GCC unroll 4
      for (int j = 0; j < NJ; ++j) StoreTail(out + j * out_stride + i, d - i, acc[j]);
    }
  }
}

void AxpyRows(const float* p, size_t nq, size_t p_stride, const float* rows, size_t n,
              size_t row_stride, size_t d, float* out, size_t out_stride) {
  HeadBlocks<4>(nq, [&]<int NJ>(size_t j) {
    AxpyRowsByRow<NJ>(p + j * p_stride, p_stride, rows, n, row_stride, d, out + j * out_stride,
                      out_stride);
  });
}

void AxpyRowsI8(const float* p, size_t nq, size_t p_stride, const float* row_scale,
                const int8_t* rows, size_t n, size_t row_stride, size_t d, float* out,
                size_t out_stride) {
  HeadBlocks<4>(nq, [&]<int NJ>(size_t j) {
    AxpyRowsTiled<NJ>(p + j * p_stride, p_stride, row_scale, rows, n, row_stride, d,
                      out + j * out_stride, out_stride);
  });
}

float QuantizeRowI8(const float* x, int8_t* q, size_t n) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 amax = _mm256_setzero_ps();  // max(|x|, acc): a NaN element leaves acc unchanged
  size_t i = 0;
  for (; i + kV <= n; i += kV)
    amax = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)), amax);
  if (i < n) amax = _mm256_max_ps(_mm256_andnot_ps(sign, LoadTail(x + i, n - i)), amax);
  const float mx = HMax(amax);
  if (!(mx > 0.0f)) {
    for (size_t k = 0; k < n; ++k) q[k] = 0;
    return 0.0f;
  }
  const float scale = mx / 127.0f;
  const __m256 vs = _mm256_set1_ps(scale), magic = _mm256_set1_ps(kRoundMagic);
  const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
  auto quant = [&](__m256 v) {
    v = _mm256_sub_ps(_mm256_add_ps(_mm256_div_ps(v, vs), magic), magic);
    v = _mm256_min_ps(hi, _mm256_max_ps(v, lo));
    __m256i i32 = _mm256_cvttps_epi32(v);
    __m128i i16 = _mm_packs_epi32(_mm256_castsi256_si128(i32), _mm256_extracti128_si256(i32, 1));
    return _mm_packs_epi16(i16, i16);  // 8 valid bytes
  };
  for (i = 0; i + kV <= n; i += kV)
    _mm_storel_epi64(reinterpret_cast<__m128i*>(q + i), quant(_mm256_loadu_ps(x + i)));
  if (i < n) {
    alignas(16) int8_t buf[16];
    _mm_store_si128(reinterpret_cast<__m128i*>(buf), quant(LoadTail(x + i, n - i)));
    for (size_t k = 0; k < n - i; ++k) q[i + k] = buf[k];
  }
  return scale;
}

// ---- Normalisation / activation ----
void RmsNorm(const float* x, const float* weight, float eps, size_t n, float* out) {
  if (n == 0) return;
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  size_t i = 0;
  for (; i + 4 * kV <= n; i += 4 * kV) {
    __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
    __m256 c = _mm256_loadu_ps(x + i + 16), d = _mm256_loadu_ps(x + i + 24);
    s0 = _mm256_fmadd_ps(a, a, s0);
    s1 = _mm256_fmadd_ps(b, b, s1);
    s2 = _mm256_fmadd_ps(c, c, s2);
    s3 = _mm256_fmadd_ps(d, d, s3);
  }
  for (; i + kV <= n; i += kV) {
    __m256 a = _mm256_loadu_ps(x + i);
    s0 = _mm256_fmadd_ps(a, a, s0);
  }
  if (i < n) {
    __m256 a = LoadTail(x + i, n - i);
    s1 = _mm256_fmadd_ps(a, a, s1);
  }
  const float ss = Sum4(s0, s1, s2, s3);
  const __m256 inv = _mm256_set1_ps(1.0f / __builtin_sqrtf(ss / static_cast<float>(n) + eps));
  for (i = 0; i + kV <= n; i += kV) {
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), inv),
                                            _mm256_loadu_ps(weight + i)));
  }
  if (i < n) {
    StoreTail(
        out + i, n - i,
        _mm256_mul_ps(_mm256_mul_ps(LoadTail(x + i, n - i), inv), LoadTail(weight + i, n - i)));
  }
}

// exp by the shared polynomial; see kernels_internal.h.
CORTIQ_INLINE __m256 Exp(__m256 x) {
  const __m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(kExpMin), _CMP_LT_OQ);
  // max/min return the second operand when one is NaN: NaN flows through.
  x = _mm256_max_ps(_mm256_set1_ps(kExpMin), x);
  x = _mm256_min_ps(_mm256_set1_ps(kExpMax), x);
  const __m256 magic = _mm256_set1_ps(kRoundMagic);
  __m256 n = _mm256_sub_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(kExpLog2e), magic), magic);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kExpLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kExpLn2Lo), r);
  __m256 p = _mm256_set1_ps(kExpP0);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpP1));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpP2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpP3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpP4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpP5));
  p = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  const __m256i ni = _mm256_cvttps_epi32(n);
  const __m256i n1 = _mm256_srai_epi32(ni, 1);
  const __m256i n2 = _mm256_sub_epi32(ni, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  return _mm256_andnot_ps(under, _mm256_mul_ps(_mm256_mul_ps(p, s1), s2));
}

void Softmax(float* x, size_t n) {
  if (n == 0) return;
  const __m256 ninf = _mm256_set1_ps(-__builtin_inff());
  __m256 m0 = ninf, m1 = ninf;
  size_t i = 0;
  for (; i + 2 * kV <= n; i += 2 * kV) {
    m0 = _mm256_max_ps(_mm256_loadu_ps(x + i), m0);
    m1 = _mm256_max_ps(_mm256_loadu_ps(x + i + 8), m1);
  }
  for (; i + kV <= n; i += kV) m0 = _mm256_max_ps(_mm256_loadu_ps(x + i), m0);
  if (i < n) {
    // Masked-off lanes load as 0: replace them by -inf.
    __m256 t = _mm256_blendv_ps(ninf, LoadTail(x + i, n - i), _mm256_castsi256_ps(TailMask(n - i)));
    m1 = _mm256_max_ps(t, m1);
  }
  const float mx = HMax(_mm256_max_ps(m0, m1));
  if (mx == -__builtin_inff()) {
    const float u = 1.0f / static_cast<float>(n);
    for (size_t k = 0; k < n; ++k) x[k] = u;
    return;
  }
  const __m256 vmx = _mm256_set1_ps(mx);
  __m256 s0 = _mm256_setzero_ps(), s1 = s0;
  for (i = 0; i + 2 * kV <= n; i += 2 * kV) {
    __m256 e0 = Exp(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmx));
    __m256 e1 = Exp(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8), vmx));
    _mm256_storeu_ps(x + i, e0);
    _mm256_storeu_ps(x + i + 8, e1);
    s0 = _mm256_add_ps(s0, e0);
    s1 = _mm256_add_ps(s1, e1);
  }
  for (; i + kV <= n; i += kV) {
    __m256 e = Exp(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmx));
    _mm256_storeu_ps(x + i, e);
    s0 = _mm256_add_ps(s0, e);
  }
  if (i < n) {
    __m256 e = _mm256_and_ps(Exp(_mm256_sub_ps(LoadTail(x + i, n - i), vmx)),
                             _mm256_castsi256_ps(TailMask(n - i)));
    StoreTail(x + i, n - i, e);
    s1 = _mm256_add_ps(s1, e);
  }
  Scale(x, 1.0f / HSum(_mm256_add_ps(s0, s1)), n);
}

CORTIQ_INLINE __m256 SwiGluV(__m256 g, __m256 u) {
  __m256 e = Exp(_mm256_sub_ps(_mm256_setzero_ps(), g));
  return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

void SwiGlu(const float* gate, const float* up, size_t n, float* out) {
  size_t i = 0;
  for (; i + kV <= n; i += kV)
    _mm256_storeu_ps(out + i, SwiGluV(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
  if (i < n) StoreTail(out + i, n - i, SwiGluV(LoadTail(gate + i, n - i), LoadTail(up + i, n - i)));
}

void Rope(float* x, size_t head_dim, const float* cos, const float* sin) {
  const size_t half = head_dim / 2;
  float* x1 = x + half;
  for (size_t i = 0; i < half; i += kV) {
    const size_t m = half - i;
    __m256 a = LoadTail(x + i, m), b = LoadTail(x1 + i, m);
    __m256 c = LoadTail(cos + i, m), s = LoadTail(sin + i, m);
    StoreTail(x + i, m, _mm256_fmsub_ps(a, c, _mm256_mul_ps(b, s)));
    StoreTail(x1 + i, m, _mm256_fmadd_ps(b, c, _mm256_mul_ps(a, s)));
  }
}

// ---- Conversions ----
CORTIQ_INLINE __m256 Bf16x8ToF32(__m128i h) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// 8 floats from 16-bit or f32 data at p + i; lanes past n (<= 8) are zero.
CORTIQ_INLINE __m256 LoadAsF32(const void* p, DType dtype, size_t i, size_t n) {
  if (dtype == DType::kF32) return LoadTail(static_cast<const float*>(p) + i, n);
  const uint16_t* s = static_cast<const uint16_t*>(p) + i;
  __m128i h;
  if (n >= 8) {
    h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
  } else {
    alignas(16) uint16_t buf[8] = {};
    for (size_t k = 0; k < n; ++k) buf[k] = s[k];
    h = _mm_load_si128(reinterpret_cast<const __m128i*>(buf));
  }
  return dtype == DType::kBF16 ? Bf16x8ToF32(h) : _mm256_cvtph_ps(h);
}

void ConvertToF32(const void* src, DType dtype, size_t n, float* dst) {
  if (dtype == DType::kF32 && static_cast<const float*>(src) == dst) return;
  size_t i = 0;
  for (; i + kV <= n; i += kV) _mm256_storeu_ps(dst + i, LoadAsF32(src, dtype, i, kV));
  if (i < n) StoreTail(dst + i, n - i, LoadAsF32(src, dtype, i, n - i));
}

CORTIQ_INLINE __m128i F32ToBf16x8(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb), 16);
  const __m256i qnan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  r = _mm256_blendv_epi8(r, qnan, nan);
  // Values are 0..0xFFFF, so unsigned saturation is exact; fix the lane order.
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08));
}

void ConvertFromF32(const float* src, DType dtype, size_t n, void* dst) {
  if (dtype == DType::kF32) {
    float* d = static_cast<float*>(dst);
    if (d == src) return;
    size_t i = 0;
    for (; i + kV <= n; i += kV) _mm256_storeu_ps(d + i, _mm256_loadu_ps(src + i));
    if (i < n) StoreTail(d + i, n - i, LoadTail(src + i, n - i));
    return;
  }
  uint16_t* d = static_cast<uint16_t*>(dst);
  auto conv = [dtype](__m256 v) {
    return dtype == DType::kBF16
               ? F32ToBf16x8(v)
               : _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  };
  size_t i = 0;
  for (; i + kV <= n; i += kV)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), conv(_mm256_loadu_ps(src + i)));
  if (i < n) {
    alignas(16) uint16_t buf[8];
    _mm_store_si128(reinterpret_cast<__m128i*>(buf), conv(LoadTail(src + i, n - i)));
    for (size_t k = 0; k < n - i; ++k) d[i + k] = buf[k];
  }
}

// ---- Decode GEMV ----
// x is packed in blocks of 16 floats (kernels_internal.h); each loader turns
// 16 columns of a W row into two registers lined up with the two halves of
// the block (bf16: even then odd columns; f16/f32: first then second 8).
constexpr size_t kGemvBlock = 16;

struct Bf16Loader {
  static constexpr size_t kElem = 2;
  CORTIQ_INLINE static void Load(const void* p, __m256* lo, __m256* hi) {
    __m256i v = _mm256_loadu_si256(static_cast<const __m256i*>(p));
    *lo = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    *hi =
        _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
  }
};
struct F16Loader {
  static constexpr size_t kElem = 2;
  CORTIQ_INLINE static void Load(const void* p, __m256* lo, __m256* hi) {
    const __m128i* q = static_cast<const __m128i*>(p);
    *lo = _mm256_cvtph_ps(_mm_loadu_si128(q));
    *hi = _mm256_cvtph_ps(_mm_loadu_si128(q + 1));
  }
};
struct F32Loader {
  static constexpr size_t kElem = 4;
  CORTIQ_INLINE static void Load(const void* p, __m256* lo, __m256* hi) {
    const float* q = static_cast<const float*>(p);
    *lo = _mm256_loadu_ps(q);
    *hi = _mm256_loadu_ps(q + 8);
  }
};

// Horizontal sums of up to 8 accumulators at once, each by the same tree as
// HSum (i + i+4, i + i+2, i + i+1), so a result does not depend on how many
// accumulators were reduced together (decode stays batch-invariant).
template <int N>
CORTIQ_INLINE void ReduceMany(const __m256* v, float* out) {
  static_assert(N >= 1 && N <= 8);
  __m256 s[4], t[2];
  const __m256 zero = _mm256_setzero_ps();
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {  // [v[2k] folded to 4 | v[2k+1] folded to 4]
    if (2 * k >= N) {
      s[k] = zero;
      continue;
    }
    const __m256 a = v[2 * k], b = 2 * k + 1 < N ? v[2 * k + 1] : zero;
    s[k] = _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
  }
#pragma GCC unroll 2
  for (int k = 0; k < 2; ++k) {
    t[k] = _mm256_add_ps(_mm256_shuffle_ps(s[2 * k], s[2 * k + 1], 0x44),
                         _mm256_shuffle_ps(s[2 * k], s[2 * k + 1], 0xEE));
  }
  // Element 4L + e: the sum of v[2e + L].
  const __m256 w =
      _mm256_add_ps(_mm256_shuffle_ps(t[0], t[1], 0x88), _mm256_shuffle_ps(t[0], t[1], 0xDD));
  alignas(32) float tmp[8];
  _mm256_store_ps(tmp, w);
#pragma GCC unroll 8
  for (int i = 0; i < N; ++i) out[i] = tmp[(i % 2) * 4 + i / 2];
}

// Accumulates columns [c0, c1) of R rows of W (from r0) times B rows of x
// (from b0), starting from zero (first) or `spill`, ending in `spill` or, on
// the last chunk, reduced into y. Every (row, batch) accumulator sees the
// same FMA sequence whatever R, B and the chunking are.
template <typename L, int R, int B>
void GemvTile(const GemvArgs& a, size_t r0, size_t b0, size_t c0, size_t c1, __m256* spill,
              bool first, bool last) {
  const size_t row_bytes = a.cols * L::kElem;
  const char* w0 = static_cast<const char*>(a.w) + r0 * row_bytes;
  const float* x0 = a.x + b0 * a.x_stride;
  __m256 acc[R][B];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int b = 0; b < B; ++b) acc[r][b] = first ? _mm256_setzero_ps() : spill[r * B + b];
  }
  auto step = [&](size_t c, const char* const* wp) {
    __m256 xl[B], xh[B];
#pragma GCC unroll 4
    for (int b = 0; b < B; ++b) {
      xl[b] = _mm256_load_ps(x0 + b * a.x_stride + c);
      xh[b] = _mm256_load_ps(x0 + b * a.x_stride + c + 8);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      __m256 wl, wh;
      L::Load(wp[r], &wl, &wh);
#pragma GCC unroll 4
      for (int b = 0; b < B; ++b) {
        acc[r][b] = _mm256_fmadd_ps(wl, xl[b], acc[r][b]);
        acc[r][b] = _mm256_fmadd_ps(wh, xh[b], acc[r][b]);
      }
    }
  };
  const size_t full = c0 + (c1 - c0) / kGemvBlock * kGemvBlock;
  // The batch-1 tile over whole rows (decode): the next 8 rows, one
  // contiguous run, are pulled into L2 a slice per step, so the DRAM stream
  // never waits on the 8 row streams' own misses (as q8_avx2.cc does).
  // Touches memory only through prefetch hints: results are unchanged.
  const size_t steps = (full - c0) / kGemvBlock;
  const bool ahead = R == 8 && B == 1 && c0 == 0 && c1 == a.cols && steps > 0 &&
                     r0 + 2 * R <= a.rows;
  const char* pf = w0 + R * row_bytes;
  const size_t pf_step = ahead ? (R * row_bytes + steps - 1) / steps : 0;
  // A batch tile: the first batch rows of a row block stream W from memory
  // (the later ones find it in cache), so they pull the same columns of the
  // next R rows into L2, one line per row per 64 bytes of columns.
  const bool ahead_rows = !ahead && b0 == 0 && r0 + 2 * R <= a.rows;
  size_t c = c0;
  for (; c < full; c += kGemvBlock) {
    const char* wp[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) wp[r] = w0 + r * row_bytes + c * L::kElem;
    for (size_t k = 0; k < pf_step; k += 64) _mm_prefetch(pf + k, _MM_HINT_T1);
    pf += pf_step;
    if (ahead_rows && (c * L::kElem) % 64 < kGemvBlock * L::kElem) {
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) _mm_prefetch(wp[r] + R * row_bytes, _MM_HINT_T1);
    }
    step(c, wp);
  }
  if (c < c1) {
    // Zero-padded copies of the row tails (x is already zero-padded).
    alignas(32) char tail[R][kGemvBlock * 4] = {};
    const char* wp[R];
    const size_t bytes = (c1 - c) * L::kElem;
    for (int r = 0; r < R; ++r) {
      const char* src = w0 + r * row_bytes + c * L::kElem;
      for (size_t k = 0; k < bytes; ++k) tail[r][k] = src[k];
      wp[r] = tail[r];
    }
    step(c, wp);
  }
  if (!last) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
      for (int b = 0; b < B; ++b) spill[r * B + b] = acc[r][b];
    }
    return;
  }
  float sums[R * B];
  ReduceMany<R * B>(&acc[0][0], sums);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int b = 0; b < B; ++b) a.y[(b0 + b) * a.rows + r0 + r] = sums[r * B + b];
  }
}

// Columns per chunk: the chunk of every x row together within ~16 KiB (half
// a typical AVX2-era L1), at least 1024 columns to amortise the spills.
size_t GemvChunk(size_t batch) {
  size_t chunk = (16 * 1024 / sizeof(float)) / batch / kGemvBlock * kGemvBlock;
  return chunk < 1024 ? 1024 : chunk;
}

constexpr size_t kGemvMaxGroup = 64;

// Rows [r0, r0 + R) for the whole batch: groups of up to kGemvMaxGroup batch
// rows, column chunks within a group, batch blocks of 2 within a chunk.
template <typename L, int R>
void GemvRowBlock(const GemvArgs& a, size_t r0) {
  const size_t chunk = GemvChunk(a.batch < kGemvMaxGroup ? a.batch : kGemvMaxGroup);
  alignas(32) __m256 spill[R * kGemvMaxGroup];
  for (size_t g0 = 0; g0 < a.batch; g0 += kGemvMaxGroup) {
    const size_t g1 = a.batch - g0 > kGemvMaxGroup ? g0 + kGemvMaxGroup : a.batch;
    for (size_t c0 = 0; c0 < a.cols; c0 += chunk) {
      const size_t c1 = a.cols - c0 > chunk ? c0 + chunk : a.cols;
      const bool first = c0 == 0, last = c1 == a.cols;
      size_t b = g0;
      if constexpr (R <= 4) {  // R = 8 is the batch-1 tile: B = 1 only
        for (; b + 2 <= g1; b += 2)
          GemvTile<L, R, 2>(a, r0, b, c0, c1, spill + (b - g0) * R, first, last);
      }
      for (; b < g1; ++b) GemvTile<L, R, 1>(a, r0, b, c0, c1, spill + (b - g0) * R, first, last);
    }
  }
}

template <typename L>
void GemvRange(const GemvArgs& a, size_t row_begin, size_t row_end) {
  size_t r = row_begin;
  if (a.batch == 1) {
    for (; r + 8 <= row_end; r += 8) GemvRowBlock<L, 8>(a, r);
  } else {
    for (; r + 4 <= row_end; r += 4) GemvRowBlock<L, 4>(a, r);
  }
  for (; r < row_end; ++r) GemvRowBlock<L, 1>(a, r);
}

void GemvPackX(const float* x, size_t batch, size_t cols, bool even_odd, size_t stride,
               float* out) {
  for (size_t b = 0; b < batch; ++b) {
    const float* src = x + b * cols;
    float* dst = out + b * stride;
    for (size_t c = 0; c < stride; c += kGemvBlock) {
      const size_t n = c < cols ? cols - c : 0;
      const __m256 lo = LoadTail(src + c, n);
      const __m256 hi = LoadTail(src + c + 8, n > 8 ? n - 8 : 0);
      if (even_odd) {
        // shuffle_ps picks within 128-bit lanes; permute4x64 puts the halves in order.
        const __m256 e = _mm256_shuffle_ps(lo, hi, 0x88), o = _mm256_shuffle_ps(lo, hi, 0xDD);
        _mm256_store_ps(dst + c,
                        _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e), 0xD8)));
        _mm256_store_ps(dst + c + 8,
                        _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(o), 0xD8)));
      } else {
        _mm256_store_ps(dst + c, lo);
        _mm256_store_ps(dst + c + 8, hi);
      }
    }
  }
}

void Gemv(const GemvArgs& a, size_t row_begin, size_t row_end) {
  switch (a.dtype) {
    case DType::kBF16:
      return GemvRange<Bf16Loader>(a, row_begin, row_end);
    case DType::kF16:
      return GemvRange<F16Loader>(a, row_begin, row_end);
    case DType::kF32:
      return GemvRange<F32Loader>(a, row_begin, row_end);
    case DType::kQ8_0:  // MatMul hands int8 weights to q8_matmul
      return;
  }
}

// ---- Prefill GEMM ----
// Micro-tile 6 x 16: 12 accumulators + 2 W registers + 1 broadcast of 16 ymm.
constexpr size_t kMr = 6;
constexpr size_t kNr = 16;
constexpr size_t kKc = 256;
constexpr size_t kNc = 512;

// In-register transpose of an 8x8 float block.
CORTIQ_INLINE void Transpose8(__m256 r[8]) {
  __m256 t[8], u[8];
#pragma GCC unroll 16
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
#pragma GCC unroll 16
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
#pragma GCC unroll 16
  for (int c = 0; c < 4; ++c) {
    r[c] = _mm256_permute2f128_ps(u[c], u[c + 4], 0x20);
    r[c + 4] = _mm256_permute2f128_ps(u[c], u[c + 4], 0x31);
  }
}

void GemmPackX(const float* x, size_t m, size_t k, float* xp, size_t pb, size_t pe) {
  const __m256i store_mask = TailMask(kMr);
  for (size_t p = pb; p < pe; ++p) {
    const size_t m0 = p * kMr;
    const size_t rows = MinSz(kMr, m - m0);
    float* out = xp + p * k * kMr;
    for (size_t k0 = 0; k0 < k; k0 += 8) {
      const size_t kn = MinSz(8, k - k0);
      __m256 r[8];
      for (size_t i = 0; i < 8; ++i)
        r[i] = i < rows ? LoadTail(x + (m0 + i) * k + k0, kn) : _mm256_setzero_ps();
      Transpose8(r);
#pragma GCC unroll 8
      for (size_t j = 0; j < 8; ++j) {
        if (j < kn) _mm256_maskstore_ps(out + (k0 + j) * kMr, store_mask, r[j]);
      }
    }
  }
}

void GemmPackW(const GemmArgs& a, size_t n0, size_t n_end, size_t k0, size_t kc, float* bp) {
  const size_t esize = ElemSize(a.dtype);
  const char* w = static_cast<const char*>(a.w);
  for (size_t p0 = n0; p0 < n_end; p0 += kNr) {
    float* out = bp + (p0 - n0) * kc;
    for (size_t kk = 0; kk < kc; kk += 8) {
      const size_t kn = MinSz(8, kc - kk);
      for (size_t h = 0; h < kNr; h += 8) {
        __m256 r[8];
        for (size_t i = 0; i < 8; ++i) {
          const size_t row = p0 + h + i;
          r[i] = row < n_end ? LoadAsF32(w + row * a.k * esize, a.dtype, k0 + kk, kn)
                             : _mm256_setzero_ps();
        }
        Transpose8(r);
#pragma GCC unroll 8
        for (size_t j = 0; j < 8; ++j) {
          if (j < kn) _mm256_store_ps(out + (kk + j) * kNr + h, r[j]);
        }
      }
    }
  }
}

// c[0..kRows)[0..cols) (+)= a[kc][kMr]^T . b[kc][kNr]. kRows < kMr serves the
// last x panel.
template <int kRows, bool kAccumulate>
void MicroKernel(size_t kc, const float* a, const float* b, float* c, size_t ldc, size_t cols) {
  __m256 acc[kRows][2];
#pragma GCC unroll 6
  for (int i = 0; i < kRows; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  for (size_t k = 0; k < kc; ++k) {
    const __m256 b0 = _mm256_load_ps(b + k * kNr);
    const __m256 b1 = _mm256_load_ps(b + k * kNr + 8);
#pragma GCC unroll 6
    for (int i = 0; i < kRows; ++i) {
      const __m256 ai = _mm256_broadcast_ss(a + k * kMr + i);
      acc[i][0] = _mm256_fmadd_ps(ai, b0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(ai, b1, acc[i][1]);
    }
  }
  const __m256i m0 = TailMask(cols), m1 = TailMask(cols > 8 ? cols - 8 : 0);
#pragma GCC unroll 6
  for (int i = 0; i < kRows; ++i) {
    float* ci = c + i * ldc;
    if (kAccumulate) {
      acc[i][0] = _mm256_add_ps(acc[i][0], _mm256_maskload_ps(ci, m0));
      acc[i][1] = _mm256_add_ps(acc[i][1], _mm256_maskload_ps(ci + 8, m1));
    }
    _mm256_maskstore_ps(ci, m0, acc[i][0]);
    _mm256_maskstore_ps(ci + 8, m1, acc[i][1]);
  }
}

using MicroKernelFn = void (*)(size_t, const float*, const float*, float*, size_t, size_t);
// Indexed by the number of valid rows in the x panel (1..kMr).
template <bool kAcc>
constexpr MicroKernelFn kMicroKernels[kMr + 1] = {
    nullptr,
    MicroKernel<1, kAcc>,
    MicroKernel<2, kAcc>,
    MicroKernel<3, kAcc>,
    MicroKernel<4, kAcc>,
    MicroKernel<5, kAcc>,
    MicroKernel<6, kAcc>,
};
static_assert(kMr == 6, "kMicroKernels lists one kernel per row count");

// Loop order as in the AVX-512 file: W row block > k block (packed) > x panel > W panel.
void Gemm(const GemmArgs& a, size_t row_begin, size_t row_end, float* scratch) {
  const size_t panels = (a.m + kMr - 1) / kMr;
  for (size_t jc = row_begin; jc < row_end; jc += kNc) {
    const size_t jc_end = MinSz(row_end, jc + kNc);
    for (size_t pc = 0; pc < a.k; pc += kKc) {
      const size_t kc = MinSz(kKc, a.k - pc);
      GemmPackW(a, jc, jc_end, pc, kc, scratch);
      for (size_t ip = 0; ip < panels; ++ip) {
        const float* ap = a.xp + (ip * a.k + pc) * kMr;
        const size_t rows = MinSz(kMr, a.m - ip * kMr);
        const MicroKernelFn kernel =
            pc == 0 ? kMicroKernels<false>[rows] : kMicroKernels<true>[rows];
        float* crow = a.y + ip * kMr * a.n;
        for (size_t n0 = jc; n0 < jc_end; n0 += kNr) {
          kernel(kc, ap, scratch + (n0 - jc) * kc, crow + n0, a.n, MinSz(kNr, jc_end - n0));
        }
      }
    }
  }
}

// ---- Benchmark helpers ----
uint64_t ReadStream(const void* p, size_t bytes) {
  const char* c = static_cast<const char*>(p);
  __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
  for (size_t i = 0; i + 256 <= bytes; i += 256) {
    s0 = _mm256_xor_si256(
        s0, _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + i)),
                             _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + i + 32))));
    s1 = _mm256_xor_si256(
        s1, _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + i + 64)),
                             _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + i + 96))));
    s2 = _mm256_xor_si256(
        s2, _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + i + 128)),
                             _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + i + 160))));
    s3 = _mm256_xor_si256(
        s3, _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + i + 192)),
                             _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + i + 224))));
  }
  __m256i s = _mm256_xor_si256(_mm256_xor_si256(s0, s1), _mm256_xor_si256(s2, s3));
  __m128i h = _mm_xor_si128(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  return static_cast<uint64_t>(_mm_cvtsi128_si64(h)) ^
         static_cast<uint64_t>(_mm_extract_epi64(h, 1));
}

double FmaLoop(uint64_t iters) {
  constexpr int kAcc = 10;  // > latency (4) x ports (2)
  __m256 acc[kAcc];
  for (int j = 0; j < kAcc; ++j) acc[j] = _mm256_set1_ps(static_cast<float>(j));
  const __m256 m = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(0.001f);
  for (uint64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 10
    for (int j = 0; j < kAcc; ++j) acc[j] = _mm256_fmadd_ps(acc[j], m, c);
  }
  __m256 s = acc[0];
  for (int j = 1; j < kAcc; ++j) s = _mm256_add_ps(s, acc[j]);
  volatile float sink = HSum(s);
  (void)sink;
  return 2.0 * kAcc * kV * static_cast<double>(iters);
}

constexpr KernelTable kTable = {
    .isa = Isa::kAvx2,
    .dot = Dot,
    .axpy = Axpy,
    .dot_rows = DotRows,
    .axpy_rows = AxpyRows,
    .scale = Scale,
    .dot_i8 = DotI8,
    .axpy_i8 = AxpyI8,
    .dot_rows_i8 = DotRowsI8,
    .axpy_rows_i8 = AxpyRowsI8,
    .quantize_row_i8 = QuantizeRowI8,
    .rms_norm = RmsNorm,
    .softmax = Softmax,
    .swiglu = SwiGlu,
    .rope_rotate_half = Rope,
    .convert_to_f32 = ConvertToF32,
    .convert_from_f32 = ConvertFromF32,
    .gemv_col_block = kGemvBlock,
    .gemv_bf16_even_odd = true,
    .gemv_pack_x = GemvPackX,
    .gemv = Gemv,
    .gemv_bf16_pack_size = nullptr,
    .gemv_bf16_pack_x = nullptr,
    .gemv_bf16_row_block = 0,
    .gemv_bf16 = nullptr,
    .amx_pack_x = nullptr,
    .amx_matmul = nullptr,
    .q8_row_block = kQ8Avx2RowBlock,
    .q8_matmul = Q8MatMulAvx2,
    .q8_lanes_matmul = Q8LanesMatMulAvx2,
    .q8_lanes_amx = nullptr,
    .gemm_mr = kMr,
    .gemm_nr = kNr,
    .gemm_kc = kKc,
    .gemm_nc = kNc,
    .gemm_pack_x = GemmPackX,
    .gemm = Gemm,
    .gemm_bf16_pack_x = nullptr,
    .gemm_bf16 = nullptr,
    .read_stream = ReadStream,
    .fma_loop = FmaLoop,
};

// AVX-VNNI: the same table with the int8 lane kernel on VPDPBUSD.
constexpr KernelTable WithAvxVnni(KernelTable t) {
  t.isa = Isa::kAvxVnni;
  t.q8_lanes_matmul = Q8LanesMatMulAvxVnni;
  return t;
}
constexpr KernelTable kTableAvxVnni = WithAvxVnni(kTable);

}  // namespace

const KernelTable* Avx2Table() { return &kTable; }
const KernelTable* AvxVnniTable() { return &kTableAvxVnni; }

}  // namespace cortiq::math::internal
