// HugeBuffer<T>: a large zero-filled array in its own anonymous mapping,
// 2 MiB-aligned and advised for transparent huge pages (MADV_HUGEPAGE), for
// data streamed end to end on every step (the AMX tile copy of the weights):
// one TLB entry per 2 MiB instead of per 4 KiB. Where the kernel gives no
// huge pages (THP off) it is an ordinary mapping. Move-only; not
// thread-safe (the owner serialises access).
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <new>
#include <type_traits>
#include <utility>

namespace cortiq::util {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// A private anonymous mapping of exactly `bytes` (a multiple of the page
// size), zero by construction, starting on a 2 MiB boundary and advised for
// transparent huge pages: its whole 2 MiB extents can be huge pages, and the
// mapping is never larger than asked. Throws std::bad_alloc when the mapping
// fails. Freed with munmap(p, bytes).
inline void* MapHugeAligned(size_t bytes) {
  // Over-map by one huge page, then trim both ends to a 2 MiB-aligned range.
  void* m = mmap(nullptr, bytes + kHugePageBytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) throw std::bad_alloc();
  const uintptr_t base = reinterpret_cast<uintptr_t>(m);
  const uintptr_t start = (base + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  if (start > base) munmap(m, start - base);
  const uintptr_t end = start + bytes, map_end = base + bytes + kHugePageBytes;
  if (map_end > end) munmap(reinterpret_cast<void*>(end), map_end - end);
  madvise(reinterpret_cast<void*>(start), bytes, MADV_HUGEPAGE);  // advice: failure is harmless
  return reinterpret_cast<void*>(start);
}

template <typename T>
class HugeBuffer {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  static constexpr size_t kHugePage = kHugePageBytes;

  HugeBuffer() = default;
  // n zero elements; throws std::bad_alloc when the mapping fails.
  explicit HugeBuffer(size_t n) {
    if (n == 0) return;
    const size_t bytes = (n * sizeof(T) + kHugePage - 1) / kHugePage * kHugePage;
    data_ = static_cast<T*>(MapHugeAligned(bytes));
    size_ = n;
    bytes_ = bytes;
  }
  HugeBuffer(HugeBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)),
        size_(std::exchange(o.size_, 0)),
        bytes_(std::exchange(o.bytes_, 0)) {}
  HugeBuffer& operator=(HugeBuffer&& o) noexcept {
    if (this != &o) {
      Free();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  HugeBuffer(const HugeBuffer&) = delete;
  HugeBuffer& operator=(const HugeBuffer&) = delete;
  ~HugeBuffer() { Free(); }

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  // Bytes mapped (the element bytes rounded up to 2 MiB).
  size_t MemoryBytes() const { return bytes_; }

 private:
  void Free() {
    if (data_ != nullptr) munmap(data_, bytes_);
    data_ = nullptr;
    size_ = 0;
    bytes_ = 0;
  }
  T* data_ = nullptr;
  size_t size_ = 0;
  size_t bytes_ = 0;
};

}  // namespace cortiq::util
