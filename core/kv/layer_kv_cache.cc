// LayerKvCache and AttentionHead (see the header for the contract).
//
// Bit-exactness: the f32 branch of Attend, AttendGroup and AttentionHead all
// score a row with Logit(Dot(q, k) , ...), normalise with math::Softmax over
// the same contiguous [first, n) logits, and accumulate Axpy(p[t], v[t], out)
// with t ascending from out = 0. AttendGroup only changes the loop nesting
// (rows outside, heads inside), never the per-head sequence of operations.
#include "core/kv/layer_kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "core/math/kernels.h"

namespace cortiq::kv {
namespace {

// Programmer-invariant check, always on: these guard caller-sized buffers
// (a wrong span size would corrupt memory silently) and cost one compare per
// call, never per row.
[[noreturn]] void CheckFailed(const char* cond, const char* file, int line) {
  std::fprintf(stderr, "%s:%d: LayerKvCache check failed: %s\n", file, line, cond);
  std::abort();
}
#define CORTIQ_KV_CHECK(cond)                            \
  do {                                                   \
    if (!(cond)) CheckFailed(#cond, __FILE__, __LINE__); \
  } while (0)

float ResolveScale(float scale, size_t head_dim) {
  return scale != 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
}

// The one definition of a logit from a (row-scaled) dot product.
inline float Logit(float dot, float scale, float softcap) {
  float s = dot * scale;
  if (softcap > 0.0f) s = softcap * std::tanh(s / softcap);
  return s;
}

// Softmax over probs[first, n), zeros before; returns false (and zeros all of
// probs[0, n)) when no row is visible.
inline bool NormaliseVisible(float* probs, size_t first, size_t n) {
  if (first >= n) {
    std::fill(probs, probs + n, 0.0f);
    return false;
  }
  std::fill(probs, probs + first, 0.0f);
  math::Softmax(probs + first, n - first);
  return true;
}

size_t RoundUp64(size_t bytes) {
  constexpr size_t kA = util::AlignedBuffer<float>::kAlignment;
  return (bytes + kA - 1) / kA * kA;
}

// Copies `rows` rows of `row_elems` elements of every head from a block of
// old_capacity rows per head to one of new_capacity rows per head.
template <typename T>
void CopyHeadBlocks(const util::AlignedBuffer<T>& from, util::AlignedBuffer<T>& to,
                    size_t num_heads, size_t old_capacity, size_t new_capacity, const size_t* rows,
                    size_t row_elems) {
  if (from.empty()) return;
  for (size_t h = 0; h < num_heads; ++h) {
    if (rows[h] == 0) continue;
    std::memcpy(to.data() + h * new_capacity * row_elems,
                from.data() + h * old_capacity * row_elems, rows[h] * row_elems * sizeof(T));
  }
}

}  // namespace

const char* KvModeName(KvMode mode) {
  switch (mode) {
    case KvMode::kF32:
      return "f32";
    case KvMode::kInt8:
      return "int8";
  }
  return "unknown";
}

void AttentionHead(std::span<const float> q, std::span<const float> keys,
                   std::span<const float> values, size_t head_dim, const AttendOptions& options,
                   std::span<float> out, std::span<float> probs) {
  CORTIQ_KV_CHECK(head_dim > 0 && q.size() == head_dim && out.size() == head_dim);
  CORTIQ_KV_CHECK(keys.size() % head_dim == 0 && values.size() == keys.size());
  const size_t n = std::min(keys.size() / head_dim, options.end);
  CORTIQ_KV_CHECK(probs.size() >= n);
  const float scale = ResolveScale(options.scale, head_dim);
  const size_t first = options.first;

  // DotRows / AxpyRows are bit-for-bit the per-row Dot / Axpy loops, with
  // one dispatch for all rows.
  if (first < n) {
    math::DotRows(q.data(), 1, 0, keys.data() + first * head_dim, n - first, head_dim, head_dim,
                  probs.data() + first, 0);
  }
  for (size_t t = first; t < n; ++t) probs[t] = Logit(probs[t], scale, options.softcap);
  std::fill(out.begin(), out.end(), 0.0f);
  if (!NormaliseVisible(probs.data(), first, n)) return;
  math::AxpyRows(probs.data() + first, 1, 0, values.data() + first * head_dim, n - first,
                 head_dim, head_dim, out.data(), 0);
}

// ---------------------------------------------------------------------------
// Construction, copies, sizes.

LayerKvCache::LayerKvCache(size_t num_kv_heads, size_t head_dim, KvMode mode)
    : mode_(mode), num_kv_heads_(num_kv_heads), head_dim_(head_dim) {
  CORTIQ_KV_CHECK(num_kv_heads > 0 && head_dim > 0);
}

LayerKvCache::LayerKvCache(LayerKvCache&& other) noexcept
    : mode_(other.mode_),
      num_kv_heads_(other.num_kv_heads_),
      head_dim_(other.head_dim_),
      capacity_(other.capacity_),
      seq_len_(other.seq_len_),
      head_len_(std::move(other.head_len_)),
      k_f32_(std::move(other.k_f32_)),
      v_f32_(std::move(other.v_f32_)),
      k_i8_(std::move(other.k_i8_)),
      v_i8_(std::move(other.v_i8_)),
      k_scale_(std::move(other.k_scale_)),
      v_scale_(std::move(other.v_scale_)),
      importance_(std::move(other.importance_)),
      alive_log_(std::move(other.alive_log_)),
      o1_(std::move(other.o1_)) {
  other.ResetScalars();
}

LayerKvCache& LayerKvCache::operator=(LayerKvCache&& other) noexcept {
  if (this == &other) return *this;
  mode_ = other.mode_;
  num_kv_heads_ = other.num_kv_heads_;
  head_dim_ = other.head_dim_;
  capacity_ = other.capacity_;
  seq_len_ = other.seq_len_;
  head_len_ = std::move(other.head_len_);
  k_f32_ = std::move(other.k_f32_);
  v_f32_ = std::move(other.v_f32_);
  k_i8_ = std::move(other.k_i8_);
  v_i8_ = std::move(other.v_i8_);
  k_scale_ = std::move(other.k_scale_);
  v_scale_ = std::move(other.v_scale_);
  importance_ = std::move(other.importance_);
  alive_log_ = std::move(other.alive_log_);
  o1_ = std::move(other.o1_);
  other.ResetScalars();
  return *this;
}

// A moved-from cache is an empty (released) cache of the same geometry
// (std::optional's move leaves the source engaged: reset it here).
void LayerKvCache::ResetScalars() {
  capacity_ = 0;
  seq_len_ = 0;
  o1_.reset();
}

LayerKvCache LayerKvCache::Copy() const {
  LayerKvCache c(num_kv_heads_, head_dim_, mode_);
  c.capacity_ = capacity_;
  c.seq_len_ = seq_len_;
  c.head_len_ = head_len_.Copy();
  c.k_f32_ = k_f32_.Copy();
  c.v_f32_ = v_f32_.Copy();
  c.k_i8_ = k_i8_.Copy();
  c.v_i8_ = v_i8_.Copy();
  c.k_scale_ = k_scale_.Copy();
  c.v_scale_ = v_scale_.Copy();
  c.importance_ = importance_.Copy();
  c.alive_log_ = alive_log_.Copy();
  if (o1_) {
    internal::LayerO1State& o = c.o1_.emplace();
    o.m = o1_->m;
    o.w = o1_->w;
    o.sink = o1_->sink;
    o.rect = o1_->rect;
    o.sealed = o1_->sealed;
    o.trace.reserve(o1_->trace.capacity());  // same bytes, same growth
    o.trace.assign(o1_->trace.begin(), o1_->trace.end());
    o.trace_heads = o1_->trace_heads;
    o.trace_rows = o1_->trace_rows;
    o.num_heads = o1_->num_heads;
    o.states.reserve(o1_->states.capacity());
    for (const NystromState& st : o1_->states) o.states.push_back(st.Copy());
  }
  return c;
}

size_t LayerKvCache::ProjectedBytes(size_t num_kv_heads, size_t head_dim, KvMode mode,
                                    size_t positions) {
  if (positions == 0) return 0;
  const size_t rows = num_kv_heads * positions;
  size_t bytes = RoundUp64(num_kv_heads * sizeof(size_t));  // head_len_
  switch (mode) {
    case KvMode::kF32:
      bytes += 2 * RoundUp64(rows * head_dim * sizeof(float));
      break;
    case KvMode::kInt8:
      bytes += 2 * RoundUp64(rows * head_dim * sizeof(int8_t));
      bytes += 2 * RoundUp64(rows * sizeof(float));
      break;
  }
  return bytes;
}

size_t LayerKvCache::MemoryBytes() const {
  return head_len_.MemoryBytes() + k_f32_.MemoryBytes() + v_f32_.MemoryBytes() +
         k_i8_.MemoryBytes() + v_i8_.MemoryBytes() + k_scale_.MemoryBytes() +
         v_scale_.MemoryBytes() + importance_.MemoryBytes() + alive_log_.MemoryBytes() +
         O1MemoryBytes();
}

size_t LayerKvCache::HeadLen(size_t kv_head) const {
  CORTIQ_KV_CHECK(kv_head < num_kv_heads_);
  return head_len_.empty() ? 0 : head_len_[kv_head];
}

// ---------------------------------------------------------------------------
// Capacity.

void LayerKvCache::Reallocate(size_t new_capacity) {
  CORTIQ_KV_CHECK(new_capacity >= seq_len_);
  if (new_capacity == 0) {
    FreeExactStorage();  // seq_len_ == 0; an armed O(1) trace stays armed
    return;
  }
  const size_t H = num_kv_heads_;
  const size_t D = head_dim_;
  if (head_len_.empty()) head_len_.Resize(H);  // zero-filled
  const size_t* rows = head_len_.data();

  auto regrow = [&](auto& buf, size_t row_elems) {
    std::remove_reference_t<decltype(buf)> next(H * new_capacity * row_elems);
    CopyHeadBlocks(buf, next, H, capacity_, new_capacity, rows, row_elems);
    buf = std::move(next);
  };
  if (mode_ == KvMode::kF32) {
    regrow(k_f32_, D);
    regrow(v_f32_, D);
  } else {
    regrow(k_i8_, D);
    regrow(v_i8_, D);
    regrow(k_scale_, 1);
    regrow(v_scale_, 1);
  }
  if (!importance_.empty()) {
    util::AlignedBuffer<float> next(new_capacity);
    std::memcpy(next.data(), importance_.data(), std::min(capacity_, new_capacity) * sizeof(float));
    importance_ = std::move(next);
  }
  if (!alive_log_.empty()) {
    util::AlignedBuffer<uint8_t> next(new_capacity * H);
    std::memcpy(next.data(), alive_log_.data(), seq_len_ * H);
    alive_log_ = std::move(next);
  }
  capacity_ = new_capacity;
}

// A sealed layer holds no exact rows and never will again: both are no-ops.
void LayerKvCache::Reserve(size_t positions) {
  if (O1Sealed()) return;
  if (positions > capacity_) Reallocate(positions);
}

void LayerKvCache::ShrinkToFit() {
  if (O1Sealed()) return;
  if (seq_len_ != capacity_) Reallocate(seq_len_);
}

// ---------------------------------------------------------------------------
// Mutation.

void LayerKvCache::Append(std::span<const float> k_new, std::span<const float> v_new) {
  Append(k_new, v_new, {});
}

void LayerKvCache::Append(std::span<const float> k_new, std::span<const float> v_new,
                          std::span<const bool> alive) {
  const size_t H = num_kv_heads_;
  const size_t D = head_dim_;
  CORTIQ_KV_CHECK(!O1Sealed());  // the sealed path inserts through O1Step
  CORTIQ_KV_CHECK(k_new.size() == H * D && v_new.size() == H * D);
  CORTIQ_KV_CHECK(alive.empty() || alive.size() == H);

  if (seq_len_ == capacity_) {
    Reallocate(std::max<size_t>(16, 2 * capacity_));
  }
  const bool any_dead =
      !alive.empty() && std::find(alive.begin(), alive.end(), false) != alive.end();
  if (any_dead && alive_log_.empty()) {
    // First dead head: every earlier position was stored by every head.
    alive_log_.Resize(capacity_ * H);
    std::memset(alive_log_.data(), 1, seq_len_ * H);
  }
  if (!alive_log_.empty()) {
    uint8_t* log = alive_log_.data() + seq_len_ * H;
    for (size_t h = 0; h < H; ++h) log[h] = alive.empty() || alive[h];
  }

  for (size_t h = 0; h < H; ++h) {
    if (!alive.empty() && !alive[h]) continue;
    const size_t t = head_len_[h];
    const float* k = k_new.data() + h * D;
    const float* v = v_new.data() + h * D;
    if (mode_ == KvMode::kF32) {
      std::memcpy(k_f32_.data() + RowBase(h) + t * D, k, D * sizeof(float));
      std::memcpy(v_f32_.data() + RowBase(h) + t * D, v, D * sizeof(float));
    } else {
      k_scale_[ScaleBase(h) + t] = math::QuantizeRowI8(k, k_i8_.data() + RowBase(h) + t * D, D);
      v_scale_[ScaleBase(h) + t] = math::QuantizeRowI8(v, v_i8_.data() + RowBase(h) + t * D, D);
    }
    head_len_[h] = t + 1;
  }
  ++seq_len_;
}

absl::Status LayerKvCache::TruncateLast(size_t n_drop) {
  CORTIQ_KV_CHECK(n_drop <= seq_len_);
  if (O1Sealed()) {
    return absl::FailedPreconditionError(
        "TruncateLast: the layer is sealed into O(1) Nystrom states, which cannot roll "
        "back an absorbed position");
  }
  if (n_drop == 0) return absl::OkStatus();
  const size_t H = num_kv_heads_;
  size_t old_max = 0;
  size_t new_max = 0;
  for (size_t h = 0; h < H; ++h) old_max = std::max(old_max, head_len_[h]);
  if (alive_log_.empty()) {
    for (size_t h = 0; h < H; ++h) head_len_[h] -= n_drop;
  } else {
    for (size_t p = seq_len_ - n_drop; p < seq_len_; ++p) {
      for (size_t h = 0; h < H; ++h) head_len_[h] -= alive_log_[p * H + h];
    }
  }
  seq_len_ -= n_drop;
  for (size_t h = 0; h < H; ++h) new_max = std::max(new_max, head_len_[h]);
  if (!importance_.empty()) {
    std::fill(importance_.data() + new_max, importance_.data() + old_max, 0.0f);
  }
  if (O1Collecting() && o1_->trace_rows > seq_len_) {
    // Trace row p is the queries of position p: drop the rolled-back ones.
    o1_->trace_rows = seq_len_;
    o1_->trace.resize(seq_len_ * o1_->trace_heads * head_dim_);  // keeps capacity
  }
  return absl::OkStatus();
}

void LayerKvCache::AccumulateImp(std::span<const float> probs) {
  CORTIQ_KV_CHECK(!O1Sealed());
  CORTIQ_KV_CHECK(probs.size() <= seq_len_);
  if (importance_.empty()) importance_.Resize(capacity_);  // zero-filled
  float* imp = importance_.data();
  for (size_t t = 0; t < probs.size(); ++t) imp[t] += probs[t];
}

void LayerKvCache::Clear() {
  seq_len_ = 0;
  std::fill(head_len_.begin(), head_len_.end(), size_t{0});
  importance_ = {};
  alive_log_ = {};
  o1_.reset();
}

void LayerKvCache::Release() {
  ResetScalars();  // drops the O(1) override too
  FreeExactStorage();
}

void LayerKvCache::FreeExactStorage() {
  capacity_ = 0;
  head_len_ = {};
  k_f32_ = {};
  v_f32_ = {};
  k_i8_ = {};
  v_i8_ = {};
  k_scale_ = {};
  v_scale_ = {};
  importance_ = {};
  alive_log_ = {};
}

// ---------------------------------------------------------------------------
// Attention.

void LayerKvCache::Attend(std::span<const float> q, size_t kv_head, std::span<float> out,
                          std::span<float> probs, const AttendOptions& options) const {
  const size_t D = head_dim_;
  CORTIQ_KV_CHECK(!O1Sealed());  // no rows left: decode goes through O1Step
  const size_t n = std::min(HeadLen(kv_head), options.end);
  if (mode_ == KvMode::kF32) {
    // The reference itself: bit-for-bit by construction.
    AttentionHead(q, HeadKeys(kv_head), HeadValues(kv_head), D, options, out, probs);
    return;
  }
  CORTIQ_KV_CHECK(q.size() == D && out.size() == D && probs.size() >= n);
  const float scale = ResolveScale(options.scale, D);
  const size_t first = options.first;
  const int8_t* k = k_i8_.data() + RowBase(kv_head);
  const int8_t* v = v_i8_.data() + RowBase(kv_head);
  const float* sk = k_scale_.data() + ScaleBase(kv_head);
  const float* sv = v_scale_.data() + ScaleBase(kv_head);

  if (first < n) {
    // Bit-for-bit the per-row DotI8 loop, one dispatch for the pass.
    math::DotRowsI8(q.data(), 1, 0, k + first * D, n - first, D, D, probs.data() + first, n);
    for (size_t t = first; t < n; ++t) probs[t] = Logit(sk[t] * probs[t], scale, options.softcap);
  }
  std::fill(out.begin(), out.end(), 0.0f);
  if (!NormaliseVisible(probs.data(), first, n)) return;
  math::AxpyRowsI8(probs.data() + first, 1, 0, sv + first, v + first * D, n - first, D, D,
                   out.data(), D);
}

void LayerKvCache::AttendGroup(std::span<const float> q_group, size_t kv_head, size_t n_q_heads,
                               std::span<float> out, std::span<float> probs,
                               std::span<float> imp_acc, const AttendOptions& options) const {
  const size_t D = head_dim_;
  const size_t G = n_q_heads;
  CORTIQ_KV_CHECK(!O1Sealed());  // no rows left: decode goes through O1Step
  const size_t n = std::min(HeadLen(kv_head), options.end);
  CORTIQ_KV_CHECK(G > 0 && q_group.size() == G * D && out.size() == G * D);
  CORTIQ_KV_CHECK(probs.size() >= G * n);
  CORTIQ_KV_CHECK(imp_acc.empty() || imp_acc.size() >= n);
  const float scale = ResolveScale(options.scale, D);
  const float softcap = options.softcap;
  const size_t first = options.first;
  const float* q = q_group.data();
  float* p = probs.data();  // head j's row: p + j * n

  // Pass 1 over K: every visible row scored for every head of the group.
  if (mode_ == KvMode::kF32) {
    const float* k = k_f32_.data() + RowBase(kv_head);
    if (first < n) {
      // Bit-for-bit the (row, head) Dot loop, one dispatch for the pass.
      math::DotRows(q, G, D, k + first * D, n - first, D, D, p + first, n);
      for (size_t j = 0; j < G; ++j) {
        for (size_t t = first; t < n; ++t) p[j * n + t] = Logit(p[j * n + t], scale, softcap);
      }
    }
  } else {
    const int8_t* k = k_i8_.data() + RowBase(kv_head);
    const float* sk = k_scale_.data() + ScaleBase(kv_head);
    if (first < n) {
      // Bit-for-bit the (row, head) DotI8 loop, each row widened once.
      math::DotRowsI8(q, G, D, k + first * D, n - first, D, D, p + first, n);
      for (size_t j = 0; j < G; ++j) {
        for (size_t t = first; t < n; ++t) {
          p[j * n + t] = Logit(sk[t] * p[j * n + t], scale, softcap);
        }
      }
    }
  }

  std::fill(out.begin(), out.end(), 0.0f);
  const bool visible = first < n;
  for (size_t j = 0; j < G; ++j) NormaliseVisible(p + j * n, first, n);

  // Pass 2 over V: every visible row accumulated into every head's output.
  if (visible) {
    float* o = out.data();
    if (mode_ == KvMode::kF32) {
      const float* v = v_f32_.data() + RowBase(kv_head);
      math::AxpyRows(p + first, G, n, v + first * D, n - first, D, D, o, D);
    } else {
      const int8_t* v = v_i8_.data() + RowBase(kv_head);
      const float* sv = v_scale_.data() + ScaleBase(kv_head);
      math::AxpyRowsI8(p + first, G, n, sv + first, v + first * D, n - first, D, D, o, D);
    }
  }

  // Importance, head by head (the order of the caller's former loop).
  if (!imp_acc.empty()) {
    for (size_t j = 0; j < G; ++j) {
      const float* pj = p + j * n;
      for (size_t t = 0; t < n; ++t) imp_acc[t] += pj[t];
    }
  }
}

// ---------------------------------------------------------------------------
// Views.

std::span<const float> LayerKvCache::HeadKeys(size_t kv_head) const {
  if (mode_ != KvMode::kF32) return {};
  return {k_f32_.data() + RowBase(kv_head), HeadLen(kv_head) * head_dim_};
}
std::span<const float> LayerKvCache::HeadValues(size_t kv_head) const {
  if (mode_ != KvMode::kF32) return {};
  return {v_f32_.data() + RowBase(kv_head), HeadLen(kv_head) * head_dim_};
}
std::span<const int8_t> LayerKvCache::HeadKeysI8(size_t kv_head) const {
  if (mode_ != KvMode::kInt8) return {};
  return {k_i8_.data() + RowBase(kv_head), HeadLen(kv_head) * head_dim_};
}
std::span<const int8_t> LayerKvCache::HeadValuesI8(size_t kv_head) const {
  if (mode_ != KvMode::kInt8) return {};
  return {v_i8_.data() + RowBase(kv_head), HeadLen(kv_head) * head_dim_};
}
std::span<const float> LayerKvCache::HeadKeyScales(size_t kv_head) const {
  if (mode_ != KvMode::kInt8) return {};
  return {k_scale_.data() + ScaleBase(kv_head), HeadLen(kv_head)};
}
std::span<const float> LayerKvCache::HeadValueScales(size_t kv_head) const {
  if (mode_ != KvMode::kInt8) return {};
  return {v_scale_.data() + ScaleBase(kv_head), HeadLen(kv_head)};
}

}  // namespace cortiq::kv
