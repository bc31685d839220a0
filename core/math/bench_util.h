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

// Runs a register-only loop of independent fused multiply-adds on every
// thread; returns the best of a few runs in GFLOP/s (an FMA counts as 2).
double MeasureFmaPeakGflops(util::ThreadPool* pool);

}  // namespace cortiq::math
