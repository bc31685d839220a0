#include "core/math/bench_util.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "core/math/kernels_internal.h"
#include "core/util/thread_pool.h"

namespace cortiq::math {
namespace {

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Runs fn(thread_index) on every thread of pool (or inline).
template <typename Fn>
void OnAll(util::ThreadPool* pool, Fn&& fn) {
  if (pool == nullptr) {
    fn(size_t{0});
  } else {
    pool->RunOnAll(fn);
  }
}

}  // namespace

ReadBandwidthProbe::ReadBandwidthProbe(size_t bytes, util::ThreadPool* pool)
    : pool_(pool), threads_(pool == nullptr ? 1 : pool->num_threads()) {
  // Each thread reads a slice that is a multiple of 4 KiB.
  slice_ = bytes / threads_ / 4096 * 4096;
  if (slice_ == 0) return;
  buf_ = static_cast<unsigned char*>(std::aligned_alloc(64, slice_ * threads_));
  if (buf_ == nullptr) throw std::bad_alloc();
  // First touch from each thread, so pages are local to the reader.
  OnAll(pool_, [&](size_t i) { std::memset(buf_ + i * slice_, static_cast<int>(i + 1), slice_); });
}

ReadBandwidthProbe::~ReadBandwidthProbe() { std::free(buf_); }

double ReadBandwidthProbe::Measure(int passes) {
  if (slice_ == 0) return 0.0;
  const internal::KernelTable& t = internal::Active();
  std::atomic<uint64_t> sink{0};
  double best = 0.0;
  for (int pass = 0; pass < passes; ++pass) {
    auto t0 = std::chrono::steady_clock::now();
    OnAll(pool_, [&](size_t i) {
      sink.fetch_xor(t.read_stream(buf_ + i * slice_, slice_), std::memory_order_relaxed);
    });
    auto t1 = std::chrono::steady_clock::now();
    best = std::max(best, static_cast<double>(slice_ * threads_) / Seconds(t0, t1) / 1e9);
  }
  return best;
}

double MeasureReadBandwidthGBs(size_t bytes, util::ThreadPool* pool) {
  return ReadBandwidthProbe(bytes, pool).Measure();
}

double MeasureFmaPeakGflops(util::ThreadPool* pool) {
  const internal::KernelTable& t = internal::Active();
  const size_t threads = pool == nullptr ? 1 : pool->num_threads();
  // Many short passes (~25 ms each at AVX-512 peak): on a shared machine the
  // best one is the one that ran undisturbed.
  constexpr uint64_t kIters = 4'000'000;
  std::vector<double> flops(threads);
  double best = 0.0;
  for (int pass = 0; pass < 12; ++pass) {
    auto t0 = std::chrono::steady_clock::now();
    OnAll(pool, [&](size_t i) { flops[i] = t.fma_loop(kIters); });
    auto t1 = std::chrono::steady_clock::now();
    double total = 0.0;
    for (double f : flops) total += f;
    best = std::max(best, total / Seconds(t0, t1) / 1e9);
  }
  return best;
}

}  // namespace cortiq::math
