// ThreadPool: a fixed set of worker threads for data-parallel loops.
//
// ParallelFor(n, fn) splits [0, n) into contiguous chunks, one per thread
// (the calling thread takes the first chunk), and returns when all are done.
// No allocation per call. Not re-entrant: one ParallelFor at a time per pool
// (the engine owns one pool and calls it from its scheduler thread only).
//
// Example:
//   ThreadPool pool(2);
//   pool.ParallelFor(rows, [&](size_t begin, size_t end) { ... });
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <thread>
#include <vector>

namespace cortiq::util {

class ThreadPool {
 public:
  // num_threads includes the caller; 0 = std::thread::hardware_concurrency().
  explicit ThreadPool(size_t num_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  size_t num_threads() const { return workers_.size() + 1; }

  // Calls fn(begin, end) over disjoint chunks covering [0, n); chunk edges
  // are multiples of `grain` (except the last). Blocks until all complete.
  template <typename Fn>
  void ParallelFor(size_t n, Fn&& fn, size_t grain = 1) {
    RunChunks(n, grain, &Trampoline<std::remove_reference_t<Fn>>, &fn);
  }

  // Calls fn(thread_index) once on every thread (0 = caller).
  template <typename Fn>
  void RunOnAll(Fn&& fn) {
    ParallelFor(num_threads(), [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) fn(i);
    });
  }

  // A process-wide pool sized from CORTIQ_THREADS or the hardware.
  static ThreadPool& Default();

 private:
  using ChunkFn = void (*)(void* ctx, size_t begin, size_t end);
  template <typename Fn>
  static void Trampoline(void* ctx, size_t begin, size_t end) {
    (*static_cast<Fn*>(ctx))(begin, end);
  }
  void RunChunks(size_t n, size_t grain, ChunkFn fn, void* ctx);
  void WorkerLoop(size_t index);
  void Chunk(size_t index, size_t* begin, size_t* end) const;

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_start_;
  std::condition_variable cv_done_;
  uint64_t generation_ = 0;  // guarded by mu_
  size_t pending_ = 0;       // guarded by mu_
  bool stop_ = false;        // guarded by mu_
  // The current job (valid while pending_ > 0).
  ChunkFn fn_ = nullptr;
  void* ctx_ = nullptr;
  size_t n_ = 0;
  size_t grain_ = 1;
};

}  // namespace cortiq::util
