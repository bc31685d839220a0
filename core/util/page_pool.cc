// PagePool (see the header for the contract).
#include "core/util/page_pool.h"

#include <sys/mman.h>

#include <cstring>
#include <iterator>
#include <new>

namespace cortiq::util {

void PopulateFresh(void* p, size_t bytes) {
#ifdef MADV_POPULATE_WRITE
  if (madvise(p, bytes, MADV_POPULATE_WRITE) == 0) return;
#endif
  std::memset(p, 0, bytes);
}

PagePool& PagePool::Global() {
  static auto* pool = new PagePool();  // never destroyed: buffers outlive statics
  return *pool;
}

PagePool::~PagePool() { ReleaseAll(); }

void* PagePool::Take(size_t bytes) {
  void* kept = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    last_take_ = Clock::now();
    auto it = by_len_.lower_bound({bytes, 0});
    if (it != by_len_.end()) {
      const auto [len, addr] = *it;
      Erase(addr, len);
      if (len > bytes) Insert(addr + bytes, len - bytes);
      reused_ += bytes;
      kept = reinterpret_cast<void*>(addr);
    } else {
      mapped_ += bytes;
    }
  }
  if (kept != nullptr) {
    // Out of the maps, so zeroed outside the lock (resident pages: ~1 ms
    // for 15 MB). They held another buffer's bytes.
    std::memset(kept, 0, bytes);
    return kept;
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  PopulateFresh(p, bytes);
  return p;
}

void PagePool::Give(void* p, size_t bytes) {
  if (p == nullptr || bytes == 0) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (held_ + bytes <= capacity_) {
      Insert(reinterpret_cast<uintptr_t>(p), bytes);
      return;
    }
  }
  munmap(p, bytes);
}

void PagePool::SetCapacity(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  capacity_ = bytes;
  ShrinkTo(capacity_);
}

size_t PagePool::capacity() const {
  std::lock_guard<std::mutex> lock(mu_);
  return capacity_;
}

size_t PagePool::held_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return held_;
}

uint64_t PagePool::reused_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reused_;
}

uint64_t PagePool::mapped_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return mapped_;
}

size_t PagePool::ReleaseIfIdle(Clock::time_point now, Clock::duration idle) {
  std::lock_guard<std::mutex> lock(mu_);
  if (held_ == 0 || now - last_take_ < idle) return 0;
  const size_t before = held_;
  ShrinkTo(0);
  return before;
}

size_t PagePool::ReleaseAll() {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t before = held_;
  ShrinkTo(0);
  return before;
}

void PagePool::ShrinkTo(size_t limit) {
  while (held_ > limit && !by_len_.empty()) {
    const auto [len, addr] = *std::prev(by_len_.end());
    Erase(addr, len);
    munmap(reinterpret_cast<void*>(addr), len);
  }
}

void PagePool::Insert(uintptr_t addr, size_t len) {
  // Merge with the free range just below and the one just above, if they
  // touch: ranges split from one mapping join again, and so do mappings the
  // kernel placed next to each other (one contiguous run of pages either way).
  auto next = by_addr_.lower_bound(addr);
  if (next != by_addr_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == addr) {
      addr = prev->first;
      len += prev->second;
      by_len_.erase({prev->second, prev->first});
      held_ -= prev->second;
      by_addr_.erase(prev);
    }
  }
  if (next != by_addr_.end() && addr + len == next->first) {
    len += next->second;
    by_len_.erase({next->second, next->first});
    held_ -= next->second;
    by_addr_.erase(next);
  }
  by_addr_.emplace(addr, len);
  by_len_.emplace(len, addr);
  held_ += len;
}

void PagePool::Erase(uintptr_t addr, size_t len) {
  by_addr_.erase(addr);
  by_len_.erase({len, addr});
  held_ -= len;
}

}  // namespace cortiq::util
