// NystromState: the streaming Nyström attention kernel (see nystrom.h).
//
// Numerics follow the seed nystrom.rs (shared/seeds/002) operation for
// operation: landmarks and the pseudo-inverse in f64, the hot path in f32
// with per-landmark running maxima, a per-row landmark shift f and one joint
// scale c_all before the single division. Dot products and axpys go through
// core/math (the seed's NEON dot_f32/axpy_f32: same products, regrouped sums);
// the m×m mixing product stays a sequential scalar loop as in the seed.
//
// Two deliberate hardenings (both no-ops on finite, in-range data):
//   * a mixing matrix that does not fit f32 (seed: 1/MIN_POSITIVE fallback
//     cast to +inf) is replaced by zeros — the head runs near-only;
//   * a far denominator that is +inf drops the far field like a negative one
//     (the seed keeps it and divides inf/inf).
#include "core/kv/nystrom.h"

#include "core/kv/o1_config.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/str_format.h"
#include "core/math/kernels.h"
#include "spdlog/spdlog.h"

namespace cortiq::kv {
namespace {

std::atomic<bool> g_meff_clamp_warned{false};
std::atomic<bool> g_mu_overflow_warned{false};

// Programmer-invariant check (the seed's assert!): logs and aborts.
// Straight to stderr: the default logger may be buffered or on stdout.
void Require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "NystromState: %s\n", what);
  std::abort();
}

// Contiguous segment means (the Nyströmformer landmark recipe), f64
// accumulation. Segment i is rows [i·t/m, (i+1)·t/m). xs is [t][d]; the
// result is [m][d].
std::vector<double> SegMeans(const float* xs, size_t t, size_t d, size_t m) {
  std::vector<double> out(m * d, 0.0);
  for (size_t i = 0; i < m; ++i) {
    const size_t lo = i * t / m;
    const size_t hi = (i + 1) * t / m;
    double* o = &out[i * d];
    for (size_t j = lo; j < hi; ++j) {
      for (size_t c = 0; c < d; ++c) o[c] += static_cast<double>(xs[j * d + c]);
    }
    const double inv = 1.0 / static_cast<double>(hi - lo);
    for (size_t c = 0; c < d; ++c) o[c] *= inv;
  }
  return out;
}

std::vector<float> ToF32(const std::vector<double>& x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = static_cast<float>(x[i]);
  return out;
}

// In-place lower Cholesky of an SPD n×n matrix; false if a pivot fails.
bool Cholesky(std::vector<double>& g, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j <= i; ++j) {
      double s = g[i * n + j];
      for (size_t k = 0; k < j; ++k) s -= g[i * n + k] * g[j * n + k];
      if (i == j) {
        if (s <= 0.0 || !std::isfinite(s)) return false;
        g[i * n + i] = std::sqrt(s);
      } else {
        g[i * n + j] = s / g[j * n + j];
      }
    }
  }
  return true;
}

size_t Bytes(const std::vector<float>& x) { return x.capacity() * sizeof(float); }

absl::Status SizeError(const char* field, size_t got, size_t want) {
  return absl::InvalidArgumentError(
      absl::StrFormat("NystromState: %s has %d elements, expected %d", field, got, want));
}

}  // namespace

namespace internal {
void ResetMEffClampWarningForTesting() { g_meff_clamp_warned.store(false); }
}  // namespace internal

const char* O1RectName(O1Rect rect) {
  switch (rect) {
    case O1Rect::kAggregate:
      return "aggregate";
    case O1Rect::kFm:
      return "fm";
  }
  return "?";
}

RidgePinvResult RidgePinv(std::span<const double> a, size_t n) {
  RidgePinvResult res;
  std::vector<double> ata(n * n, 0.0);
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) {
      double s = 0.0;
      for (size_t k = 0; k < n; ++k) s += a[k * n + i] * a[k * n + j];
      ata[i * n + j] = s;
    }
  }
  double mean_diag = 0.0;
  for (size_t i = 0; i < n; ++i) mean_diag += ata[i * n + i];
  mean_diag /= static_cast<double>(n);
  // fmax, like Rust's f64::max, ignores a NaN operand.
  const double diag_floor = std::fmax(mean_diag, std::numeric_limits<double>::min());
  double lambda = kRidgeRel * diag_floor;
  std::vector<double> g(n * n);
  std::vector<double> x(n);
  for (int attempt = 0; attempt < kRidgeAttempts; ++attempt) {
    res.attempts = attempt + 1;
    g = ata;
    for (size_t i = 0; i < n; ++i) g[i * n + i] += lambda;
    if (Cholesky(g, n)) {
      const std::vector<double>& l = g;
      res.m.assign(n * n, 0.0);
      // Solve G·M = Aᵀ column by column; column j of Aᵀ is row j of A.
      for (size_t j = 0; j < n; ++j) {
        const double* rhs = &a[j * n];
        for (size_t i = 0; i < n; ++i) {  // forward: L·y = rhs
          double s = rhs[i];
          for (size_t k = 0; k < i; ++k) s -= l[i * n + k] * x[k];
          x[i] = s / l[i * n + i];
        }
        for (size_t i = n; i-- > 0;) {  // backward: Lᵀ·x = y
          double s = x[i];
          for (size_t k = i + 1; k < n; ++k) s -= l[k * n + i] * x[k];
          x[i] = s / l[i * n + i];
        }
        for (size_t i = 0; i < n; ++i) res.m[i * n + j] = x[i];
      }
      return res;
    }
    lambda *= 10.0;
  }
  // Unreachable for finite input (λ dominates the rounding of the
  // factorisation); degrade to a scaled identity rather than poison.
  res.fallback = true;
  res.m.assign(n * n, 0.0);
  for (size_t i = 0; i < n; ++i) res.m[i * n + i] = 1.0 / diag_floor;
  return res;
}

// ---- construction ----------------------------------------------------------

NystromState NystromState::New(size_t m, size_t w, size_t sink) { return NewGroup(m, w, sink, 1); }

NystromState NystromState::NewGroup(size_t m, size_t w, size_t sink, size_t q_heads) {
  Require(m >= kO1MinLandmarks, "landmark budget must be at least 4 (kO1MinLandmarks)");
  Require(w >= kO1MinWindow, "window must hold at least one key");
  Require(q_heads >= 1, "a GQA group needs at least one query head");
  NystromState st;
  st.group_.m = m;
  st.group_.w = w;
  st.group_.sink = sink;
  st.heads_.resize(q_heads);
  st.scratch_.resize(q_heads);
  return st;
}

NystromState NystromState::WithRect(O1Rect rect) && {
  for (NystromHead& h : heads_) h.rect = rect;
  return std::move(*this);
}

NystromState NystromState::Copy() const {
  NystromState st;
  st.group_ = group_;
  st.heads_ = heads_;
  st.scratch_.resize(heads_.size());
  if (Prefilled()) st.AllocateScratch();
  return st;
}

void NystromState::AllocateScratch() {
  const NystromGroup& g = group_;
  for (Scratch& sc : scratch_) {
    if (g.exact_only) {
      // The window grows on decode; leave room for a few steps (as the seed).
      sc.s = std::vector<float>();
      sc.s.reserve(g.win_len + 64);
      sc.fh = sc.u = sc.l = std::vector<float>();
    } else {
      sc.s = std::vector<float>(g.sink + g.w, 0.0f);
      sc.fh = std::vector<float>(g.m_eff, 0.0f);
      sc.u = std::vector<float>(g.m_eff, 0.0f);
      sc.l = std::vector<float>(g.m_eff, 0.0f);
    }
  }
}

// ---- prefill -----------------------------------------------------------------

absl::Status NystromState::Prefill(std::span<const float> qs, std::span<const float> ks,
                                   std::span<const float> vs, size_t t, size_t d, size_t dv) {
  if (heads_.size() != 1) {
    return absl::FailedPreconditionError("NystromState::Prefill on a GQA group; use PrefillGroup");
  }
  const std::span<const float> one[1] = {qs};
  return PrefillGroup(one, ks, vs, t, d, dv);
}

absl::Status NystromState::PrefillGroup(std::span<const std::span<const float>> qs,
                                        std::span<const float> ks, std::span<const float> vs,
                                        size_t t, size_t d, size_t dv) {
  if (d == 0 || dv == 0) {
    return absl::InvalidArgumentError("NystromState: d and dv must be at least 1");
  }
  if (qs.size() != heads_.size()) return SizeError("qs (query blocks)", qs.size(), heads_.size());
  for (const auto& q : qs) {
    if (q.size() != t * d) return SizeError("qs[h]", q.size(), t * d);
  }
  if (ks.size() != t * d) return SizeError("ks", ks.size(), t * d);
  if (vs.size() != t * dv) return SizeError("vs", vs.size(), t * dv);

  NystromGroup& g = group_;
  g.d = d;
  g.dv = dv;
  g.scale = 1.0f / std::sqrt(static_cast<float>(d));
  g.win_len = 0;
  g.win_head = 0;
  g.sink_len = 0;
  g.m_eff = 0;
  g.sink_k = std::vector<float>();
  g.sink_v = std::vector<float>();
  g.k_tilde = std::vector<float>();
  g.exact_only = t <= g.w + g.sink + kExactSlack;
  for (NystromHead& h : heads_) {
    const O1Rect rect = h.rect;
    h = NystromHead{};
    h.rect = rect;
  }

  if (g.exact_only) {
    // Every key is a permanent exact key; no skeleton, no sink buffer.
    // Headroom for a few decode steps before the vectors grow.
    g.win_k = std::vector<float>();
    g.win_v = std::vector<float>();
    g.win_k.reserve((t + 64) * d);
    g.win_v.reserve((t + 64) * dv);
    g.win_k.assign(ks.begin(), ks.end());
    g.win_v.assign(vs.begin(), vs.end());
    g.win_len = t;
    AllocateScratch();
    return absl::OkStatus();
  }

  // Sinks: positions 0..sink bypass the ring, so delayed insertion can
  // never move them into the far field. Skeleton mode guarantees t > sink.
  g.sink_len = g.sink;
  g.sink_k.assign(ks.begin(), ks.begin() + g.sink * d);
  g.sink_v.assign(vs.begin(), vs.begin() + g.sink * dv);

  // Landmarks: contiguous segment means; the clamp keeps tiny prompts from
  // producing duplicate landmarks.
  const size_t m_eff = std::clamp<size_t>(t / 8, 4, g.m);
  if (m_eff < g.m && !g_meff_clamp_warned.exchange(true, std::memory_order_relaxed)) {
    // A flag that silently does nothing reads as a saturating method (the
    // seed lost a sweep to it): say so once per process.
    spdlog::warn(
        "o1: landmark budget m={} clamped to m_eff={} — the prefill is {} tokens and the "
        "skeleton takes t/8. Prefill at least {} tokens to use the budget you asked for.",
        g.m, m_eff, t, g.m * 8);
  }
  g.m_eff = m_eff;
  const std::vector<double> k_tilde64 = SegMeans(ks.data(), t, d, m_eff);
  g.k_tilde = ToF32(k_tilde64);
  g.win_k = std::vector<float>(g.w * d, 0.0f);
  g.win_v = std::vector<float>(g.w * dv, 0.0f);

  for (size_t h = 0; h < heads_.size(); ++h) SealHead(h, qs[h].data(), t, k_tilde64);
  AllocateScratch();
  // Replay the post-sink prompt once for the group: each key enters the
  // shared window, evicting the (j-w)-th into every head's far field.
  for (size_t j = g.sink; j < t; ++j) Advance(&ks[j * d], &vs[j * dv]);
  return absl::OkStatus();
}

void NystromState::SealHead(size_t h, const float* qs, size_t t,
                            const std::vector<double>& k_tilde64) {
  const NystromGroup& g = group_;
  NystromHead& head = heads_[h];
  const size_t d = g.d, dv = g.dv, m_eff = g.m_eff;
  head.far_len = 0;
  const std::vector<double> q_tilde64 = SegMeans(qs, t, d, m_eff);
  head.q_tilde = ToF32(q_tilde64);

  // Au = exp(Q̃·K̃ᵀ/√d) and its ridge pseudo-inverse, f64: one-off m×m work.
  std::vector<double> au(m_eff * m_eff);
  for (size_t i = 0; i < m_eff; ++i) {
    for (size_t j = 0; j < m_eff; ++j) {
      double s = 0.0;
      for (size_t c = 0; c < d; ++c) s += q_tilde64[i * d + c] * k_tilde64[j * d + c];
      au[i * m_eff + j] = std::exp(s * static_cast<double>(g.scale));
    }
  }
  head.mu = ToF32(RidgePinv(au, m_eff).m);
  if (!std::all_of(head.mu.begin(), head.mu.end(), [](float x) { return std::isfinite(x); })) {
    // Hardening (see banner): an f32-unrepresentable M would turn every
    // output of this head into inf/NaN. Zeros make the head near-only.
    std::fill(head.mu.begin(), head.mu.end(), 0.0f);
    if (!g_mu_overflow_warned.exchange(true, std::memory_order_relaxed)) {
      spdlog::warn(
          "o1: landmark mixing matrix overflows f32 (extreme logits); the far "
          "field of the affected heads is disabled");
    }
  }
  head.t_hat = std::vector<float>(m_eff * dv, 0.0f);
  head.z_hat = std::vector<float>(m_eff, 0.0f);
  head.m_max = std::vector<float>(m_eff, -std::numeric_limits<float>::infinity());
}

// ---- decode --------------------------------------------------------------------

absl::Status NystromState::Step(std::span<const float> q, std::span<const float> k,
                                std::span<const float> v, std::span<float> out) {
  if (heads_.size() != 1) {
    return absl::FailedPreconditionError("NystromState::Step on a GQA group; use StepGroup");
  }
  return StepGroup(q, k, v, out);
}

absl::Status NystromState::StepGroup(std::span<const float> q_all, std::span<const float> k,
                                     std::span<const float> v, std::span<float> out_all) {
  const size_t d = group_.d, dv = group_.dv, nh = heads_.size();
  if (d == 0) return absl::FailedPreconditionError("NystromState: Prefill must run before Step");
  if (q_all.size() != nh * d) return SizeError("q_all", q_all.size(), nh * d);
  if (k.size() != d) return SizeError("k", k.size(), d);
  if (v.size() != dv) return SizeError("v", v.size(), dv);
  if (out_all.size() != nh * dv) return SizeError("out_all", out_all.size(), nh * dv);
  // The current token is in its own near window (t-j = 0): insert first.
  Advance(k.data(), v.data());
  for (size_t h = 0; h < nh; ++h) HeadStep(h, &q_all[h * d], &out_all[h * dv]);
  return absl::OkStatus();
}

// Pushes (k, v) into the shared window. A full ring first evicts its oldest
// key — ONE eviction per position (the window is shared), absorbed once into
// EACH head's far field: q_heads insertions, never more, never fewer.
void NystromState::Advance(const float* k, const float* v) {
  NystromGroup& g = group_;
  const size_t d = g.d, dv = g.dv;
  if (!g.exact_only && g.win_len == g.w) {
    const size_t slot = g.win_head;
    // Every head absorbs the outgoing key BEFORE the slot is overwritten.
    for (size_t h = 0; h < heads_.size(); ++h) FarInsert(h, slot);
    std::copy(k, k + d, &g.win_k[slot * d]);
    std::copy(v, v + dv, &g.win_v[slot * dv]);
    g.win_head = (g.win_head + 1) % g.w;
  } else if (g.exact_only) {
    g.win_k.insert(g.win_k.end(), k, k + d);
    g.win_v.insert(g.win_v.end(), v, v + dv);
    ++g.win_len;
  } else {
    std::copy(k, k + d, &g.win_k[g.win_len * d]);
    std::copy(v, v + dv, &g.win_v[g.win_len * dv]);
    ++g.win_len;
  }
}

// Absorbs window slot `slot` into head h's far accumulators with the
// per-landmark flash shift: T̂[i]/Ẑ[i] live at scale e^{-m_max[i]}; a new
// larger logit rescales the existing mass by e^{old-new} (exactly 0 on the
// first insertion, since m_max starts at -inf).
void NystromState::FarInsert(size_t h, size_t slot) {
  const NystromGroup& g = group_;
  NystromHead& head = heads_[h];
  float* l = scratch_[h].l.data();
  const size_t d = g.d, dv = g.dv;
  const float* key = &g.win_k[slot * d];
  const float* val = &g.win_v[slot * dv];
  for (size_t i = 0; i < g.m_eff; ++i) {
    l[i] = math::Dot(&head.q_tilde[i * d], key, d) * g.scale;
  }
  for (size_t i = 0; i < g.m_eff; ++i) {
    float* t_row = &head.t_hat[i * dv];
    if (l[i] > head.m_max[i]) {
      const float r = std::exp(head.m_max[i] - l[i]);
      head.z_hat[i] *= r;
      math::Scale(t_row, r, dv);
      head.m_max[i] = l[i];
    }
    const float e = std::exp(l[i] - head.m_max[i]);
    head.z_hat[i] += e;
    math::Axpy(e, val, t_row, dv);
  }
  ++head.far_len;
}

// Head h's output for q against the group's window + sinks and its own far
// field. The window insertion for this position already happened (Advance).
void NystromState::HeadStep(size_t h, const float* q, float* out) {
  const NystromGroup& g = group_;
  const NystromHead& head = heads_[h];
  Scratch& sc = scratch_[h];
  const size_t d = g.d, dv = g.dv, m_eff = g.m_eff;

  // Near field: exact logits over sinks + window, one shared shift.
  const size_t ns = g.sink_len;
  const size_t n = ns + g.win_len;
  if (sc.s.size() < n) sc.s.resize(n);  // exact-only mode only
  float* s_near = sc.s.data();
  float c = -std::numeric_limits<float>::infinity();
  for (size_t s = 0; s < ns; ++s) {
    const float lg = math::Dot(q, &g.sink_k[s * d], d) * g.scale;
    s_near[s] = lg;
    c = std::fmax(c, lg);
  }
  for (size_t s = 0; s < g.win_len; ++s) {
    const float lg = math::Dot(q, &g.win_k[s * d], d) * g.scale;
    s_near[ns + s] = lg;
    c = std::fmax(c, lg);
  }

  // Far field: shifted skeleton. Every exp argument is ≤ 0 relative to the
  // joint shift c_all, so nothing overflows.
  float far_den = 0.0f;
  float c_all = c;
  bool have_far = false;
  if (head.far_len > 0) {
    float* fh = sc.fh.data();
    float* u = sc.u.data();
    // Per-token row shift f over the landmark scores.
    float f = -std::numeric_limits<float>::infinity();
    for (size_t a = 0; a < m_eff; ++a) {
      const float s = math::Dot(q, &g.k_tilde[a * d], d) * g.scale;
      fh[a] = s;
      f = std::fmax(f, s);
    }
    for (size_t a = 0; a < m_eff; ++a) fh[a] = std::exp(fh[a] - f);
    // u = (F·e^{-f})·M — the landmark mixing row (FM up to e^{-f} > 0).
    const bool fm = head.rect == O1Rect::kFm;
    for (size_t b = 0; b < m_eff; ++b) {
      float s = 0.0f;
      for (size_t a = 0; a < m_eff; ++a) s += fh[a] * head.mu[a * m_eff + b];
      // Fm: every far weight is Σ_b FM[b]·E[b,j] with E ≥ 0, so FM ≥ 0 makes
      // all of them non-negative. The positive factors below do not change
      // the sign, so clamping here is the same predicate.
      u[b] = fm ? std::fmax(s, 0.0f) : s;
    }
    // Joint scale: far term b carries e^{f + m_max[b]}, near e^{c}.
    for (size_t b = 0; b < m_eff; ++b) c_all = std::fmax(c_all, f + head.m_max[b]);
    for (size_t b = 0; b < m_eff; ++b) {
      const float gain = u[b] * std::exp(f + head.m_max[b] - c_all);
      u[b] = gain;
      far_den += gain * head.z_hat[b];
    }
    // Aggregate guard (Aggregate's rectifier; under Fm it can only fire on
    // rounding): a negative (or non-finite) far denominator means the
    // skeleton estimate is unusable for this row — drop the far field.
    if (far_den >= 0.0f && std::isfinite(far_den)) {
      have_far = true;
    } else {
      far_den = 0.0f;
    }
  }

  std::fill(out, out + dv, 0.0f);
  if (have_far) {
    for (size_t b = 0; b < m_eff; ++b) math::Axpy(sc.u[b], &head.t_hat[b * dv], out, dv);
  }
  float den = far_den;
  for (size_t s = 0; s < n; ++s) {
    const float p = std::exp(s_near[s] - c_all);
    den += p;
    // Rows 0..ns are sinks, the rest window slots.
    const float* vv = s < ns ? &g.sink_v[s * dv] : &g.win_v[(s - ns) * dv];
    math::Axpy(p, vv, out, dv);
  }
  den = std::fmax(den, kDenEps);
  for (size_t i = 0; i < dv; ++i) out[i] /= den;
}

// ---- accounting, views, parts ---------------------------------------------------

size_t NystromState::MemoryBytes() const {
  const NystromGroup& g = group_;
  size_t bytes =
      Bytes(g.win_k) + Bytes(g.win_v) + Bytes(g.sink_k) + Bytes(g.sink_v) + Bytes(g.k_tilde);
  bytes += heads_.capacity() * sizeof(NystromHead);
  for (const NystromHead& h : heads_) {
    bytes += Bytes(h.t_hat) + Bytes(h.z_hat) + Bytes(h.m_max) + Bytes(h.q_tilde) + Bytes(h.mu);
  }
  bytes += scratch_.capacity() * sizeof(Scratch);
  for (const Scratch& sc : scratch_) {
    bytes += Bytes(sc.s) + Bytes(sc.fh) + Bytes(sc.u) + Bytes(sc.l);
  }
  return bytes;
}

O1DeviceView NystromState::DeviceView() const {
  const NystromGroup& g = group_;
  O1DeviceView v;
  v.m_eff = g.m_eff;
  v.w = g.w;
  v.sink_len = g.sink_len;
  v.d = g.d;
  v.dv = g.dv;
  v.exact_only = g.exact_only;
  v.scale = g.scale;
  v.win_len = g.win_len;
  v.win_head = g.win_head;
  v.far_len = heads_.empty() ? 0 : heads_.front().far_len;
  v.win_k = g.win_k;
  v.win_v = g.win_v;
  v.sink_k = g.sink_k;
  v.sink_v = g.sink_v;
  v.k_tilde = g.k_tilde;
  v.heads.reserve(heads_.size());
  for (const NystromHead& h : heads_) {
    v.heads.push_back(
        O1HeadView{h.rect == O1Rect::kFm, h.t_hat, h.z_hat, h.m_max, h.q_tilde, h.mu});
  }
  return v;
}

absl::StatusOr<NystromState> NystromState::FromParts(NystromGroup group,
                                                     std::vector<NystromHead> heads) {
  auto invalid = [](const std::string& msg) {
    return absl::InvalidArgumentError("NystromState::FromParts: " + msg);
  };
  auto check_size = [](const char* field, size_t got, size_t want) -> absl::Status {
    if (got == want) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrFormat(
        "NystromState::FromParts: %s has %d elements, expected %d", field, got, want));
  };
#define CORTIQ_NYS_CHECK_SIZE_(field, got, want)     \
  do {                                               \
    absl::Status st_ = check_size(field, got, want); \
    if (!st_.ok()) return st_;                       \
  } while (0)

  const NystromGroup& g = group;
  if (g.m < kO1MinLandmarks) return invalid(absl::StrCat("m must be at least ", kO1MinLandmarks));
  if (g.w < kO1MinWindow) return invalid(absl::StrCat("w must be at least ", kO1MinWindow));
  if (heads.empty()) return invalid("a GQA group needs at least one query head");
  for (const NystromHead& h : heads) {
    if (h.rect != O1Rect::kAggregate && h.rect != O1Rect::kFm) return invalid("unknown rect");
  }
  const bool prefilled = g.d > 0;
  if (!prefilled) {
    // A fresh (never prefilled) state: nothing but the configuration.
    if (g.dv != 0 || g.win_len != 0 || g.win_head != 0 || g.sink_len != 0 || g.m_eff != 0 ||
        !g.win_k.empty() || !g.win_v.empty() || !g.sink_k.empty() || !g.sink_v.empty() ||
        !g.k_tilde.empty() || !g.exact_only) {
      return invalid("d == 0 (not prefilled) but the group holds data");
    }
    for (const NystromHead& h : heads) {
      if (h.far_len != 0 || !h.t_hat.empty() || !h.z_hat.empty() || !h.m_max.empty() ||
          !h.q_tilde.empty() || !h.mu.empty()) {
        return invalid("d == 0 (not prefilled) but a head holds data");
      }
    }
  } else {
    if (g.dv == 0) return invalid("dv must be at least 1");
    if (!(std::isfinite(g.scale) && g.scale > 0.0f)) return invalid("scale must be finite and > 0");
    const size_t d = g.d, dv = g.dv;
    if (g.exact_only) {
      if (g.sink_len != 0 || g.m_eff != 0 || g.win_head != 0) {
        return invalid("exact_only group with sink_len, m_eff or win_head set");
      }
      CORTIQ_NYS_CHECK_SIZE_("win_k", g.win_k.size(), g.win_len * d);
      CORTIQ_NYS_CHECK_SIZE_("win_v", g.win_v.size(), g.win_len * dv);
      CORTIQ_NYS_CHECK_SIZE_("sink_k", g.sink_k.size(), 0);
      CORTIQ_NYS_CHECK_SIZE_("sink_v", g.sink_v.size(), 0);
      CORTIQ_NYS_CHECK_SIZE_("k_tilde", g.k_tilde.size(), 0);
      for (const NystromHead& h : heads) {
        if (h.far_len != 0) return invalid("exact_only head with far_len > 0");
        CORTIQ_NYS_CHECK_SIZE_("t_hat", h.t_hat.size(), 0);
        CORTIQ_NYS_CHECK_SIZE_("z_hat", h.z_hat.size(), 0);
        CORTIQ_NYS_CHECK_SIZE_("m_max", h.m_max.size(), 0);
        CORTIQ_NYS_CHECK_SIZE_("q_tilde", h.q_tilde.size(), 0);
        CORTIQ_NYS_CHECK_SIZE_("mu", h.mu.size(), 0);
      }
    } else {
      const size_t m_eff = g.m_eff;
      if (m_eff < kO1MinLandmarks || m_eff > g.m) return invalid("m_eff must lie in [4, m]");
      if (g.sink_len != g.sink) return invalid("sink_len must equal sink in skeleton mode");
      if (g.win_len > g.w) return invalid("win_len exceeds w");
      if (g.win_head >= g.w || (g.win_len < g.w && g.win_head != 0)) {
        return invalid("win_head out of range for the ring");
      }
      CORTIQ_NYS_CHECK_SIZE_("win_k", g.win_k.size(), g.w * d);
      CORTIQ_NYS_CHECK_SIZE_("win_v", g.win_v.size(), g.w * dv);
      CORTIQ_NYS_CHECK_SIZE_("sink_k", g.sink_k.size(), g.sink * d);
      CORTIQ_NYS_CHECK_SIZE_("sink_v", g.sink_v.size(), g.sink * dv);
      CORTIQ_NYS_CHECK_SIZE_("k_tilde", g.k_tilde.size(), m_eff * d);
      const size_t far_len = heads.front().far_len;
      if (far_len > 0 && g.win_len != g.w) return invalid("far_len > 0 with a window not full");
      for (const NystromHead& h : heads) {
        // Each eviction is absorbed once by every head.
        if (h.far_len != far_len) return invalid("far_len differs between heads of a group");
        CORTIQ_NYS_CHECK_SIZE_("t_hat", h.t_hat.size(), m_eff * dv);
        CORTIQ_NYS_CHECK_SIZE_("z_hat", h.z_hat.size(), m_eff);
        CORTIQ_NYS_CHECK_SIZE_("m_max", h.m_max.size(), m_eff);
        CORTIQ_NYS_CHECK_SIZE_("q_tilde", h.q_tilde.size(), m_eff * d);
        CORTIQ_NYS_CHECK_SIZE_("mu", h.mu.size(), m_eff * m_eff);
      }
    }
  }
#undef CORTIQ_NYS_CHECK_SIZE_

  // Values: a NaN or an infinity anywhere would make every later output of
  // the group NaN (a decode that emits token 0 forever), so a state holding
  // one is impossible, not merely unusual. m_max alone may be -inf (a
  // landmark nothing was absorbed into yet), never NaN or +inf.
  auto first_bad = [](const std::vector<float>& xs, bool minus_inf_ok) -> std::optional<size_t> {
    for (size_t i = 0; i < xs.size(); ++i) {
      const float x = xs[i];
      if (!std::isfinite(x) && !(minus_inf_ok && x == -std::numeric_limits<float>::infinity())) {
        return i;
      }
    }
    return std::nullopt;
  };
  const std::pair<const char*, const std::vector<float>*> group_arrays[] = {
      {"win_k", &g.win_k},
      {"win_v", &g.win_v},
      {"sink_k", &g.sink_k},
      {"sink_v", &g.sink_v},
      {"k_tilde", &g.k_tilde}};
  for (const auto& [name, xs] : group_arrays) {
    if (auto i = first_bad(*xs, false)) {
      return invalid(absl::StrCat("non-finite value in ", name, " at ", *i));
    }
  }
  for (size_t h = 0; h < heads.size(); ++h) {
    const NystromHead& hd = heads[h];
    const std::pair<const char*, const std::vector<float>*> head_arrays[] = {
        {"t_hat", &hd.t_hat}, {"z_hat", &hd.z_hat}, {"q_tilde", &hd.q_tilde}, {"mu", &hd.mu}};
    for (const auto& [name, xs] : head_arrays) {
      if (auto i = first_bad(*xs, false)) {
        return invalid(absl::StrCat("non-finite value in head ", h, "'s ", name, " at ", *i));
      }
    }
    if (auto i = first_bad(hd.m_max, true)) {
      return invalid(absl::StrCat("NaN or +inf in head ", h, "'s m_max at ", *i));
    }
  }

  NystromState st;
  st.group_ = std::move(group);
  st.heads_ = std::move(heads);
  st.scratch_.resize(st.heads_.size());
  if (prefilled) st.AllocateScratch();
  return st;
}

}  // namespace cortiq::kv
