// KvRows (see the header for the contract).
#include "core/kv/kv_rows.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <utility>

#include "core/kv/kv_check.h"
#include "core/math/kernels.h"

namespace cortiq::kv {
namespace {

size_t RoundUp64(size_t bytes) {
  constexpr size_t kA = util::AlignedBuffer<float>::kAlignment;
  return (bytes + kA - 1) / kA * kA;
}

size_t PageBytes() { return util::AlignedBuffer<char>::PageBytes(); }

size_t RoundUpPage(size_t bytes) { return (bytes + PageBytes() - 1) / PageBytes() * PageBytes(); }

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

// A new buffer of H blocks of `stride` rows of `row_elems` elements: a
// paged one (its pages committed up to `commit` rows of each block, one
// call per block) or a plain zero-filled one; the first rows[h] rows of
// each of `from`'s blocks (of `from_stride` rows) copied into it.
template <typename T>
util::AlignedBuffer<T> NewHeadBlocks(const util::AlignedBuffer<T>& from, size_t from_stride,
                                     size_t num_heads, size_t stride, size_t row_elems,
                                     const size_t* rows, bool paged, size_t commit) {
  util::AlignedBuffer<T> next;
  if (paged) {
    next.ResizeUncommitted(num_heads * stride * row_elems);
    for (size_t h = 0; h < num_heads; ++h) next.Commit(h * stride * row_elems, commit * row_elems);
  } else {
    next.Resize(num_heads * stride * row_elems);
  }
  CopyHeadBlocks(from, next, num_heads, from_stride, stride, rows, row_elems);
  return next;
}

// `rows` rows of head h's blocks as the spans of a HeadRowsView (const
// buffers) or a HeadRowsFill (mutable ones): the mode's spans set, the
// other mode's left empty.
template <typename Spans, typename F32Buf, typename I8Buf>
Spans HeadSpans(KvMode mode, size_t row_base, size_t scale_base, size_t elems, size_t rows,
                F32Buf& k_f32, F32Buf& v_f32, I8Buf& k_i8, I8Buf& v_i8, F32Buf& k_scale,
                F32Buf& v_scale) {
  Spans s;
  if (mode == KvMode::kF32) {
    s.keys = {k_f32.data() + row_base, elems};
    s.values = {v_f32.data() + row_base, elems};
  } else {
    s.keys_i8 = {k_i8.data() + row_base, elems};
    s.values_i8 = {v_i8.data() + row_base, elems};
    s.key_scales = {k_scale.data() + scale_base, rows};
    s.value_scales = {v_scale.data() + scale_base, rows};
  }
  return s;
}

}  // namespace

KvRows::KvRows(size_t num_kv_heads, size_t head_dim, KvMode mode)
    : mode_(mode), num_kv_heads_(num_kv_heads), head_dim_(head_dim) {
  CORTIQ_KV_CHECK(num_kv_heads > 0 && head_dim > 0);
}

KvRows::KvRows(KvRows&& other) noexcept
    : mode_(other.mode_), num_kv_heads_(other.num_kv_heads_), head_dim_(other.head_dim_) {
  *this = std::move(other);
}

// The source keeps its geometry and is left empty (Release()d).
KvRows& KvRows::operator=(KvRows&& other) noexcept {
  if (this == &other) return *this;
  mode_ = other.mode_;
  num_kv_heads_ = other.num_kv_heads_;
  head_dim_ = other.head_dim_;
  capacity_ = std::exchange(other.capacity_, 0);
  stride_ = std::exchange(other.stride_, 0);
  paged_ = std::exchange(other.paged_, false);
  seq_len_ = std::exchange(other.seq_len_, 0);
  committed_ = std::exchange(other.committed_, 0);
  dropped_bytes_ = std::exchange(other.dropped_bytes_, 0);
  head_len_ = std::move(other.head_len_);
  k_f32_ = std::move(other.k_f32_);
  v_f32_ = std::move(other.v_f32_);
  k_i8_ = std::move(other.k_i8_);
  v_i8_ = std::move(other.v_i8_);
  k_scale_ = std::move(other.k_scale_);
  v_scale_ = std::move(other.v_scale_);
  importance_ = std::move(other.importance_);
  alive_log_ = std::move(other.alive_log_);
  return *this;
}

KvRows KvRows::Copy() const {
  KvRows c(num_kv_heads_, head_dim_, mode_);
  c.capacity_ = capacity_;
  c.stride_ = stride_;
  c.paged_ = paged_;
  // A paged copy commits what the original holds (its rows, and a
  // reservation's pages), not its whole capacity: a session's capacity
  // stays after a turn that ended short of it (ReleaseUnused), and a fork of
  // n > 1 choices is admitted for the positions its plan needs, which the
  // engine then reserves. A plain buffer is copied whole.
  c.committed_ = paged_ ? committed_ : capacity_;
  c.seq_len_ = seq_len_;
  c.head_len_ = head_len_.Copy();
  if (paged_) {
    // The same stride, committed as the original is; the stored rows copied.
    auto copy = [&](const auto& from, auto& to) {
      if (from.empty()) return;
      to = NewHeadBlocks(from, stride_, num_kv_heads_, stride_, head_dim_, head_len_.data(),
                         /*paged=*/true, committed_);
    };
    copy(k_f32_, c.k_f32_);
    copy(v_f32_, c.v_f32_);
    copy(k_i8_, c.k_i8_);
    copy(v_i8_, c.v_i8_);
  } else {
    c.k_f32_ = k_f32_.Copy();
    c.v_f32_ = v_f32_.Copy();
    c.k_i8_ = k_i8_.Copy();
    c.v_i8_ = v_i8_.Copy();
  }
  c.k_scale_ = k_scale_.Copy();
  c.v_scale_ = v_scale_.Copy();
  c.importance_ = importance_.Copy();
  c.alive_log_ = alive_log_.Copy();
  // The scales' pages past the committed rows, which the whole-buffer copy
  // touched, given back as the original's were.
  if (c.committed_ < c.capacity_) c.dropped_bytes_ = c.TailPageBytes(c.committed_, /*drop=*/true);
  return c;
}

size_t KvRows::RowBytes(size_t head_dim, KvMode mode) {
  return head_dim * (mode == KvMode::kF32 ? sizeof(float) : sizeof(int8_t));
}

// With CORTIQ_HUGE_PAGES=1 nothing is paged: the buffers are whole huge
// pages, and a turn reallocates exactly (paged blocks are in 4 KiB pages:
// AlignedBuffer::ResizeUncommitted).
bool KvRows::PagedAt(size_t num_kv_heads, size_t row_bytes, size_t rows) {
  return num_kv_heads * rows * row_bytes >= util::AlignedBuffer<char>::kMapBytes &&
         !util::AlignedBuffer<char>::HugePagesRequested();
}

// The fewest rows >= `rows` whose bytes are whole pages, so that every head
// block of a paged buffer starts on a page.
size_t KvRows::PagedStride(size_t row_bytes, size_t rows) {
  const size_t unit = PageBytes() / std::gcd(PageBytes(), row_bytes);
  return (rows + unit - 1) / unit * unit;
}

size_t KvRows::RowBufferBytes(size_t num_kv_heads, size_t row_bytes, size_t rows) {
  if (PagedAt(num_kv_heads, row_bytes, rows)) return num_kv_heads * RoundUpPage(rows * row_bytes);
  return RoundUp64(num_kv_heads * rows * row_bytes);
}

size_t KvRows::ProjectedBytes(size_t num_kv_heads, size_t head_dim, KvMode mode, size_t positions) {
  if (positions == 0) return 0;
  size_t bytes = RoundUp64(num_kv_heads * sizeof(size_t));  // head_len_
  bytes += 2 * RowBufferBytes(num_kv_heads, RowBytes(head_dim, mode), positions);
  if (mode == KvMode::kInt8) bytes += 2 * RoundUp64(num_kv_heads * positions * sizeof(float));
  return bytes;
}

size_t KvRows::MemoryBytes() const {
  const size_t rows =
      paged_
          ? 2 * num_kv_heads_ * RoundUpPage(committed_ * RowBytes(head_dim_, mode_))
          : k_f32_.MemoryBytes() + v_f32_.MemoryBytes() + k_i8_.MemoryBytes() + v_i8_.MemoryBytes();
  return head_len_.MemoryBytes() + rows + k_scale_.MemoryBytes() + v_scale_.MemoryBytes() +
         importance_.MemoryBytes() + alive_log_.MemoryBytes() - dropped_bytes_;
}

size_t KvRows::HeadLen(size_t kv_head) const {
  CORTIQ_KV_CHECK(kv_head < num_kv_heads_);
  return head_len_.empty() ? 0 : head_len_[kv_head];
}

HeadRowsView KvRows::Head(size_t kv_head) const {
  const size_t n = HeadLen(kv_head);
  HeadRowsView v =
      HeadSpans<HeadRowsView>(mode_, RowBase(kv_head), ScaleBase(kv_head), n * head_dim_, n, k_f32_,
                              v_f32_, k_i8_, v_i8_, k_scale_, v_scale_);
  v.mode = mode_;
  v.head_dim = head_dim_;
  v.len = n;
  return v;
}

HeadRowsFill KvRows::Fill(size_t kv_head, size_t rows) {
  CORTIQ_KV_CHECK(kv_head < num_kv_heads_ && rows <= capacity_);
  CORTIQ_KV_CHECK(rows <= committed_);  // Reserve(rows) first
  return HeadSpans<HeadRowsFill>(mode_, RowBase(kv_head), ScaleBase(kv_head), rows * head_dim_,
                                 rows, k_f32_, v_f32_, k_i8_, v_i8_, k_scale_, v_scale_);
}

HeadRowsFill KvRows::FillNext(size_t kv_head, size_t rows) {
  CORTIQ_KV_CHECK(kv_head < num_kv_heads_ && seq_len_ + rows <= capacity_);
  CORTIQ_KV_CHECK(seq_len_ + rows <= committed_);  // Reserve(seq_len() + rows) first
  return HeadSpans<HeadRowsFill>(mode_, RowBase(kv_head) + seq_len_ * head_dim_,
                                 ScaleBase(kv_head) + seq_len_, rows * head_dim_, rows, k_f32_,
                                 v_f32_, k_i8_, v_i8_, k_scale_, v_scale_);
}

void KvRows::AppendDenseRows(size_t rows) {
  CORTIQ_KV_CHECK(alive_log_.empty() && seq_len_ + rows <= committed_);
  if (rows == 0) return;
  for (size_t h = 0; h < num_kv_heads_; ++h) head_len_[h] += rows;
  seq_len_ += rows;
}

void KvRows::SetDenseRows(size_t seq_len) {
  CORTIQ_KV_CHECK(seq_len_ == 0 && seq_len <= capacity_);
  CORTIQ_KV_CHECK(importance_.empty() && alive_log_.empty());
  if (seq_len == 0) return;
  std::fill(head_len_.begin(), head_len_.end(), seq_len);
  seq_len_ = seq_len;
}

// ---------------------------------------------------------------------------
// Capacity.

void KvRows::Reallocate(size_t new_capacity, bool exact) {
  CORTIQ_KV_CHECK(new_capacity >= seq_len_);
  if (new_capacity == 0) {
    Release();  // seq_len_ == 0 already
    return;
  }
  const size_t H = num_kv_heads_;
  const size_t D = head_dim_;
  if (head_len_.empty()) head_len_.Resize(H);  // zero-filled
  const size_t* rows = head_len_.data();
  const size_t row_bytes = RowBytes(D, mode_);

  // The row buffers.
  const bool paged = PagedAt(H, row_bytes, new_capacity);
  // Room in the blocks: the pages up to the new capacity are committed
  // (CommitRows, at the end); no row moves. Otherwise new blocks of `stride`
  // rows: a paged one with half again of room ahead (of the larger of the
  // new capacity and the old stride; none when exact), committed up to the
  // new capacity one call per block, or a plain exact one, zero-filled. The
  // room is address space only: a session's first reservation (its first
  // call, or a restore) leaves its next turns room to grow in place.
  const bool in_place = paged && paged_ && !exact && new_capacity <= stride_;
  if (!in_place) {
    size_t stride = new_capacity;
    if (paged) {
      const size_t base = std::max(new_capacity, paged_ ? stride_ : 0);
      stride = PagedStride(row_bytes, exact ? new_capacity : base + base / 2);
    }
    auto regrow = [&](auto& buf) {
      buf = NewHeadBlocks(buf, stride_, H, stride, D, rows, paged, new_capacity);
    };
    if (mode_ == KvMode::kF32) {
      regrow(k_f32_);
      regrow(v_f32_);
    } else {
      regrow(k_i8_);
      regrow(v_i8_);
    }
    stride_ = stride;
    committed_ = new_capacity;
  }
  paged_ = paged;

  // The scales, the importance and the alive log: exactly new_capacity,
  // fresh and zero-filled.
  if (mode_ == KvMode::kInt8) {
    k_scale_ = NewHeadBlocks(k_scale_, capacity_, H, new_capacity, 1, rows, false, 0);
    v_scale_ = NewHeadBlocks(v_scale_, capacity_, H, new_capacity, 1, rows, false, 0);
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
  dropped_bytes_ = 0;  // the scales are fresh; paged rows count their committed pages
  if (in_place) CommitRows(new_capacity);
}

void KvRows::Reserve(size_t positions) {
  if (positions > capacity_) {
    Reallocate(positions);
  } else if (positions > committed_) {
    CommitRows(positions);
  }
}

size_t KvRows::TailPageBytes(size_t from, bool drop) {
  const uintptr_t page = PageBytes();
  size_t bytes = 0;
  // Whole pages of rows [from, stride) of every head block of `buf`.
  auto tails = [&](auto& buf, size_t stride, size_t row_elems) {
    if (buf.empty()) return size_t{0};
    size_t n = 0;
    for (size_t h = 0; h < num_kv_heads_; ++h) {
      const uintptr_t a = reinterpret_cast<uintptr_t>(buf.data() + (h * stride + from) * row_elems);
      const uintptr_t b = reinterpret_cast<uintptr_t>(buf.data() + (h + 1) * stride * row_elems);
      const uintptr_t first = (a + page - 1) / page * page, last = b / page * page;
      if (last <= first) continue;
      // A page-aligned range inside our own private anonymous buffer: the
      // call cannot fail short of a bug, and its result is not needed.
      if (drop) madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
      n += last - first;
    }
    return n;
  };
  // Paged row buffers count their committed pages (MemoryBytes), not these.
  const size_t row_tails =
      mode_ == KvMode::kF32 ? tails(k_f32_, stride_, head_dim_) + tails(v_f32_, stride_, head_dim_)
                            : tails(k_i8_, stride_, head_dim_) + tails(v_i8_, stride_, head_dim_);
  if (!paged_) bytes += row_tails;
  if (mode_ == KvMode::kInt8) {
    bytes += tails(k_scale_, capacity_, 1) + tails(v_scale_, capacity_, 1);
  }
  return bytes;
}

void KvRows::ReleaseUnused() {
  if (seq_len_ >= committed_) return;  // nothing committed past the rows held
  dropped_bytes_ = TailPageBytes(seq_len_, /*drop=*/true);
  committed_ = seq_len_;
}

void KvRows::CommitRows(size_t rows) {
  CORTIQ_KV_CHECK(rows <= capacity_);
  if (rows <= committed_) return;
  // Rows [committed_, rows) of every block made resident and zero: a paged
  // block's pages in one call first (the pages past the committed ones were
  // given back or never touched, so they come in as zeros), then a memset,
  // which also clears what the last committed page held past committed_.
  auto zero = [&](auto& buf, size_t stride, size_t row_elems, bool commit) {
    if (buf.empty()) return;
    for (size_t h = 0; h < num_kv_heads_; ++h) {
      const size_t at = (h * stride + committed_) * row_elems, n = (rows - committed_) * row_elems;
      if (commit) buf.Commit(at, n);
      std::memset(static_cast<void*>(buf.data() + at), 0, n * sizeof(buf[0]));
    }
  };
  if (mode_ == KvMode::kF32) {
    zero(k_f32_, stride_, head_dim_, paged_);
    zero(v_f32_, stride_, head_dim_, paged_);
  } else {
    zero(k_i8_, stride_, head_dim_, paged_);
    zero(v_i8_, stride_, head_dim_, paged_);
    zero(k_scale_, capacity_, 1, false);
    zero(v_scale_, capacity_, 1, false);
  }
  committed_ = rows;
  dropped_bytes_ = rows == capacity_ ? 0 : TailPageBytes(rows, /*drop=*/false);
}

void KvRows::ShrinkToFit() {
  if (seq_len_ != capacity_ ||
      (paged_ && stride_ != PagedStride(RowBytes(head_dim_, mode_), seq_len_))) {
    Reallocate(seq_len_, /*exact=*/true);
  }
}

// ---------------------------------------------------------------------------
// Mutation.

void KvRows::Append(std::span<const float> k_new, std::span<const float> v_new,
                    std::span<const bool> alive) {
  const size_t H = num_kv_heads_;
  const size_t D = head_dim_;
  CORTIQ_KV_CHECK(k_new.size() == H * D && v_new.size() == H * D);
  CORTIQ_KV_CHECK(alive.empty() || alive.size() == H);

  if (seq_len_ == capacity_) {
    Reallocate(std::max<size_t>(16, 2 * capacity_));
  } else if (seq_len_ == committed_) {
    CommitRows(capacity_);  // past what ReleaseUnused kept: no Reserve came first
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

void KvRows::TruncateLast(size_t n_drop) {
  CORTIQ_KV_CHECK(n_drop <= seq_len_);
  if (n_drop == 0) return;
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
}

void KvRows::AccumulateImp(std::span<const float> probs) {
  CORTIQ_KV_CHECK(probs.size() <= seq_len_);
  if (importance_.empty()) importance_.Resize(capacity_);  // zero-filled
  float* imp = importance_.data();
  for (size_t t = 0; t < probs.size(); ++t) imp[t] += probs[t];
}

void KvRows::Clear() {
  seq_len_ = 0;
  std::fill(head_len_.begin(), head_len_.end(), size_t{0});
  importance_ = {};
  alive_log_ = {};
}

void KvRows::Release() { *this = KvRows(num_kv_heads_, head_dim_, mode_); }

}  // namespace cortiq::kv
