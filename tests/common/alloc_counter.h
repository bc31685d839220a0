// Counts heap allocations and live heap bytes in a test binary by replacing
// the global operator new / delete (plain, nothrow and aligned forms).
// Include it in exactly ONE translation unit of a binary (every test binary
// here is a single .cc file) and read AllocCount() / LiveBytes() around the
// code under test. std::aligned_alloc (util::AlignedBuffer) is not seen.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>

namespace cortiq::testing {
inline std::atomic<size_t> g_alloc_count{0};
inline std::atomic<long long> g_live_bytes{0};
// operator new calls since the process started.
inline size_t AllocCount() { return g_alloc_count.load(std::memory_order_relaxed); }

// Heap allocations made while fn() runs.
template <typename Fn>
size_t AllocationsDuring(Fn&& fn) {
  const size_t before = AllocCount();
  fn();
  return AllocCount() - before;
}
// Bytes currently held through the unaligned operator new.
inline long long LiveBytes() { return g_live_bytes.load(std::memory_order_relaxed); }

namespace internal {
inline constexpr size_t kHeader = 16;  // keeps operator new's 16-byte alignment
// noinline: GCC otherwise sees malloc/free through the replaced operators
// and warns about mismatched allocation functions.
__attribute__((noinline)) inline void* CountedAlloc(size_t n) {
  void* base = std::malloc(n + kHeader);
  if (base == nullptr) return nullptr;
  std::memcpy(base, &n, sizeof(n));
  g_alloc_count.fetch_add(1, std::memory_order_relaxed);
  g_live_bytes.fetch_add(static_cast<long long>(n), std::memory_order_relaxed);
  return static_cast<char*>(base) + kHeader;
}
__attribute__((noinline)) inline void CountedFree(void* p) {
  if (p == nullptr) return;
  void* base = static_cast<char*>(p) - kHeader;
  size_t n;
  std::memcpy(&n, base, sizeof(n));
  g_live_bytes.fetch_sub(static_cast<long long>(n), std::memory_order_relaxed);
  std::free(base);
}
inline void* AlignedAlloc(size_t n, std::align_val_t al) {
  g_alloc_count.fetch_add(1, std::memory_order_relaxed);
  const size_t a = static_cast<size_t>(al);
  return std::aligned_alloc(a, (n + a - 1) / a * a);
}
}  // namespace internal
}  // namespace cortiq::testing

void* operator new(size_t n) {
  if (void* p = cortiq::testing::internal::CountedAlloc(n)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n) { return operator new(n); }
void* operator new(size_t n, const std::nothrow_t&) noexcept {
  return cortiq::testing::internal::CountedAlloc(n);
}
void* operator new[](size_t n, const std::nothrow_t&) noexcept {
  return cortiq::testing::internal::CountedAlloc(n);
}
void operator delete(void* p) noexcept { cortiq::testing::internal::CountedFree(p); }
void operator delete[](void* p) noexcept { cortiq::testing::internal::CountedFree(p); }
void operator delete(void* p, size_t) noexcept { cortiq::testing::internal::CountedFree(p); }
void operator delete[](void* p, size_t) noexcept { cortiq::testing::internal::CountedFree(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept {
  cortiq::testing::internal::CountedFree(p);
}
void operator delete[](void* p, const std::nothrow_t&) noexcept {
  cortiq::testing::internal::CountedFree(p);
}
void* operator new(size_t n, std::align_val_t al) {
  if (void* p = cortiq::testing::internal::AlignedAlloc(n, al)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n, std::align_val_t al) { return operator new(n, al); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { std::free(p); }
