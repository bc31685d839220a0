// int8 weights (DType::kQ8_0): the block format and its quantizers against
// hand-computed values (ggml's rounding), and MatMul on every ISA against the
// exact definition in kernels.h (bit for bit) and a float64 reference on the
// same quantized inputs; decode and prefill batch sizes, odd row counts,
// unaligned rows, the -128 a foreign file may hold, NaN, thread counts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/math/kernels.h"
#include "core/math/kernels_internal.h"
#include "core/util/aligned_buffer.h"
#include "core/util/thread_pool.h"
#include "tests/math/test_util.h"

namespace cortiq::math {
namespace {

using testing::Bits;
using testing::kU;
using testing::RandomFloats;

uint16_t ScaleBits(const uint8_t* block) { return static_cast<uint16_t>(block[0] | block[1] << 8); }

TEST(Q8FormatTest, RowBytesAndNames) {
  EXPECT_EQ(RowBytes(DType::kQ8_0, 32), 34u);
  EXPECT_EQ(RowBytes(DType::kQ8_0, 1024), 1088u);
  EXPECT_EQ(RowBytes(DType::kBF16, 1024), 2048u);
  EXPECT_EQ(RowBytes(DType::kF32, 3), 12u);
  EXPECT_EQ(DTypeSize(DType::kQ8_0), 0u);
  EXPECT_STREQ(DTypeName(DType::kQ8_0), "q8_0");
}

TEST(Q8FormatTest, QuantizesAsGgmlDoes) {
  // amax 127: d = 1, id = 1, so q = roundf(x): ties away from zero.
  std::vector<float> x(32, 0.0f);
  x[0] = 127.0f;
  x[1] = 2.5f;
  x[2] = -2.5f;
  x[3] = 0.5f;
  x[4] = -0.49f;
  x[5] = -127.0f;
  uint8_t out[34];
  QuantizeQ8_0(x.data(), 32, out);
  EXPECT_EQ(ScaleBits(out), 0x3C00);  // f16 1.0
  const int8_t* q = reinterpret_cast<const int8_t*>(out + 2);
  EXPECT_EQ(q[0], 127);
  EXPECT_EQ(q[1], 3);
  EXPECT_EQ(q[2], -3);
  EXPECT_EQ(q[3], 1);
  EXPECT_EQ(q[4], 0);
  EXPECT_EQ(q[5], -127);
  EXPECT_EQ(q[6], 0);

  // d is stored rounded to f16; q uses the unrounded 1/d (as ggml).
  std::vector<float> y = RandomFloats(64, 7, -3.0f, 3.0f);
  uint8_t blocks[68];
  QuantizeQ8_0(y.data(), 64, blocks);
  for (int b = 0; b < 2; ++b) {
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(y[b * 32 + i]));
    const float d = amax / 127.0f;
    EXPECT_EQ(ScaleBits(blocks + b * 34), F32ToF16(d));
    for (int i = 0; i < 32; ++i) {
      EXPECT_EQ(static_cast<int8_t>(blocks[b * 34 + 2 + i]),
                static_cast<int8_t>(std::round(y[b * 32 + i] * (1.0f / d))));
    }
  }
  // Round trip within half a step (plus the f16 rounding of d).
  std::vector<float> back(64);
  DequantizeQ8_0(blocks, 64, back.data());
  std::vector<float> via(64);
  ConvertToF32(blocks, DType::kQ8_0, 64, via.data());
  for (int i = 0; i < 64; ++i) {
    EXPECT_EQ(Bits(back[i]), Bits(via[i]));
    EXPECT_NEAR(back[i], y[i], 3.0 / 127 * 0.51 + 3.0 * 1e-3) << i;
  }
  std::vector<uint8_t> again(68);
  ConvertFromF32(y.data(), DType::kQ8_0, 64, again.data());
  EXPECT_EQ(std::memcmp(again.data(), blocks, 68), 0);
}

TEST(Q8FormatTest, ZeroAndNonFiniteBlocks) {
  std::vector<float> x(64, 0.0f);
  x[40] = std::numeric_limits<float>::quiet_NaN();
  uint8_t out[68];
  QuantizeQ8_0(x.data(), 64, out);
  EXPECT_EQ(ScaleBits(out), 0u);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(out[2 + i], 0u);
  EXPECT_TRUE(std::isnan(F16ToF32(ScaleBits(out + 34))));
  for (int i = 0; i < 32; ++i) EXPECT_EQ(out[36 + i], 0u);
}

// Blocks whose largest magnitude is a denormal: scaling by the inverse would
// overflow to inf (and inf -> int8 is undefined; found by the GGUF fuzzer).
// They quantize as zero blocks; a normal-range neighbour is unaffected.
TEST(Q8FormatTest, DenormalBlocksQuantizeToZero) {
  std::vector<float> x(96, 0.0f);
  x[0] = -std::numeric_limits<float>::denorm_min();
  x[1] = 1e-40f;
  x[32] = 1e-38f;  // d = 7.9e-41: 1 / d overflows
  x[33] = -1e-38f;
  x[64] = 1.0f;
  uint8_t out[3 * 34];
  QuantizeQ8_0(x.data(), 96, out);
  for (int b = 0; b < 2; ++b) {
    EXPECT_EQ(ScaleBits(out + 34 * b), 0u);
    for (int i = 0; i < 32; ++i) EXPECT_EQ(out[34 * b + 2 + i], 0u) << b << " " << i;
  }
  EXPECT_EQ(static_cast<int8_t>(out[68 + 2]), 127);
  std::vector<int8_t> q(96, 1);
  std::vector<float> d(3);
  QuantizeActivationsQ8(x.data(), 1, 96, q.data(), d.data());
  EXPECT_EQ(d[0], 0.0f);
  EXPECT_EQ(d[1], 0.0f);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(q[i], 0) << i;
  EXPECT_EQ(d[2], 1.0f / 127.0f);
  EXPECT_EQ(q[64], 127);
}

TEST(Q8ActivationsTest, RoundsTiesToEvenAndFlagsNonFinite) {
  std::vector<float> x(96, 0.0f);
  x[0] = 127.0f;  // block 0: scale 1
  x[1] = 2.5f;
  x[2] = -3.5f;
  x[3] = 0.5f;
  x[64] = std::numeric_limits<float>::infinity();  // block 2
  x[65] = 1.0f;
  std::vector<int8_t> q(96);
  std::vector<float> d(3);
  QuantizeActivationsQ8(x.data(), 1, 96, q.data(), d.data());
  EXPECT_EQ(d[0], 1.0f);
  EXPECT_EQ(q[0], 127);
  EXPECT_EQ(q[1], 2);
  EXPECT_EQ(q[2], -4);
  EXPECT_EQ(q[3], 0);
  EXPECT_EQ(d[1], 0.0f);  // all-zero block
  for (int i = 32; i < 64; ++i) EXPECT_EQ(q[i], 0);
  EXPECT_TRUE(std::isnan(d[2]));
  for (int i = 64; i < 96; ++i) EXPECT_EQ(q[i], 0);
}

// The MatMul checks below take qx from QuantizeActivationsQ8 itself, so its
// rounding is checked here on its own against std::nearbyint: random blocks
// (ties rare) and blocks of exact halves (amax 127: scale 1, every x.5 a tie).
TEST(Q8ActivationsTest, EqualsNearbyintOnRandomAndTiedValues) {
  const size_t cols = 4096;
  std::vector<float> x = RandomFloats(cols, 21, -3.0f, 3.0f);
  for (size_t i = 0; i < cols / 2; i += kQ8Block) {
    x[i] = 127.0f;
    for (size_t k = 1; k < kQ8Block; ++k) {
      x[i + k] = static_cast<float>(static_cast<int>(i / 2 + k) % 254 - 127) + 0.5f;
    }
  }
  std::vector<int8_t> q(cols);
  std::vector<float> d(cols / kQ8Block);
  QuantizeActivationsQ8(x.data(), 1, cols, q.data(), d.data());
  for (size_t i = 0; i < cols; ++i) {
    const float* blk = x.data() + i / kQ8Block * kQ8Block;
    float amax = 0.0f;
    for (size_t k = 0; k < kQ8Block; ++k) amax = std::max(amax, std::fabs(blk[k]));
    ASSERT_EQ(Bits(d[i / kQ8Block]), Bits(amax / 127.0f)) << i;
    ASSERT_EQ(q[i], static_cast<int8_t>(std::nearbyint(x[i] * (127.0f / amax))))
        << i << " " << x[i];
  }
}

// Blocks that leave the vector path: NaN or inf at every lane position,
// -0.0 only, and an amax so small that 127/amax overflows (a zero block);
// and a negative amax, which does not.
TEST(Q8ActivationsTest, SpecialBlocksAtEveryPosition) {
  const float kNan = std::numeric_limits<float>::quiet_NaN();
  const float kInf = std::numeric_limits<float>::infinity();
  for (size_t pos = 0; pos < kQ8Block; ++pos) {
    for (const float special : {kNan, -kNan, kInf, -kInf}) {
      std::vector<float> x = RandomFloats(kQ8Block, 5 + pos, -1.0f, 1.0f);
      x[pos] = special;
      std::vector<int8_t> q(kQ8Block, 7);
      float d = 0.0f;
      QuantizeActivationsQ8(x.data(), 1, kQ8Block, q.data(), &d);
      ASSERT_TRUE(std::isnan(d)) << pos;
      for (const int8_t v : q) ASSERT_EQ(v, 0) << pos;
    }
  }
  std::vector<float> x(3 * kQ8Block, -0.0f);
  for (size_t k = 0; k < kQ8Block; ++k) x[kQ8Block + k] = (k % 2 ? 1.0f : -1.0f) * 1e-38f;
  for (size_t k = 0; k < kQ8Block; ++k) x[2 * kQ8Block + k] = static_cast<float>(k) - 40.0f;
  std::vector<int8_t> q(3 * kQ8Block, 7);
  std::vector<float> d(3);
  QuantizeActivationsQ8(x.data(), 1, 3 * kQ8Block, q.data(), d.data());
  EXPECT_EQ(d[0], 0.0f);
  EXPECT_EQ(d[1], 0.0f);  // below 127 / FLT_MAX: counts as zero
  for (size_t k = 0; k < 2 * kQ8Block; ++k) EXPECT_EQ(q[k], 0) << k;
  EXPECT_EQ(d[2], 40.0f / 127.0f);
  EXPECT_EQ(q[2 * kQ8Block], -127);
  for (size_t k = 0; k < kQ8Block; ++k) {
    EXPECT_EQ(q[2 * kQ8Block + k],
              static_cast<int8_t>(std::nearbyint(x[2 * kQ8Block + k] * (127.0f / 40.0f))));
  }
}

// Raw Q8_0 rows with every int8 value possible (-128 too: a foreign file may
// hold it, QuantizeQ8_0 never writes it) and random normal-range f16 scales,
// stored at a deliberately unaligned address.
struct RawWeights {
  std::vector<uint8_t> storage;
  const uint8_t* base = nullptr;
  WeightView view;
};

RawWeights MakeRaw(size_t rows, size_t cols, uint32_t seed, size_t misalign) {
  RawWeights t;
  const size_t bytes = rows * RowBytes(DType::kQ8_0, cols);
  t.storage.resize(bytes + misalign + 64);
  uint8_t* base = t.storage.data() + misalign;
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> q(-128, 127);
  std::uniform_real_distribution<float> scale(1e-4f, 2e-2f);
  for (size_t blk = 0; blk < bytes / kQ8BlockBytes; ++blk) {
    uint8_t* b = base + blk * kQ8BlockBytes;
    const uint16_t h = F32ToF16(blk % 5 == 0 ? -scale(rng) : scale(rng));
    b[0] = static_cast<uint8_t>(h & 0xff);
    b[1] = static_cast<uint8_t>(h >> 8);
    for (size_t i = 0; i < kQ8Block; ++i) b[2 + i] = static_cast<uint8_t>(q(rng));
  }
  t.base = base;
  t.view = WeightView{base, DType::kQ8_0, rows, cols};
  return t;
}

// The exact definition (kernels.h), written out here independently of the
// library, and the float64 value of the same quantized product with a bound.
struct Expected {
  std::vector<float> exact;  // [batch][rows]
  std::vector<double> ref;
  std::vector<double> bound;
};

Expected Reference(const float* x, size_t batch, const RawWeights& w) {
  const size_t rows = w.view.rows, cols = w.view.cols, blocks = cols / kQ8Block;
  std::vector<int8_t> qx(batch * cols);
  std::vector<float> dx(batch * blocks);
  QuantizeActivationsQ8(x, batch, cols, qx.data(), dx.data());
  Expected e;
  e.exact.resize(batch * rows);
  e.ref.resize(batch * rows);
  e.bound.resize(batch * rows);
  for (size_t b = 0; b < batch; ++b) {
    for (size_t r = 0; r < rows; ++r) {
      float acc = 0.0f;
      double ref = 0.0, mag = 0.0;
      for (size_t j = 0; j < blocks; ++j) {
        const uint8_t* blk = w.base + (r * blocks + j) * kQ8BlockBytes;
        int32_t sum = 0;
        for (size_t i = 0; i < kQ8Block; ++i) {
          sum += static_cast<int8_t>(blk[2 + i]) * qx[b * cols + j * kQ8Block + i];
        }
        const float dw = F16ToF32(ScaleBits(blk));
        acc = std::fma(static_cast<float>(sum), dw * dx[b * blocks + j], acc);
        const double term = static_cast<double>(sum) * dw * dx[b * blocks + j];
        ref += term;
        mag += std::fabs(term);
      }
      e.exact[b * rows + r] = acc;
      e.ref[b * rows + r] = ref;
      e.bound[b * rows + r] = (blocks + 2) * kU * mag + 1e-30;
    }
  }
  return e;
}

class Q8MatMulTest : public ::testing::TestWithParam<Isa> {};

// `lanes`: the view also carries the lane-order copy (PackQ8Lanes, packed
// here in two row ranges as threads would) and its data is withdrawn, so
// MatMul can only read the copy.
void CheckShape(Isa isa, size_t rows, size_t cols, size_t batch, size_t misalign,
                util::ThreadPool* pool, bool lanes = false) {
  RawWeights w = MakeRaw(rows, cols, static_cast<uint32_t>(rows * 131 + cols), misalign);
  util::AlignedBuffer<uint8_t> packed;
  WeightView view = w.view;
  if (lanes) {
    packed.Resize(Q8LaneBytes(rows, cols));
    const size_t mid = std::min(rows, (rows / 2 + kQ8LaneRows - 1) / kQ8LaneRows * kQ8LaneRows);
    PackQ8Lanes(w.base, rows, cols, packed.data(), 0, mid);
    PackQ8Lanes(w.base, rows, cols, packed.data(), mid, rows);
    view.q8_lanes = packed.data();
    view.data = nullptr;
  }
  auto x = RandomFloats(batch * cols, static_cast<uint32_t>(batch * 7 + cols), -2.0f, 2.0f);
  // An outlier per row, as real activations have: the block scales differ.
  for (size_t b = 0; b < batch; ++b) x[b * cols + (b * 37) % cols] = 40.0f;
  const Expected e = Reference(x.data(), batch, w);
  std::vector<float> y(batch * rows, -1.0f);
  MatMul(x.data(), batch, view, y.data(), pool);
  for (size_t i = 0; i < y.size(); ++i) {
    ASSERT_EQ(Bits(y[i]), Bits(e.exact[i]))
        << IsaName(isa) << (lanes ? " lanes" : "") << " rows=" << rows << " cols=" << cols
        << " batch=" << batch << " misalign=" << misalign << " at " << i << ": " << y[i] << " vs "
        << e.exact[i];
    ASSERT_LE(std::fabs(y[i] - e.ref[i]), e.bound[i]) << IsaName(isa) << " at " << i;
  }
}

TEST_P(Q8MatMulTest, DecodeBatchesEqualTheDefinitionBitForBit) {
  testing::ScopedIsa scoped(GetParam());
  util::ThreadPool pool(2);
  for (size_t batch = 1; batch <= 33; ++batch) {
    CheckShape(scoped.active(), 100, 96, batch, batch % 3, batch % 2 ? &pool : nullptr);
  }
  for (size_t rows : {1, 7, 15, 16, 17, 31, 33, 48})
    CheckShape(scoped.active(), rows, 64, 5, 1, &pool);
}

// Lane order (natively where Q8LanesUsed, else the scalar loop over it):
// the same bits as the rows, every batch, row count and thread split.
TEST_P(Q8MatMulTest, LaneOrderEqualsTheDefinitionBitForBit) {
  testing::ScopedIsa scoped(GetParam());
  util::ThreadPool pool(2);
  for (size_t batch = 1; batch <= 33; ++batch) {
    CheckShape(scoped.active(), 100, 96, batch, 0, batch % 2 ? &pool : nullptr, true);
  }
  for (size_t rows : {1, 7, 15, 16, 17, 31, 33, 48})
    CheckShape(scoped.active(), rows, 64, 5, 0, &pool, true);
  for (size_t batch : {1, 8, 64, 100})
    CheckShape(scoped.active(), 257, 1024, batch, 0, &pool, true);
}

// AMX-INT8 tiles (kAmx only): with the threshold at 1 every batch runs on
// TDPBSUD, and every output is the definition's bits: one and two A tiles,
// ragged x and W edges, odd and even block counts, a prefill batch across
// the kernel's 256-row x chunks, and the thread split.
TEST(Q8AmxTest, LaneOrderOnAmxTilesEqualsTheDefinitionBitForBit) {
  if (!IsaAvailable(Isa::kAmx)) GTEST_SKIP() << "this CPU (or OS) has no AMX-INT8";
  testing::ScopedIsa scoped(Isa::kAmx);
  ASSERT_EQ(scoped.active(), Isa::kAmx);
  EXPECT_TRUE(Q8AmxVerified());
  const size_t previous = SetQ8AmxMinBatchForTesting(1);
  EXPECT_TRUE(Q8AmxUsed(1));
  util::ThreadPool pool(2);
  for (size_t batch = 1; batch <= 33; ++batch) {
    CheckShape(scoped.active(), 100, 96, batch, 0, batch % 2 ? &pool : nullptr, true);
  }
  for (size_t cols : {32, 64, 96, 160}) CheckShape(scoped.active(), 33, cols, 17, 0, &pool, true);
  for (size_t batch : {1, 8, 64, 100, 300})
    CheckShape(scoped.active(), 257, 1024, batch, 0, &pool, true);
  CheckShape(scoped.active(), 48, 3072, 40, 0, nullptr, true);
  SetQ8AmxMinBatchForTesting(previous);
  if (previous > 1) {
    EXPECT_FALSE(Q8AmxUsed(previous - 1));
  }
  EXPECT_TRUE(Q8AmxUsed(previous));
}

// The start-up check that keeps a tile kernel which disagrees with the
// definition off the int8 path (Q8AmxVerified) tells a right kernel from a
// wrong one: one output's last bit off, in the second call of the row split.
void OneBitOff(const internal::Q8Args& a, size_t row_begin, size_t row_end) {
  internal::Q8LanesMatMulScalar(a, row_begin, row_end);
  if (row_begin == 0) return;
  uint32_t bits = Bits(a.y[row_begin]) ^ 1u;
  std::memcpy(&a.y[row_begin], &bits, sizeof bits);
}

TEST(Q8AmxTest, TheStartUpCheckTellsAWrongKernel) {
  EXPECT_TRUE(internal::Q8KernelAgreesWithDefinition(internal::Q8LanesMatMulScalar));
  EXPECT_FALSE(internal::Q8KernelAgreesWithDefinition(OneBitOff));
  if (!IsaAvailable(Isa::kAmx)) {
    EXPECT_FALSE(Q8AmxVerified());
  }
}

TEST(Q8LanesTest, LayoutAndSize) {
  const RawWeights w = MakeRaw(17, 64, 5, 0);
  EXPECT_EQ(Q8LaneBytes(17, 64), 2u * 2u * (16u * 32u + 16u * 4u));  // 2 groups of 2 blocks
  std::vector<uint8_t> out(Q8LaneBytes(17, 64));
  PackQ8Lanes(w.base, 17, 64, out.data(), 0, 17);
  const size_t blocks = 2, group = blocks * (16 * 32 + 16 * 4);
  for (size_t r = 0; r < 32; ++r) {
    for (size_t j = 0; j < blocks; ++j) {
      const uint8_t* g = out.data() + r / 16 * group;
      const uint8_t* blk = r < 17 ? w.base + (r * blocks + j) * kQ8BlockBytes : nullptr;
      for (size_t i = 0; i < kQ8Block; ++i) {
        const uint8_t want = blk != nullptr ? blk[2 + i] ^ 0x80u : 0x80u;
        ASSERT_EQ(g[j * 576 + i / 4 * 64 + r % 16 * 4 + i % 4], want) << r << " " << j << " " << i;
      }
      float scale;  // the block's 16 scales follow its values
      std::memcpy(&scale, g + j * 576 + 512 + r % 16 * 4, 4);
      EXPECT_EQ(scale, blk != nullptr ? F16ToF32(ScaleBits(blk)) : 0.0f) << r;
    }
  }
}

TEST_P(Q8MatMulTest, ModelShapesAndPrefillBatches) {
  testing::ScopedIsa scoped(GetParam());
  util::ThreadPool pool(2);
  for (size_t batch : {1, 8, 16, 64, 100}) CheckShape(scoped.active(), 257, 1024, batch, 3, &pool);
  CheckShape(scoped.active(), 96, 3072, 8, 0, &pool);
  CheckShape(scoped.active(), 40, 32, 70, 1, nullptr);
}

TEST_P(Q8MatMulTest, EveryRowOfABatchEqualsItsBatchOneCall) {
  testing::ScopedIsa scoped(GetParam());
  util::ThreadPool pool(2);
  const size_t rows = 70, cols = 256;
  const RawWeights w = MakeRaw(rows, cols, 5, 1);
  for (size_t batch : {2, 9, 17, 33, 65}) {
    auto x = RandomFloats(batch * cols, static_cast<uint32_t>(batch), -1.0f, 1.0f);
    std::vector<float> all(batch * rows), one(rows);
    MatMul(x.data(), batch, w.view, all.data(), &pool);
    for (size_t b = 0; b < batch; ++b) {
      MatMul(x.data() + b * cols, 1, w.view, one.data(), nullptr);
      for (size_t r = 0; r < rows; ++r) {
        ASSERT_EQ(Bits(all[b * rows + r]), Bits(one[r])) << IsaName(scoped.active()) << " b=" << b;
      }
    }
  }
}

TEST_P(Q8MatMulTest, NonFiniteActivationsStayInTheirRow) {
  testing::ScopedIsa scoped(GetParam());
  const size_t rows = 20, cols = 64;
  const RawWeights w = MakeRaw(rows, cols, 9, 0);
  auto x = RandomFloats(3 * cols, 3);
  x[cols + 5] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> y(3 * rows);
  MatMul(x.data(), 3, w.view, y.data(), nullptr);
  for (size_t r = 0; r < rows; ++r) {
    EXPECT_FALSE(std::isnan(y[r]));
    EXPECT_TRUE(std::isnan(y[rows + r]));
    EXPECT_FALSE(std::isnan(y[2 * rows + r]));
  }
}

// Quantized weights from f32 values approximate the f32 product: the error is
// the quantization's, a few parts per thousand of the row's magnitude.
TEST_P(Q8MatMulTest, ApproximatesTheF32Product) {
  testing::ScopedIsa scoped(GetParam());
  const size_t rows = 64, cols = 512;
  auto wf = RandomFloats(rows * cols, 11);
  std::vector<uint8_t> wq(rows * RowBytes(DType::kQ8_0, cols));
  QuantizeQ8_0(wf.data(), wf.size(), wq.data());
  auto x = RandomFloats(4 * cols, 12);
  std::vector<float> y(4 * rows);
  MatMul(x.data(), 4, WeightView{wq.data(), DType::kQ8_0, rows, cols}, y.data(), nullptr);
  for (size_t b = 0; b < 4; ++b) {
    for (size_t r = 0; r < rows; ++r) {
      double ref = 0, mag = 0;
      for (size_t c = 0; c < cols; ++c) {
        ref += double{wf[r * cols + c]} * x[b * cols + c];
        mag += std::fabs(double{wf[r * cols + c]} * x[b * cols + c]);
      }
      EXPECT_NEAR(y[b * rows + r], ref, 0.01 * mag) << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllIsas, Q8MatMulTest, ::testing::ValuesIn(testing::SupportedIsas()),
                         [](const auto& info) { return testing::IsaParamName(info.param); });

}  // namespace
}  // namespace cortiq::math
