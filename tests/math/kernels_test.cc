// Every kernel of kernels.h on every ISA this CPU supports, against float64
// references. Error bounds are in units of kU (f32 unit roundoff) times the
// length of the longest sequential chain of roundings the contract allows.
#include "core/math/kernels.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "tests/math/test_util.h"

namespace cortiq::math {
namespace {

using testing::Bits;
using testing::FromBits;
using testing::kU;
using testing::RandomFloats;
using testing::RandomI8;

const std::vector<size_t> kLengths = {0,  1,  2,  3,  7,   8,   15,  16,  17,   31,  32,
                                      33, 63, 64, 65, 100, 127, 128, 129, 1000, 4099};
// Offsets (in elements) applied to every input pointer: exercises unaligned access.
const std::vector<size_t> kOffsets = {0, 1, 3};

class KernelsTest : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override { ASSERT_EQ(isa_.active(), GetParam()); }
  testing::ScopedIsa isa_{GetParam()};
};

// ---- Level 1 ----
TEST_P(KernelsTest, DotMatchesFloat64) {
  for (size_t n : kLengths) {
    for (size_t off : kOffsets) {
      auto a = RandomFloats(n + off, 1 + n), b = RandomFloats(n + off, 2 + n);
      double ref = 0, mag = 0;
      for (size_t i = 0; i < n; ++i) {
        ref += static_cast<double>(a[off + i]) * b[off + i];
        mag += std::fabs(static_cast<double>(a[off + i]) * b[off + i]);
      }
      float got = Dot(a.data() + off, b.data() + off, n);
      // Any blocked f32 summation: at most n/8 + 16 roundings in a chain.
      EXPECT_LE(std::fabs(got - ref), kU * (n / 8.0 + 16) * mag) << "n=" << n << " off=" << off;
    }
  }
}

TEST_P(KernelsTest, DotIsDeterministicAcrossAlignment) {
  for (size_t n : {17, 128, 1000, 4099}) {
    auto a = RandomFloats(n, 11), b = RandomFloats(n, 12);
    const float base = Dot(a.data(), b.data(), n);
    for (size_t off : {1, 2, 3, 5, 8, 15}) {
      std::vector<float> a2(n + off), b2(n + off);
      std::copy(a.begin(), a.end(), a2.begin() + off);
      std::copy(b.begin(), b.end(), b2.begin() + off);
      EXPECT_EQ(Bits(Dot(a2.data() + off, b2.data() + off, n)), Bits(base)) << n << " " << off;
    }
  }
}

TEST_P(KernelsTest, AxpyAndScale) {
  for (size_t n : kLengths) {
    for (size_t off : kOffsets) {
      auto x = RandomFloats(n + off, 3 + n), y0 = RandomFloats(n + off + 1, 4 + n);
      auto y = y0;
      const float alpha = 0.37f;
      Axpy(alpha, x.data() + off, y.data() + off, n);
      for (size_t i = 0; i < n; ++i) {
        double ref = static_cast<double>(y0[off + i]) + static_cast<double>(alpha) * x[off + i];
        double bound = 2 * kU * (std::fabs(y0[off + i]) + std::fabs(alpha * x[off + i]));
        ASSERT_LE(std::fabs(y[off + i] - ref), bound) << "n=" << n << " i=" << i;
      }
      EXPECT_EQ(y[off + n], y0[off + n]) << "wrote past the end";
      auto s = x;
      Scale(s.data() + off, -1.5f, n);
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(s[off + i], x[off + i] * -1.5f);
    }
  }
}

TEST_P(KernelsTest, DotI8AndAxpyI8) {
  for (size_t n : kLengths) {
    for (size_t off : kOffsets) {
      auto a = RandomFloats(n + off, 5 + n);
      auto q = RandomI8(n + off, 6 + n);
      double ref = 0, mag = 0;
      for (size_t i = 0; i < n; ++i) {
        ref += static_cast<double>(a[off + i]) * q[off + i];
        mag += std::fabs(static_cast<double>(a[off + i]) * q[off + i]);
      }
      float got = DotI8(a.data() + off, q.data() + off, n);
      EXPECT_LE(std::fabs(got - ref), kU * (n / 8.0 + 16) * mag) << "n=" << n;

      auto y0 = RandomFloats(n + off + 1, 7 + n);
      auto y = y0;
      AxpyI8(0.01f, q.data() + off, y.data() + off, n);
      for (size_t i = 0; i < n; ++i) {
        double t = 0.01 * q[off + i];
        double ref_i = static_cast<double>(y0[off + i]) + t;
        ASSERT_LE(std::fabs(y[off + i] - ref_i), 3 * kU * (std::fabs(y0[off + i]) + std::fabs(t)));
      }
      EXPECT_EQ(y[off + n], y0[off + n]);
    }
  }
}

TEST_P(KernelsTest, QuantizeRowI8RoundsHalfToEven) {
  for (size_t n : kLengths) {
    auto x = RandomFloats(n + 1, 8 + n, -3.0f, 3.0f);
    std::vector<int8_t> q(n + 2, 99);
    float scale = QuantizeRowI8(x.data() + 1, q.data() + 1, n);
    float amax = 0;
    for (size_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[1 + i]));
    if (n == 0) continue;
    EXPECT_EQ(scale, amax / 127.0f);
    for (size_t i = 0; i < n; ++i) {
      const float v = std::nearbyint(x[1 + i] / scale);
      ASSERT_EQ(q[1 + i], static_cast<int8_t>(std::clamp(v, -127.0f, 127.0f))) << "n=" << n;
    }
    EXPECT_EQ(q[0], 99);
    EXPECT_EQ(q[n + 1], 99);
  }
  // Exact ties go to even: 0.5, 1.5, 2.5 with scale 1.
  std::vector<float> t = {127.0f, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -126.5f};
  std::vector<int8_t> q(t.size());
  EXPECT_EQ(QuantizeRowI8(t.data(), q.data(), t.size()), 1.0f);
  EXPECT_EQ(q, (std::vector<int8_t>{127, 0, 2, 2, 0, -2, -126}));
  // All zero: scale 0, q zero.
  std::vector<float> z(37, 0.0f);
  std::vector<int8_t> qz(37, 5);
  EXPECT_EQ(QuantizeRowI8(z.data(), qz.data(), z.size()), 0.0f);
  EXPECT_TRUE(std::all_of(qz.begin(), qz.end(), [](int8_t v) { return v == 0; }));
}

// ---- Normalisation / activation ----
TEST_P(KernelsTest, RmsNorm) {
  for (size_t n : kLengths) {
    if (n == 0) continue;
    auto x = RandomFloats(n + 1, 9 + n, -4.0f, 4.0f), w = RandomFloats(n + 1, 10 + n, 0.5f, 1.5f);
    std::vector<float> out(n + 2, 42.0f);
    const float eps = 1e-6f;
    RmsNorm(x.data() + 1, w.data() + 1, eps, n, out.data() + 1);
    double ss = 0;
    for (size_t i = 0; i < n; ++i) ss += static_cast<double>(x[1 + i]) * x[1 + i];
    double inv = 1.0 / std::sqrt(ss / n + eps);
    for (size_t i = 0; i < n; ++i) {
      double ref = x[1 + i] * inv * w[1 + i];
      ASSERT_LE(std::fabs(out[1 + i] - ref), kU * (n / 16.0 + 24) * std::fabs(ref)) << n;
    }
    EXPECT_EQ(out[0], 42.0f);
    EXPECT_EQ(out[n + 1], 42.0f);
    // In place gives the same bits.
    auto y = x;
    RmsNorm(y.data() + 1, w.data() + 1, eps, n, y.data() + 1);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(Bits(y[1 + i]), Bits(out[1 + i]));
  }
}

void ExpectSoftmaxClose(const std::vector<float>& in, const std::vector<float>& got) {
  const size_t n = in.size();
  double mx = -INFINITY;
  for (float v : in) mx = std::max<double>(mx, v);
  std::vector<double> e(n);
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += e[i] = std::exp(static_cast<double>(in[i]) - mx);
  for (size_t i = 0; i < n; ++i) {
    double ref = e[i] / sum;
    // The f32 subtraction x - max is off by up to u|x - max|, which exp turns
    // into that relative error; exp itself is within a few ulp, the sum has
    // at most n/8 + 16 roundings in a chain, then one multiply. Results below
    // FLT_MIN may flush to zero.
    double rel = kU * (n / 8.0 + 24 + std::fabs(static_cast<double>(in[i]) - mx));
    ASSERT_LE(std::fabs(got[i] - ref), rel * ref + 1.2e-38) << "n=" << n << " i=" << i;
  }
}

TEST_P(KernelsTest, SoftmaxMatchesFloat64) {
  for (size_t n : kLengths) {
    if (n == 0) continue;
    for (float range : {1.0f, 30.0f, 200.0f}) {
      auto x = RandomFloats(n, 13 + n, -range, range);
      auto y = x;
      Softmax(y.data(), n);
      ExpectSoftmaxClose(x, y);
    }
  }
}

TEST_P(KernelsTest, SoftmaxSpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x = {1.0f, -inf, 2.0f, -inf, 0.5f, -inf, -inf, -inf, -inf,
                          -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, 3.0f};
  auto y = x;
  Softmax(y.data(), y.size());
  double sum = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] == -inf) {
      EXPECT_EQ(y[i], 0.0f) << i;
    }
    sum += y[i];
  }
  EXPECT_NEAR(sum, 1.0, 1e-6);
  // All masked: uniform.
  std::vector<float> m(21, -inf);
  Softmax(m.data(), m.size());
  for (float v : m) EXPECT_FLOAT_EQ(v, 1.0f / 21);
  // Huge logits do not overflow.
  std::vector<float> h = {1e30f, 1e30f, -1e30f, 3e38f};
  Softmax(h.data(), h.size());
  EXPECT_EQ(h[3], 1.0f);
  EXPECT_EQ(h[0], 0.0f);
  // One element.
  float one = -7.0f;
  Softmax(&one, 1);
  EXPECT_EQ(one, 1.0f);
}

TEST_P(KernelsTest, SwiGlu) {
  for (size_t n : kLengths) {
    for (float range : {4.0f, 100.0f}) {
      auto g = RandomFloats(n + 1, 14 + n, -range, range), u = RandomFloats(n + 1, 15 + n);
      std::vector<float> out(n + 2, 42.0f);
      SwiGlu(g.data() + 1, u.data() + 1, n, out.data() + 1);
      for (size_t i = 0; i < n; ++i) {
        double gd = g[1 + i];
        double ref = gd / (1.0 + std::exp(-gd)) * u[1 + i];
        ASSERT_LE(std::fabs(out[1 + i] - ref), 16 * kU * std::fabs(ref) + 1e-36)
            << "g=" << gd << " n=" << n;
      }
      EXPECT_EQ(out[0], 42.0f);
      EXPECT_EQ(out[n + 1], 42.0f);
      // Aliasing out with gate or up gives the same bits.
      auto g2 = g;
      SwiGlu(g2.data() + 1, u.data() + 1, n, g2.data() + 1);
      auto u2 = u;
      SwiGlu(g.data() + 1, u2.data() + 1, n, u2.data() + 1);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(Bits(g2[1 + i]), Bits(out[1 + i]));
        ASSERT_EQ(Bits(u2[1 + i]), Bits(out[1 + i]));
      }
    }
  }
  // Extremes: silu(-inf-ish) -> -0, silu(large) -> x, silu(0) = 0.
  std::vector<float> g = {-1000.0f, -88.0f, 0.0f, 88.0f, 1000.0f};
  std::vector<float> u(g.size(), 1.0f), out(g.size());
  SwiGlu(g.data(), u.data(), g.size(), out.data());
  EXPECT_EQ(std::fabs(out[0]), 0.0f);
  EXPECT_NEAR(out[1], 0.0f, 1e-30);
  EXPECT_EQ(out[2], 0.0f);
  EXPECT_EQ(out[3], 88.0f);
  EXPECT_EQ(out[4], 1000.0f);
}

TEST_P(KernelsTest, RopeRotateHalf) {
  for (size_t head_dim : {2, 4, 6, 30, 32, 34, 64, 128, 256}) {
    const size_t half = head_dim / 2;
    auto x = RandomFloats(head_dim + 2, 16 + head_dim);
    std::vector<float> c(half + 1), s(half + 1);
    for (size_t i = 0; i < half; ++i) {
      double ang = 17.0 * std::pow(10000.0, -2.0 * i / head_dim);
      c[1 + i] = static_cast<float>(std::cos(ang));
      s[1 + i] = static_cast<float>(std::sin(ang));
    }
    auto y = x;
    RopeRotateHalf(y.data() + 1, head_dim, c.data() + 1, s.data() + 1);
    for (size_t i = 0; i < half; ++i) {
      double a = x[1 + i], b = x[1 + half + i], cc = c[1 + i], ss = s[1 + i];
      double r0 = a * cc - b * ss, r1 = b * cc + a * ss;
      ASSERT_LE(std::fabs(y[1 + i] - r0), 2 * kU * (std::fabs(a * cc) + std::fabs(b * ss)));
      ASSERT_LE(std::fabs(y[1 + half + i] - r1), 2 * kU * (std::fabs(b * cc) + std::fabs(a * ss)));
    }
    EXPECT_EQ(y[0], x[0]);
    EXPECT_EQ(y[head_dim + 1], x[head_dim + 1]);
  }
}

// ---- Conversions ----
// float64 models of the formats, independent of the code under test.
double F16Value(uint16_t h) {
  int e = (h >> 10) & 31, m = h & 1023;
  double v = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
  return (h & 0x8000) ? -v : v;
}

// Nearest-even rounding of finite |v| onto a sorted grid of codes; codes past
// the largest finite one round to `inf_code`, whose value is `inf_value`.
uint16_t RoundToGrid(double v, const std::vector<double>& grid, double inf_value,
                     uint16_t inf_code) {
  auto it = std::lower_bound(grid.begin(), grid.end(), v);
  size_t hi = static_cast<size_t>(it - grid.begin());
  if (hi < grid.size() && grid[hi] == v) return static_cast<uint16_t>(hi);
  size_t lo = hi - 1;  // v > grid[0] == 0 here
  double hv = hi < grid.size() ? grid[hi] : inf_value;
  double dl = v - grid[lo], dh = hv - v;
  size_t pick = dl < dh ? lo : dh < dl ? hi : (lo % 2 == 0 ? lo : hi);
  return pick < grid.size() ? static_cast<uint16_t>(pick) : inf_code;
}

TEST(ConversionTest, F16ToF32Exhaustive) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = F16ToF32(static_cast<uint16_t>(h));
    if (((h >> 10) & 31) == 31 && (h & 1023) != 0) {
      ASSERT_TRUE(std::isnan(f)) << h;
      ASSERT_EQ(Bits(f) & 0x400000u, 0x400000u) << "NaN not quiet: " << h;
      ASSERT_EQ(Bits(f) >> 31, h >> 15);
      continue;
    }
    if (((h >> 10) & 31) == 31) {
      ASSERT_TRUE(std::isinf(f));
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), F16Value(static_cast<uint16_t>(h))) << h;
    ASSERT_EQ(Bits(f) >> 31, h >> 15) << "sign of " << h;  // -0 stays -0
    ASSERT_EQ(F32ToF16(f), h) << "round trip " << h;
  }
}

TEST(ConversionTest, F32ToF16RoundsToNearestEven) {
  std::vector<double> grid(0x7C00);
  for (uint32_t h = 0; h < 0x7C00; ++h) grid[h] = F16Value(static_cast<uint16_t>(h));
  std::mt19937 rng(17);
  std::vector<float> cases = {0.0f,
                              -0.0f,
                              65504.0f,
                              65519.99f,
                              65520.0f,
                              1e10f,
                              5.960464477539063e-08f,
                              2.9802322387695312e-08f,  // 2^-24, 2^-25 tie
                              2.98023259e-08f,
                              6.1035156e-05f,
                              6.1e-05f,
                              1.0f + 1.0f / 2048};
  for (int i = 0; i < 400000; ++i) cases.push_back(FromBits(rng()));
  // Concentrate on the f16 range, halfway points included.
  for (int i = 0; i < 200000; ++i) {
    uint32_t b = (rng() % (0x47800000u - 0x33000000u)) + 0x33000000u;
    if (i % 4 == 0) b = (b & ~0x1FFFu) | 0x1000u;  // exact tie for normals
    cases.push_back(FromBits(b | (rng() & 0x80000000u)));
  }
  for (float f : cases) {
    uint16_t got = F32ToF16(f);
    if (std::isnan(f)) {
      ASSERT_EQ(got & 0x7E00u, 0x7E00u) << "NaN must stay a quiet NaN";
      continue;
    }
    double a = std::fabs(static_cast<double>(f));
    uint16_t mag = std::isinf(f) ? 0x7C00 : RoundToGrid(a, grid, 65536.0, 0x7C00);
    uint16_t want = static_cast<uint16_t>(mag | (std::signbit(f) ? 0x8000 : 0));
    ASSERT_EQ(got, want) << "f=" << f << " bits=" << std::hex << Bits(f);
  }
}

TEST(ConversionTest, Bf16RoundTripAndNearestEven) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = Bf16ToF32(static_cast<uint16_t>(h));
    ASSERT_EQ(Bits(f), h << 16);
    if (!std::isnan(f)) {
      ASSERT_EQ(F32ToBf16(f), h);
    }
  }
  std::mt19937 rng(18);
  for (int i = 0; i < 1000000; ++i) {
    uint32_t b = rng();
    if (i % 3 == 0) b = (b & 0xFFFF0000u) | 0x8000u;  // exact ties
    float f = FromBits(b);
    uint16_t got = F32ToBf16(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(Bf16ToF32(got)));
      ASSERT_EQ(got & 0x40u, 0x40u);
      continue;
    }
    // Neighbours: truncation and the next code up in magnitude.
    uint32_t lo = b & 0xFFFF0000u, hi = lo + 0x10000u;
    double v = std::fabs(static_cast<double>(f)), lv = std::fabs(static_cast<double>(FromBits(lo)));
    double hv = (hi & 0x7FFFFFFFu) == 0x7F800000u ? std::ldexp(1.0, 128)
                                                  : std::fabs(static_cast<double>(FromBits(hi)));
    uint32_t want = (v - lv < hv - v) ? lo : (hv - v < v - lv) ? hi : (((lo >> 16) & 1) ? hi : lo);
    ASSERT_EQ(got, want >> 16) << std::hex << b;
  }
  EXPECT_EQ(F32ToBf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(F32ToBf16(-0.0f), 0x8000);
  EXPECT_EQ(F32ToBf16(1e-45f), 0x0000);                 // smallest denormal rounds to 0
  EXPECT_EQ(F32ToBf16(FromBits(0x00018000u)), 0x0002);  // denormal tie to even
  EXPECT_EQ(F32ToBf16(3.4028235e38f), 0x7F80);          // max float rounds up to inf
}

// The vector conversions agree with the scalar ones bit for bit, NaNs included.
TEST_P(KernelsTest, VectorConversionsMatchScalar) {
  std::vector<uint16_t> all(65536 + 3);
  for (uint32_t h = 0; h < all.size(); ++h) all[h] = static_cast<uint16_t>(h * 7919u);
  std::vector<float> src(70000);
  std::mt19937 rng(19);
  for (auto& f : src) f = FromBits(rng());
  for (size_t i = 0; i < 64; ++i)
    src[i] = FromBits(0x7F800001u + static_cast<uint32_t>(i) * 4099u);  // NaNs
  for (size_t n : {size_t{0}, size_t{1}, size_t{15}, size_t{17}, size_t{33}, all.size() - 1}) {
    for (DType dt : {DType::kBF16, DType::kF16}) {
      std::vector<float> out(n + 2, 42.0f);
      ConvertToF32(all.data() + 1, dt, n, out.data() + 1);
      for (size_t i = 0; i < n; ++i) {
        float want = dt == DType::kBF16 ? Bf16ToF32(all[1 + i]) : F16ToF32(all[1 + i]);
        ASSERT_EQ(Bits(out[1 + i]), Bits(want)) << DTypeName(dt) << " h=" << all[1 + i];
      }
      EXPECT_EQ(out[n + 1], 42.0f);
      std::vector<uint16_t> back(n + 2, 0xABCD);
      ConvertFromF32(src.data() + 1, dt, n, back.data() + 1);
      for (size_t i = 0; i < n; ++i) {
        uint16_t want = dt == DType::kBF16 ? F32ToBf16(src[1 + i]) : F32ToF16(src[1 + i]);
        ASSERT_EQ(back[1 + i], want) << DTypeName(dt) << " f=" << std::hex << Bits(src[1 + i]);
      }
      EXPECT_EQ(back[n + 1], 0xABCD);
    }
    std::vector<float> out(n + 2, 42.0f);
    ConvertToF32(src.data() + 1, DType::kF32, n, out.data() + 1);
    EXPECT_TRUE(std::equal(out.begin() + 1, out.begin() + 1 + n, src.begin() + 1,
                           [](float a, float b) { return Bits(a) == Bits(b); }));
    EXPECT_EQ(out[n + 1], 42.0f);
  }
}

TEST(DispatchTest, NamesAndCaps) {
  EXPECT_STREQ(IsaName(Isa::kScalar), "scalar");
  EXPECT_STREQ(IsaName(Isa::kAvx512), "avx512");
  EXPECT_STREQ(IsaName(Isa::kAvx512Bf16), "avx512bf16");
  EXPECT_STREQ(IsaName(Isa::kAmx), "amx");
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_STREQ(DTypeName(DType::kF16), "f16");
  EXPECT_EQ(SetIsaForTesting(Isa::kScalar), Isa::kScalar);
  EXPECT_EQ(ActiveIsa(), Isa::kScalar);
  EXPECT_EQ(SetIsaForTesting(Isa::kAmx), DetectedIsa());
  EXPECT_EQ(ActiveIsa(), DetectedIsa());
}

// kAvxVnni is a cap like the others, but a CPU can have AVX-512 without
// AVX-VNNI (Zen 4, Ice Lake): capped there it runs kAvx2.
TEST(DispatchTest, AvxVnniCapFallsBackToAvx2WithoutIt) {
  EXPECT_STREQ(IsaName(Isa::kAvxVnni), "avxvnni");
  EXPECT_FALSE(IsaAvailable(static_cast<Isa>(static_cast<int>(DetectedIsa()) + 1)));
  EXPECT_TRUE(IsaAvailable(Isa::kScalar));
  const Isa got = SetIsaForTesting(Isa::kAvxVnni);
  if (IsaAvailable(Isa::kAvxVnni)) {
    EXPECT_EQ(got, Isa::kAvxVnni);
  } else if (IsaAvailable(Isa::kAvx2)) {
    EXPECT_EQ(got, Isa::kAvx2);
  } else {
    EXPECT_EQ(got, Isa::kScalar);
  }
  EXPECT_EQ(ActiveIsa(), got);
  SetIsaForTesting(DetectedIsa());
}

// CORTIQ_ISA is read once, at the first kernel call: check it in a child
// process that runs only this test with the variable set.
TEST(DispatchTest, EnvironmentCapsIsa) {
  if (const char* want = std::getenv("CORTIQ_TEST_EXPECT_ISA")) {  // the child
    EXPECT_STREQ(IsaName(ActiveIsa()), want);
    return;
  }
  char exe[4096];
  const ssize_t len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  ASSERT_GT(len, 0);
  exe[len] = '\0';
  auto run = [&](const char* cap, Isa expect) {
    std::string cmd = std::string("CORTIQ_ISA=") + cap +
                      " CORTIQ_TEST_EXPECT_ISA=" + IsaName(expect) + " '" + exe +
                      "' --gtest_filter=DispatchTest.EnvironmentCapsIsa >/dev/null 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  };
  for (Isa isa : testing::SupportedIsas()) run(IsaName(isa), isa);
  // Asking for more than the CPU has gives what it has.
  run("amx", DetectedIsa());
}

INSTANTIATE_TEST_SUITE_P(Isas, KernelsTest, ::testing::ValuesIn(testing::SupportedIsas()),
                         [](const auto& info) { return testing::IsaParamName(info.param); });

}  // namespace
}  // namespace cortiq::math
