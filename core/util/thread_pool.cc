#include "core/util/thread_pool.h"

#include <algorithm>
#include <cstdlib>
#include <string>

namespace cortiq::util {

ThreadPool::ThreadPool(size_t num_threads) {
  if (num_threads == 0) num_threads = std::max(1u, std::thread::hardware_concurrency());
  workers_.reserve(num_threads - 1);
  for (size_t i = 1; i < num_threads; ++i) {
    workers_.emplace_back([this, i] { WorkerLoop(i); });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_start_.notify_all();
  for (auto& t : workers_) t.join();
}

ThreadPool& ThreadPool::Default() {
  static ThreadPool* pool = [] {
    size_t n = 0;
    if (const char* env = std::getenv("CORTIQ_THREADS")) n = std::strtoul(env, nullptr, 10);
    return new ThreadPool(n);
  }();
  return *pool;
}

void ThreadPool::Chunk(size_t index, size_t* begin, size_t* end) const {
  size_t threads = num_threads();
  size_t units = (n_ + grain_ - 1) / grain_;
  size_t per = units / threads, rem = units % threads;
  size_t ub = index * per + std::min(index, rem);
  size_t ue = ub + per + (index < rem ? 1 : 0);
  *begin = std::min(n_, ub * grain_);
  *end = std::min(n_, ue * grain_);
}

void ThreadPool::RunChunks(size_t n, size_t grain, ChunkFn fn, void* ctx) {
  if (n == 0) return;
  if (workers_.empty() || n <= grain) {
    fn(ctx, 0, n);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = fn;
    ctx_ = ctx;
    n_ = n;
    grain_ = std::max<size_t>(1, grain);
    pending_ = workers_.size();
    ++generation_;
  }
  cv_start_.notify_all();
  size_t b, e;
  Chunk(0, &b, &e);
  if (b < e) fn(ctx, b, e);
  std::unique_lock<std::mutex> lock(mu_);
  cv_done_.wait(lock, [this] { return pending_ == 0; });
}

void ThreadPool::WorkerLoop(size_t index) {
  uint64_t seen = 0;
  for (;;) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_start_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    size_t b, e;
    Chunk(index, &b, &e);
    ChunkFn fn = fn_;
    void* ctx = ctx_;
    lock.unlock();
    if (b < e) fn(ctx, b, e);
    lock.lock();
    if (--pending_ == 0) cv_done_.notify_one();
  }
}

}  // namespace cortiq::util
