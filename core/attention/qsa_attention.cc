#include "core/attention/qsa_attention.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/attention/attention_scratch.h"
#include "core/attention/exact_attention.h"
#include "core/util/status_macros.h"
#include "spdlog/spdlog.h"

namespace cortiq::attention {
namespace {

qsa::DevicePtr P(const void* p) { return qsa::DevicePtr::FromHost(p); }

}  // namespace

QsaAttention::QsaAttention(const AttentionGeometry& geometry, kv::KvMode mode, size_t layer,
                           const QsaConfig& config)
    : CacheAttention(geometry, mode, layer, /*accepts_sealed=*/false),
      ratio_(config.ratio),
      budget_(config.budget) {}

QsaAttention::~QsaAttention() { Release(); }

absl::Status QsaAttention::Bind(const std::shared_ptr<QsaRuntime>& runtime) {
  if (indexer_ != nullptr) return absl::OkStatus();
  CORTIQ_ASSIGN_OR_RETURN(const qsa::QsaIndexer* ix, runtime->IndexerFor(layer_, ratio_, budget_));
  CORTIQ_ASSIGN_OR_RETURN(state_, ix->NewSeqState(cache_.capacity()));
  indexer_ = ix;
  runtime_ = runtime;
  return absl::OkStatus();
}

absl::Status QsaAttention::Prefill(const AttentionRows& rows, AttentionContext& ctx) {
  AppendRows(cache_, rows, geometry_);
  AttendCausal(cache_, rows, ctx);
  // Ingest, then replace the context of rows past the inert bound with
  // attention over their selected blocks.
  const size_t n = rows.count;
  const size_t start = cache_.seq_len() - n;
  qsa::QsaScratch& scratch = ctx.scratch.Qsa(runtime_);
  CORTIQ_RETURN_IF_ERROR(indexer_->PrefillIngest(state_, P(rows.xn), n, start, scratch));
  if (start + n <= indexer_->InertBound()) return absl::OkStatus();  // every row stays dense
  CORTIQ_RETURN_IF_ERROR(ctx.scratch.qsa_pool().Bind(cache_, ratio_));
  return indexer_->PrefillSelect(state_, P(rows.xn), P(rows.q), P(rows.out),
                                 ctx.scratch.qsa_pool().pool(), ctx.scratch.qsa_pool().table(),
                                 start, n, geometry_.num_q_heads, geometry_.scale, scratch);
}

absl::StatusOr<size_t> QsaAttention::BeginDecode(const AttentionRows& row, AttentionContext& ctx) {
  AppendRows(cache_, row, geometry_);
  // The launch scratch grows with the visible length: size it for the
  // reserved capacity so warm steps within it never allocate.
  qsa::QsaScratch& scratch = ctx.scratch.Qsa(runtime_);
  const size_t visible = std::max(cache_.capacity(), cache_.seq_len());
  CORTIQ_RETURN_IF_ERROR(scratch.Reserve(indexer_->ScratchBytes(1, visible)));
  // Ingest the row's key and select its blocks now: a row past the inert
  // bound skips dense attention (no task) and attends in EndDecode.
  qsa::QsaSelection& sel = ctx.scratch.Selection(row.batch_row);
  sel.active = false;
  CORTIQ_RETURN_IF_ERROR(
      indexer_->DecodeSelect(state_, P(row.xn), cache_.seq_len() - 1, scratch, &sel));
  return sel.active ? 0 : geometry_.num_kv_heads;
}

void QsaAttention::DecodeTask(const AttentionRows& row, size_t task, ScratchSlot& slot) {
  AttendGroupTask(cache_, row, 0, task, 0, geometry_, slot);
}

absl::Status QsaAttention::EndDecode(const AttentionRows& row, AttentionContext& ctx) {
  const qsa::QsaSelection& sel = ctx.scratch.Selection(row.batch_row);
  if (!sel.active) return absl::OkStatus();
  CORTIQ_RETURN_IF_ERROR(ctx.scratch.qsa_pool().Bind(cache_, ratio_));
  return indexer_->AttendSelection(sel, P(row.q), P(row.out), ctx.scratch.qsa_pool().pool(),
                                   ctx.scratch.qsa_pool().table(), geometry_.num_q_heads,
                                   geometry_.scale, ctx.scratch.Qsa(runtime_));
}

void QsaAttention::Reserve(size_t positions) {
  cache_.Reserve(positions);
  if (indexer_ == nullptr) return;
  // Advisory (the state grows on demand); only allocation fails.
  const absl::Status st = indexer_->Reserve(state_, positions);
  if (!st.ok()) spdlog::warn("qsa: reserve layer {}: {}", layer_, std::string(st.message()));
}

void QsaAttention::ReleaseUnused() {
  cache_.ReleaseUnused();
  if (indexer_ == nullptr) return;
  // Only allocation fails: the state then keeps its larger buffers.
  const absl::Status st = indexer_->ShrinkToFit(state_);
  if (!st.ok()) spdlog::warn("qsa: shrink layer {}: {}", layer_, std::string(st.message()));
}

absl::Status QsaAttention::CanTruncate(size_t n) const {
  CORTIQ_RETURN_IF_ERROR(CacheAttention::CanTruncate(n));
  const size_t keep = cache_.seq_len() - n;
  if (indexer_ != nullptr && state_.ingested() < keep) {
    return absl::FailedPreconditionError(
        absl::StrCat("truncate: layer ", layer_, "'s QSA state ingested ", state_.ingested(),
                     " positions, fewer than the ", keep, " kept"));
  }
  return absl::OkStatus();
}

void QsaAttention::TruncateLast(size_t n) {
  const size_t keep = cache_.seq_len() - n;
  absl::Status st = cache_.TruncateLast(n);
  if (st.ok() && indexer_ != nullptr) st = indexer_->Truncate(state_, keep);
  (void)st;  // CanTruncate checked both refusals
}

void QsaAttention::Release() {
  cache_.Release();
  if (indexer_ == nullptr) return;
  // Idempotent: a released state holds null pointers. A failed Free is the
  // backend's to account for (CpuBackend only fails on a bad pointer).
  const absl::Status st = indexer_->ReleaseSeqState(state_);
  if (!st.ok()) spdlog::warn("qsa: releasing layer {}: {}", layer_, std::string(st.message()));
}

MemoryByKind QsaAttention::Memory() const {
  MemoryByKind m;
  m[RowsKind(cache_.mode())] = cache_.MemoryBytes();
  m[MemoryKind::kQsa] = state_.MemoryBytes();
  return m;
}

std::unique_ptr<LayerAttentionState> QsaAttention::Copy() const {
  QsaConfig config;
  config.ratio = ratio_;
  config.budget = budget_;
  auto out = std::make_unique<QsaAttention>(geometry_, cache_.mode(), layer_, config);
  out->cache_ = cache_.Copy();
  if (indexer_ == nullptr) return out;
  absl::StatusOr<qsa::QsaSeqState> st = indexer_->NewSeqState(state_.capacity());
  absl::StatusOr<std::vector<uint8_t>> blob = indexer_->SnapshotAux(state_);
  absl::Status restored =
      st.ok() && blob.ok() ? indexer_->RestoreAux(*st, *blob) : absl::OkStatus();
  if (!st.ok() || !blob.ok() || !restored.ok()) {
    const absl::Status why = !st.ok() ? st.status() : (!blob.ok() ? blob.status() : restored);
    spdlog::critical("qsa: copying layer {}'s state failed: {}", layer_,
                     std::string(why.message()));
    std::abort();  // backend out of memory: treated like std::bad_alloc
  }
  out->runtime_ = runtime_;
  out->indexer_ = indexer_;
  out->state_ = *std::move(st);
  return out;
}

absl::StatusOr<std::vector<uint8_t>> QsaAttention::SnapshotAux() const {
  if (indexer_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("qsa: layer ", layer_, " is not a bound QSA layer of this sequence"));
  }
  return indexer_->SnapshotAux(state_);
}

size_t QsaAttention::AuxRowBytes() const {
  return indexer_ == nullptr ? 0 : indexer_->geometry().hd * 2;  // bf16 raw keys
}

absl::Status QsaAttention::AuxRows(size_t from, size_t count, uint8_t* dst) const {
  if (indexer_ == nullptr) return LayerAttentionState::AuxRows(from, count, dst);
  return indexer_->CopyRawKeys(state_, from, count, dst);
}

absl::Status QsaAttention::RestoreAux(const std::shared_ptr<QsaRuntime>& runtime,
                                      std::span<const uint8_t> blob) {
  CORTIQ_RETURN_IF_ERROR(Bind(runtime));
  CORTIQ_RETURN_IF_ERROR(indexer_->RestoreAux(state_, blob));
  // Bind sized the state for the cache's capacity: keep what it holds only,
  // as the source does after its call (ReleaseUnused), so a moved session
  // holds the same bytes on both nodes.
  return indexer_->ShrinkToFit(state_);
}

absl::Status QsaAttention::IngestRows(const float* normed, size_t rows) {
  if (indexer_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("qsa: layer ", layer_, " is not a bound QSA layer of this sequence"));
  }
  qsa::QsaScratch scratch(&runtime_->backend);
  return indexer_->PrefillIngest(state_, P(normed), rows, state_.ingested(), scratch);
}

}  // namespace cortiq::attention
