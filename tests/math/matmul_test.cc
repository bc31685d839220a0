// MatMul on every ISA x dtype against a float64 reference, decode and GEMM
// paths, odd shapes, unaligned weights; plus the determinism contract
// (batch-invariant decode, thread-count-invariant results).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/math/kernels.h"
#include "core/util/aligned_buffer.h"
#include "core/util/thread_pool.h"
#include "tests/math/test_util.h"

namespace cortiq::math {
namespace {

using testing::Bits;
using testing::kU;
using testing::RandomFloats;

// A weight matrix stored in `dtype` at a deliberately unaligned address, and
// its exact f32 values for the reference.
struct TestWeights {
  std::vector<uint8_t> storage;
  std::vector<float> values;            // [rows][cols], exactly what the kernel reads
  util::AlignedBuffer<uint16_t> tiles;  // PackAmxTiles of the bf16 matrix (amx_tiles)
  WeightView view;
};

// `amx_tiles` (bf16 only): the view also carries the tile-order copy, as the
// model loader makes it on AMX (other ISAs ignore it).
TestWeights MakeWeights(size_t rows, size_t cols, DType dtype, uint32_t seed, size_t misalign,
                        bool bf16_activations = false, bool amx_tiles = false) {
  TestWeights t;
  auto f = RandomFloats(rows * cols, seed);
  const size_t es = DTypeSize(dtype);
  t.storage.resize(rows * cols * es + misalign + 64);
  uint8_t* base = t.storage.data() + misalign;
  ConvertFromF32(f.data(), dtype, rows * cols, base);
  t.values.resize(rows * cols);
  ConvertToF32(base, dtype, rows * cols, t.values.data());
  t.view = WeightView{base, dtype, rows, cols, bf16_activations};
  if (amx_tiles && dtype == DType::kBF16) {
    // The source is deliberately unaligned: copy it to 16-bit words first.
    std::vector<uint16_t> words(rows * cols);
    if (!words.empty()) std::memcpy(words.data(), base, words.size() * 2);
    t.tiles.Resize(AmxTileElements(rows, cols));
    PackAmxTiles(words.data(), rows, cols, t.tiles.data(), 0, rows);
    t.view.amx_tiles = t.tiles.data();
  }
  return t;
}

// Checks y against float64 for all outputs. The bound is probabilistic for
// random-sign data: f32 rounding errors of a length-K sum behave like a random
// walk, ~u * sqrt(K) * sum|x w|; we allow 2 sqrt(K) + 8 of those (the
// worst-case bound K * u * sum|x w| would hide a wrong tail or offset).
void ExpectMatMulClose(const std::vector<float>& x, size_t batch, const TestWeights& w,
                       const std::vector<float>& y, const std::string& what) {
  const size_t rows = w.view.rows, cols = w.view.cols;
  const double factor = kU * (2 * std::sqrt(static_cast<double>(cols)) + 8);
  for (size_t b = 0; b < batch; ++b) {
    for (size_t r = 0; r < rows; ++r) {
      double ref = 0, mag = 0;
      const float* xr = x.data() + b * cols;
      const float* wr = w.values.data() + r * cols;
      // bf16 activations: the reference is the product of the rounded x.
      const bool round = w.view.bf16_activations && w.view.dtype == DType::kBF16;
      for (size_t c = 0; c < cols; ++c) {
        const double xc = round ? RoundToBf16(xr[c]) : xr[c];
        ref += xc * wr[c];
        mag += std::fabs(xc * wr[c]);
      }
      ASSERT_LE(std::fabs(y[b * rows + r] - ref), factor * mag)
          << what << " b=" << b << " r=" << r << " got=" << y[b * rows + r] << " ref=" << ref;
    }
  }
}

std::string Describe(Isa isa, DType dt, size_t batch, size_t rows, size_t cols) {
  return std::string(IsaName(isa)) + "/" + DTypeName(dt) + " batch=" + std::to_string(batch) +
         " rows=" + std::to_string(rows) + " cols=" + std::to_string(cols);
}

// Sets GemmBf16Used for a scope.
class ScopedGemmBf16 {
 public:
  explicit ScopedGemmBf16(bool use) : previous_(SetGemmBf16ForTesting(use)) {}
  ~ScopedGemmBf16() { SetGemmBf16ForTesting(previous_); }
  ScopedGemmBf16(const ScopedGemmBf16&) = delete;
  ScopedGemmBf16& operator=(const ScopedGemmBf16&) = delete;

 private:
  bool previous_;
};

// (ISA, weight dtype, bf16 activations, AMX tile-order copy, GemmBf16Used:
// both prefill paths of bf16 activations where the ISA has VDPBF16PS)
class MatMulTest : public ::testing::TestWithParam<std::tuple<Isa, DType, bool, bool, bool>> {
 protected:
  Isa isa() const { return std::get<0>(GetParam()); }
  DType dtype() const { return std::get<1>(GetParam()); }
  bool bf16_act() const { return std::get<2>(GetParam()); }
  bool tiles() const { return std::get<3>(GetParam()); }
  TestWeights MakeW(size_t rows, size_t cols, uint32_t seed, size_t misalign) const {
    return MakeWeights(rows, cols, dtype(), seed, misalign, bf16_act(), tiles());
  }
  testing::ScopedIsa scoped_{std::get<0>(GetParam())};
  ScopedGemmBf16 gemm_bf16_{std::get<4>(GetParam())};
  util::ThreadPool pool_{3};
};

// Small and odd shapes on both paths: every tail of every blocking.
TEST_P(MatMulTest, SmallShapesMatchFloat64) {
  constexpr size_t g = kMatMulGemmMinBatch;  // first GEMM batch
  const size_t batches[] = {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 29, g - 1, g, g + 1, g + 13};
  const size_t shapes[][2] = {{1, 1},   {3, 5},   {8, 32},   {9, 33},  {17, 31},
                              {33, 64}, {40, 17}, {70, 100}, {64, 257}};
  uint32_t seed = 100;
  for (size_t batch : batches) {
    for (auto& s : shapes) {
      const size_t rows = s[0], cols = s[1];
      TestWeights w = MakeW(rows, cols, ++seed, 2);
      auto x = RandomFloats(batch * cols, ++seed);
      std::vector<float> y(batch * rows + 1, 42.0f);
      MatMul(x.data(), batch, w.view, y.data(), (seed % 2) ? &pool_ : nullptr);
      ExpectMatMulClose(x, batch, w, y, Describe(isa(), dtype(), batch, rows, cols));
      ASSERT_EQ(y[batch * rows], 42.0f) << "wrote past y";
    }
  }
}

// Big enough for several k-blocks, several row blocks per thread, and tails
// in every dimension of the GEMM.
TEST_P(MatMulTest, LargeShapesMatchFloat64) {
  // {batch, rows, cols, threaded}; single-threaded calls give one thread
  // several row blocks.
  constexpr size_t g = kMatMulGemmMinBatch;
  const size_t shapes[][4] = {
      {1, 1100, 600, 1}, {6, 517, 3000, 1}, {g + 6, 1100, 300, 0}, {g + 33, 100, 777, 1}};
  uint32_t seed = 500;
  for (auto& s : shapes) {
    const size_t batch = s[0], rows = s[1], cols = s[2];
    TestWeights w = MakeW(rows, cols, ++seed, 6);
    auto x = RandomFloats(batch * cols, ++seed);
    std::vector<float> y(batch * rows);
    MatMul(x.data(), batch, w.view, y.data(), s[3] ? &pool_ : nullptr);
    ExpectMatMulClose(x, batch, w, y, Describe(isa(), dtype(), batch, rows, cols));
  }
}

// Decode is batch-invariant: row b of a batched call equals a batch-1 call.
// 3100 columns: long rows, which the bf16 GEMV takes a column chunk at a
// time from batch 4 on (a ragged end of 28 columns).
TEST_P(MatMulTest, DecodeIsBatchInvariant) {
  for (auto [rows, cols] : {std::pair<size_t, size_t>{77, 300}, {45, 3100}}) {
    TestWeights w = MakeW(rows, cols, 7, 0);
    for (size_t batch = 2; batch < kMatMulGemmMinBatch; ++batch) {
      auto x = RandomFloats(batch * cols, 8 + batch);
      std::vector<float> y(batch * rows), y1(rows);
      MatMul(x.data(), batch, w.view, y.data(), &pool_);
      for (size_t b = 0; b < batch; ++b) {
        MatMul(x.data() + b * cols, 1, w.view, y1.data(), nullptr);
        for (size_t r = 0; r < rows; ++r) {
          ASSERT_EQ(Bits(y[b * rows + r]), Bits(y1[r]))
              << "cols=" << cols << " batch=" << batch << " b=" << b << " r=" << r;
        }
      }
    }
  }
}

// A mixed batch (an engine step): its decode rows are bit-equal to batch-1
// calls and its other rows to the same rows in a GEMM-sized call, whatever
// else shares the call (a chunk of 1 row or of 5 takes the GEMM too).
TEST_P(MatMulTest, SplitRowsMatchTheirOwnPaths) {
  const size_t rows = 77, cols = 300, g = kMatMulGemmMinBatch;
  TestWeights w = MakeW(rows, cols, 11, 0);
  // The GEMM rows' reference: all of them in one call of at least g rows.
  auto big = RandomFloats((g + 9) * cols, 12);
  std::vector<float> ref(big.size() / cols * rows);
  MatMul(big.data(), g + 9, w.view, ref.data(), &pool_);
  for (auto [gemv_rows, gemm_rows] : {std::pair<size_t, size_t>{0, 1},
                                      {0, 5},
                                      {3, 1},
                                      {8, 20},
                                      {31, g + 9},
                                      {g + 2, 4},
                                      {5, 0}}) {
    const size_t batch = gemv_rows + gemm_rows;
    std::vector<float> x(batch * cols);
    auto dec = RandomFloats(gemv_rows * cols + 1, 13 + gemv_rows);
    std::copy_n(dec.begin(), gemv_rows * cols, x.begin());
    std::copy_n(big.begin(), gemm_rows * cols, x.begin() + gemv_rows * cols);
    std::vector<float> y(batch * rows + 1, 42.0f), y1(rows);
    MatMulSplit(x.data(), batch, gemv_rows, w.view, y.data(), &pool_);
    ASSERT_EQ(y[batch * rows], 42.0f) << "wrote past y";
    for (size_t b = 0; b < gemv_rows; ++b) {
      MatMul(x.data() + b * cols, 1, w.view, y1.data(), nullptr);
      ASSERT_EQ(0, std::memcmp(y.data() + b * rows, y1.data(), rows * 4))
          << "decode row " << b << " of " << gemv_rows << " + " << gemm_rows;
    }
    for (size_t b = 0; b < gemm_rows; ++b) {
      ASSERT_EQ(0, std::memcmp(y.data() + (gemv_rows + b) * rows, ref.data() + b * rows, rows * 4))
          << "chunk row " << b << " of " << gemv_rows << " + " << gemm_rows;
    }
  }
}

// The thread count never changes a result, on either path.
TEST_P(MatMulTest, ThreadCountDoesNotChangeResults) {
  const size_t rows = 700, cols = 300;
  TestWeights w = MakeW(rows, cols, 9, 0);
  util::ThreadPool two(2);
  for (size_t batch : {size_t{1}, size_t{5}, size_t{16}, kMatMulGemmMinBatch + 31}) {
    auto x = RandomFloats(batch * cols, 10 + batch);
    std::vector<float> a(batch * rows), b(batch * rows), c(batch * rows);
    MatMul(x.data(), batch, w.view, a.data(), nullptr);
    MatMul(x.data(), batch, w.view, b.data(), &two);
    MatMul(x.data(), batch, w.view, c.data(), &pool_);
    ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << "batch=" << batch;
    ASSERT_EQ(0, std::memcmp(a.data(), c.data(), a.size() * 4)) << "batch=" << batch;
  }
}

TEST_P(MatMulTest, DegenerateShapes) {
  TestWeights w = MakeW(5, 0, 11, 0);
  std::vector<float> y(3 * 5, 42.0f);
  MatMul(nullptr, 3, w.view, y.data(), &pool_);  // cols == 0: y = 0
  for (float v : y) EXPECT_EQ(v, 0.0f);
  TestWeights w2 = MakeW(0, 8, 12, 0);
  MatMul(nullptr, 3, w2.view, nullptr, &pool_);  // rows == 0: nothing
  TestWeights w3 = MakeW(4, 8, 13, 0);
  MatMul(nullptr, 0, w3.view, nullptr, &pool_);  // batch == 0: nothing
}

// Values far from 1 (large K, mixed magnitudes) keep the relative bound.
TEST_P(MatMulTest, WideDynamicRange) {
  const size_t rows = 40, cols = 2000;
  TestWeights w = MakeW(rows, cols, 14, 0);
  for (size_t batch : {size_t{20}, kMatMulGemmMinBatch + 2}) {
    auto x = RandomFloats(batch * cols, 15);
    for (size_t i = 0; i < x.size(); ++i) x[i] *= (i % 7 == 0) ? 1000.0f : 0.001f;
    std::vector<float> y(batch * rows);
    MatMul(x.data(), batch, w.view, y.data(), &pool_);
    ExpectMatMulClose(x, batch, w, y, "wide range batch " + std::to_string(batch));
  }
}

// The tile order itself, element by element, against its definition
// (kernels.h), ragged edges zero.
TEST(AmxTilesTest, PackMatchesTheDefinition) {
  for (auto [rows, cols] :
       {std::pair<size_t, size_t>{16, 32}, {17, 33}, {5, 70}, {48, 31}, {32, 70}, {16, 1024}}) {
    std::vector<uint16_t> w(rows * cols);
    for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<uint16_t>(i * 7 + 1);
    const size_t kb = (cols + 31) / 32, nb = (rows + 15) / 16;
    ASSERT_EQ(AmxTileElements(rows, cols), nb * kb * 512);
    std::vector<uint16_t> out(AmxTileElements(rows, cols), 0xFFFF);
    // In two row ranges, as threads would.
    const size_t split = rows > 16 ? 16 : rows;
    PackAmxTiles(w.data(), rows, cols, out.data(), 0, split);
    PackAmxTiles(w.data(), rows, cols, out.data(), split, rows);
    for (size_t i = 0; i < nb; ++i) {
      for (size_t j = 0; j < kb; ++j) {
        for (size_t p = 0; p < 16; ++p) {
          for (size_t n = 0; n < 16; ++n) {
            for (size_t e = 0; e < 2; ++e) {
              const size_t r = 16 * i + n, c = 32 * j + 2 * p + e;
              const uint16_t want = r < rows && c < cols ? w[r * cols + c] : 0;
              ASSERT_EQ(out[(i * kb + j) * 512 + p * 32 + n * 2 + e], want)
                  << rows << "x" << cols << " tile " << i << "," << j << " p=" << p << " n=" << n;
            }
          }
        }
      }
    }
  }
}

// On tile-order weights every batch, decode-sized or prefill-sized, computes
// each row bit-identically to a batch-1 call (and so one long prefill, a
// chunked one and token-by-token decode project the same values), and agrees
// with the in-place bf16 path's rounded-input reference.
TEST(AmxTilesTest, EveryBatchIsBitIdenticalToBatchOne) {
  testing::ScopedIsa isa(Isa::kAmx);
  // (Other ISAs ignore the tiles; their GEMM sums prefill-sized batches in
  // another order than decode: see MatMulTest.DecodeIsBatchInvariant.)
  if (isa.active() != Isa::kAmx) GTEST_SKIP() << "this CPU has no AMX";
  ASSERT_TRUE(AmxTilesUsed());
  util::ThreadPool pool(3);
  for (auto [rows, cols] : {std::pair<size_t, size_t>{77, 300}, {64, 1024}, {33, 31}}) {
    TestWeights w = MakeWeights(rows, cols, DType::kBF16, 21 + rows, 0, true, true);
    for (size_t batch : {1, 2, 7, 15, 16, 17, 31, 33, 63, 64, 65, 130, 257}) {
      auto x = RandomFloats(batch * cols, 30 + batch);
      std::vector<float> y(batch * rows + 1, 42.0f), y1(rows);
      MatMul(x.data(), batch, w.view, y.data(), &pool);
      ASSERT_EQ(y[batch * rows], 42.0f) << "wrote past y";
      ExpectMatMulClose(x, batch, w, y, "tiles batch " + std::to_string(batch));
      for (size_t b = 0; b < batch; ++b) {
        MatMul(x.data() + b * cols, 1, w.view, y1.data(), nullptr);
        for (size_t r = 0; r < rows; ++r) {
          ASSERT_EQ(Bits(y[b * rows + r]), Bits(y1[r]))
              << rows << "x" << cols << " batch=" << batch << " b=" << b << " r=" << r;
        }
      }
    }
  }
}

std::vector<std::tuple<Isa, DType, bool, bool, bool>> Params() {
  std::vector<std::tuple<Isa, DType, bool, bool, bool>> out;
  for (Isa isa : testing::SupportedIsas()) {
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
      out.emplace_back(isa, dt, false, false, true);
    }
    out.emplace_back(isa, DType::kBF16, true, false, true);
    if (isa >= Isa::kAvx512Bf16) out.emplace_back(isa, DType::kBF16, true, false, false);
    out.emplace_back(isa, DType::kBF16, true, true, true);
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(IsasAndDtypes, MatMulTest, ::testing::ValuesIn(Params()),
                         [](const auto& info) {
                           return std::string(IsaName(std::get<0>(info.param))) + "_" +
                                  DTypeName(std::get<1>(info.param)) +
                                  (std::get<2>(info.param) ? "_bf16act" : "") +
                                  (std::get<3>(info.param) ? "_tiles" : "") +
                                  (std::get<4>(info.param) ? "" : "_fma");
                         });

}  // namespace
}  // namespace cortiq::math
