// Attention over one KV head's rows (see the header for the contract).
//
// Bit-exactness: one function, AttendGroup, does the work for every entry
// point. Attend is AttendGroup with one head, AttentionHead is Attend over
// f32 slices; the row-batched kernels (DotRows, AxpyRows and their int8
// forms) are bit-for-bit their per-row loops whatever the strides, so one
// head through the group path is the per-head computation itself.
#include "core/kv/attend.h"

#include <algorithm>
#include <cmath>

#include "core/kv/kv_check.h"
#include "core/math/kernels.h"

namespace cortiq::kv {
namespace {

float ResolveScale(float scale, size_t head_dim) {
  return scale != 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
}

// The one definition of a logit from a (row-scaled) dot product.
inline float Logit(float dot, float scale, float softcap) {
  float s = dot * scale;
  if (softcap > 0.0f) s = softcap * std::tanh(s / softcap);
  return s;
}

// Softmax over probs[first, n), zeros before; zeros all of probs[0, n) when
// no row is visible.
inline void NormaliseVisible(float* probs, size_t first, size_t n) {
  if (first >= n) {
    std::fill(probs, probs + n, 0.0f);
    return;
  }
  std::fill(probs, probs + first, 0.0f);
  math::Softmax(probs + first, n - first);
}

}  // namespace

void AttendGroup(const HeadRowsView& rows, std::span<const float> q_group, size_t n_q_heads,
                 std::span<float> out, std::span<float> probs, std::span<float> imp_acc,
                 const AttendOptions& options) {
  const size_t D = rows.head_dim;
  const size_t G = n_q_heads;
  const size_t n = std::min(rows.len, options.end);
  CORTIQ_KV_CHECK(D > 0 && G > 0 && q_group.size() == G * D && out.size() == G * D);
  CORTIQ_KV_CHECK(probs.size() >= G * n);
  CORTIQ_KV_CHECK(imp_acc.empty() || imp_acc.size() >= n);
  const float scale = ResolveScale(options.scale, D);
  const float softcap = options.softcap;
  const size_t first = options.first;
  const bool visible = first < n;
  const float* q = q_group.data();
  float* p = probs.data();  // head j's row: p + j * n

  // Pass 1 over K: every visible row scored for every head of the group.
  if (visible) {
    if (rows.mode == KvMode::kF32) {
      CORTIQ_KV_CHECK(rows.keys.size() >= n * D && rows.values.size() >= n * D);
      // Bit-for-bit the (row, head) Dot loop, one dispatch for the pass.
      math::DotRows(q, G, D, rows.keys.data() + first * D, n - first, D, D, p + first, n);
      for (size_t j = 0; j < G; ++j) {
        for (size_t t = first; t < n; ++t) p[j * n + t] = Logit(p[j * n + t], scale, softcap);
      }
    } else {
      CORTIQ_KV_CHECK(rows.keys_i8.size() >= n * D && rows.values_i8.size() >= n * D);
      CORTIQ_KV_CHECK(rows.key_scales.size() >= n && rows.value_scales.size() >= n);
      const float* sk = rows.key_scales.data();
      // Bit-for-bit the (row, head) DotI8 loop, each row widened once.
      math::DotRowsI8(q, G, D, rows.keys_i8.data() + first * D, n - first, D, D, p + first, n);
      for (size_t j = 0; j < G; ++j) {
        for (size_t t = first; t < n; ++t) {
          p[j * n + t] = Logit(sk[t] * p[j * n + t], scale, softcap);
        }
      }
    }
  }

  std::fill(out.begin(), out.end(), 0.0f);
  for (size_t j = 0; j < G; ++j) NormaliseVisible(p + j * n, first, n);

  // Pass 2 over V: every visible row accumulated into every head's output.
  if (visible) {
    float* o = out.data();
    if (rows.mode == KvMode::kF32) {
      math::AxpyRows(p + first, G, n, rows.values.data() + first * D, n - first, D, D, o, D);
    } else {
      math::AxpyRowsI8(p + first, G, n, rows.value_scales.data() + first,
                       rows.values_i8.data() + first * D, n - first, D, D, o, D);
    }
  }

  // Importance, head by head (the order of a per-head attend + accumulate loop).
  if (!imp_acc.empty()) {
    for (size_t j = 0; j < G; ++j) {
      const float* pj = p + j * n;
      for (size_t t = 0; t < n; ++t) imp_acc[t] += pj[t];
    }
  }
}

void Attend(const HeadRowsView& rows, std::span<const float> q, std::span<float> out,
            std::span<float> probs, const AttendOptions& options) {
  AttendGroup(rows, q, /*n_q_heads=*/1, out, probs, /*imp_acc=*/{}, options);
}

void AttentionHead(std::span<const float> q, std::span<const float> keys,
                   std::span<const float> values, size_t head_dim, const AttendOptions& options,
                   std::span<float> out, std::span<float> probs) {
  CORTIQ_KV_CHECK(head_dim > 0 && keys.size() % head_dim == 0 && values.size() == keys.size());
  Attend(HeadRowsView::F32(keys, values, head_dim), q, out, probs, options);
}

}  // namespace cortiq::kv
