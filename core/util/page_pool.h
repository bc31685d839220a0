// PagePool: resident anonymous pages kept after their buffer was freed, so
// that the next buffer of that size or smaller reuses them instead of
// faulting fresh pages in.
//
// Why: a session's K/V buffers are allocated when its call is admitted, on
// the engine's thread, while every other stream waits for the next step.
// Fresh pages are faulted in one 4 KiB page at a time; under a hypervisor
// that shadows the guest's page tables each first touch is an exit of
// ~6-14 us, and a 64-position session at the Qwen3-0.6B shape (14.7 MB of
// f32 K/V) took 37-50 ms to fault in, against ~1 ms to zero the same
// bytes once resident (docs/PERFORMANCE.md, 2026-12-07 third session).
// MADV_POPULATE_WRITE and MAP_POPULATE do not help there (the guest's first
// write still exits), and pages moved with mremap fault again: only pages
// the process has already touched, at the same address, are cheap. So the
// pool keeps freed ranges mapped and hands them out again, zero-filled.
//
// The pool holds at most capacity() bytes (0, the default: every range given
// back is unmapped at once, as an allocator would); the rest is unmapped.
// Ranges are best-fit: the smallest free range that is large enough, its
// head handed out and its tail kept; address-adjacent free ranges merge.
// An owner that wants idle memory back calls ReleaseIfIdle (the server's
// reaper: an idle node returns to its baseline RSS).
//
// Thread-safe (one mutex); Take and Give cost a map lookup plus, for Take,
// zeroing the bytes (or a fresh mapping's faults on a miss). Not on any hot
// path: decode allocates nothing.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <utility>

namespace cortiq::util {

// Faults in the pages of a fresh private anonymous mapping of `bytes` (zero
// by construction): one madvise(MADV_POPULATE_WRITE) call rather than one
// fault per 4 KiB page, or a memset where the kernel lacks it (before 5.14).
void PopulateFresh(void* p, size_t bytes);

class PagePool {
 public:
  using Clock = std::chrono::steady_clock;

  // Buffers from this many bytes on are AlignedBuffer's pool buffers
  // (smaller ones stay on the heap: glibc's mmap threshold, as the server
  // sets it, is the same 128 KiB).
  static constexpr size_t kMinBytes = size_t{128} << 10;

  // The process's pool, which AlignedBuffer uses. Capacity 0 until an owner
  // (the server, --page-pool-mb) sets it.
  static PagePool& Global();

  PagePool() = default;
  PagePool(const PagePool&) = delete;
  PagePool& operator=(const PagePool&) = delete;
  ~PagePool();  // unmaps every free range

  // `bytes` (a positive multiple of the page size) of zero-filled, resident
  // memory, page-aligned: a free range's head (zeroed here) or a fresh
  // private anonymous mapping (faulted in with MADV_POPULATE_WRITE, or a
  // memset before Linux 5.14). Throws std::bad_alloc if mmap fails.
  void* Take(size_t bytes);
  // Hands back a range Take returned (or any part of one; `bytes` a multiple
  // of the page size): kept if it fits under the capacity, else unmapped.
  void Give(void* p, size_t bytes);

  // Sets the cap; free ranges beyond it are unmapped now.
  void SetCapacity(size_t bytes);
  size_t capacity() const;
  // Free bytes kept (resident, in no buffer).
  size_t held_bytes() const;
  // Bytes Take served from kept ranges / from fresh mappings, since start.
  uint64_t reused_bytes() const;
  uint64_t mapped_bytes() const;

  // Unmaps every free range if nothing was taken since `now - idle`;
  // returns the bytes unmapped. `now` is the caller's clock reading (the
  // reaper's tick; tests pass their own).
  size_t ReleaseIfIdle(Clock::time_point now, Clock::duration idle);
  // Unmaps every free range; returns the bytes unmapped.
  size_t ReleaseAll();

 private:
  // Requires mu_. Unmaps free ranges, largest first, until held_ <= limit.
  void ShrinkTo(size_t limit);
  void Insert(uintptr_t addr, size_t len);  // requires mu_; merges neighbours
  void Erase(uintptr_t addr, size_t len);   // requires mu_

  mutable std::mutex mu_;
  std::map<uintptr_t, size_t> by_addr_;            // free range: address -> bytes
  std::set<std::pair<size_t, uintptr_t>> by_len_;  // the same ranges: (bytes, address)
  size_t held_ = 0;
  size_t capacity_ = 0;
  uint64_t reused_ = 0;
  uint64_t mapped_ = 0;
  Clock::time_point last_take_{};
};

}  // namespace cortiq::util
