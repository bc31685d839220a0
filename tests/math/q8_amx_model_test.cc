// The AMX-INT8 kernel's schedule on a software model of its tiles
// (q8_amx_model_avx512.cc): every output bit-identical to the definition
// (Q8LanesMatMulScalar), on any CPU with AVX-512.
#include <gtest/gtest.h>

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

using testing::RandomFloats;

// W in lane order and x as MatMul prepares them for the kernel (qx padded
// to whole A tiles, dx and the block corrections), the rows in calls of
// `split` as the pool splits them.
void Check(size_t rows, size_t cols, size_t batch, size_t split) {
  auto wf = RandomFloats(rows * cols, static_cast<uint32_t>(rows * 7 + cols));
  std::vector<uint8_t> q(rows * RowBytes(DType::kQ8_0, cols));
  QuantizeQ8_0(wf.data(), wf.size(), q.data());
  util::AlignedBuffer<uint8_t> lanes(Q8LaneBytes(rows, cols));
  PackQ8Lanes(q.data(), rows, cols, lanes.data(), 0, rows);
  auto x = RandomFloats(batch * cols, static_cast<uint32_t>(batch * 3 + cols), -3.0f, 3.0f);
  for (size_t b = 0; b < batch; ++b) x[b * cols + (b * 37) % cols] = 40.0f;  // outliers
  EXPECT_EQ(internal::Q8LanesKernelFirstMismatch(internal::Q8LanesMatMulAmxModel, lanes.data(),
                                                 rows, cols, x.data(), batch, split),
            batch * rows)
      << "rows=" << rows << " cols=" << cols << " batch=" << batch << " split=" << split;
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
