// AlignedBuffer<T>: a heap array aligned to 64 bytes (one cache line, one
// AVX-512 register), move-only. Copies of big state are explicit (Copy()).
// Not thread-safe; the owner serialises access.
//
// Zero-filled and resident from the start. A buffer of kMapBytes or more is
// its own private anonymous mapping, zero by construction, whose pages are
// faulted in by one madvise(MADV_POPULATE_WRITE) call rather than one page
// fault per 4 KiB page as a memset would take them (in a virtual machine a
// fault costs microseconds: a 500 MB session restored or reserved took ~0.2
// s of faults alone); a kernel without it (before 5.14) gets the memset.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>
#include <utility>

namespace cortiq::util {

template <typename T>
class AlignedBuffer {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  static constexpr size_t kAlignment = 64;

  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t n) { Resize(n); }
  AlignedBuffer(AlignedBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept {
    if (this != &o) {
      Free();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer() { Free(); }

  static constexpr size_t kMapBytes = size_t{1} << 20;

  // Reallocates to exactly n elements (contents not preserved, zero-filled).
  void Resize(size_t n) {
    Free();
    if (n == 0) return;
    const size_t bytes = BytesFor(n);
    if (bytes >= kMapBytes) {
      void* p = mmap(nullptr, MappedBytes(bytes), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) throw std::bad_alloc();
      // No MADV_HUGEPAGE: where the system grants huge pages on request
      // only (defrag = madvise), asking stalls the allocation on direct
      // compaction when memory is fragmented (a 500 MB restore measured
      // 0.2 s one time, 1.5 s the next); 4 KiB pages cost the same every
      // time.
#ifdef MADV_POPULATE_WRITE
      if (madvise(p, MappedBytes(bytes), MADV_POPULATE_WRITE) != 0) std::memset(p, 0, bytes);
#else
      std::memset(p, 0, bytes);
#endif
      data_ = static_cast<T*>(p);
    } else {
      data_ = static_cast<T*>(std::aligned_alloc(kAlignment, bytes));
      if (data_ == nullptr) throw std::bad_alloc();
      std::memset(static_cast<void*>(data_), 0, bytes);
    }
    size_ = n;
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

 private:
  static size_t MappedBytes(size_t bytes) {
    static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    return (bytes + page - 1) / page * page;
  }
  void Free() {
    if (data_ != nullptr && BytesFor(size_) >= kMapBytes) {
      munmap(static_cast<void*>(data_), MappedBytes(BytesFor(size_)));
    } else {
      std::free(data_);
    }
    data_ = nullptr;
    size_ = 0;
  }
  T* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace cortiq::util
