// PagePool: freed ranges kept resident up to the capacity and handed out
// again zeroed, best fit, merged with their neighbours; everything else
// unmapped. Residency is read with mincore(2), which fails with ENOMEM on
// an unmapped page.
#include "core/util/page_pool.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/util/aligned_buffer.h"

namespace cortiq::util {
namespace {

const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));

// Whether every page of [p, p + bytes) is mapped (and, if so, resident).
bool Mapped(const void* p, size_t bytes) {
  std::vector<unsigned char> v(bytes / kPage);
  return mincore(const_cast<void*>(p), bytes, v.data()) == 0;
}
bool Resident(const void* p, size_t bytes) {
  std::vector<unsigned char> v(bytes / kPage);
  if (mincore(const_cast<void*>(p), bytes, v.data()) != 0) return false;
  return std::all_of(v.begin(), v.end(), [](unsigned char c) { return (c & 1) != 0; });
}
bool AllZero(const void* p, size_t bytes) {
  const auto* c = static_cast<const unsigned char*>(p);
  return std::all_of(c, c + bytes, [](unsigned char x) { return x == 0; });
}

TEST(PagePoolTest, WithoutCapacityAGivenRangeIsUnmapped) {
  PagePool pool;
  void* p = pool.Take(64 * kPage);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kPage, 0u);
  EXPECT_TRUE(Resident(p, 64 * kPage));
  EXPECT_TRUE(AllZero(p, 64 * kPage));
  EXPECT_EQ(pool.mapped_bytes(), 64 * kPage);
  pool.Give(p, 64 * kPage);
  EXPECT_EQ(pool.held_bytes(), 0u);
  EXPECT_FALSE(Mapped(p, 64 * kPage));
}

TEST(PagePoolTest, AKeptRangeComesBackZeroedAtTheSameAddress) {
  PagePool pool;
  pool.SetCapacity(1024 * kPage);
  auto* p = static_cast<unsigned char*>(pool.Take(64 * kPage));
  std::memset(p, 0xab, 64 * kPage);  // another session's rows
  pool.Give(p, 64 * kPage);
  EXPECT_EQ(pool.held_bytes(), 64 * kPage);
  EXPECT_TRUE(Resident(p, 64 * kPage));
  void* q = pool.Take(64 * kPage);
  EXPECT_EQ(q, p);
  EXPECT_TRUE(AllZero(q, 64 * kPage));
  EXPECT_EQ(pool.held_bytes(), 0u);
  EXPECT_EQ(pool.reused_bytes(), 64 * kPage);
  EXPECT_EQ(pool.mapped_bytes(), 64 * kPage);
  pool.Give(q, 64 * kPage);
}

TEST(PagePoolTest, BestFitSplitsAndMerges) {
  PagePool pool;
  pool.SetCapacity(1024 * kPage);
  auto* big = static_cast<char*>(pool.Take(64 * kPage));
  // Kept out of the pool until the end, so that `small` cannot sit right
  // next to `big` (the kernel places new mappings next to each other).
  void* spacer = pool.Take(4 * kPage);
  auto* small = static_cast<char*>(pool.Take(8 * kPage));
  pool.Give(big, 64 * kPage);
  pool.Give(small, 8 * kPage);
  ASSERT_EQ(pool.held_bytes(), 72 * kPage);
  // 6 pages: the 8-page range (the smallest that fits), its tail kept.
  auto* a = static_cast<char*>(pool.Take(6 * kPage));
  EXPECT_EQ(a, small);
  // 36 pages: the head of the 64-page range; then its 28-page tail.
  auto* b = static_cast<char*>(pool.Take(36 * kPage));
  EXPECT_EQ(b, big);
  auto* c = static_cast<char*>(pool.Take(28 * kPage));
  EXPECT_EQ(c, big + 36 * kPage);
  EXPECT_EQ(pool.held_bytes(), 2 * kPage);
  // Given back in any order, the pieces of the big range merge into one
  // run of 64 pages again.
  pool.Give(c, 28 * kPage);
  pool.Give(b, 36 * kPage);
  EXPECT_EQ(pool.Take(64 * kPage), big);
  EXPECT_EQ(pool.mapped_bytes(), 76 * kPage);  // nothing new was mapped
  pool.Give(big, 64 * kPage);
  pool.Give(a, 6 * kPage);
  EXPECT_EQ(pool.held_bytes(), 72 * kPage);
  pool.Give(spacer, 4 * kPage);
  EXPECT_EQ(pool.held_bytes(), 76 * kPage);
}

TEST(PagePoolTest, NothingBeyondTheCapacityStays) {
  PagePool pool;
  pool.SetCapacity(100 * kPage);
  void* a = pool.Take(64 * kPage);
  void* b = pool.Take(64 * kPage);
  pool.Give(a, 64 * kPage);
  pool.Give(b, 64 * kPage);  // 128 pages would exceed 100: unmapped
  EXPECT_EQ(pool.held_bytes(), 64 * kPage);
  EXPECT_TRUE(Resident(a, 64 * kPage));
  EXPECT_FALSE(Mapped(b, 64 * kPage));
  // Lowering the capacity unmaps what no longer fits.
  pool.SetCapacity(32 * kPage);
  EXPECT_EQ(pool.held_bytes(), 0u);
  EXPECT_FALSE(Mapped(a, 64 * kPage));
}

TEST(PagePoolTest, AnIdlePoolIsReleasedOnlyAfterTheIdleTime) {
  using std::chrono::seconds;
  PagePool pool;
  pool.SetCapacity(1024 * kPage);
  const auto taken = PagePool::Clock::now();
  void* p = pool.Take(32 * kPage);
  pool.Give(p, 32 * kPage);
  // The reaper's clock, scripted: 10 s after the last Take nothing goes;
  // 40 s after it (idle 30 s) everything does.
  EXPECT_EQ(pool.ReleaseIfIdle(taken + seconds(10), seconds(30)), 0u);
  EXPECT_TRUE(Resident(p, 32 * kPage));
  EXPECT_EQ(pool.ReleaseIfIdle(taken + seconds(40), seconds(30)), 32 * kPage);
  EXPECT_EQ(pool.held_bytes(), 0u);
  EXPECT_FALSE(Mapped(p, 32 * kPage));
}

// AlignedBuffer's buffers from PagePool::kMinBytes on are the global pool's:
// a freed K/V-sized buffer's pages serve the next one, zeroed.
TEST(PagePoolTest, AlignedBuffersReuseTheGlobalPoolsPages) {
  PagePool& pool = PagePool::Global();
  pool.SetCapacity(64 << 20);
  const size_t n = (256 << 10) / sizeof(float);  // 256 KiB: one 64-position K block
  const float* first = nullptr;
  {
    AlignedBuffer<float> a(n);
    first = a.data();
    std::fill(a.begin(), a.end(), 3.0f);
  }
  EXPECT_EQ(pool.held_bytes(), AlignedBuffer<float>::BytesFor(n));
  {
    AlignedBuffer<float> b(n / 2);  // a smaller one: the same pages' head
    EXPECT_EQ(b.data(), first);
    EXPECT_TRUE(AllZero(b.data(), b.MemoryBytes()));
    EXPECT_EQ(pool.held_bytes(), AlignedBuffer<float>::BytesFor(n) - b.MemoryBytes());
  }
  // Small buffers stay on the heap.
  { AlignedBuffer<float> s(1000); }
  EXPECT_EQ(pool.held_bytes(), AlignedBuffer<float>::BytesFor(n));
  pool.SetCapacity(0);
  EXPECT_EQ(pool.held_bytes(), 0u);
  EXPECT_FALSE(Mapped(first, AlignedBuffer<float>::BytesFor(n)));
}

}  // namespace
}  // namespace cortiq::util
