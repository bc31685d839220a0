// AttentionScratch: every scratch buffer the attention states use during a
// forward call, owned by the caller's model::ForwardScratch (one per engine
// thread). Buffers grow to the largest call seen and are then reused: a warm
// decode step allocates nothing.
//
//   * one ScratchSlot per pool thread: scores / probabilities and the tiles
//     of tiled prefill attention. ParallelFor hands each chunk of a parallel
//     region its own slot (a chunk runs on one thread; a region has at most
//     one chunk per thread);
//   * QSA: the launch scratch (allocated on the QSA backend, so it holds the
//     runtime that frees it), the paged-pool view of the cache being read,
//     and one decode selection per batch row.
//
// Thread-safety: one forward call at a time; inside it, slots are handed to
// distinct threads by ParallelFor.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <memory>
#include <vector>

#include "core/qsa/kv_pool.h"
#include "core/qsa/qsa_indexer.h"
#include "core/util/aligned_buffer.h"
#include "core/util/thread_pool.h"

namespace cortiq::attention {

struct QsaRuntime;

// One thread's buffers inside a parallel region.
struct ScratchSlot {
  util::AlignedBuffer<float> scores;       // probabilities / logits of one task
  // Tiled prefill: Q tile, scores, Vᵀ (before it, int8 K widened), output.
  util::AlignedBuffer<float> q, s, vt, o;

  // b grown to at least n floats (geometrically: no allocation once warm).
  static float* Grow(util::AlignedBuffer<float>& b, size_t n) {
    if (b.size() < n) b.Resize(std::max(n, 2 * b.size()));
    return b.data();
  }
};

class AttentionScratch {
 public:
  AttentionScratch() = default;
  ~AttentionScratch();
  AttentionScratch(AttentionScratch&& o) noexcept;
  AttentionScratch& operator=(AttentionScratch&& o) noexcept;
  AttentionScratch(const AttentionScratch&) = delete;
  AttentionScratch& operator=(const AttentionScratch&) = delete;

  // pool->ParallelFor(n, ...) where each chunk also gets its own slot:
  // fn(begin, end, ScratchSlot&). Allocates the slots on the first call only.
  template <typename Fn>
  void ParallelFor(util::ThreadPool* pool, size_t n, Fn&& fn) {
    EnsureSlots(pool->num_threads());
    next_slot_.store(0, std::memory_order_relaxed);
    pool->ParallelFor(n, [&](size_t begin, size_t end) {
      fn(begin, end, *slots_[next_slot_.fetch_add(1, std::memory_order_relaxed)]);
    });
  }
  // The slot of a serial (caller-thread) task.
  ScratchSlot& SerialSlot() {
    EnsureSlots(1);
    return *slots_[0];
  }

  // ---- QSA ----
  // The launch scratch on `runtime`'s backend (recreated when the runtime
  // changes; the old one is freed through the runtime it came from).
  qsa::QsaScratch& Qsa(const std::shared_ptr<QsaRuntime>& runtime);
  // Backend bytes of the launch scratch (0 before the first QSA call).
  size_t QsaMemoryBytes() const { return qsa_scratch_ ? qsa_scratch_->MemoryBytes() : 0; }
  qsa::LayerKvPool& qsa_pool() { return qsa_pool_; }
  // Selection of decode batch row `row` (grown to the batch once).
  qsa::QsaSelection& Selection(size_t row) {
    if (selections_.size() <= row) selections_.resize(row + 1);
    return selections_[row];
  }

 private:
  void EnsureSlots(size_t n);

  std::vector<std::unique_ptr<ScratchSlot>> slots_;  // [pool threads]
  std::atomic<size_t> next_slot_{0};
  // Declared before the scratch: destroyed after it, so its frees find a
  // live backend.
  std::shared_ptr<QsaRuntime> qsa_runtime_;
  std::unique_ptr<qsa::QsaScratch> qsa_scratch_;
  qsa::LayerKvPool qsa_pool_;
  std::vector<qsa::QsaSelection> selections_;  // [decode batch rows]
};

}  // namespace cortiq::attention
