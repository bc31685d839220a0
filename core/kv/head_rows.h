// What one KV head's stored rows look like, apart from who stores them: the
// row formats (KvMode) and the two windows onto one head's rows — a read-only
// HeadRowsView (what attention and a wire exporter read) and a writable
// HeadRowsFill (what a wire importer writes into before the rows count).
//
// Contract
//   * A view or fill holds spans into storage it does not own (KvRows): valid
//     until that storage next changes (Append, Reserve, TruncateLast, Clear,
//     Release, a move). Building one allocates nothing, O(1).
//   * Exactly one row format is set: kF32 fills keys / values; kInt8 fills
//     keys_i8 / values_i8 and one f32 dequantisation scale per row
//     (row t ≈ scale[t] · q[t]); the other format's spans are empty.
//
// Thread-safety: plain values; reading a view is as thread-safe as reading the
// storage it points into.
//
// Example (attention over a head held by hand, e.g. in a test):
//   const HeadRowsView rows = HeadRowsView::F32(keys, values, head_dim);
//   kv::AttendGroup(rows, q_group, n_q_heads, out, probs, {}, {});
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace cortiq::kv {

enum class KvMode : uint8_t {
  kF32 = 0,   // rows stored as f32: exact
  kInt8 = 1,  // rows stored as int8 + one f32 scale per row (~4× smaller)
};

// "f32" / "int8" ("unknown" for a value outside the enum). O(1), static strings.
inline const char* KvModeName(KvMode mode) {
  switch (mode) {
    case KvMode::kF32:
      return "f32";
    case KvMode::kInt8:
      return "int8";
  }
  return "unknown";
}

// One KV head's `len` stored rows, read-only.
struct HeadRowsView {
  KvMode mode = KvMode::kF32;
  size_t head_dim = 0;
  size_t len = 0;                                   // rows stored
  std::span<const float> keys, values;              // kF32: [len × head_dim] each
  std::span<const int8_t> keys_i8, values_i8;       // kInt8: [len × head_dim] each
  std::span<const float> key_scales, value_scales;  // kInt8: [len] each

  // f32 rows held elsewhere: keys, values [len × head_dim] (len =
  // keys.size() / head_dim; the caller checks the shapes).
  static HeadRowsView F32(std::span<const float> keys, std::span<const float> values,
                          size_t head_dim) {
    HeadRowsView v;
    v.mode = KvMode::kF32;
    v.head_dim = head_dim;
    v.len = head_dim == 0 ? 0 : keys.size() / head_dim;
    v.keys = keys;
    v.values = values;
    return v;
  }
};

// The first `rows` slots of one head's storage, writable, in the same layout
// as HeadRowsView (HeadRowsFill's spans are HeadRowsView's, mutable). Filled
// slots count as stored rows only once the storage says so
// (KvRows::SetDenseRows).
struct HeadRowsFill {
  std::span<float> keys, values;              // kF32: [rows × head_dim] each
  std::span<int8_t> keys_i8, values_i8;       // kInt8: [rows × head_dim] each
  std::span<float> key_scales, value_scales;  // kInt8: [rows] each
};

}  // namespace cortiq::kv
