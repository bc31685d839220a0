// NystromState: streaming Nyström (landmark) attention for ONE GQA group —
// the O(1)-memory attention operator of `attn_type: nystrom` layers. A C++
// port of the seed `nystrom.rs` (shared/seeds/002); its numerics are the
// specification and are followed operation for operation (f64 where the seed
// uses f64).
//
// Attention splits into an EXACT sliding window (last `w` keys, plus `sink`
// permanent keys at positions 0..sink) and a landmark-skeleton far field that
// share ONE joint denominator:
//
//   out(q_t) = (Σ_near e_j·v_j + F·M·T_far) / (Σ_near e_j + F·M·Z_far)
//   e_j   = exp(q_t·k_j/√d)                 exact near weights
//   F_i   = exp(q_t·k̃_i/√d)                 scores vs landmark keys
//   M     = pinv_reg(exp(Q̃·K̃ᵀ/√d))          fixed after prefill
//   T_far = Σ_{far j} exp(Q̃·k_j/√d)·v_jᵀ    [m_eff][dv]
//   Z_far = Σ_{far j} exp(Q̃·k_j/√d)         [m_eff]
//   near  = (t-j < w) OR (j < sink);  far = sink ≤ j ≤ t-w
//
// Delayed insertion: key j enters T/Z at the step it LEAVES the window
// (t = j+w) — no overlap, no hole. Sinks never enter the ring, so they never
// reach the far field. Prompts of length ≤ w + sink + 8 run exact-only (no
// skeleton; the window just grows).
//
// State splits along the GQA grain (see NystromGroup / NystromHead below):
// the window ring, sinks and key landmarks K̃ are stored once per group; each
// Q head owns its far accumulators T̂/Ẑ (+ per-landmark running max), its
// query landmarks Q̃ and its mixing matrix M.
//
// Cost: Prefill O(t·(m·d + dv)·heads) + O(m³) per head; Step O((sink + w)·(d +
// dv) + m·(d + m + dv)) per head, and zero heap allocations in skeleton mode
// (exact-only mode may grow its window). MemoryBytes() is exact.
//
// Ownership / threading: the state owns all its buffers; move-only, explicit
// Copy(). Not thread-safe: one owner mutates it (the layer's KV cache, on the
// engine's scheduler thread). Const methods are thread-compatible.
//
// Example:
//   auto st = NystromState::NewGroup(/*m=*/32, /*w=*/128, /*sink=*/4, /*q_heads=*/2);
//   std::array<std::span<const float>, 2> qs = {q0, q1};  // each [t][d]
//   CORTIQ_RETURN_IF_ERROR(st.PrefillGroup(qs, ks, vs, t, d, dv));
//   CORTIQ_RETURN_IF_ERROR(st.StepGroup(q_all, k, v, out_all));  // per token
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace cortiq::kv {

// Which rectifier keeps the skeleton's estimated far mass non-negative
// (M is indefinite; unrectified, the joint denominator collapses).
//   kAggregate: a row whose far denominator comes out negative drops its far
//               field entirely. Measured best (seed table: ×1.296 at m=32).
//   kFm:        clamp FM = F·M (an m-vector per row) at zero, so every
//               per-key far weight Σ_b FM[b]·E[b,j] is ≥ 0. Measured worse.
enum class O1Rect : uint8_t { kAggregate = 0, kFm = 1 };
inline constexpr O1Rect kO1DefaultRect = O1Rect::kAggregate;
const char* O1RectName(O1Rect rect);

// Ridge factor of the pseudo-inverse: λ = kRidgeRel · mean(diag(AᵀA)).
inline constexpr double kRidgeRel = 1e-6;
// Floor for the joint denominator (mirrors the reference probe).
inline constexpr float kDenEps = 1e-30f;
// Prompts of length ≤ w + sink + kExactSlack skip the skeleton entirely:
// tiny prefills duplicate segment-mean landmarks (singular Au).
inline constexpr size_t kExactSlack = 8;
// Ridge attempts (λ ×10 each) before the scaled-identity fallback.
inline constexpr int kRidgeAttempts = 12;

// The part of the state a GQA group shares: everything derived from the
// group's keys and values alone. A plain value type so a wire format can
// read and rebuild every field (see NystromState::FromParts).
struct NystromGroup {
  size_t m = 0;               // landmark budget (≥ 4); m_eff may be lower
  size_t w = 0;               // exact-window width in keys (≥ 1)
  size_t sink = 0;            // permanent exact sink keys at positions 0..sink
  size_t d = 0;               // key / query width; 0 = not prefilled yet
  size_t dv = 0;              // value width
  size_t m_eff = 0;           // clamp(t/8, 4, m) at prefill; 0 in exact-only mode
  bool exact_only = true;     // short-prompt mode: window holds ALL keys
  float scale = 0.0f;         // 1/√d (f32, as the seed computes it)
  std::vector<float> win_k;   // [cap][d]: ring (cap = w) or append-only (exact-only: cap = win_len)
  std::vector<float> win_v;   // [cap][dv]
  size_t win_len = 0;         // live window entries
  size_t win_head = 0;        // ring slot of the OLDEST entry (0 until full)
  std::vector<float> sink_k;  // [sink_len][d], immutable after prefill
  std::vector<float> sink_v;  // [sink_len][dv]
  size_t sink_len = 0;        // == sink in skeleton mode, 0 in exact-only mode
  std::vector<float> k_tilde;  // [m_eff][d] key landmarks (segment means)
};

// The part of the state private to one Q head: everything touching that
// head's queries. Plain value type (see NystromGroup).
struct NystromHead {
  O1Rect rect = kO1DefaultRect;
  std::vector<float> t_hat;    // [m_eff][dv] far numerator at scale e^{-m_max[i]}
  std::vector<float> z_hat;    // [m_eff] far denominator, same scale
  std::vector<float> m_max;    // [m_eff] running max of far logits q̃_i·k_j/√d (-inf: none yet)
  size_t far_len = 0;          // keys absorbed into the far field
  std::vector<float> q_tilde;  // [m_eff][d] query landmarks
  std::vector<float> mu;       // [m_eff][m_eff] M = ridge_pinv(exp(Q̃·K̃ᵀ/√d)), row-major
};

// Borrowed view of the state for a device upload (the seed's O1DeviceView):
// every buffer in the layout the kernels index. Valid until the state is next
// mutated or destroyed. exact_only groups are not portable; callers refuse
// the device path for them.
struct O1HeadView {
  bool rect_fm = false;
  std::span<const float> t_hat;    // [m_eff][dv]
  std::span<const float> z_hat;    // [m_eff]
  std::span<const float> m_max;    // [m_eff]
  std::span<const float> q_tilde;  // [m_eff][d]
  std::span<const float> mu;       // [m_eff][m_eff]
};
struct O1DeviceView {
  size_t m_eff = 0, w = 0, sink_len = 0, d = 0, dv = 0;
  bool exact_only = true;
  float scale = 0.0f;
  size_t win_len = 0, win_head = 0;
  size_t far_len = 0;              // equal for every head (group invariant)
  std::span<const float> win_k;    // [cap][d]
  std::span<const float> win_v;    // [cap][dv]
  std::span<const float> sink_k;   // [sink_len][d]
  std::span<const float> sink_v;   // [sink_len][dv]
  std::span<const float> k_tilde;  // [m_eff][d]
  std::vector<O1HeadView> heads;   // [q_heads]
};

class NystromState {
 public:
  // Single-head state. m ≥ 4 and w ≥ 1 are programmer invariants (O1Config
  // clamps user input): violating them aborts.
  static NystromState New(size_t m, size_t w, size_t sink);
  // One GQA group of q_heads (≥ 1) query heads sharing a KV head.
  static NystromState NewGroup(size_t m, size_t w, size_t sink, size_t q_heads);
  // Selects the rectifier of every head (builder).
  NystromState WithRect(O1Rect rect) &&;

  NystromState(NystromState&&) noexcept = default;
  NystromState& operator=(NystromState&&) noexcept = default;
  NystromState(const NystromState&) = delete;
  NystromState& operator=(const NystromState&) = delete;
  // Deep copy (a few hundred KB per group at the defaults).
  NystromState Copy() const;

  size_t NumQHeads() const { return heads_.size(); }
  // Keys absorbed into head `head`'s far field. Eviction is a group event
  // but each head absorbs the evicted key exactly once, so this equals the
  // number of evictions — never a multiple.
  size_t FarLen(size_t head) const { return heads_[head].far_len; }
  bool Prefilled() const { return group_.d > 0; }
  bool ExactOnly() const { return group_.exact_only; }
  size_t MEff() const { return group_.m_eff; }

  // Absorbs the whole prompt of a single-head state (see PrefillGroup).
  absl::Status Prefill(std::span<const float> qs, std::span<const float> ks,
                       std::span<const float> vs, size_t t, size_t d, size_t dv);
  // Absorbs the whole prompt of a GQA group: freezes K̃ and each head's Q̃/M,
  // then replays positions sink..t through the step() state semantics
  // (window fill + delayed far insertion). qs[h] is head h's [t][d] query
  // block; ks is [t][d], vs is [t][dv], row-major. d, dv ≥ 1. A second call
  // starts over.
  absl::Status PrefillGroup(std::span<const std::span<const float>> qs, std::span<const float> ks,
                            std::span<const float> vs, size_t t, size_t d, size_t dv);

  // One decode step of a single-head state (see StepGroup).
  absl::Status Step(std::span<const float> q, std::span<const float> k, std::span<const float> v,
                    std::span<float> out);
  // One decode step for the group: inserts (k, v) ONCE (evicting the oldest
  // window key into every head's far field), then writes each head's output.
  // q_all is [q_heads][d], k [d], v [dv], out_all [q_heads][dv].
  // FailedPrecondition before Prefill; InvalidArgument on a size mismatch.
  absl::Status StepGroup(std::span<const float> q_all, std::span<const float> k,
                         std::span<const float> v, std::span<float> out_all);

  // Exact heap bytes held: every buffer's capacity (shared window, sinks,
  // K̃, each head's skeleton and scratch) plus the per-head arrays.
  size_t MemoryBytes() const;

  // Views for a device mirror (allocates only the heads vector).
  O1DeviceView DeviceView() const;

  // Serialisation access: every persistent field, by reference. Scratch is
  // not part of the state and is rebuilt by FromParts.
  const NystromGroup& group() const { return group_; }
  std::span<const NystromHead> heads() const { return heads_; }
  // Rebuilds a state from its parts (e.g. read from a wire format),
  // validating every shape and group invariant; InvalidArgument names the
  // offending field.
  static absl::StatusOr<NystromState> FromParts(NystromGroup group, std::vector<NystromHead> heads);

 private:
  // Per-head scratch, preallocated at prefill so skeleton-mode Step is
  // allocation-free. Per head: heads of a group write it independently.
  struct Scratch {
    std::vector<float> s;   // [sink + w] near logits (grows in exact-only mode)
    std::vector<float> fh;  // [m_eff] shifted landmark scores
    std::vector<float> u;   // [m_eff] mixing row / far gains
    std::vector<float> l;   // [m_eff] far logits of the evicted key
  };

  NystromState() = default;
  void AllocateScratch();
  void Advance(const float* k, const float* v);
  void FarInsert(size_t h, size_t slot);
  void HeadStep(size_t h, const float* q, float* out);
  void SealHead(size_t h, const float* qs, size_t t, const std::vector<double>& k_tilde64);

  NystromGroup group_;
  std::vector<NystromHead> heads_;  // [q_heads]
  std::vector<Scratch> scratch_;    // [q_heads]
};

// Regularised pseudo-inverse M = (AᵀA + λI)⁻¹Aᵀ of a square n×n row-major
// matrix, λ = kRidgeRel·mean(diag(AᵀA)), via Cholesky in f64. λ grows ×10 on
// a failed factorisation, up to kRidgeAttempts times; then the result falls
// back to I / mean(diag(AᵀA)). Exposed for tests and trainers that must seal
// with the same solver.
struct RidgePinvResult {
  std::vector<double> m;  // [n][n]
  int attempts = 0;       // Cholesky factorisations tried
  bool fallback = false;  // true: scaled identity
};
RidgePinvResult RidgePinv(std::span<const double> a, size_t n);

namespace internal {
// Re-arms the once-per-process "m clamped to m_eff" warning (tests only).
void ResetMEffClampWarningForTesting();
}  // namespace internal

}  // namespace cortiq::kv
