// Sanity of the benchmark ceilings: positive, finite, and in a plausible
// range (they are measured, so only loose bounds are honest).
#include "core/math/bench_util.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/util/thread_pool.h"

namespace cortiq::math {
namespace {

TEST(BenchUtilTest, ReadBandwidthIsPlausible) {
  util::ThreadPool pool(2);
  const double gbs = MeasureReadBandwidthGBs(size_t{64} << 20, &pool);
  EXPECT_TRUE(std::isfinite(gbs));
  EXPECT_GT(gbs, 0.1);
  EXPECT_LT(gbs, 10000.0);
  EXPECT_GT(MeasureReadBandwidthGBs(size_t{8} << 20, nullptr), 0.1);
  EXPECT_EQ(MeasureReadBandwidthGBs(100, nullptr), 0.0);  // less than one 4 KiB slice
}

TEST(BenchUtilTest, FmaPeakIsPlausible) {
  const double gflops = MeasureFmaPeakGflops(nullptr);
  EXPECT_TRUE(std::isfinite(gflops));
  EXPECT_GT(gflops, 0.5);
  EXPECT_LT(gflops, 100000.0);
}

}  // namespace
}  // namespace cortiq::math
