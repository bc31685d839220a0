// AlignedBuffer<T>: a heap array aligned to 64 bytes (one cache line, one
// AVX-512 register), move-only. Copies of big state are explicit (Copy()).
// Not thread-safe; the owner serialises access.
//
// Zero-filled and resident from the start. A buffer of PagePool::kMinBytes
// (128 KiB) or more is pages of the process's PagePool (page_pool.h): pages
// a freed buffer left there, zeroed, or a fresh private anonymous mapping
// whose pages are faulted in by one madvise(MADV_POPULATE_WRITE) call
// rather than one page fault per 4 KiB page as a memset would take them (in
// a virtual machine a fault costs microseconds: a 500 MB session restored
// or reserved took ~0.2 s of faults alone); a kernel without it (before
// 5.14) gets the memset. Freed, they go back to the pool (unmapped at once
// while the pool's capacity is 0, its default). Smaller buffers are the
// heap's.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "core/util/huge_buffer.h"
#include "core/util/page_pool.h"

namespace cortiq::util {

template <typename T>
class AlignedBuffer {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  static constexpr size_t kAlignment = 64;

  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t n) { Resize(n); }
  AlignedBuffer(AlignedBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)),
        size_(std::exchange(o.size_, 0)),
        source_(std::exchange(o.source_, Source::kHeap)) {}
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept {
    if (this != &o) {
      Free();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
      source_ = std::exchange(o.source_, Source::kHeap);
    }
    return *this;
  }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer() { Free(); }

  // The smallest buffer ResizeUncommitted maps (KvRows pages its head
  // blocks from this size on).
  static constexpr size_t kMapBytes = size_t{1} << 20;

  // Reallocates to exactly n elements (contents not preserved, zero-filled).
  void Resize(size_t n) {
    Free();
    if (n == 0) return;
    const size_t bytes = BytesFor(n);
    // With CORTIQ_HUGE_PAGES=1 and from 2 MiB on: a mapping of its own that
    // starts on a 2 MiB boundary and is advised for transparent huge pages,
    // so that its whole 2 MiB extents can be huge pages; the tail past the
    // last one stays in 4 KiB pages, so the mapping, and the resident set,
    // is never larger than asked. Off by default, as each way costs
    // somewhere (docs/PERFORMANCE.md, 2026-12-06): under a hypervisor that
    // shadows the guest's page tables each first touch of a 4 KiB page is an
    // exit of microseconds, and a 543 MB session restored 3x faster in huge
    // pages (0.92-1.34 -> 0.33-0.39 s), but the same VM's kept-session
    // decode steps were slower (43-52 -> 66-88 ms), and where the kernel
    // grants huge pages on request only (THP defrag = madvise) a fragmented
    // machine compacts memory at the first fault (once 1.5 s for 500 MB).
    if (bytes >= kHugePageBytes && HugePagesRequested()) {
      void* p = MapHugeAligned(MappedBytes(bytes));
      PopulateFresh(p, MappedBytes(bytes));
      data_ = static_cast<T*>(p);
      source_ = Source::kMapping;
    } else if (bytes >= PagePool::kMinBytes) {
      data_ = static_cast<T*>(PagePool::Global().Take(MappedBytes(bytes)));
      source_ = Source::kPool;
    } else {
      data_ = static_cast<T*>(std::aligned_alloc(kAlignment, bytes));
      if (data_ == nullptr) throw std::bad_alloc();
      std::memset(static_cast<void*>(data_), 0, bytes);
    }
    size_ = n;
  }
  // Reallocates to exactly n elements as a mapping of its own (BytesFor(n)
  // >= kMapBytes, else std::length_error) whose pages are NOT faulted in:
  // zero by construction, resident only where written or Commit()ed. For an
  // owner that uses a part of a large reservation (KvRows' head blocks,
  // grown geometrically) and counts what it commits. Always in 4 KiB pages
  // (MADV_NOHUGEPAGE, whatever the system's THP mode and
  // CORTIQ_HUGE_PAGES): a huge page faulted in for a committed page would
  // make the 2 MiB around it resident, uncommitted bytes included.
  void ResizeUncommitted(size_t n) {
    Free();
    if (n == 0) return;
    if (BytesFor(n) < kMapBytes) throw std::length_error("AlignedBuffer::ResizeUncommitted: small");
    const size_t bytes = MappedBytes(BytesFor(n));
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
#ifdef MADV_NOHUGEPAGE
    madvise(p, bytes, MADV_NOHUGEPAGE);  // advice only: a kernel without THP ignores it
#endif
    data_ = static_cast<T*>(p);
    size_ = n;
    source_ = Source::kMapping;  // not resident: never the pool's
  }
  // Faults in the pages holding elements [first, first + count) of a mapped
  // buffer (first + count <= size(); the owner's invariant): zero where
  // never written, and the bytes of a page already resident kept. One
  // madvise(MADV_POPULATE_WRITE) call; without it (before Linux 5.14) a
  // write of each page's first byte with its own value.
  void Commit(size_t first, size_t count) {
    if (count == 0) return;
    const uintptr_t page = PageBytes();
    const uintptr_t a = reinterpret_cast<uintptr_t>(data_ + first) / page * page;
    const uintptr_t b = reinterpret_cast<uintptr_t>(data_ + first + count);
#ifdef MADV_POPULATE_WRITE
    if (madvise(reinterpret_cast<void*>(a), b - a, MADV_POPULATE_WRITE) == 0) return;
#endif
    for (uintptr_t p = a; p < b; p += page) {
      volatile char* c = reinterpret_cast<volatile char*>(p);
      *c = *c;
    }
  }
  AlignedBuffer Copy() const {
    AlignedBuffer b(size_);
    if (size_) std::memcpy(static_cast<void*>(b.data_), data_, size_ * sizeof(T));
    return b;
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }
  T* begin() { return data_; }
  T* end() { return data_ + size_; }
  const T* begin() const { return data_; }
  const T* end() const { return data_ + size_; }
  // Heap bytes a buffer of n elements holds (rounded up to the alignment).
  static constexpr size_t BytesFor(size_t n) {
    return n == 0 ? 0 : (n * sizeof(T) + kAlignment - 1) / kAlignment * kAlignment;
  }
  // Heap bytes actually held.
  size_t MemoryBytes() const { return BytesFor(size_); }
  // The system's page size (the unit of Commit and of a mapping).
  static size_t PageBytes() {
    static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    return page;
  }

  // CORTIQ_HUGE_PAGES=1: buffers from 2 MiB on are advised for transparent
  // huge pages (read at each such allocation, which are few).
  static bool HugePagesRequested() {
    const char* env = std::getenv("CORTIQ_HUGE_PAGES");
    return env != nullptr && std::strcmp(env, "1") == 0;
  }

 private:
  static size_t MappedBytes(size_t bytes) {
    return (bytes + PageBytes() - 1) / PageBytes() * PageBytes();
  }
  void Free() {
    switch (source_) {
      case Source::kHeap:
        std::free(data_);
        break;
      case Source::kPool:
        PagePool::Global().Give(data_, MappedBytes(BytesFor(size_)));
        break;
      case Source::kMapping:
        munmap(static_cast<void*>(data_), MappedBytes(BytesFor(size_)));
        break;
    }
    data_ = nullptr;
    size_ = 0;
    source_ = Source::kHeap;
  }
  // Where data_ came from, so that Free hands it back there.
  enum class Source : uint8_t {
    kHeap,     // std::aligned_alloc (or nothing)
    kPool,     // PagePool::Global().Take
    kMapping,  // a mapping of its own (huge-page aligned, or uncommitted)
  };
  T* data_ = nullptr;
  size_t size_ = 0;
  Source source_ = Source::kHeap;
};

}  // namespace cortiq::util
