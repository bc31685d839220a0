// Row-batched attention kernels, built from an ISA's own Dot / Axpy (or their
// int8 forms). The scalar table instantiates them with its per-row kernels;
// the AVX2 and AVX-512 files have register-blocked forms of the same loops,
// which tests/math/rows_test.cc checks bit for bit against the loops. Every
// (query, row) result is computed by the very same function a single Dot /
// Axpy call runs, in the same order, so the batched forms are bit-for-bit
// equal to the loops they replace. What they save is one dispatch (indirect
// call) per row and head.
//
// Internal linkage (static templates): each including file gets its own copy.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cortiq::math::internal {

// out[j·out_stride + t] = dot(q + j·q_stride, rows + t·row_stride, d)
// for t < n (outer), j < nq (inner): one pass over the rows.
template <float (*DotFn)(const float*, const float*, size_t)>
static void DotRowsT(const float* q, size_t nq, size_t q_stride, const float* rows, size_t n,
                     size_t row_stride, size_t d, float* out, size_t out_stride) {
  for (size_t t = 0; t < n; ++t) {
    const float* r = rows + t * row_stride;
    for (size_t j = 0; j < nq; ++j) out[j * out_stride + t] = DotFn(q + j * q_stride, r, d);
  }
}

// out + j·out_stride += Σ_t p[j·p_stride + t] · rows[t], t ascending (outer),
// j inner: one pass over the rows.
template <void (*AxpyFn)(float, const float*, float*, size_t)>
static void AxpyRowsT(const float* p, size_t nq, size_t p_stride, const float* rows, size_t n,
                      size_t row_stride, size_t d, float* out, size_t out_stride) {
  for (size_t t = 0; t < n; ++t) {
    const float* r = rows + t * row_stride;
    for (size_t j = 0; j < nq; ++j) AxpyFn(p[j * p_stride + t], r, out + j * out_stride, d);
  }
}

// The int8 forms: out[j·out_stride + t] = DotI8Fn(q_j, row_t, d).
template <float (*DotI8Fn)(const float*, const int8_t*, size_t)>
static void DotRowsI8T(const float* q, size_t nq, size_t q_stride, const int8_t* rows, size_t n,
                       size_t row_stride, size_t d, float* out, size_t out_stride) {
  for (size_t t = 0; t < n; ++t) {
    const int8_t* r = rows + t * row_stride;
    for (size_t j = 0; j < nq; ++j) out[j * out_stride + t] = DotI8Fn(q + j * q_stride, r, d);
  }
}

// out + j·out_stride += (p[j·p_stride + t] · row_scale[t]) · rows[t], t
// ascending (outer), j inner.
template <void (*AxpyI8Fn)(float, const int8_t*, float*, size_t)>
static void AxpyRowsI8T(const float* p, size_t nq, size_t p_stride, const float* row_scale,
                        const int8_t* rows, size_t n, size_t row_stride, size_t d, float* out,
                        size_t out_stride) {
  for (size_t t = 0; t < n; ++t) {
    const int8_t* r = rows + t * row_stride;
    for (size_t j = 0; j < nq; ++j) {
      AxpyI8Fn(p[j * p_stride + t] * row_scale[t], r, out + j * out_stride, d);
    }
  }
}

}  // namespace cortiq::math::internal
