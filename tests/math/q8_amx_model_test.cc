// The AMX-INT8 kernel's schedule on a software model of its tiles
// (q8_amx_model_avx512.cc): every output bit-identical to the definition
// (Q8LanesMatMulScalar), on any CPU with AVX-512.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/math/kernels.h"
#include "core/math/kernels_internal.h"
#include "core/util/aligned_buffer.h"
#include "tests/math/test_util.h"

namespace cortiq::math::internal {
void Q8LanesMatMulAmxModel(const Q8Args& a, size_t row_begin, size_t row_end);
}

namespace cortiq::math {
namespace {

using testing::Bits;
using testing::RandomFloats;

// x and W as MatMul prepares them for the kernel (matmul.cc's Q8): qx padded
// to whole A tiles, ux, dx and the block corrections; W in lane order.
void Check(size_t rows, size_t cols, size_t batch, size_t split) {
  const size_t blocks = cols / kQ8Block;
  auto wf = RandomFloats(rows * cols, static_cast<uint32_t>(rows * 7 + cols));
  std::vector<uint8_t> q(rows * RowBytes(DType::kQ8_0, cols));
  QuantizeQ8_0(wf.data(), wf.size(), q.data());
  util::AlignedBuffer<uint8_t> lanes(Q8LaneBytes(rows, cols));
  PackQ8Lanes(q.data(), rows, cols, lanes.data(), 0, rows);
  auto x = RandomFloats(batch * cols, static_cast<uint32_t>(batch * 3 + cols), -3.0f, 3.0f);
  for (size_t b = 0; b < batch; ++b) x[b * cols + (b * 37) % cols] = 40.0f;  // outliers
  const size_t qrows = (batch + 15) / 16 * 16;
  std::vector<int8_t> qx(qrows * cols, 0);  // rows past the batch stay zero
  std::vector<uint8_t> ux(batch * cols);
  std::vector<float> dx(batch * blocks);
  std::vector<int32_t> corr(batch * blocks);
  internal::QuantizeQ8Args(x.data(), batch, cols, qx.data(), ux.data(), dx.data(), corr.data());
  internal::Q8Args a;
  a.qx = qx.data();
  a.ux = ux.data();
  a.dx = dx.data();
  a.batch = batch;
  a.w = q.data();
  a.lanes = lanes.data();
  a.rows = rows;
  a.cols = cols;
  a.corr = corr.data();
  std::vector<float> want(batch * rows, -1.0f), got(batch * rows, -2.0f);
  a.y = want.data();
  internal::Q8LanesMatMulScalar(a, 0, rows);
  a.y = got.data();
  // Row ranges as the pool splits them (multiples of 16).
  for (size_t r0 = 0; r0 < rows; r0 += split) {
    internal::Q8LanesMatMulAmxModel(a, r0, std::min(rows, r0 + split));
  }
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(Bits(got[i]), Bits(want[i]))
        << "rows=" << rows << " cols=" << cols << " batch=" << batch << " split=" << split << " at "
        << i << ": " << got[i] << " vs " << want[i];
  }
}

TEST(Q8AmxModelTest, EveryScheduleEqualsTheDefinitionBitForBit) {
  if (!IsaAvailable(Isa::kAvx512)) GTEST_SKIP() << "the model's kernel needs AVX-512";
  for (size_t batch = 1; batch <= 33; ++batch) Check(100, 96, batch, 48);
  for (size_t cols : {32, 64, 96, 160}) Check(33, cols, 17, 16);  // odd and even block counts
  Check(257, 1024, 300, 128);  // two x chunks of the prefill schedule, ragged W
  Check(48, 3072, 40, 48);
  Check(7, 64, 65, 16);
  // and it passes the check Q8AmxVerified runs on the real tiles
  EXPECT_TRUE(internal::Q8KernelAgreesWithDefinition(internal::Q8LanesMatMulAmxModel));
}

}  // namespace
}  // namespace cortiq::math
