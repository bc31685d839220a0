// QSA block-sparse attention (seed 004, core/qsa, docs/QSA.md) on one layer
// of one sequence: the exact rows (a LayerKvCache, which QSA reads through
// a paged-pool view) plus the indexer's per-sequence QsaSeqState.
//
//   * Bind (first forward call): the layer's indexer from the model's
//     QsaRuntime (built on first use) and a state with room for the cache's
//     capacity;
//   * every row is appended exactly and ingested by the indexer (its normed
//     layer input). A prefill row at a position >= InertBound() = budget ·
//     ratio gets its dense attention context replaced by attention over its
//     selected blocks (PrefillSelect); a decode row past the bound skips
//     dense attention (BeginDecode returns no task) and attends over its
//     DecodeSelect selection in EndDecode. Rows below the bound are the dense
//     output, bit for bit;
//   * Release and the destructor free the state's backend bytes through the
//     shared runtime (a QsaSeqState dropped unreleased would leak); the state
//     stays bound and reusable.
#pragma once

#include <memory>
#include <string_view>

#include "core/attention/exact_attention.h"
#include "core/attention/layer_attention_state.h"
#include "core/attention/qsa_runtime.h"
#include "core/kv/layer_kv_cache.h"

namespace cortiq::attention {

class QsaAttention final : public CacheAttention {
 public:
  QsaAttention(const AttentionGeometry& geometry, kv::KvMode mode, size_t layer,
               const QsaConfig& config);
  ~QsaAttention() override;

  std::string_view name() const override { return "qsa"; }
  absl::Status Bind(const std::shared_ptr<QsaRuntime>& runtime) override;
  absl::Status Prefill(const AttentionRows& rows, AttentionContext& ctx) override;
  absl::StatusOr<size_t> BeginDecode(const AttentionRows& row, AttentionContext& ctx) override;
  void DecodeTask(const AttentionRows& row, size_t task, ScratchSlot& slot) override;
  absl::Status EndDecode(const AttentionRows& row, AttentionContext& ctx) override;
  void Reserve(size_t positions) override;
  // The rows' unused pages, and the indexer state's capacity past what it
  // holds (QsaIndexer::ShrinkToFit): what an import of the session makes.
  void ReleaseUnused() override;
  absl::Status CanTruncate(size_t n) const override;
  void TruncateLast(size_t n) override;
  void Release() override;
  size_t MemoryBytes() const override { return cache_.MemoryBytes() + state_.MemoryBytes(); }
  MemoryByKind Memory() const override;
  // Deep copy: the state travels through its aux blob (it IS the state);
  // a backend allocation failure aborts like any other out-of-memory here.
  std::unique_ptr<LayerAttentionState> Copy() const override;
  bool HasAux() const override { return indexer_ != nullptr; }
  // FailedPrecondition when not bound.
  absl::StatusOr<std::vector<uint8_t>> SnapshotAux() const override;
  // Binds if needed, then QsaIndexer::RestoreAux (DATA_LOSS for a blob that
  // disagrees with the geometry; the state is then untouched).
  absl::Status RestoreAux(const std::shared_ptr<QsaRuntime>& runtime,
                          std::span<const uint8_t> blob) override;
  size_t AuxPositions() const override { return state_.ingested(); }
  size_t AuxRowBytes() const override;
  absl::Status AuxRows(size_t from, size_t count, uint8_t* dst) const override;

  // The indexer state (null until bound): tests and metrics.
  const qsa::QsaSeqState* state() const { return indexer_ != nullptr ? &state_ : nullptr; }
  // Benchmarks only: ingests `rows` normed rows at the next positions for K/V
  // rows a tool appended to the cache directly (mutable_cache_for_tools).
  absl::Status IngestRows(const float* normed, size_t rows);
  kv::LayerKvCache& mutable_cache_for_tools() { return cache_; }

 private:
  const size_t ratio_, budget_;
  std::shared_ptr<QsaRuntime> runtime_;       // null until bound
  const qsa::QsaIndexer* indexer_ = nullptr;  // owned by runtime_
  qsa::QsaSeqState state_;
};

}  // namespace cortiq::attention
