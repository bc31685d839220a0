// KvRows' plain row buffers (under 1 MiB) of 128 KiB and more are pages of
// the process's PagePool: a released session's K/V pages serve the next
// session's reservation (no fresh mapping, no page faults), which reads
// back only its own rows; paged buffers (1 MiB and more, committed in
// place) never enter the pool, since most of their pages are not resident.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "core/kv/kv_rows.h"
#include "core/util/page_pool.h"
#include "tests/kv/kv_test_util.h"

namespace cortiq::kv {
namespace {

using kvtest::RandomVec;

constexpr size_t kH = 8, kD = 128;  // the Qwen3-0.6B shape: one 4 KiB page per f32 row

class KvRowsPoolTest : public ::testing::Test {
 protected:
  void SetUp() override { pool().SetCapacity(size_t{64} << 20); }
  void TearDown() override { pool().SetCapacity(0); }
  static util::PagePool& pool() { return util::PagePool::Global(); }
};

void Append(KvRows& r, std::mt19937& rng, size_t n, std::vector<std::vector<float>>* keys) {
  for (size_t i = 0; i < n; ++i) {
    std::vector<float> k = RandomVec(rng, kH * kD);
    r.Append(k, RandomVec(rng, kH * kD), {});
    keys->push_back(std::move(k));
  }
}

TEST_F(KvRowsPoolTest, AReleasedSessionsPagesServeTheNextReservation) {
  std::mt19937 rng(7);
  const size_t block = kH * 64 * kD * sizeof(float);  // 256 KiB per K or V buffer
  {
    KvRows first(kH, kD, KvMode::kF32);
    first.Reserve(64);
    std::vector<std::vector<float>> keys;
    Append(first, rng, 64, &keys);
  }
  ASSERT_EQ(pool().held_bytes(), 2 * block);
  const uint64_t mapped = pool().mapped_bytes(), reused = pool().reused_bytes();

  KvRows second(kH, kD, KvMode::kF32);
  second.Reserve(36);
  const size_t used = kH * 36 * kD * sizeof(float);
  EXPECT_EQ(pool().mapped_bytes(), mapped);  // nothing faulted in fresh
  EXPECT_EQ(pool().reused_bytes(), reused + 2 * used);
  EXPECT_EQ(pool().held_bytes(), 2 * (block - used));
  EXPECT_EQ(second.MemoryBytes(), KvRows::ProjectedBytes(kH, kD, KvMode::kF32, 36));
  // Its rows are its own: what it appends reads back, nothing else.
  std::vector<std::vector<float>> keys;
  Append(second, rng, 36, &keys);
  for (size_t h = 0; h < kH; ++h) {
    const HeadRowsView v = second.Head(h);
    ASSERT_EQ(v.keys.size(), 36 * kD);
    for (size_t t = 0; t < 36; ++t) {
      for (size_t d = 0; d < kD; ++d) ASSERT_EQ(v.keys[t * kD + d], keys[t][h * kD + d]);
    }
  }
}

TEST_F(KvRowsPoolTest, PagedBuffersNeverEnterThePool) {
  std::mt19937 rng(8);
  {
    KvRows big(kH, kD, KvMode::kF32);
    big.Reserve(300);  // 1.2 MB per buffer: paged, 450 rows of room reserved
    std::vector<std::vector<float>> keys;
    Append(big, rng, 300, &keys);
  }
  EXPECT_EQ(pool().held_bytes(), 0u);
}

}  // namespace
}  // namespace cortiq::kv
