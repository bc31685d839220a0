// AlignedBuffer<T>: a heap array aligned to 64 bytes (one cache line, one
// AVX-512 register), move-only. Copies of big state are explicit (Copy()).
// Not thread-safe; the owner serialises access.
#pragma once

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

  // Reallocates to exactly n elements (contents not preserved, zero-filled).
  void Resize(size_t n) {
    Free();
    if (n == 0) return;
    size_t bytes = (n * sizeof(T) + kAlignment - 1) / kAlignment * kAlignment;
    data_ = static_cast<T*>(std::aligned_alloc(kAlignment, bytes));
    if (data_ == nullptr) throw std::bad_alloc();
    std::memset(static_cast<void*>(data_), 0, bytes);
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
  void Free() {
    std::free(data_);
    data_ = nullptr;
    size_ = 0;
  }
  T* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace cortiq::util
