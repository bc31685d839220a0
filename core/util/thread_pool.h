// ThreadPool: a fixed set of worker threads for data-parallel loops.
//
// ParallelFor(n, fn) splits [0, n) into contiguous chunks, one per thread
// (the calling thread takes the first chunk), and returns when all are done.
// No allocation per call. One ParallelFor at a time per pool (the engine owns
// one pool and calls it from its scheduler thread only); a ParallelFor issued
// while another is running on the same pool (from inside fn, or from another
// thread) does not deadlock: it runs all of its chunks inline on its caller.
//
// Latency: the engine calls ParallelFor a few hundred times per decoded token,
// so a worker that finishes a job spins on an atomic generation counter for
// `spin` (default 200 us, env CORTIQ_POOL_SPIN_US) before it sleeps on a
// condition variable; a call that finds the workers spinning costs well under
// a microsecond to start. The caller likewise spins, then sleeps, while it
// waits for the last chunk.
//
// fn must not throw on a worker thread (std::terminate); an exception thrown
// by the caller's own chunk propagates after the workers have finished.
//
// Example:
//   ThreadPool pool(2);
//   pool.ParallelFor(rows, [&](size_t begin, size_t end) { ... });
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace cortiq::util {

class ThreadPool {
 public:
  // num_threads includes the caller; 0 = std::thread::hardware_concurrency().
  explicit ThreadPool(size_t num_threads = 0);
  // As above with an explicit spin time before idle threads sleep (0 = sleep at once).
  ThreadPool(size_t num_threads, std::chrono::microseconds spin);
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
  // Worker side: returns the first generation != seen (spin, then sleep).
  uint64_t AwaitGeneration(uint64_t seen);
  // Caller side: returns once every worker has finished the current job.
  void AwaitWorkers();

  std::vector<std::thread> workers_;
  const std::chrono::nanoseconds spin_;

  // The current job. Written by the caller before it bumps generation_
  // (release) and read by workers after they see the bump (acquire); not
  // written again until pending_ is back to 0.
  ChunkFn fn_ = nullptr;
  void* ctx_ = nullptr;
  size_t n_ = 0;
  size_t grain_ = 1;

  // Hot atomics on their own cache lines: workers poll generation_, the
  // caller polls pending_.
  alignas(64) std::atomic<uint64_t> generation_{0};
  alignas(64) std::atomic<size_t> pending_{0};  // workers yet to finish the job
  alignas(64) std::atomic<bool> busy_{false};   // a job is in flight
  std::atomic<bool> stop_{false};
  // Sleep protocol (no lost wake-up): a sleeper announces itself (seq_cst)
  // under mu_ and re-checks its condition before waiting; the waker changes
  // the condition (seq_cst), then takes mu_ to notify if anyone announced.
  std::atomic<int> sleeping_workers_{0};
  std::atomic<bool> caller_sleeping_{false};
  std::mutex mu_;
  std::condition_variable cv_start_;
  std::condition_variable cv_done_;
};

}  // namespace cortiq::util
