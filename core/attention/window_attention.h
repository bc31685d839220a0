// Sink + sliding-window attention (StreamingLLM) on one layer of one
// sequence: the first `sink` positions and the last `window` positions
// (the current one included) are kept, exactly, and nothing else. Position
// t attends over
//     [0, min(sink, t + 1))  ∪  [max(sink, t − window + 1), t]
// — the near field of the O(1) Nyström kernel (seed 002's near mask
// (t − j < w) OR (j < sink)) without its far field, so the two compare at
// the same S and W (docs/QUALITY.md). Memory is constant: 2 · kv_heads ·
// (sink + window) · head_dim f32, allocated at the first Reserve / row and
// held until Release.
//
// Storage per KV head: [sink + window] rows of keys and of values; position
// p lives in slot p (p < sink) or sink + (p − sink) mod window (a ring).
// Attention reads the visible rows in ascending position order with
// math::DotRows / AxpyRows, so each head's output is bit for bit
// kv::AttentionHead over the visible rows gathered in order.
//
// A prefill block attends over the state's older rows and the block's own
// rows (read from its inputs), then appends the block: rows of one block run
// in parallel even when the block is longer than the window.
//
// Rollback: only while nothing has been evicted (position <= sink + window).
// Rows are f32 (int8 rows are refused when the sequence is configured).
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/attention/layer_attention_state.h"
#include "core/util/aligned_buffer.h"

namespace cortiq::attention {

struct WindowConfig {
  static constexpr size_t kMinWindow = 1;        // the current position
  static constexpr size_t kDefaultSink = 4;      // as the O(1) kernel's default
  static constexpr size_t kDefaultWindow = 128;  // as the O(1) kernel's default

  std::vector<size_t> layers;  // sorted, unique layer indices; empty = off
  size_t sink = kDefaultSink;
  size_t window = kDefaultWindow;

  bool Enabled() const { return !layers.empty(); }
  bool IsWindowLayer(size_t layer) const;
  // e.g. "window: layers=[0,1] sink=4 window=128" or "window: off".
  std::string DebugString() const;
  // InvalidArgument naming the field: a layer >= num_layers, window <
  // kMinWindow.
  absl::Status Validate(size_t num_layers) const;
  // Heap bytes of one layer's state once it holds a row (constant).
  size_t LayerBytes(size_t num_kv_heads, size_t head_dim) const;
};

// A WindowConfig from a layer spec (kv::ParseLayerSpec), validated.
absl::StatusOr<WindowConfig> MakeWindowConfig(std::string_view layer_spec, size_t sink,
                                              size_t window, size_t num_layers);

class WindowAttention final : public LayerAttentionState {
 public:
  WindowAttention(const AttentionGeometry& geometry, size_t layer, const WindowConfig& config);

  std::string_view name() const override { return "window"; }
  size_t position() const override { return position_; }
  absl::Status Prefill(const AttentionRows& rows, AttentionContext& ctx) override;
  absl::StatusOr<size_t> BeginDecode(const AttentionRows& row, AttentionContext& ctx) override;
  void DecodeTask(const AttentionRows& row, size_t task, ScratchSlot& slot) override;
  void Reserve(size_t positions) override;
  absl::Status CanTruncate(size_t n) const override;
  void TruncateLast(size_t n) override;
  void Release() override;
  size_t MemoryBytes() const override;
  MemoryByKind Memory() const override;
  std::unique_ptr<LayerAttentionState> Copy() const override;
  // The held rows, ascending by position, as an f32 cache (held() rows).
  absl::StatusOr<kv::LayerKvCache> ExportRows() const override;
  // Takes ExportRows' form back: held rows of a sequence at `positions`.
  absl::Status InstallCache(kv::LayerKvCache cache, size_t positions) override;

  size_t sink() const { return sink_; }
  size_t window() const { return window_; }
  // Positions currently held (min(position, sink + window)).
  size_t held() const;
  // Keys / values of a held position p of KV head h ([head_dim]); p must be
  // held (p < sink or p >= position − window).
  const float* Key(size_t h, size_t p) const { return keys_.data() + Offset(h, p); }
  const float* Value(size_t h, size_t p) const { return values_.data() + Offset(h, p); }
  // Import: installs `position` positions whose held rows are given in
  // ascending position order, [held × kv_heads × head_dim] each (what
  // Key/Value read back). InvalidArgument for sizes that disagree.
  absl::Status Install(size_t position, std::span<const float> keys, std::span<const float> values);

 private:
  size_t Slot(size_t p) const { return p < sink_ ? p : sink_ + (p - sink_) % window_; }
  size_t Offset(size_t h, size_t p) const {
    return (h * (sink_ + window_) + Slot(p)) * geometry_.head_dim;
  }
  // fn(p) for every position a state at `position` holds, ascending: the
  // sink, then the window (what ExportRows writes and Install reads).
  template <typename Fn>
  void ForEachHeld(size_t position, Fn&& fn) const {
    for (size_t p = 0; p < std::min(position, sink_); ++p) fn(p);
    for (size_t p = std::max(sink_, position - std::min(position, window_)); p < position; ++p) {
      fn(p);
    }
  }
  void Allocate();
  void Store(size_t p, const float* k_row, const float* v_row);  // [kv_heads × head_dim] each
  // Head group g's attention for block row r at position p, seeing the
  // state's rows below `first_in_block` and the block's rows from there on.
  void AttendRow(const AttentionRows& rows, size_t r, size_t g, size_t first_in_block,
                 ScratchSlot& slot) const;

  const AttentionGeometry geometry_;
  const size_t layer_;
  const size_t sink_, window_;
  size_t position_ = 0;
  util::AlignedBuffer<float> keys_;    // [kv_heads × (sink + window) × head_dim]
  util::AlignedBuffer<float> values_;  // [kv_heads × (sink + window) × head_dim]
};

}  // namespace cortiq::attention
