// Exact attention of query heads over one KV head's stored rows (seed 001's
// attend / attend_group / attention_head): free functions over a read-only
// HeadRowsView, so the math knows nothing of who stores the rows
// (LayerKvCache's KvRows, a test's vectors, a wire buffer).
//
// Contract
//   * Bit-exactness: every function here scores row t with
//     logit[t] = cap(scale · dot) — dot = Dot(q, k[t]) for f32 rows,
//     s_k[t] · DotI8(q, k_q[t]) for int8 rows —, normalises with math::Softmax
//     over the contiguous visible logits [first, n), and accumulates
//     out = Σ_t p[t] · v[t] (Axpy / p[t]·s_v[t] AxpyI8, t ascending, from
//     out = 0), f32 throughout. AttendGroup only changes the loop nesting
//     (rows outside, heads inside), so each of its heads equals Attend of that
//     head, which for f32 rows equals AttentionHead, bit for bit.
//   * Allocation: none. Every output and scratch buffer is the caller's.
//   * Cost: O(n · head_dim) per query head (n visible rows), one pass over K
//     and one over V per call whatever the number of heads.
//   * Errors: wrong buffer sizes are programmer errors (abort, "kv check
//     failed"): q, out: [head_dim] per head; probs as stated per function.
//
// Thread-safety: pure functions of their arguments; concurrent calls are
// safe as long as each has its own out / probs / imp_acc.
//
// Example (one GQA group of 4 Q heads over f32 rows held elsewhere):
//   std::vector<float> out(4 * d), probs(4 * n);
//   kv::AttendGroup(HeadRowsView::F32(keys, values, d), q_group, 4, out, probs, {}, {});
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "core/kv/head_rows.h"

namespace cortiq::kv {

// Score options shared by Attend, AttendGroup and AttentionHead.
struct AttendOptions {
  // Logit scale; 0 → 1/sqrt(head_dim) (the architecture may override it).
  float scale = 0.0f;
  // Earliest visible stored row: rows [0, first) get probability exactly 0
  // (sliding-window layers pass stored − window). first >= stored → every
  // probability is 0 and the output is 0.
  size_t first = 0;
  // One past the last visible stored row: rows [end, stored) are ignored as if
  // never appended (a causal prefill chunk appends every row first, then row
  // i attends with end = its position + 1). Default: every stored row.
  size_t end = SIZE_MAX;
  // > 0: Gemma-style soft cap, logit = softcap · tanh(logit / softcap), applied
  // after scaling and before softmax. 0 = off.
  float softcap = 0.0f;
};

// All n_q_heads query heads of one GQA group over `rows`: ONE pass over the
// stored K rows (each row scored for every head) and ONE pass over the V
// rows. n = min(rows.len, options.end). q_group, out: [n_q_heads × head_dim]
// (the group's heads, contiguous); probs: [>= n_q_heads × n], receives head
// j's probabilities at [j × n, (j+1) × n); imp_acc: empty or [>= n] —
// imp_acc[t] += p_j[t] for every head j in order (a per-head attend +
// accumulate loop, bit for bit).
void AttendGroup(const HeadRowsView& rows, std::span<const float> q_group, size_t n_q_heads,
                 std::span<float> out, std::span<float> probs, std::span<float> imp_acc,
                 const AttendOptions& options = {});

// One query head over `rows`: AttendGroup with one head and no importance.
// q, out: [head_dim]; probs: [>= n], receives the n probabilities.
void Attend(const HeadRowsView& rows, std::span<const float> q, std::span<float> out,
            std::span<float> probs, const AttendOptions& options = {});

// Plain attention of one query head over f32 slices — the reference the f32
// branch of Attend / AttendGroup equals bit for bit (it is Attend over
// HeadRowsView::F32(keys, values, head_dim)):
//   logit[t] = cap(scale · Dot(q, keys[t]))  for t in [first, len)
//   p = Softmax(logit[first..len)),  p[t < first] = 0
//   out = Σ_t p[t] · values[t]  (Axpy, t ascending, from out = 0)
// q: [head_dim]; keys, values: [len × head_dim]; out: [head_dim];
// probs: [>= len], receives p. Allocates nothing.
void AttentionHead(std::span<const float> q, std::span<const float> keys,
                   std::span<const float> values, size_t head_dim, const AttendOptions& options,
                   std::span<float> out, std::span<float> probs);

}  // namespace cortiq::kv
