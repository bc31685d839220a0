// core/math/bench_util.h: machine ceilings the kernel benchmarks compare to.
//
// Both functions run on every thread of `pool` (nullptr = the calling thread
// only) with the active ISA (kernels.h), take a fraction of a second to a few
// seconds, and are meant for benchmarks and diagnostics, not the serving path.
// Thread-compatible: do not run two at once on the same pool.
//
// Example:
//   util::ThreadPool pool(2);
//   double gbs = MeasureReadBandwidthGBs(size_t{2} << 30, &pool);
//   double gflops = MeasureFmaPeakGflops(&pool);
#pragma once

#include <cstddef>

namespace cortiq::util {
class ThreadPool;
}

namespace cortiq::math {

// Allocates and fills a buffer of `bytes` (use far more than the last-level
// cache, e.g. 2 GiB, to measure DRAM), then streams it with full-width vector
// loads split over the pool's threads. Returns the best of a few passes, in
// GB/s (1e9 bytes per second). The buffer is freed before returning.
double MeasureReadBandwidthGBs(size_t bytes, util::ThreadPool* pool);

// The same measurement, repeatable: the buffer is allocated and touched once,
// so a benchmark can probe the bandwidth next to each of its own measurements
// (a shared machine's bandwidth drifts by ±20% within seconds). Measure()
// returns the best of `passes` streams, in GB/s; 0 when bytes < 4 KiB per
// thread.
class ReadBandwidthProbe {
 public:
  ReadBandwidthProbe(size_t bytes, util::ThreadPool* pool);
  ~ReadBandwidthProbe();
  ReadBandwidthProbe(const ReadBandwidthProbe&) = delete;
  ReadBandwidthProbe& operator=(const ReadBandwidthProbe&) = delete;
  double Measure(int passes = 4);

 private:
  util::ThreadPool* pool_;
  size_t threads_;
  size_t slice_;  // bytes per thread, a multiple of 4 KiB
  unsigned char* buf_ = nullptr;
};

// Runs a register-only loop of independent fused multiply-adds on every
// thread; returns the best of a few runs in GFLOP/s (an FMA counts as 2).
double MeasureFmaPeakGflops(util::ThreadPool* pool);

}  // namespace cortiq::math
