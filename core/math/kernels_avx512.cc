// AVX-512 (F/BW/VL/DQ) kernels. Compiled with -mavx512* flags and reached only
// through the dispatch table after CPUID says the CPU has them. No std::
// templates here (see kernels_internal.h for why).
//
// Tails are done with masked loads/stores, so every element sees the same
// operations whatever n is; the order of a reduction depends only on n.
#include "core/math/kernels_avx512_inl.h"
#include "core/math/kernels_internal.h"

namespace cortiq::math::internal {
namespace {

// ---- Level 1 ----
float Dot(const float* a, const float* b, size_t n) {
  __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  size_t i = 0;
  for (; i + 4 * kV <= n; i += 4 * kV) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
    s2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 32), _mm512_loadu_ps(b + i + 32), s2);
    s3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 48), _mm512_loadu_ps(b + i + 48), s3);
  }
  for (; i + kV <= n; i += kV) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
  }
  if (i < n) {
    __mmask16 m = Mask16(n - i);
    s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s1);
  }
  return Sum4(s0, s1, s2, s3);
}

void Axpy(float alpha, const float* x, float* y, size_t n) {
  const __m512 va = _mm512_set1_ps(alpha);
  size_t i = 0;
  for (; i + kV <= n; i += kV) {
    _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
  }
  if (i < n) {
    __mmask16 m = Mask16(n - i);
    __m512 r =
        _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i));
    _mm512_mask_storeu_ps(y + i, m, r);
  }
}

void Scale(float* x, float alpha, size_t n) {
  const __m512 va = _mm512_set1_ps(alpha);
  size_t i = 0;
  for (; i + kV <= n; i += kV) _mm512_storeu_ps(x + i, _mm512_mul_ps(va, _mm512_loadu_ps(x + i)));
  if (i < n) {
    __mmask16 m = Mask16(n - i);
    _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(va, _mm512_maskz_loadu_ps(m, x + i)));
  }
}

CORTIQ_INLINE __m512 LoadI8(const int8_t* p) {
  return _mm512_cvtepi32_ps(
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
CORTIQ_INLINE __m512 LoadI8Masked(const int8_t* p, __mmask16 m) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, p)));
}

// Runs block.template operator()<NJ>(j) over the query heads [j, j + NJ)
// of nq: blocks of four, then one of the remaining 1-3.
template <typename Block>
CORTIQ_INLINE void HeadBlocks(size_t nq, Block&& block) {
  size_t j = 0;
  for (; j + 4 <= nq; j += 4) block.template operator()<4>(j);
  switch (nq - j) {
    case 3:
      return block.template operator()<3>(j);
    case 2:
      return block.template operator()<2>(j);
    case 1:
      return block.template operator()<1>(j);
    default:
      return;
  }
}

// ---- Attention rows (kernels.h DotRows / AxpyRows) ----
// Register-blocked forms of the per-row loops: a cached row is loaded once for
// up to four query heads. Every (head, row) value goes through exactly the
// operations Dot / Axpy apply to it (same accumulators, same order, same
// tails), so the results are bit-for-bit those of the loops.

// The row loads of the attention passes: f32 rows as they are, int8 rows
// widened to f32 (what Dot / DotI8 load).
CORTIQ_INLINE __m512 LoadRow(const float* p) { return _mm512_loadu_ps(p); }
CORTIQ_INLINE __m512 LoadRow(const int8_t* p) { return LoadI8(p); }
CORTIQ_INLINE __m512 LoadRowMasked(const float* p, __mmask16 m) {
  return _mm512_maskz_loadu_ps(m, p);
}
CORTIQ_INLINE __m512 LoadRowMasked(const int8_t* p, __mmask16 m) { return LoadI8Masked(p, m); }

// Software prefetch of the cached rows, ~4 KiB ahead along the pass. A KV
// head's rows are one contiguous block, but the hardware streamer starts
// afresh on every 4 KiB page, so without this the first lines of each page
// arrive at DRAM latency: in batch-8 decode at context 512 (int8 rows) ~half
// of the score kernel's time sat on a row's first load. Measured there: a
// step 10-17 % faster with 2-6 KiB ahead (8 KiB or more: less). Past the
// last row the prefetch runs into the next head's block or is a no-op.
constexpr size_t kRowPrefetchBytes = 4096;
CORTIQ_INLINE size_t RowsAhead(size_t row_stride_bytes) {
  if (row_stride_bytes == 0) return 0;
  return row_stride_bytes >= kRowPrefetchBytes ? 1 : kRowPrefetchBytes / row_stride_bytes;
}
// The `bytes` from p + offset (rounded to whole lines), into L1. The address
// is formed as an integer: past the end of the rows it is no valid pointer.
CORTIQ_INLINE void PrefetchBytes(const void* p, size_t offset, size_t bytes) {
  const uintptr_t c = reinterpret_cast<uintptr_t>(p) + offset;
  for (size_t b = 0; b < bytes; b += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(c + b), _MM_HINT_T0);
  }
}

// Scores of NJ heads against n rows (f32 or int8): each row is loaded (for
// int8, widened) once for the NJ heads, and the horizontal sums are deferred:
// ReduceMany folds 16 rows' sums at once with the tree _mm512_reduce_add_ps
// (Sum4) uses one sum at a time. Every (head, row) value is bit-for-bit what
// Dot / DotI8 returns.
//
// DotRowsPass is the pass (prefetch, 16-row groups, the sums); `row(r, s)`
// leaves in s[j][0..3] head j's four FMA chains over the row at r, as Dot
// runs them. Two forms of it: DotRowsBlock's for any head dim, which reloads
// q from L1 for every row, and, for head dim 128 with one or two heads
// (Qwen3's GQA group of 2 at 0.6B), the same operations with the heads' q
// held in 16 zmm for the whole pass, so a row costs its own loads only
// (cortiq-bench-math AttendRows: the reloads were more than the FMAs hid).
template <int NJ, typename T, typename Row>
CORTIQ_INLINE void DotRowsPass(const T* rows, size_t n, size_t row_stride, size_t d, float* out,
                               size_t out_stride, Row&& row) {
  constexpr size_t kGroup = 16;
  alignas(64) __m512 part[NJ][kGroup];
  const size_t ahead = RowsAhead(row_stride * sizeof(T)) * row_stride * sizeof(T);
  for (size_t t0 = 0; t0 < n; t0 += kGroup) {
    const size_t nt = MinSz(kGroup, n - t0);
    for (size_t tt = 0; tt < nt; ++tt) {
      const T* r = rows + (t0 + tt) * row_stride;
      PrefetchBytes(r, ahead, d * sizeof(T));
      __m512 s[NJ][4];
#pragma GCC unroll 4
      for (int j = 0; j < NJ; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = _mm512_setzero_ps();
      row(r, s);
#pragma GCC unroll 4
      for (int j = 0; j < NJ; ++j) {
        part[j][tt] =
            _mm512_add_ps(_mm512_add_ps(s[j][0], s[j][1]), _mm512_add_ps(s[j][2], s[j][3]));
      }
    }
#pragma GCC unroll 4
    for (int j = 0; j < NJ; ++j) {
      float* o = out + j * out_stride + t0;
      if (nt == kGroup) {
        ReduceMany<16>(part[j], o);
      } else {
        for (size_t tt = 0; tt < nt; ++tt) o[tt] = _mm512_reduce_add_ps(part[j][tt]);
      }
    }
  }
}

template <int NJ, typename T>
void DotRowsBlock(const float* q, size_t q_stride, const T* rows, size_t n, size_t row_stride,
                  size_t d, float* out, size_t out_stride) {
  if constexpr (NJ <= 2) {
    if (d == 128) {
      __m512 qv[NJ][8];
#pragma GCC unroll 2
      for (int j = 0; j < NJ; ++j) {
#pragma GCC unroll 8
        for (size_t k = 0; k < 8; ++k) qv[j][k] = _mm512_loadu_ps(q + j * q_stride + k * kV);
      }
      // The generic loop's two steps of 4 · kV (i = 0, 64), unrolled.
      return DotRowsPass<NJ>(
          rows, n, row_stride, d, out,
          out_stride, [&](const T* r, __m512(&s)[NJ][4]) __attribute__((always_inline)) {
#pragma GCC unroll 2
            for (size_t h = 0; h < 2; ++h) {
              const __m512 x0 = LoadRow(r + h * 64), x1 = LoadRow(r + h * 64 + 16),
                           x2 = LoadRow(r + h * 64 + 32), x3 = LoadRow(r + h * 64 + 48);
#pragma GCC unroll 2
              for (int j = 0; j < NJ; ++j) {
                s[j][0] = _mm512_fmadd_ps(qv[j][4 * h], x0, s[j][0]);
                s[j][1] = _mm512_fmadd_ps(qv[j][4 * h + 1], x1, s[j][1]);
                s[j][2] = _mm512_fmadd_ps(qv[j][4 * h + 2], x2, s[j][2]);
                s[j][3] = _mm512_fmadd_ps(qv[j][4 * h + 3], x3, s[j][3]);
              }
            }
          });
    }
  }
  DotRowsPass<NJ>(
      rows, n, row_stride, d, out,
      out_stride, [&](const T* r, __m512(&s)[NJ][4]) __attribute__((always_inline)) {
        size_t i = 0;
        for (; i + 4 * kV <= d; i += 4 * kV) {
          const __m512 x0 = LoadRow(r + i), x1 = LoadRow(r + i + 16), x2 = LoadRow(r + i + 32),
                       x3 = LoadRow(r + i + 48);
#pragma GCC unroll 4
          for (int j = 0; j < NJ; ++j) {
            const float* qj = q + j * q_stride + i;
            s[j][0] = _mm512_fmadd_ps(_mm512_loadu_ps(qj), x0, s[j][0]);
            s[j][1] = _mm512_fmadd_ps(_mm512_loadu_ps(qj + 16), x1, s[j][1]);
            s[j][2] = _mm512_fmadd_ps(_mm512_loadu_ps(qj + 32), x2, s[j][2]);
            s[j][3] = _mm512_fmadd_ps(_mm512_loadu_ps(qj + 48), x3, s[j][3]);
          }
        }
        for (; i + kV <= d; i += kV) {
          const __m512 x = LoadRow(r + i);
#pragma GCC unroll 4
          for (int j = 0; j < NJ; ++j) {
            s[j][0] = _mm512_fmadd_ps(_mm512_loadu_ps(q + j * q_stride + i), x, s[j][0]);
          }
        }
        if (i < d) {
          const __mmask16 m = Mask16(d - i);
          const __m512 x = LoadRowMasked(r + i, m);
#pragma GCC unroll 4
          for (int j = 0; j < NJ; ++j) {
            s[j][1] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + j * q_stride + i), x, s[j][1]);
          }
        }
      });
}

void DotRows(const float* q, size_t nq, size_t q_stride, const float* rows, size_t n,
             size_t row_stride, size_t d, float* out, size_t out_stride) {
  HeadBlocks(nq, [&]<int NJ>(size_t j) {
    DotRowsBlock<NJ>(q + j * q_stride, q_stride, rows, n, row_stride, d, out + j * out_stride,
                     out_stride);
  });
}

// Columns [c, c + 64) of NJ heads' outputs stay in registers across all rows:
// per element, acc = fma(p[t], row[t], acc) for t ascending — what Axpy does
// to it row by row (its masked tail included).
template <int NJ>
void AxpyRowsBlock(const float* p, size_t p_stride, const float* rows, size_t n, size_t row_stride,
                   size_t d, float* out, size_t out_stride) {
  for (size_t c = 0; c < d; c += 4 * kV) {
    __mmask16 m[4];
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      const size_t lo = c + size_t(k) * kV;
      m[k] = lo >= d ? __mmask16(0) : (d - lo >= kV ? __mmask16(0xFFFF) : Mask16(d - lo));
    }
    __m512 acc[NJ][4];
#pragma GCC unroll 4
    for (int j = 0; j < NJ; ++j) {
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {
        acc[j][k] = _mm512_maskz_loadu_ps(m[k], out + j * out_stride + c + size_t(k) * kV);
      }
    }
    const size_t ahead = RowsAhead(row_stride * sizeof(float)) * row_stride * sizeof(float);
    for (size_t t = 0; t < n; ++t) {
      const float* r = rows + t * row_stride + c;
      PrefetchBytes(r, ahead, MinSz(4 * kV, d - c) * sizeof(float));
      __m512 x[4];
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) x[k] = _mm512_maskz_loadu_ps(m[k], r + size_t(k) * kV);
#pragma GCC unroll 4
      for (int j = 0; j < NJ; ++j) {
        const __m512 va = _mm512_set1_ps(p[j * p_stride + t]);
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k) acc[j][k] = _mm512_fmadd_ps(va, x[k], acc[j][k]);
      }
    }
#pragma GCC unroll 4
    for (int j = 0; j < NJ; ++j) {
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {
        _mm512_mask_storeu_ps(out + j * out_stride + c + size_t(k) * kV, m[k], acc[j][k]);
      }
    }
  }
}

void AxpyRows(const float* p, size_t nq, size_t p_stride, const float* rows, size_t n,
              size_t row_stride, size_t d, float* out, size_t out_stride) {
  if (n == 0) return;
  HeadBlocks(nq, [&]<int NJ>(size_t j) {
    AxpyRowsBlock<NJ>(p + j * p_stride, p_stride, rows, n, row_stride, d, out + j * out_stride,
                      out_stride);
  });
}

float DotI8(const float* a, const int8_t* b, size_t n) {
  __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  size_t i = 0;
  for (; i + 4 * kV <= n; i += 4 * kV) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), LoadI8(b + i), s0);
    s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), LoadI8(b + i + 16), s1);
    s2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 32), LoadI8(b + i + 32), s2);
    s3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 48), LoadI8(b + i + 48), s3);
  }
  for (; i + kV <= n; i += kV) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), LoadI8(b + i), s0);
  if (i < n) {
    __mmask16 m = Mask16(n - i);
    s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), LoadI8Masked(b + i, m), s1);
  }
  return Sum4(s0, s1, s2, s3);
}

void AxpyI8(float alpha, const int8_t* x, float* y, size_t n) {
  const __m512 va = _mm512_set1_ps(alpha);
  size_t i = 0;
  for (; i + kV <= n; i += kV) {
    _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, LoadI8(x + i), _mm512_loadu_ps(y + i)));
  }
  if (i < n) {
    __mmask16 m = Mask16(n - i);
    __m512 r = _mm512_fmadd_ps(va, LoadI8Masked(x + i, m), _mm512_maskz_loadu_ps(m, y + i));
    _mm512_mask_storeu_ps(y + i, m, r);
  }
}

// ---- int8 attention rows (kernels.h DotRowsI8 / AxpyRowsI8) ----
// Each cached row is widened to f32 once for up to four query heads (the
// widening, not the FMAs, is the dearest part of an int8 row). Every (head,
// row) value goes through exactly the operations DotI8 / AxpyI8 apply to it.
// The scores are DotRowsBlock's, on int8 rows.
void DotRowsI8(const float* q, size_t nq, size_t q_stride, const int8_t* rows, size_t n,
               size_t row_stride, size_t d, float* out, size_t out_stride) {
  HeadBlocks(nq, [&]<int NJ>(size_t j) {
    DotRowsBlock<NJ>(q + j * q_stride, q_stride, rows, n, row_stride, d, out + j * out_stride,
                     out_stride);
  });
}

// Columns [c, c + KV·16) of NJ heads' outputs stay in registers across all
// rows: acc = fma(p[t]·scale[t], row[t], acc), t ascending, as AxpyI8 does.
template <int NJ, int KV>
void AxpyRowsI8Block(const float* p, size_t p_stride, const float* row_scale, const int8_t* rows,
                     size_t n, size_t row_stride, size_t d, float* out, size_t out_stride) {
  for (size_t c = 0; c < d; c += KV * kV) {
    __mmask16 m[KV];
#pragma GCC unroll 8
    for (int k = 0; k < KV; ++k) {
      const size_t lo = c + size_t(k) * kV;
      m[k] = lo >= d ? __mmask16(0) : (d - lo >= kV ? __mmask16(0xFFFF) : Mask16(d - lo));
    }
    __m512 acc[NJ][KV];
#pragma GCC unroll 4
    for (int j = 0; j < NJ; ++j) {
#pragma GCC unroll 8
      for (int k = 0; k < KV; ++k) {
        acc[j][k] = _mm512_maskz_loadu_ps(m[k], out + j * out_stride + c + size_t(k) * kV);
      }
    }
    const bool whole = c + KV * kV <= d;
    const size_t ahead = RowsAhead(row_stride) * row_stride;
    for (size_t t = 0; t < n; ++t) {
      const int8_t* r = rows + t * row_stride + c;
      PrefetchBytes(r, ahead, MinSz(KV * kV, d - c));
      __m512 x[KV];
      if (whole) {  // a plain load where every lane is in (head_dim 128: always)
#pragma GCC unroll 8
        for (int k = 0; k < KV; ++k) x[k] = LoadI8(r + size_t(k) * kV);
      } else {
#pragma GCC unroll 8
        for (int k = 0; k < KV; ++k) x[k] = LoadI8Masked(r + size_t(k) * kV, m[k]);
      }
#pragma GCC unroll 4
      for (int j = 0; j < NJ; ++j) {
        const __m512 va = _mm512_set1_ps(p[j * p_stride + t] * row_scale[t]);
#pragma GCC unroll 8
        for (int k = 0; k < KV; ++k) acc[j][k] = _mm512_fmadd_ps(va, x[k], acc[j][k]);
      }
    }
#pragma GCC unroll 4
    for (int j = 0; j < NJ; ++j) {
#pragma GCC unroll 8
      for (int k = 0; k < KV; ++k) {
        _mm512_mask_storeu_ps(out + j * out_stride + c + size_t(k) * kV, m[k], acc[j][k]);
      }
    }
  }
}

void AxpyRowsI8(const float* p, size_t nq, size_t p_stride, const float* row_scale,
                const int8_t* rows, size_t n, size_t row_stride, size_t d, float* out,
                size_t out_stride) {
  if (n == 0) return;
  HeadBlocks(nq, [&]<int NJ>(size_t j) {
    // One or two heads (the common GQA group): 8 accumulators per head span
    // a 128-wide head in one pass over the rows.
    constexpr int kKv = NJ <= 2 ? 8 : 4;
    AxpyRowsI8Block<NJ, kKv>(p + j * p_stride, p_stride, row_scale, rows, n, row_stride, d,
                             out + j * out_stride, out_stride);
  });
}

float QuantizeRowI8(const float* x, int8_t* q, size_t n) {
  // max(|x|, acc) with acc second: a NaN element leaves acc unchanged.
  __m512 amax = _mm512_setzero_ps();
  size_t i = 0;
  for (; i + kV <= n; i += kV) amax = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + i)), amax);
  if (i < n) {
    amax = _mm512_max_ps(_mm512_abs_ps(_mm512_maskz_loadu_ps(Mask16(n - i), x + i)), amax);
  }
  float mx = _mm512_reduce_max_ps(amax);
  if (!(mx > 0.0f)) {
    for (size_t k = 0; k < n; ++k) q[k] = 0;
    return 0.0f;
  }
  const float scale = mx / 127.0f;
  const __m512 vs = _mm512_set1_ps(scale), magic = _mm512_set1_ps(kRoundMagic);
  const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
  auto quant = [&](__m512 v) {
    v = _mm512_sub_ps(_mm512_add_ps(_mm512_div_ps(v, vs), magic), magic);
    v = _mm512_min_ps(hi, _mm512_max_ps(v, lo));
    return _mm512_cvtsepi32_epi8(_mm512_cvttps_epi32(v));
  };
  for (i = 0; i + kV <= n; i += kV) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), quant(_mm512_loadu_ps(x + i)));
  }
  if (i < n) {
    __mmask16 m = Mask16(n - i);
    _mm_mask_storeu_epi8(q + i, m, quant(_mm512_maskz_loadu_ps(m, x + i)));
  }
  return scale;
}

// ---- Normalisation / activation ----
void RmsNorm(const float* x, const float* weight, float eps, size_t n, float* out) {
  if (n == 0) return;
  __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  size_t i = 0;
  for (; i + 4 * kV <= n; i += 4 * kV) {
    __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + 16);
    __m512 c = _mm512_loadu_ps(x + i + 32), d = _mm512_loadu_ps(x + i + 48);
    s0 = _mm512_fmadd_ps(a, a, s0);
    s1 = _mm512_fmadd_ps(b, b, s1);
    s2 = _mm512_fmadd_ps(c, c, s2);
    s3 = _mm512_fmadd_ps(d, d, s3);
  }
  for (; i + kV <= n; i += kV) {
    __m512 a = _mm512_loadu_ps(x + i);
    s0 = _mm512_fmadd_ps(a, a, s0);
  }
  if (i < n) {
    __m512 a = _mm512_maskz_loadu_ps(Mask16(n - i), x + i);
    s1 = _mm512_fmadd_ps(a, a, s1);
  }
  const float ss = Sum4(s0, s1, s2, s3);
  const __m512 inv = _mm512_set1_ps(1.0f / __builtin_sqrtf(ss / static_cast<float>(n) + eps));
  for (i = 0; i + kV <= n; i += kV) {
    __m512 v =
        _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), inv), _mm512_loadu_ps(weight + i));
    _mm512_storeu_ps(out + i, v);
  }
  if (i < n) {
    __mmask16 m = Mask16(n - i);
    __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), inv),
                             _mm512_maskz_loadu_ps(m, weight + i));
    _mm512_mask_storeu_ps(out + i, m, v);
  }
}

// exp by the shared polynomial; see kernels_internal.h.
CORTIQ_INLINE __m512 Exp(__m512 x) {
  const __mmask16 under = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kExpMin), _CMP_LT_OQ);
  // max/min return the second operand when one is NaN: NaN flows through.
  x = _mm512_max_ps(_mm512_set1_ps(kExpMin), x);
  x = _mm512_min_ps(_mm512_set1_ps(kExpMax), x);
  const __m512 magic = _mm512_set1_ps(kRoundMagic);
  __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(kExpLog2e), magic), magic);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kExpLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kExpLn2Lo), r);
  __m512 p = _mm512_set1_ps(kExpP0);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpP1));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpP2));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpP3));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpP4));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpP5));
  p = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  const __m512i ni = _mm512_cvttps_epi32(n);
  const __m512i n1 = _mm512_srai_epi32(ni, 1);
  const __m512i n2 = _mm512_sub_epi32(ni, n1);
  const __m512i bias = _mm512_set1_epi32(127);
  const __m512 s1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n1, bias), 23));
  const __m512 s2 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n2, bias), 23));
  return _mm512_maskz_mul_ps(static_cast<__mmask16>(~under), _mm512_mul_ps(p, s1), s2);
}

void Softmax(float* x, size_t n) {
  if (n == 0) return;
  const __m512 ninf = _mm512_set1_ps(-__builtin_inff());
  __m512 m0 = ninf, m1 = ninf;
  size_t i = 0;
  for (; i + 2 * kV <= n; i += 2 * kV) {
    m0 = _mm512_max_ps(_mm512_loadu_ps(x + i), m0);
    m1 = _mm512_max_ps(_mm512_loadu_ps(x + i + 16), m1);
  }
  for (; i + kV <= n; i += kV) m0 = _mm512_max_ps(_mm512_loadu_ps(x + i), m0);
  if (i < n) m1 = _mm512_max_ps(_mm512_mask_loadu_ps(ninf, Mask16(n - i), x + i), m1);
  const float mx = _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
  if (mx == -__builtin_inff()) {
    const float u = 1.0f / static_cast<float>(n);
    for (size_t k = 0; k < n; ++k) x[k] = u;
    return;
  }
  const __m512 vmx = _mm512_set1_ps(mx);
  __m512 s0 = _mm512_setzero_ps(), s1 = s0;
  for (i = 0; i + 2 * kV <= n; i += 2 * kV) {
    __m512 e0 = Exp(_mm512_sub_ps(_mm512_loadu_ps(x + i), vmx));
    __m512 e1 = Exp(_mm512_sub_ps(_mm512_loadu_ps(x + i + 16), vmx));
    _mm512_storeu_ps(x + i, e0);
    _mm512_storeu_ps(x + i + 16, e1);
    s0 = _mm512_add_ps(s0, e0);
    s1 = _mm512_add_ps(s1, e1);
  }
  for (; i + kV <= n; i += kV) {
    __m512 e = Exp(_mm512_sub_ps(_mm512_loadu_ps(x + i), vmx));
    _mm512_storeu_ps(x + i, e);
    s0 = _mm512_add_ps(s0, e);
  }
  if (i < n) {
    __mmask16 m = Mask16(n - i);
    __m512 e = _mm512_maskz_mov_ps(m, Exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), vmx)));
    _mm512_mask_storeu_ps(x + i, m, e);
    s1 = _mm512_add_ps(s1, e);
  }
  const float sum = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
  Scale(x, 1.0f / sum, n);
}

CORTIQ_INLINE __m512 SwiGluV(__m512 g, __m512 u) {
  __m512 e = Exp(_mm512_sub_ps(_mm512_setzero_ps(), g));
  return _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), u);
}

void SwiGlu(const float* gate, const float* up, size_t n, float* out) {
  size_t i = 0;
  for (; i + kV <= n; i += kV) {
    _mm512_storeu_ps(out + i, SwiGluV(_mm512_loadu_ps(gate + i), _mm512_loadu_ps(up + i)));
  }
  if (i < n) {
    __mmask16 m = Mask16(n - i);
    __m512 v = SwiGluV(_mm512_maskz_loadu_ps(m, gate + i), _mm512_maskz_loadu_ps(m, up + i));
    _mm512_mask_storeu_ps(out + i, m, v);
  }
}

void Rope(float* x, size_t head_dim, const float* cos, const float* sin) {
  const size_t half = head_dim / 2;
  float* x1 = x + half;
  for (size_t i = 0; i < half; i += kV) {
    __mmask16 m = Mask16(half - i);
    __m512 a = _mm512_maskz_loadu_ps(m, x + i), b = _mm512_maskz_loadu_ps(m, x1 + i);
    __m512 c = _mm512_maskz_loadu_ps(m, cos + i), s = _mm512_maskz_loadu_ps(m, sin + i);
    _mm512_mask_storeu_ps(x + i, m, _mm512_fmsub_ps(a, c, _mm512_mul_ps(b, s)));
    _mm512_mask_storeu_ps(x1 + i, m, _mm512_fmadd_ps(b, c, _mm512_mul_ps(a, s)));
  }
}

// ---- Conversions ----
CORTIQ_INLINE __m512 Bf16x16ToF32(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// W (or any 16-bit/f32 source) element loaders: 16 floats from p + i, the
// lanes past n zero.
CORTIQ_INLINE __m512 LoadAsF32(const void* p, DType dtype, size_t i, __mmask16 m) {
  switch (dtype) {
    case DType::kBF16:
      return Bf16x16ToF32(_mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(p) + i));
    case DType::kF16:
      return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(p) + i));
    case DType::kF32:
    case DType::kQ8_0:  // never asked: MatMul hands int8 weights to q8_matmul
      break;
  }
  return _mm512_maskz_loadu_ps(m, static_cast<const float*>(p) + i);
}

void ConvertToF32(const void* src, DType dtype, size_t n, float* dst) {
  size_t i = 0;
  if (dtype == DType::kBF16) {
    const uint16_t* s = static_cast<const uint16_t*>(src);
    for (; i + kV <= n; i += kV) {
      _mm512_storeu_ps(dst + i,
                       Bf16x16ToF32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i))));
    }
  } else if (dtype == DType::kF16) {
    const uint16_t* s = static_cast<const uint16_t*>(src);
    for (; i + kV <= n; i += kV) {
      _mm512_storeu_ps(
          dst + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i))));
    }
  } else {
    const float* s = static_cast<const float*>(src);
    if (s == dst) return;
    for (; i + kV <= n; i += kV) _mm512_storeu_ps(dst + i, _mm512_loadu_ps(s + i));
  }
  if (i < n) {
    __mmask16 m = Mask16(n - i);
    _mm512_mask_storeu_ps(dst + i, m, LoadAsF32(src, dtype, i, m));
  }
}

CORTIQ_INLINE __m256i F32ToBf16x16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r =
      _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  const __m512i qnan = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  r = _mm512_mask_blend_epi32(nan, r, qnan);
  return _mm512_cvtepi32_epi16(r);
}

void ConvertFromF32(const float* src, DType dtype, size_t n, void* dst) {
  if (dtype == DType::kF32) {
    float* d = static_cast<float*>(dst);
    if (d == src) return;
    size_t i = 0;
    for (; i + kV <= n; i += kV) _mm512_storeu_ps(d + i, _mm512_loadu_ps(src + i));
    if (i < n)
      _mm512_mask_storeu_ps(d + i, Mask16(n - i), _mm512_maskz_loadu_ps(Mask16(n - i), src + i));
    return;
  }
  uint16_t* d = static_cast<uint16_t*>(dst);
  auto conv = [dtype](__m512 v) {
    return dtype == DType::kBF16
               ? F32ToBf16x16(v)
               : _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  };
  size_t i = 0;
  for (; i + kV <= n; i += kV) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), conv(_mm512_loadu_ps(src + i)));
  }
  if (i < n) {
    __mmask16 m = Mask16(n - i);
    _mm256_mask_storeu_epi16(d + i, m, conv(_mm512_maskz_loadu_ps(m, src + i)));
  }
}

// ---- Decode GEMV ----
// x is packed in blocks of 32 floats (kernels_internal.h). Each loader turns
// 32 columns of one W row into two f32 registers whose lanes line up with the
// two halves of the packed x block: for bf16, even then odd columns (one
// shift, one AND: no cross-lane shuffle on the port the FMAs need); for f16
// and f32, the first then the second 16 columns.
constexpr size_t kGemvBlock = 32;

struct Bf16Loader {
  CORTIQ_INLINE static void Load(const void* row, size_t c, __m512* lo, __m512* hi) {
    __m512i v = _mm512_loadu_si512(static_cast<const uint16_t*>(row) + c);
    *lo = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    *hi =
        _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
  }
  CORTIQ_INLINE static void LoadTail(const void* row, size_t c, size_t rem, __m512* lo,
                                     __m512* hi) {
    __m512i v = _mm512_maskz_loadu_epi16(Mask32(rem), static_cast<const uint16_t*>(row) + c);
    *lo = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    *hi =
        _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
  }
};

struct F16Loader {
  CORTIQ_INLINE static void Load(const void* row, size_t c, __m512* lo, __m512* hi) {
    const uint16_t* p = static_cast<const uint16_t*>(row) + c;
    *lo = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    *hi = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16)));
  }
  CORTIQ_INLINE static void LoadTail(const void* row, size_t c, size_t rem, __m512* lo,
                                     __m512* hi) {
    const uint16_t* p = static_cast<const uint16_t*>(row) + c;
    *lo = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(Mask16(rem), p));
    *hi = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(Mask16(rem > 16 ? rem - 16 : 0), p + 16));
  }
};

struct F32Loader {
  CORTIQ_INLINE static void Load(const void* row, size_t c, __m512* lo, __m512* hi) {
    const float* p = static_cast<const float*>(row) + c;
    *lo = _mm512_loadu_ps(p);
    *hi = _mm512_loadu_ps(p + 16);
  }
  CORTIQ_INLINE static void LoadTail(const void* row, size_t c, size_t rem, __m512* lo,
                                     __m512* hi) {
    const float* p = static_cast<const float*>(row) + c;
    *lo = _mm512_maskz_loadu_ps(Mask16(rem), p);
    *hi = _mm512_maskz_loadu_ps(Mask16(rem > 16 ? rem - 16 : 0), p + 16);
  }
};

// Accumulates columns [c0, c1) of R rows of W (from r0) times B rows of x
// (from b0). The R x B accumulators start at zero (first) or from `spill`,
// and end in `spill` or, on the last column chunk, reduced into y. Every
// (row, batch) accumulator sees the same FMA sequence whatever R, B and the
// chunking are, which is what makes decode batch-invariant.
template <typename L, int R, int B>
void GemvTile(const GemvArgs& a, size_t r0, size_t b0, size_t c0, size_t c1, __m512* spill,
              bool first, bool last) {
  const size_t elem = ElemSize(a.dtype);
  const size_t row_bytes = a.cols * elem;
  const char* w0 = static_cast<const char*>(a.w) + r0 * row_bytes;
  const float* x0 = a.x + b0 * a.x_stride;
  __m512 acc[R][B];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int b = 0; b < B; ++b) acc[r][b] = first ? _mm512_setzero_ps() : spill[r * B + b];
  }
  const size_t full = c0 + (c1 - c0) / kGemvBlock * kGemvBlock;
  // A batch-1 tile over whole rows (decode): the next R rows, one contiguous
  // run, are pulled into L2 a slice per step (as kernels_avx2.cc does:
  // measured faster than a per-row prefetch into L1 here).
  const size_t steps = (full - c0) / kGemvBlock;
  const bool ahead =
      B == 1 && c0 == 0 && c1 == a.cols && steps > 0 && r0 + 2 * R <= a.rows;
  const char* pf = w0 + R * row_bytes;
  const size_t pf_step = ahead ? (R * row_bytes + steps - 1) / steps : 0;
  size_t c = c0;
  for (; c < full; c += kGemvBlock) {
    for (size_t k = 0; k < pf_step; k += 64) _mm_prefetch(pf + k, _MM_HINT_T1);
    pf += pf_step;
    __m512 xl[B], xh[B];
#pragma GCC unroll 4
    for (int b = 0; b < B; ++b) {
      xl[b] = _mm512_load_ps(x0 + b * a.x_stride + c);
      xh[b] = _mm512_load_ps(x0 + b * a.x_stride + c + 16);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      __m512 wl, wh;
      // Otherwise the next row block's line at this column: rows are short
      // (2-6 KiB), too short for the hardware prefetcher to ramp up on each
      // of the R interleaved streams, so the tile fetches its successor
      // itself. (Past the end of W a prefetch is a harmless no-op.) A batch
      // tile of the first batch rows (the one that streams W from memory)
      // reaches 8 rows ahead into L2 instead: a batch-8 call on a cold
      // 3072 x 1024 matrix went from ~2x a batch-1 call's time to ~1.4x.
      if (B > 1 && b0 == 0) {
        _mm_prefetch(w0 + (r + 8) * row_bytes + c * elem, _MM_HINT_T1);
      } else if (!ahead) {
        _mm_prefetch(w0 + (r + R) * row_bytes + c * elem, _MM_HINT_T0);
      }
      L::Load(w0 + r * row_bytes, c, &wl, &wh);
#pragma GCC unroll 4
      for (int b = 0; b < B; ++b) {
        acc[r][b] = _mm512_fmadd_ps(wl, xl[b], acc[r][b]);
        acc[r][b] = _mm512_fmadd_ps(wh, xh[b], acc[r][b]);
      }
    }
  }
  if (c < c1) {  // only in the last chunk: the ragged end of the row
    __m512 xl[B], xh[B];
#pragma GCC unroll 4
    for (int b = 0; b < B; ++b) {
      xl[b] = _mm512_load_ps(x0 + b * a.x_stride + c);
      xh[b] = _mm512_load_ps(x0 + b * a.x_stride + c + 16);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      __m512 wl, wh;
      L::LoadTail(w0 + r * row_bytes, c, c1 - c, &wl, &wh);
#pragma GCC unroll 4
      for (int b = 0; b < B; ++b) {
        acc[r][b] = _mm512_fmadd_ps(wl, xl[b], acc[r][b]);
        acc[r][b] = _mm512_fmadd_ps(wh, xh[b], acc[r][b]);
      }
    }
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

// Columns per chunk: the chunk of every x row together stays within ~32 KiB
// (L1), so wide rows (the 3072-column down projection) do not stream x from
// L2 once per row block. At least 1024 columns, to amortise the spills.
size_t GemvChunk(size_t batch) {
  size_t chunk = (32 * 1024 / sizeof(float)) / batch / kGemvBlock * kGemvBlock;
  return chunk < 1024 ? 1024 : chunk;
}

// Rows [r0, r0 + R) for the whole batch: groups of up to kGemvMaxGroup batch
// rows, column chunks within a group, batch blocks of 4 within a chunk.
constexpr size_t kGemvMaxGroup = 64;

template <typename L, int R>
void GemvRowBlock(const GemvArgs& a, size_t r0) {
  const size_t chunk = GemvChunk(a.batch < kGemvMaxGroup ? a.batch : kGemvMaxGroup);
  // One accumulator slot per (row, batch row) of the group, for the chunks.
  alignas(64) __m512 spill[R * kGemvMaxGroup];
  for (size_t g0 = 0; g0 < a.batch; g0 += kGemvMaxGroup) {
    const size_t g1 = a.batch - g0 > kGemvMaxGroup ? g0 + kGemvMaxGroup : a.batch;
    for (size_t c0 = 0; c0 < a.cols; c0 += chunk) {
      const size_t c1 = a.cols - c0 > chunk ? c0 + chunk : a.cols;
      const bool first = c0 == 0, last = c1 == a.cols;
      size_t b = g0;
      if constexpr (R <= 4) {  // R = 8 is the batch-1 tile: B = 1 only
        for (; b + 4 <= g1; b += 4)
          GemvTile<L, R, 4>(a, r0, b, c0, c1, spill + (b - g0) * R, first, last);
        __m512* sp = spill + (b - g0) * R;
        switch (g1 - b) {
          case 3:
            GemvTile<L, R, 3>(a, r0, b, c0, c1, sp, first, last);
            break;
          case 2:
            GemvTile<L, R, 2>(a, r0, b, c0, c1, sp, first, last);
            break;
          default:
            break;
        }
        if (g1 - b >= 2) b = g1;  // handled above; a single row falls through
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
  // Lane j of `even` takes element 2j of the two registers, `odd` 2j + 1.
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  for (size_t b = 0; b < batch; ++b) {
    const float* src = x + b * cols;
    float* dst = out + b * stride;
    for (size_t c = 0; c < stride; c += kGemvBlock) {
      const size_t n = c < cols ? cols - c : 0;
      const __m512 lo = _mm512_maskz_loadu_ps(Mask16(n), src + c);
      const __m512 hi = _mm512_maskz_loadu_ps(Mask16(n > 16 ? n - 16 : 0), src + c + 16);
      if (even_odd) {
        _mm512_store_ps(dst + c, _mm512_permutex2var_ps(lo, even, hi));
        _mm512_store_ps(dst + c + 16, _mm512_permutex2var_ps(lo, odd, hi));
      } else {
        _mm512_store_ps(dst + c, lo);
        _mm512_store_ps(dst + c + 16, hi);
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

// ---- Prefill GEMM (blocking and loop: kernels_avx512_inl.h) ----
constexpr size_t kMr = kGemmMr;
constexpr size_t kNr = kGemmNr;

// Packs x rows of panels [pb, pe) into xp: [panel][k][kMr], zero-padded.
void GemmPackX(const float* x, size_t m, size_t k, float* xp, size_t pb, size_t pe) {
  const __mmask16 store_mask = Mask16(kMr);
  for (size_t p = pb; p < pe; ++p) {
    const size_t m0 = p * kMr;
    const size_t rows = MinSz(kMr, m - m0);
    float* out = xp + p * k * kMr;
    for (size_t k0 = 0; k0 < k; k0 += 16) {
      const size_t kn = MinSz(16, k - k0);
      const __mmask16 lm = Mask16(kn);
      __m512 r[16];
#pragma GCC unroll 16
      for (size_t i = 0; i < 16; ++i) {
        r[i] = i < rows ? _mm512_maskz_loadu_ps(lm, x + (m0 + i) * k + k0) : _mm512_setzero_ps();
      }
      Transpose16(r);
#pragma GCC unroll 16
      for (size_t j = 0; j < 16; ++j) {
        if (j < kn) _mm512_mask_storeu_ps(out + (k0 + j) * kMr, store_mask, r[j]);
      }
    }
  }
}

// 16 consecutive W elements of one row as f32, lanes past the mask zero.
struct PackBf16 {
  static constexpr size_t kElem = 2;
  CORTIQ_INLINE static __m512 Load(const char* p, __mmask16 m) {
    return Bf16x16ToF32(_mm256_maskz_loadu_epi16(m, p));
  }
};
struct PackF16 {
  static constexpr size_t kElem = 2;
  CORTIQ_INLINE static __m512 Load(const char* p, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
  }
};
struct PackF32 {
  static constexpr size_t kElem = 4;
  CORTIQ_INLINE static __m512 Load(const char* p, __mmask16 m) {
    return _mm512_maskz_loadu_ps(m, p);
  }
};

// Packs W rows [n0, n_end) x cols [k0, k0 + kc) into bp: [panel][kc][kNr]
// f32, rows past n_end zero: 16x16 in-register transposes, ~0.2-0.3 ns per
// element measured (3-4% of a 512-row GEMM; it is what sets the GEMV/GEMM
// crossover). Software prefetch of the 32 row streams measured no gain.
template <typename L>
void GemmPackWTyped(const GemmArgs& a, size_t n0, size_t n_end, size_t k0, size_t kc, float* bp) {
  const size_t row_bytes = a.k * L::kElem;
  const char* w = static_cast<const char*>(a.w) + k0 * L::kElem;
  for (size_t p0 = n0; p0 < n_end; p0 += kNr) {
    float* out = bp + (p0 - n0) * kc;
    const size_t rows = MinSz(kNr, n_end - p0);
    for (size_t kk = 0; kk < kc; kk += 16) {
      const size_t kn = MinSz(16, kc - kk);
      const __mmask16 lm = Mask16(kn);
      for (size_t h = 0; h < kNr; h += 16) {
        __m512 r[16];
        const char* src = w + (p0 + h) * row_bytes + kk * L::kElem;
        if (rows >= h + 16) {
#pragma GCC unroll 16
          for (size_t i = 0; i < 16; ++i) {
            r[i] = L::Load(src + i * row_bytes, lm);
          }
        } else {
#pragma GCC unroll 16
          for (size_t i = 0; i < 16; ++i) {
            r[i] = h + i < rows ? L::Load(src + i * row_bytes, lm) : _mm512_setzero_ps();
          }
        }
        Transpose16(r);
        if (kn == 16) {
#pragma GCC unroll 16
          for (size_t j = 0; j < 16; ++j) _mm512_store_ps(out + (kk + j) * kNr + h, r[j]);
        } else {
#pragma GCC unroll 16
          for (size_t j = 0; j < 16; ++j) {
            if (j < kn) _mm512_store_ps(out + (kk + j) * kNr + h, r[j]);
          }
        }
      }
    }
  }
}

void GemmPackW(const GemmArgs& a, size_t n0, size_t n_end, size_t k0, size_t kc, float* bp) {
  switch (a.dtype) {
    case DType::kBF16:
      return GemmPackWTyped<PackBf16>(a, n0, n_end, k0, kc, bp);
    case DType::kF16:
      return GemmPackWTyped<PackF16>(a, n0, n_end, k0, kc, bp);
    case DType::kF32:
      return GemmPackWTyped<PackF32>(a, n0, n_end, k0, kc, bp);
    case DType::kQ8_0:  // MatMul hands int8 weights to q8_matmul
      return;
  }
}

// One f32 FMA per (x row, 16 W rows, column) (kGemmKernels).
template <int kRows, bool kAccumulate>
struct MicroKernel {
  static void Run(size_t kc, const float* a, const float* b, float* c, size_t ldc, __mmask16 m0,
                  __mmask16 m1) {
    __m512 acc[kRows][2];
#pragma GCC unroll 14
    for (int i = 0; i < kRows; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    for (size_t k = 0; k < kc; ++k) {
      const __m512 b0 = _mm512_load_ps(b + k * kNr);
      const __m512 b1 = _mm512_load_ps(b + k * kNr + 16);
#pragma GCC unroll 14
      for (int i = 0; i < kRows; ++i) {
        const __m512 ai = _mm512_set1_ps(a[k * kMr + i]);
        acc[i][0] = _mm512_fmadd_ps(ai, b0, acc[i][0]);
        acc[i][1] = _mm512_fmadd_ps(ai, b1, acc[i][1]);
      }
    }
    GemmStoreTile<kRows, kAccumulate>(acc, c, ldc, m0, m1);
  }
};

void Gemm(const GemmArgs& a, size_t row_begin, size_t row_end, float* scratch) {
  GemmLoop<MicroKernel>(a, a.xp, a.k, row_begin, row_end, scratch,
                        [&](size_t n0, size_t n_end, size_t k0, size_t kc, float* bp) {
                          GemmPackW(a, n0, n_end, k0, kc, bp);
                        });
}

// ---- Benchmark helpers ----
uint64_t ReadStream(const void* p, size_t bytes) {
  const char* c = static_cast<const char*>(p);
  __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
  for (size_t i = 0; i + 256 <= bytes; i += 256) {
    s0 = _mm512_xor_si512(s0, _mm512_loadu_si512(c + i));
    s1 = _mm512_xor_si512(s1, _mm512_loadu_si512(c + i + 64));
    s2 = _mm512_xor_si512(s2, _mm512_loadu_si512(c + i + 128));
    s3 = _mm512_xor_si512(s3, _mm512_loadu_si512(c + i + 192));
  }
  __m512i s = _mm512_xor_si512(_mm512_xor_si512(s0, s1), _mm512_xor_si512(s2, s3));
  return static_cast<uint64_t>(_mm512_reduce_or_epi64(s));
}

double FmaLoop(uint64_t iters) {
  constexpr int kAcc = 12;  // > latency (4) x ports (2)
  __m512 acc[kAcc];
  for (int j = 0; j < kAcc; ++j) acc[j] = _mm512_set1_ps(static_cast<float>(j));
  const __m512 m = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(0.001f);
  for (uint64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int j = 0; j < kAcc; ++j) acc[j] = _mm512_fmadd_ps(acc[j], m, c);
  }
  __m512 s = acc[0];
  for (int j = 1; j < kAcc; ++j) s = _mm512_add_ps(s, acc[j]);
  volatile float sink = _mm512_reduce_add_ps(s);
  (void)sink;
  return 2.0 * kAcc * kV * static_cast<double>(iters);
}

// One table for kAvx512 and, with the bf16-activation decode of
// kernels_avx512bf16.cc (VDPBF16PS) or kernels_amx.cc (TDPBF16PS), one for
// kAvx512Bf16 and one for kAmx. constexpr: both are constant
// data (no code runs to build them, so nothing executes AVX-512 instructions
// before CPUID has been read).
constexpr KernelTable MakeTable(
    Isa isa, size_t (*bf16_pack_size)(size_t, size_t),
    void (*bf16_pack)(const float*, size_t, size_t, uint16_t*), size_t bf16_row_block,
    void (*bf16_gemv)(const GemvArgs&, size_t, size_t),
    void (*amx_pack_x)(const float*, size_t, size_t, uint16_t*, size_t, size_t),
    void (*amx_matmul)(const AmxArgs&, size_t, size_t), size_t q8_row_block,
    void (*q8_matmul)(const Q8Args&, size_t, size_t),
    void (*q8_lanes_matmul)(const Q8Args&, size_t, size_t)) {
  return {
      .isa = isa,
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
      .gemv_bf16_pack_size = bf16_pack_size,
      .gemv_bf16_pack_x = bf16_pack,
      .gemv_bf16_row_block = bf16_row_block,
      .gemv_bf16 = bf16_gemv,
      .amx_pack_x = amx_pack_x,
      .amx_matmul = amx_matmul,
      .q8_row_block = q8_row_block,
      .q8_matmul = q8_matmul,
      .q8_lanes_matmul = q8_lanes_matmul,
      .q8_lanes_amx = nullptr,
      .gemm_mr = kMr,
      .gemm_nr = kNr,
      .gemm_kc = kGemmKc,
      .gemm_nc = kGemmNc,
      .gemm_pack_x = GemmPackX,
      .gemm = Gemm,
      .gemm_bf16_pack_x = nullptr,
      .gemm_bf16 = nullptr,
      .read_stream = ReadStream,
      .fma_loop = FmaLoop,
  };
}

// Int8 weights: 16-row groups (q8_avx512.cc, q8_avx512vnni.cc).
constexpr KernelTable kTable = MakeTable(Isa::kAvx512, nullptr, nullptr, 0, nullptr, nullptr,
                                         nullptr, 16, Q8MatMulAvx512, Q8LanesMatMulAvx2);
constexpr KernelTable kTableVnni = MakeTable(Isa::kAvx512Vnni, nullptr, nullptr, 0, nullptr,
                                             nullptr, nullptr, 16, Q8MatMulVnni, Q8LanesMatMulVnni);
// The prefill GEMM on VDPBF16PS (kernels_avx512bf16.cc) for bf16 activations.
constexpr KernelTable WithGemmBf16(KernelTable t) {
  t.gemm_bf16_pack_x = GemmBf16PackX;
  t.gemm_bf16 = GemmBf16;
  return t;
}
constexpr KernelTable kTableBf16 = WithGemmBf16(
    MakeTable(Isa::kAvx512Bf16, GemvBf16PackedSize, GemvBf16PackX, 8, GemvBf16, nullptr, nullptr,
              16, Q8MatMulVnni, Q8LanesMatMulVnni));
// AMX: rows in whole 16-row tiles per thread; tile-order weights for every
// batch; lane-order int8 weights on TDPBSUD from Q8AmxMinBatch() x rows.
constexpr KernelTable WithQ8Amx(KernelTable t) {
  t.q8_lanes_amx = Q8LanesMatMulAmx;
  return t;
}
constexpr KernelTable kTableAmx = WithQ8Amx(WithGemmBf16(
    MakeTable(Isa::kAmx, GemvAmxPackedSize, GemvAmxPackX, 16, GemvAmx, AmxPackX, AmxTiledMatMul, 16,
              Q8MatMulVnni, Q8LanesMatMulVnni)));

}  // namespace

const KernelTable* Avx512Table() { return &kTable; }
const KernelTable* Avx512VnniTable() { return &kTableVnni; }
const KernelTable* Avx512Bf16Table() { return &kTableBf16; }
const KernelTable* AmxTable() { return &kTableAmx; }

}  // namespace cortiq::math::internal
