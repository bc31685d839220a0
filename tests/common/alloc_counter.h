// Counts heap allocations in a test binary by replacing the global operator
// new / delete. Include it in exactly ONE translation unit of a binary (every
// test binary here is a single .cc file) and read AllocCount() around the
// code under test.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>

namespace cortiq::testing {
inline std::atomic<size_t> g_alloc_count{0};
// Allocations through operator new since the process started.
inline size_t AllocCount() { return g_alloc_count.load(std::memory_order_relaxed); }
}  // namespace cortiq::testing

// GCC pairs the replaced new/delete below with malloc/free and cannot see
// that they match each other.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

void* operator new(size_t n) {
  cortiq::testing::g_alloc_count.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }
