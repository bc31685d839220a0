// DotRows / AxpyRows (and their int8 forms) are bit-for-bit the per-row Dot /
// Axpy (DotI8 / AxpyI8) loops they replace (the attention's bit-exactness between AttentionHead, Attend,
// AttendGroup and the QSA selected-set path rests on it), on every ISA.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/math/kernels.h"
#include "gtest/gtest.h"
#include "tests/math/test_util.h"

namespace cortiq::math {
namespace {
using testing::ScopedIsa;
using testing::SupportedIsas;

TEST(RowsTest, DotRowsAndAxpyRowsEqualTheLoopsBitForBit) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  for (Isa isa : SupportedIsas()) {
    ScopedIsa scoped(isa);
    for (size_t d : {1, 7, 16, 33, 64, 128, 200}) {
      for (size_t nq : {1, 2, 3, 4, 5, 8}) {
        const size_t n = 37, row_stride = d + 5, q_stride = d + 3, out_stride = n + 2;
        std::vector<float> rows(n * row_stride), q(nq * q_stride), p(nq * out_stride);
        for (auto& x : rows) x = nd(rng);
        for (auto& x : q) x = nd(rng);
        for (auto& x : p) x = nd(rng);
        std::vector<float> a(nq * out_stride, -1.0f), b(nq * out_stride, -1.0f);
        DotRows(q.data(), nq, q_stride, rows.data(), n, row_stride, d, a.data(), out_stride);
        for (size_t t = 0; t < n; ++t) {
          for (size_t j = 0; j < nq; ++j) {
            b[j * out_stride + t] = Dot(q.data() + j * q_stride, rows.data() + t * row_stride, d);
          }
        }
        ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)))
            << IsaName(isa) << " DotRows d=" << d << " nq=" << nq;

        std::vector<float> oa(nq * (d + 1), 0.5f), ob(nq * (d + 1), 0.5f);
        AxpyRows(p.data(), nq, out_stride, rows.data(), n, row_stride, d, oa.data(), d + 1);
        for (size_t t = 0; t < n; ++t) {
          for (size_t j = 0; j < nq; ++j) {
            Axpy(p[j * out_stride + t], rows.data() + t * row_stride, ob.data() + j * (d + 1), d);
          }
        }
        ASSERT_EQ(0, std::memcmp(oa.data(), ob.data(), oa.size() * sizeof(float)))
            << IsaName(isa) << " AxpyRows d=" << d << " nq=" << nq;
      }
    }
    // n = 0 touches nothing.
    float sentinel = 42.0f;
    DotRows(nullptr, 2, 0, nullptr, 0, 0, 8, &sentinel, 0);
    AxpyRows(nullptr, 2, 0, nullptr, 0, 0, 8, &sentinel, 0);
    EXPECT_EQ(sentinel, 42.0f);
  }
}

TEST(RowsTest, DotRowsI8AndAxpyRowsI8EqualTheLoopsBitForBit) {
  std::mt19937 rng(4);
  std::normal_distribution<float> nd;
  std::uniform_int_distribution<int> id(-127, 127);
  for (Isa isa : SupportedIsas()) {
    ScopedIsa scoped(isa);
    // n crosses the 16-row groups the AVX-512 kernel reduces together, the
    // AVX2 scores' row pairs (odd n) and its outputs' row tiles (~8 KiB of
    // rows: 150 rows span two or more from d = 64 up).
    for (size_t n : {1, 15, 16, 17, 40, 150}) {
      for (size_t d : {1, 7, 16, 33, 64, 128, 200}) {
        for (size_t nq : {1, 2, 3, 4, 5, 8}) {
          const size_t row_stride = d + 5, q_stride = d + 3, out_stride = n + 2;
          std::vector<int8_t> rows(n * row_stride);
          std::vector<float> q(nq * q_stride), p(nq * out_stride), scale(n);
          for (auto& x : rows) x = static_cast<int8_t>(id(rng));
          for (auto& x : q) x = nd(rng);
          for (auto& x : p) x = nd(rng);
          for (auto& x : scale) x = std::fabs(nd(rng)) * 0.01f;
          std::vector<float> a(nq * out_stride, -1.0f), b(nq * out_stride, -1.0f);
          DotRowsI8(q.data(), nq, q_stride, rows.data(), n, row_stride, d, a.data(), out_stride);
          for (size_t t = 0; t < n; ++t) {
            for (size_t j = 0; j < nq; ++j) {
              b[j * out_stride + t] =
                  DotI8(q.data() + j * q_stride, rows.data() + t * row_stride, d);
            }
          }
          ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)))
              << IsaName(isa) << " DotRowsI8 n=" << n << " d=" << d << " nq=" << nq;

          std::vector<float> oa(nq * (d + 1), 0.5f), ob(nq * (d + 1), 0.5f);
          AxpyRowsI8(p.data(), nq, out_stride, scale.data(), rows.data(), n, row_stride, d,
                     oa.data(), d + 1);
          for (size_t t = 0; t < n; ++t) {
            for (size_t j = 0; j < nq; ++j) {
              AxpyI8(p[j * out_stride + t] * scale[t], rows.data() + t * row_stride,
                     ob.data() + j * (d + 1), d);
            }
          }
          ASSERT_EQ(0, std::memcmp(oa.data(), ob.data(), oa.size() * sizeof(float)))
              << IsaName(isa) << " AxpyRowsI8 n=" << n << " d=" << d << " nq=" << nq;
        }
      }
    }
    float sentinel = 42.0f;
    DotRowsI8(nullptr, 2, 0, nullptr, 0, 0, 8, &sentinel, 0);
    AxpyRowsI8(nullptr, 2, 0, nullptr, nullptr, 0, 0, 8, &sentinel, 0);
    EXPECT_EQ(sentinel, 42.0f);
  }
}

}  // namespace
}  // namespace cortiq::math
