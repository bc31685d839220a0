// LayerKvCache allocation behaviour: after Reserve, a decode step (Append +
// Attend + AttendGroup + TruncateLast) allocates nothing.
//
// This binary replaces the global operator new (every C++ allocation) and
// interposes aligned_alloc (what util::AlignedBuffer uses) with counting
// versions; it is its own binary so no other test runs with them. Positive
// controls prove the hooks see both kinds of allocation. Under ASan (which
// owns the allocator) the test is skipped.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <random>
#include <vector>

#include "core/kv/layer_kv_cache.h"

#if defined(__SANITIZE_ADDRESS__)
#define CORTIQ_COUNT_ALLOCS 0
#else
#define CORTIQ_COUNT_ALLOCS 1
#endif

namespace {
std::atomic<bool> g_counting{false};
std::atomic<size_t> g_allocs{0};
void Note() {
  if (g_counting.load(std::memory_order_relaxed)) {
    g_allocs.fetch_add(1, std::memory_order_relaxed);
  }
}
}  // namespace

#if CORTIQ_COUNT_ALLOCS
// glibc's own entry points: forwarding to them (rather than malloc/free)
// keeps the hooks out of the compiler's new/delete pairing analysis.
// NOLINTBEGIN(bugprone-reserved-identifier)
extern "C" void* __libc_memalign(size_t alignment, size_t size);
extern "C" void* __libc_malloc(size_t size);
extern "C" void __libc_free(void* p);
// NOLINTEND(bugprone-reserved-identifier)

extern "C" void* aligned_alloc(size_t alignment, size_t size) noexcept {
  Note();
  return __libc_memalign(alignment, size);
}

void* operator new(size_t n) {
  Note();
  if (void* p = __libc_malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { __libc_free(p); }
void operator delete[](void* p) noexcept { __libc_free(p); }
void operator delete(void* p, size_t) noexcept { __libc_free(p); }
void operator delete[](void* p, size_t) noexcept { __libc_free(p); }
#endif

namespace cortiq::kv {
namespace {

size_t CountAllocs(const auto& fn) {
  g_allocs = 0;
  g_counting = true;
  fn();
  g_counting = false;
  return g_allocs.load();
}

TEST(LayerKvCacheAllocTest, DecodeAfterReserveDoesNotAllocate) {
  if (!CORTIQ_COUNT_ALLOCS) GTEST_SKIP() << "allocator owned by the sanitizer";
  for (KvMode mode : {KvMode::kF32, KvMode::kInt8}) {
    const size_t H = 4, D = 64, G = 2, kPositions = 300;
    std::mt19937 rng(1);
    std::normal_distribution<float> nd;
    std::vector<float> k(H * D), v(H * D), q(G * D), out(G * D);
    for (auto& x : k) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    for (auto& x : q) x = nd(rng);

    // Positive controls: the hooks see operator new and aligned_alloc.
    EXPECT_GT(CountAllocs([] {
                std::vector<int> x(10);
                (void)x;
              }),
              0u);
    LayerKvCache grow(H, D, mode);
    EXPECT_GT(CountAllocs([&] { grow.Append(k, v); }), 0u);

    LayerKvCache c(H, D, mode);
    c.Reserve(kPositions);
    std::vector<float> probs(c.GroupProbsSize(G)), imp(kPositions);
    const bool alive_all[H] = {true, true, true, true};
    const size_t n = CountAllocs([&] {
      for (size_t t = 0; t < kPositions; ++t) {
        c.Append(k, v, {alive_all, H});
        for (size_t kv = 0; kv < H; ++kv) {
          c.AttendGroup(q, kv, G, out, probs, imp, {.softcap = 30.0f});
          c.Attend(std::span<const float>(q).first(D), kv, std::span<float>(out).first(D), probs);
        }
        if (t % 10 == 9) {  // a rejected speculative token, appended again
          EXPECT_TRUE(c.TruncateLast(1).ok());
          c.Append(k, v);
        }
      }
    });
    EXPECT_EQ(n, 0u) << KvModeName(mode);
    EXPECT_EQ(c.capacity(), kPositions);
    EXPECT_EQ(c.seq_len(), kPositions);
  }
}

TEST(LayerKvCacheAllocTest, GrowthIsGeometric) {
  if (!CORTIQ_COUNT_ALLOCS) GTEST_SKIP() << "allocator owned by the sanitizer";
  LayerKvCache c(2, 8);
  std::vector<float> row(16, 1.0f);
  const size_t n = CountAllocs([&] {
    for (int t = 0; t < 1000; ++t) c.Append(row, row);
  });
  // Capacities 16, 32, ..., 1024: 7 reallocations of K and V, plus the
  // head-length array once.
  EXPECT_EQ(c.capacity(), 1024u);
  EXPECT_EQ(n, 1u + 2u * 7u);
}

}  // namespace
}  // namespace cortiq::kv
