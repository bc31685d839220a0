// LayerKvCache (see the header for the contract): the seed-named cache as a
// composition. Its exact rows are a KvRows, its attention the free functions
// of attend.h over their views, its O(1) override an O1Override; what is
// left here is the layer's state machine — which of them a call may reach
// (a sealed layer has no exact path left) and how they move together.
#include "core/kv/layer_kv_cache.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/kv/kv_check.h"

namespace cortiq::kv {

// ---------------------------------------------------------------------------
// Construction, copies.

LayerKvCache::LayerKvCache(size_t num_kv_heads, size_t head_dim, KvMode mode)
    : rows_(num_kv_heads, head_dim, mode) {}

// A moved-from cache is an empty (released) cache of the same geometry
// (std::optional's move would leave the source engaged: exchange it).
LayerKvCache::LayerKvCache(LayerKvCache&& other) noexcept
    : rows_(std::move(other.rows_)), o1_(std::exchange(other.o1_, std::nullopt)) {}

LayerKvCache& LayerKvCache::operator=(LayerKvCache&& other) noexcept {
  if (this == &other) return *this;
  rows_ = std::move(other.rows_);
  o1_ = std::exchange(other.o1_, std::nullopt);
  return *this;
}

LayerKvCache LayerKvCache::Copy() const {
  LayerKvCache c(rows_.Copy());
  if (o1_.has_value()) c.o1_ = o1_->Copy();
  return c;
}

KvRows LayerKvCache::TakeRows() {
  o1_.reset();
  return std::move(rows_);
}

// ---------------------------------------------------------------------------
// Capacity and mutation. A sealed layer holds no exact rows and never will
// again: Reserve / ShrinkToFit are no-ops there, the rest is closed.

void LayerKvCache::Reserve(size_t positions) {
  if (!O1Sealed()) rows_.Reserve(positions);
}

HeadRowsFill LayerKvCache::FillNext(size_t kv_head, size_t rows) {
  CORTIQ_KV_CHECK(!o1_.has_value());
  return rows_.FillNext(kv_head, rows);
}

void LayerKvCache::AppendDenseRows(size_t rows) {
  CORTIQ_KV_CHECK(!o1_.has_value());
  rows_.AppendDenseRows(rows);
}

void LayerKvCache::ReleaseUnused() {
  if (!O1Sealed()) rows_.ReleaseUnused();
}

void LayerKvCache::ShrinkToFit() {
  if (!O1Sealed()) rows_.ShrinkToFit();
}

void LayerKvCache::Append(std::span<const float> k_new, std::span<const float> v_new) {
  Append(k_new, v_new, {});
}

void LayerKvCache::Append(std::span<const float> k_new, std::span<const float> v_new,
                          std::span<const bool> alive) {
  CORTIQ_KV_CHECK(!O1Sealed());  // the sealed path inserts through O1Step
  rows_.Append(k_new, v_new, alive);
}

absl::Status LayerKvCache::TruncateLast(size_t n_drop) {
  CORTIQ_KV_CHECK(n_drop <= seq_len());
  if (O1Sealed()) {
    return absl::FailedPreconditionError(
        "TruncateLast: the layer is sealed into O(1) Nystrom states, which cannot roll "
        "back an absorbed position");
  }
  rows_.TruncateLast(n_drop);
  if (O1Collecting()) o1_->TruncateTrace(rows_.seq_len());
  return absl::OkStatus();
}

void LayerKvCache::AccumulateImp(std::span<const float> probs) {
  CORTIQ_KV_CHECK(!O1Sealed());
  rows_.AccumulateImp(probs);
}

void LayerKvCache::Clear() {
  rows_.Clear();
  o1_.reset();
}

void LayerKvCache::Release() {
  rows_.Release();
  o1_.reset();
}

// ---------------------------------------------------------------------------
// Attention: the free functions over this layer's rows.

void LayerKvCache::Attend(std::span<const float> q, size_t kv_head, std::span<float> out,
                          std::span<float> probs, const AttendOptions& options) const {
  CORTIQ_KV_CHECK(!O1Sealed());  // no rows left: decode goes through O1Step
  kv::Attend(rows_.Head(kv_head), q, out, probs, options);
}

void LayerKvCache::AttendGroup(std::span<const float> q_group, size_t kv_head, size_t n_q_heads,
                               std::span<float> out, std::span<float> probs,
                               std::span<float> imp_acc, const AttendOptions& options) const {
  CORTIQ_KV_CHECK(!O1Sealed());  // no rows left: decode goes through O1Step
  kv::AttendGroup(rows_.Head(kv_head), q_group, n_q_heads, out, probs, imp_acc, options);
}

// ---------------------------------------------------------------------------
// The O(1) override's lifecycle (O1Override holds the state and the math).

absl::Status LayerKvCache::O1Begin(size_t m, size_t w, size_t sink, O1Rect rect) {
  if (O1Sealed()) return absl::FailedPreconditionError("O1Begin: the layer is already sealed");
  if (rows_.seq_len() != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("O1Begin: the cache already holds ", rows_.seq_len(),
                     " positions; query collection starts on a cleared cache"));
  }
  absl::StatusOr<O1Override> o = O1Override::Collect(head_dim(), m, w, sink, rect);
  if (!o.ok()) return o.status();
  o1_ = *std::move(o);
  return absl::OkStatus();
}

void LayerKvCache::O1PushQ(std::span<const float> q_all) {
  if (O1Collecting()) o1_->PushQ(q_all);
}

absl::Status LayerKvCache::O1Seal(size_t num_heads) {
  if (O1Sealed()) return absl::FailedPreconditionError("o1 seal: the layer is already sealed");
  if (!o1_.has_value()) {
    return absl::FailedPreconditionError(
        "o1 seal refused (the layer stays exact): no query trace (O1Begin was not called on "
        "this prompt pass)");
  }
  absl::Status st = o1_->Seal(num_heads, rows_);
  if (!st.ok()) {
    // A layer that cannot seal now never will for this prompt, and a trace
    // left collecting would grow forever: drop it.
    o1_.reset();
    return st;
  }
  rows_.Release();  // the states hold the prompt now
  return absl::OkStatus();
}

void LayerKvCache::O1Step(std::span<const float> q_all, std::span<const float> k_new,
                          std::span<const float> v_new, size_t num_heads, std::span<float> out) {
  CORTIQ_KV_CHECK(O1Sealed());
  o1_->Step(q_all, k_new, v_new, num_heads, out);
}

std::optional<std::vector<O1DeviceView>> LayerKvCache::O1Views() const {
  if (!O1Sealed()) return std::nullopt;
  return o1_->Views();
}

absl::Status LayerKvCache::O1Install(std::vector<NystromState> states, size_t seq_len) {
  if (o1_.has_value() || rows_.seq_len() != 0) {
    return absl::FailedPreconditionError(
        "O1Install: the layer must be empty (no positions, no O(1) override)");
  }
  if (mode() != KvMode::kF32) {
    return absl::FailedPreconditionError(absl::StrCat(
        "O1Install: the layer stores ", KvModeName(mode()),
        " rows; only an f32 layer can be sealed, so only an f32 layer takes sealed states"));
  }
  absl::StatusOr<O1Override> o =
      O1Override::FromStates(std::move(states), num_kv_heads(), head_dim(), seq_len);
  if (!o.ok()) return o.status();
  rows_.Release();  // any exact capacity still held
  o1_ = *std::move(o);
  return absl::OkStatus();
}

}  // namespace cortiq::kv
