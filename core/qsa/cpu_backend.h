// CpuBackend: the QSA Backend on the host — DevicePtrs are host addresses,
// kernels are core/math calls, the stream is ignored (everything completes
// before the call returns).
//
// Contract
//   * Allocate: 64-byte aligned, zero-filled heap blocks; every live block is
//     recorded (address → bytes), so stats() is exact and Free of a pointer it
//     did not hand out (or already freed) returns INVALID_ARGUMENT instead of
//     corrupting the heap. Destroying the backend with live blocks frees them
//     and logs a warning naming the count and bytes (a leak in the caller).
//   * Kernels run their rows / (row, KV group) tasks on `pool` (nullptr: the
//     calling thread only) and use per-thread scratch that grows to the
//     largest call and is then reused.
//   * Determinism: for a given ISA every output is a pure function of the
//     inputs and the lengths, independent of the thread count.
//
// Thread-safety: Allocate / Free / stats() lock a mutex and are thread-safe;
// kernels are thread-compatible (disjoint outputs may run concurrently; they
// share `pool`, whose nested use runs inline).
//
// Example:
//   qsa::CpuBackend backend(&util::ThreadPool::Default());
//   CORTIQ_ASSIGN_OR_RETURN(auto indexer, qsa::QsaIndexer::New(&backend, weights, geometry));
#pragma once

#include <cstddef>
#include <mutex>
#include <unordered_map>

#include "core/qsa/backend.h"
#include "core/util/thread_pool.h"

namespace cortiq::qsa {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(util::ThreadPool* pool = nullptr) : pool_(pool) {}
  ~CpuBackend() override;
  CpuBackend(const CpuBackend&) = delete;
  CpuBackend& operator=(const CpuBackend&) = delete;

  const char* name() const override { return "cpu"; }
  bool HostAddressable() const override { return true; }

  absl::StatusOr<DevicePtr> Allocate(size_t bytes) override;
  absl::Status Free(DevicePtr p) override;
  absl::Status CopyToDevice(DevicePtr dst, const void* src, size_t bytes, Stream s) override;
  absl::Status CopyToHost(void* dst, DevicePtr src, size_t bytes, Stream s) override;
  absl::Status CopyOnDevice(DevicePtr dst, DevicePtr src, size_t bytes, Stream s) override;
  absl::Status Synchronize(Stream) override { return absl::OkStatus(); }
  BackendStats stats() const override;

  absl::Status Project(const ProjectArgs& a, Stream s) override;
  absl::Status StoreBf16(DevicePtr src_f32, DevicePtr dst_bf16, size_t n, Stream s) override;
  absl::Status PoolBlocks(const PoolArgs& a, Stream s) override;
  absl::Status ScoreBlocks(const ScoreArgs& a, Stream s) override;
  absl::Status SelectTopK(const SelectArgs& a, Stream s) override;
  absl::Status AttendSelected(const AttendArgs& a, Stream s) override;

 private:
  // Runs fn(begin, end) over [0, n) on pool_ (or inline).
  template <typename Fn>
  void ParallelFor(size_t n, Fn&& fn);

  util::ThreadPool* pool_;
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, size_t> live_;  // address → requested bytes
  size_t live_bytes_ = 0;
  size_t total_allocations_ = 0;
};

}  // namespace cortiq::qsa
