#include "core/util/huge_buffer.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <utility>

namespace cortiq::util {
namespace {

TEST(HugeBufferTest, ZeroFilledAlignedAndRoundedToHugePages) {
  HugeBuffer<uint16_t> b(3 << 20);  // 6 MiB of elements
  ASSERT_NE(b.data(), nullptr);
  EXPECT_EQ(b.size(), size_t{3} << 20);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % HugeBuffer<uint16_t>::kHugePage, 0u);
  EXPECT_EQ(b.MemoryBytes(), size_t{6} << 20);
  for (size_t i = 0; i < b.size(); i += 4099) ASSERT_EQ(b.data()[i], 0) << i;
  b.data()[b.size() - 1] = 7;  // the whole range is writable
  EXPECT_EQ(b.data()[b.size() - 1], 7);

  HugeBuffer<uint16_t> small(1);
  EXPECT_EQ(small.MemoryBytes(), HugeBuffer<uint16_t>::kHugePage);
}

TEST(HugeBufferTest, EmptyAndMoves) {
  HugeBuffer<float> empty;
  EXPECT_EQ(empty.data(), nullptr);
  EXPECT_EQ(empty.MemoryBytes(), 0u);
  HugeBuffer<float> zero(0);
  EXPECT_EQ(zero.data(), nullptr);

  HugeBuffer<float> a(1000);
  a.data()[999] = 1.5f;
  float* p = a.data();
  HugeBuffer<float> b(std::move(a));
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(b.data()[999], 1.5f);
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from is empty
  EXPECT_EQ(a.size(), 0u);
  a = std::move(b);
  EXPECT_EQ(a.data(), p);
  EXPECT_EQ(b.MemoryBytes(), 0u);  // NOLINT(bugprone-use-after-move)
}

}  // namespace
}  // namespace cortiq::util
