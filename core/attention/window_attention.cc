#include "core/attention/window_attention.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/attention/attention_scratch.h"
#include "core/attention/layer_list.h"
#include "core/kv/o1_config.h"
#include "core/math/kernels.h"
#include "core/util/status_macros.h"

namespace cortiq::attention {

// ------------------------------------------------------------- WindowConfig

bool WindowConfig::IsWindowLayer(size_t layer) const { return ContainsLayer(layers, layer); }

std::string WindowConfig::DebugString() const {
  if (!Enabled()) return "window: off";
  return absl::StrCat("window: layers=", LayerListString(layers), " sink=", sink,
                      " window=", window);
}

absl::Status WindowConfig::Validate(size_t num_layers) const {
  CORTIQ_RETURN_IF_ERROR(CheckLayersInRange(layers, num_layers, "window.layers"));
  if (window < kMinWindow) {
    return absl::InvalidArgumentError(
        absl::StrCat("window.window = ", window, " < ", kMinWindow, " (the current position)"));
  }
  return absl::OkStatus();
}

size_t WindowConfig::LayerBytes(size_t num_kv_heads, size_t head_dim) const {
  return 2 * util::AlignedBuffer<float>::BytesFor(num_kv_heads * (sink + window) * head_dim);
}

absl::StatusOr<WindowConfig> MakeWindowConfig(std::string_view layer_spec, size_t sink,
                                              size_t window, size_t num_layers) {
  WindowConfig c;
  CORTIQ_ASSIGN_OR_RETURN(c.layers, kv::ParseLayerSpec(layer_spec, num_layers));
  c.sink = sink;
  c.window = window;
  CORTIQ_RETURN_IF_ERROR(c.Validate(num_layers));
  return c;
}

// ---------------------------------------------------------- WindowAttention

WindowAttention::WindowAttention(const AttentionGeometry& geometry, size_t layer,
                                 const WindowConfig& config)
    : geometry_(geometry), layer_(layer), sink_(config.sink), window_(config.window) {}

size_t WindowAttention::held() const { return std::min(position_, sink_ + window_); }

void WindowAttention::Allocate() {
  if (!keys_.empty()) return;
  const size_t floats = geometry_.num_kv_heads * (sink_ + window_) * geometry_.head_dim;
  keys_.Resize(floats);
  values_.Resize(floats);
}

void WindowAttention::Store(size_t p, const float* k_row, const float* v_row) {
  const size_t hd = geometry_.head_dim;
  for (size_t h = 0; h < geometry_.num_kv_heads; ++h) {
    std::memcpy(keys_.data() + Offset(h, p), k_row + h * hd, hd * sizeof(float));
    std::memcpy(values_.data() + Offset(h, p), v_row + h * hd, hd * sizeof(float));
  }
}

void WindowAttention::AttendRow(const AttentionRows& rows, size_t r, size_t g,
                                size_t first_in_block, ScratchSlot& slot) const {
  const size_t hd = geometry_.head_dim, nq = geometry_.num_q_heads, hpk = geometry_.heads_per_kv(),
               kw = geometry_.kv_width();
  const size_t p = rows.start + r;
  // The visible positions as runs of rows contiguous in memory, ascending.
  struct Run {
    const float* k;
    const float* v;
    size_t n, stride;
  };
  Run runs[6];
  size_t num_runs = 0, total = 0;
  auto add = [&](size_t a, size_t b) {  // positions [a, b)
    const size_t held_end = std::min(b, first_in_block);
    while (a < held_end) {  // the state's rows: the sink, then the ring (may wrap)
      const size_t s = Slot(a);
      const size_t len =
          a < sink_ ? std::min(held_end, sink_) - a : std::min(held_end - a, sink_ + window_ - s);
      const size_t off = (g * (sink_ + window_) + s) * hd;
      runs[num_runs++] = {keys_.data() + off, values_.data() + off, len, hd};
      total += len;
      a += len;
    }
    if (a < b) {  // the block's own rows
      const size_t off = (a - rows.start) * kw + g * hd;
      runs[num_runs++] = {rows.k + off, rows.v + off, b - a, kw};
      total += b - a;
    }
  };
  add(0, std::min(sink_, p + 1));
  if (p + 1 > sink_) add(std::max(sink_, p + 1 > window_ ? p + 1 - window_ : 0), p + 1);

  const float* q = rows.q + (r * nq + g * hpk) * hd;
  float* out = rows.out + (r * nq + g * hpk) * hd;
  float* probs = ScratchSlot::Grow(slot.scores, hpk * total);  // [hpk × total]
  size_t at = 0;
  for (size_t i = 0; i < num_runs; ++i) {
    math::DotRows(q, hpk, hd, runs[i].k, runs[i].n, runs[i].stride, hd, probs + at, total);
    at += runs[i].n;
  }
  for (size_t j = 0; j < hpk; ++j) {
    float* pj = probs + j * total;
    for (size_t t = 0; t < total; ++t) pj[t] *= geometry_.scale;
    math::Softmax(pj, total);
  }
  std::fill(out, out + hpk * hd, 0.0f);
  at = 0;
  for (size_t i = 0; i < num_runs; ++i) {
    math::AxpyRows(probs + at, hpk, total, runs[i].v, runs[i].n, runs[i].stride, hd, out, hd);
    at += runs[i].n;
  }
}

absl::Status WindowAttention::Prefill(const AttentionRows& rows, AttentionContext& ctx) {
  Allocate();
  const size_t nkv = geometry_.num_kv_heads;
  // Every row reads the state's rows before the block and the block's own
  // rows from its inputs; the block is stored afterwards.
  ctx.scratch.ParallelFor(ctx.pool, rows.count * nkv,
                          [&](size_t begin, size_t end, ScratchSlot& sl) {
                            for (size_t t = begin; t < end; ++t) {
                              AttendRow(rows, t / nkv, t % nkv, rows.start, sl);
                            }
                          });
  const size_t kw = geometry_.kv_width();
  for (size_t r = 0; r < rows.count; ++r) {
    Store(position_, rows.k + r * kw, rows.v + r * kw);
    ++position_;
  }
  return absl::OkStatus();
}

absl::StatusOr<size_t> WindowAttention::BeginDecode(const AttentionRows& row, AttentionContext&) {
  Allocate();
  Store(position_, row.k, row.v);
  ++position_;
  return geometry_.num_kv_heads;
}

void WindowAttention::DecodeTask(const AttentionRows& row, size_t task, ScratchSlot& slot) {
  AttendRow(row, 0, task, /*first_in_block=*/row.start + 1, slot);
}

void WindowAttention::Reserve(size_t positions) {
  if (positions > 0) Allocate();
}

absl::Status WindowAttention::CanTruncate(size_t n) const {
  if (n > position_) {
    return absl::InvalidArgumentError(
        absl::StrCat("truncate: ", n, " positions requested, the layer holds ", position_));
  }
  if (n > 0 && position_ > sink_ + window_) {
    return absl::FailedPreconditionError(
        absl::StrCat("truncate: layer ", layer_, " keeps a sink of ", sink_, " and a window of ",
                     window_, " positions; the rows before them were dropped"));
  }
  return absl::OkStatus();
}

void WindowAttention::TruncateLast(size_t n) { position_ -= n; }

void WindowAttention::Release() {
  keys_ = util::AlignedBuffer<float>();
  values_ = util::AlignedBuffer<float>();
  position_ = 0;
}

size_t WindowAttention::MemoryBytes() const { return keys_.MemoryBytes() + values_.MemoryBytes(); }

MemoryByKind WindowAttention::Memory() const {
  MemoryByKind m;
  m[MemoryKind::kKvF32] = MemoryBytes();  // f32 K/V rows
  return m;
}

std::unique_ptr<LayerAttentionState> WindowAttention::Copy() const {
  WindowConfig config;
  config.sink = sink_;
  config.window = window_;
  auto out = std::make_unique<WindowAttention>(geometry_, layer_, config);
  out->position_ = position_;
  if (!keys_.empty()) {
    out->Allocate();
    std::memcpy(out->keys_.data(), keys_.data(), keys_.size() * sizeof(float));
    std::memcpy(out->values_.data(), values_.data(), values_.size() * sizeof(float));
  }
  return out;
}

absl::StatusOr<kv::LayerKvCache> WindowAttention::ExportRows() const {
  const size_t hd = geometry_.head_dim, nkv = geometry_.num_kv_heads;
  kv::LayerKvCache out(nkv, hd, kv::KvMode::kF32);
  out.Reserve(held());
  std::vector<float> k(nkv * hd), v(nkv * hd);
  auto put = [&](size_t p) {
    for (size_t h = 0; h < nkv; ++h) {
      std::memcpy(k.data() + h * hd, Key(h, p), hd * sizeof(float));
      std::memcpy(v.data() + h * hd, Value(h, p), hd * sizeof(float));
    }
    out.Append(k, v);
  };
  ForEachHeld(position_, put);
  return out;
}

absl::Status WindowAttention::InstallCache(kv::LayerKvCache cache, size_t positions) {
  const size_t held_rows = std::min(positions, sink_ + window_);
  if (cache.mode() != kv::KvMode::kF32 || cache.O1Sealed() || cache.HasDeadHeads() ||
      cache.HasImportance() || cache.seq_len() != held_rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("a sink + window layer at ", positions, " positions holds ", held_rows,
                     " dense f32 rows; the blob has ", cache.seq_len(), " (",
                     kv::KvModeName(cache.mode()), cache.O1Sealed() ? ", sealed O(1)" : "", ")"));
  }
  const size_t hd = geometry_.head_dim, nkv = geometry_.num_kv_heads, kw = nkv * hd;
  std::vector<float> k(held_rows * kw), v(held_rows * kw);
  for (size_t h = 0; h < nkv; ++h) {
    const std::span<const float> hk = cache.HeadKeys(h), hv = cache.HeadValues(h);
    for (size_t r = 0; r < held_rows; ++r) {
      std::memcpy(k.data() + r * kw + h * hd, hk.data() + r * hd, hd * sizeof(float));
      std::memcpy(v.data() + r * kw + h * hd, hv.data() + r * hd, hd * sizeof(float));
    }
  }
  return Install(positions, k, v);
}

absl::Status WindowAttention::Install(size_t position, std::span<const float> keys,
                                      std::span<const float> values) {
  const size_t held_rows = std::min(position, sink_ + window_);
  const size_t want = held_rows * geometry_.kv_width();
  if (keys.size() != want || values.size() != want) {
    return absl::InvalidArgumentError(absl::StrCat("window: ", held_rows, " rows of ",
                                                   geometry_.kv_width(), " floats expected, got ",
                                                   keys.size(), " and ", values.size()));
  }
  Release();
  if (position == 0) return absl::OkStatus();
  Allocate();
  const size_t kw = geometry_.kv_width();
  size_t i = 0;
  auto put = [&](size_t p) {
    Store(p, keys.data() + i * kw, values.data() + i * kw);
    ++i;
  };
  ForEachHeld(position, put);
  position_ = position;
  return absl::OkStatus();
}

}  // namespace cortiq::attention
