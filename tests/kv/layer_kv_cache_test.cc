// Tests for LayerKvCache (seed 001, exact path) and AttentionHead.
//
// Bit-exactness is checked with memcmp (EXPECT_EQ on floats would also pass
// -0.0 == 0.0; memcmp does not). The int8 error figures are printed (and
// asserted against sane bounds) so a change in quantisation shows in the log.
#include "core/kv/layer_kv_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "core/math/kernels.h"

namespace cortiq::kv {
namespace {

size_t Round64(size_t bytes) { return (bytes + 63) / 64 * 64; }

std::vector<float> RandomVec(std::mt19937& rng, size_t n, float stddev = 1.0f) {
  std::normal_distribution<float> d(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

bool SameBits(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size()) return false;
  // memcmp must not see the null data() of an empty span.
  return a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// An alive mask as a plain bool array (std::vector<bool> has no data()).
struct Mask {
  Mask(std::initializer_list<bool> v) : n(v.size()), b(new bool[v.size()]) {
    std::copy(v.begin(), v.end(), b.get());
  }
  std::span<const bool> span() const { return {b.get(), n}; }
  size_t n;
  std::unique_ptr<bool[]> b;
};

// Per-head rows kept on the side: the "slices" the reference attends over.
struct SideRows {
  SideRows(size_t h, size_t d) : k(h), v(h), head_dim(d) {}
  void Append(const std::vector<float>& kn, const std::vector<float>& vn,
              std::span<const bool> alive = {}) {
    for (size_t h = 0; h < k.size(); ++h) {
      if (!alive.empty() && !alive[h]) continue;
      k[h].insert(k[h].end(), kn.begin() + h * head_dim, kn.begin() + (h + 1) * head_dim);
      v[h].insert(v[h].end(), vn.begin() + h * head_dim, vn.begin() + (h + 1) * head_dim);
    }
  }
  std::vector<std::vector<float>> k, v;  // [H][len × head_dim]
  size_t head_dim;
};

// Fills `cache` (and `side`) with `len` random positions.
void Fill(LayerKvCache& cache, SideRows* side, std::mt19937& rng, size_t len, float stddev = 1.0f) {
  const size_t n = cache.num_kv_heads() * cache.head_dim();
  for (size_t t = 0; t < len; ++t) {
    auto k = RandomVec(rng, n, stddev);
    auto v = RandomVec(rng, n);
    cache.Append(k, v);
    if (side) side->Append(k, v);
  }
}

size_t ExpectedBytes(size_t H, size_t D, KvMode mode, size_t cap) {
  if (cap == 0) return 0;
  size_t b = Round64(H * sizeof(size_t));
  if (mode == KvMode::kF32) {
    b += 2 * Round64(H * cap * D * 4);
  } else {
    b += 2 * Round64(H * cap * D) + 2 * Round64(H * cap * 4);
  }
  return b;
}

// ---------------------------------------------------------------------------

TEST(LayerKvCacheTest, FreshCacheHoldsNothing) {
  LayerKvCache c(4, 16);
  EXPECT_EQ(c.seq_len(), 0u);
  EXPECT_EQ(c.capacity(), 0u);
  EXPECT_EQ(c.HeadLen(3), 0u);
  EXPECT_EQ(c.MemoryBytes(), 0u);
  EXPECT_FALSE(c.HasImportance());
  EXPECT_FALSE(c.HasDeadHeads());
  EXPECT_TRUE(c.HeadKeys(0).empty());
  EXPECT_STREQ(KvModeName(KvMode::kF32), "f32");
  EXPECT_STREQ(KvModeName(KvMode::kInt8), "int8");
}

TEST(LayerKvCacheTest, AppendSkipsDeadHeads) {
  const size_t H = 3, D = 8;
  std::mt19937 rng(1);
  LayerKvCache c(H, D);
  SideRows side(H, D);
  const Mask masks[] = {Mask{true, true, true}, Mask{true, false, true}, Mask{false, false, true},
                        Mask{true, false, true}, Mask{true, true, true}};
  // Enough positions to force two reallocations (16 → 32 → 64) with ragged
  // head lengths, so growth must copy each head's own row count.
  for (size_t t = 0; t < 40; ++t) {
    auto k = RandomVec(rng, H * D);
    auto v = RandomVec(rng, H * D);
    const auto alive = masks[t % 5].span();
    c.Append(k, v, alive);
    side.Append(k, v, alive);
  }
  EXPECT_EQ(c.seq_len(), 40u);
  EXPECT_EQ(c.HeadLen(0), 32u);
  EXPECT_EQ(c.HeadLen(1), 16u);
  EXPECT_EQ(c.HeadLen(2), 40u);
  EXPECT_TRUE(c.HasDeadHeads());
  for (size_t h = 0; h < H; ++h) {
    EXPECT_TRUE(SameBits(c.HeadKeys(h), side.k[h])) << h;
    EXPECT_TRUE(SameBits(c.HeadValues(h), side.v[h])) << h;
  }
  // A head dead at every append stores nothing.
  LayerKvCache d(2, 4);
  const Mask only0{true, false};
  for (int t = 0; t < 3; ++t) {
    d.Append(std::vector<float>(8, 1.0f), std::vector<float>(8, 2.0f), only0.span());
  }
  EXPECT_EQ(d.seq_len(), 3u);
  EXPECT_EQ(d.HeadLen(0), 3u);
  EXPECT_EQ(d.HeadLen(1), 0u);
  EXPECT_TRUE(d.HeadKeys(1).empty());
}

TEST(LayerKvCacheTest, AttendF32IsBitExactAttentionHeadOverSlices) {
  const size_t H = 2, D = 64;
  std::mt19937 rng(2);
  for (size_t len : {1u, 7u, 33u, 200u}) {
    LayerKvCache c(H, D);
    SideRows side(H, D);
    Fill(c, &side, rng, len);
    const AttendOptions opts[] = {{},
                                  {.scale = 0.37f},
                                  {.first = len / 2},
                                  {.softcap = 2.0f},
                                  {.scale = 0.5f, .first = len - 1, .softcap = 1.5f}};
    for (const auto& o : opts) {
      for (size_t h = 0; h < H; ++h) {
        auto q = RandomVec(rng, D);
        std::vector<float> out(D), probs(len), ref_out(D), ref_probs(len);
        c.Attend(q, h, out, probs, o);
        AttentionHead(q, side.k[h], side.v[h], D, o, ref_out, ref_probs);
        EXPECT_TRUE(SameBits(out, ref_out)) << len << " h" << h;
        EXPECT_TRUE(SameBits(probs, ref_probs)) << len << " h" << h;
        for (size_t t = 0; t < o.first && t < len; ++t) EXPECT_EQ(probs[t], 0.0f);
      }
    }
  }
}

struct GroupCase {
  KvMode mode;
  size_t n_q_heads;  // GQA ratio
  AttendOptions opt;
};

TEST(LayerKvCacheTest, AttendGroupIsBitExactPerHeadAttend) {
  const size_t H = 3, D = 32, len = 57;
  std::vector<GroupCase> cases;
  for (KvMode mode : {KvMode::kF32, KvMode::kInt8}) {
    for (size_t g : {1u, 2u, 4u, 7u}) {
      cases.push_back({mode, g, {}});
      cases.push_back({mode, g, {.first = 20}});
      cases.push_back({mode, g, {.softcap = 1.25f}});
      cases.push_back({mode, g, {.scale = 0.9f}});
      cases.push_back({mode, g, {.scale = 0.9f, .first = 56, .softcap = 3.0f}});
    }
  }
  std::mt19937 rng(3);
  for (const auto& cs : cases) {
    LayerKvCache c(H, D, cs.mode);
    Fill(c, nullptr, rng, len, 2.0f);  // larger logits: softcap bites
    const size_t G = cs.n_q_heads;
    for (size_t kv = 0; kv < H; ++kv) {
      auto q = RandomVec(rng, G * D);
      std::vector<float> out(G * D), probs(G * len), imp(len, 0.25f);
      c.AttendGroup(q, kv, G, out, probs, imp, cs.opt);

      std::vector<float> ref_imp(len, 0.25f);
      for (size_t j = 0; j < G; ++j) {
        std::vector<float> o(D), p(len);
        c.Attend(std::span<const float>(q).subspan(j * D, D), kv, o, p, cs.opt);
        for (size_t t = 0; t < len; ++t) ref_imp[t] += p[t];
        EXPECT_TRUE(SameBits(std::span<const float>(out).subspan(j * D, D), o))
            << KvModeName(cs.mode) << " G=" << G << " kv=" << kv << " j=" << j;
        EXPECT_TRUE(SameBits(std::span<const float>(probs).subspan(j * len, len), p));
      }
      EXPECT_TRUE(SameBits(imp, ref_imp)) << KvModeName(cs.mode) << " G=" << G;
    }
  }
}

TEST(LayerKvCacheTest, AttendGroupWithoutImportanceAndOnRaggedHeads) {
  const size_t H = 2, D = 16;
  std::mt19937 rng(4);
  LayerKvCache c(H, D);
  const Mask m{true, false};
  for (size_t t = 0; t < 10; ++t) {
    c.Append(RandomVec(rng, H * D), RandomVec(rng, H * D),
             t % 3 ? m.span() : std::span<const bool>{});
  }
  ASSERT_EQ(c.HeadLen(0), 10u);
  ASSERT_EQ(c.HeadLen(1), 4u);
  for (size_t kv = 0; kv < H; ++kv) {
    const size_t n = c.HeadLen(kv);
    auto q = RandomVec(rng, 2 * D);
    std::vector<float> out(2 * D), probs(c.GroupProbsSize(2));
    c.AttendGroup(q, kv, 2, out, probs, {});
    for (size_t j = 0; j < 2; ++j) {
      std::vector<float> o(D), p(n);
      c.Attend(std::span<const float>(q).subspan(j * D, D), kv, o, p);
      EXPECT_TRUE(SameBits(std::span<const float>(out).subspan(j * D, D), o));
    }
  }
}

// float64 reference of the same math.
void ReferenceF64(const std::vector<float>& q, const std::vector<float>& k,
                  const std::vector<float>& v, size_t D, double scale, size_t first, double softcap,
                  std::vector<double>& out) {
  const size_t n = k.size() / D;
  std::vector<double> s(n, 0.0);
  double mx = -INFINITY;
  for (size_t t = first; t < n; ++t) {
    double d = 0;
    for (size_t i = 0; i < D; ++i) {
      d += static_cast<double>(q[i]) * static_cast<double>(k[t * D + i]);
    }
    d *= scale;
    if (softcap > 0) d = softcap * std::tanh(d / softcap);
    s[t] = d;
    mx = std::max(mx, d);
  }
  double z = 0;
  for (size_t t = first; t < n; ++t) z += (s[t] = std::exp(s[t] - mx));
  out.assign(D, 0.0);
  for (size_t t = first; t < n; ++t) {
    for (size_t i = 0; i < D; ++i) out[i] += s[t] / z * static_cast<double>(v[t * D + i]);
  }
}

TEST(LayerKvCacheTest, AttendMatchesFloat64Reference) {
  const size_t H = 2, D = 128, len = 300;
  std::mt19937 rng(5);
  LayerKvCache c(H, D);
  SideRows side(H, D);
  Fill(c, &side, rng, len);
  const AttendOptions opts[] = {{}, {.scale = 0.2f, .first = 100}, {.softcap = 3.0f}};
  double worst = 0;
  for (const auto& o : opts) {
    for (size_t h = 0; h < H; ++h) {
      auto q = RandomVec(rng, D);
      std::vector<float> out(D), probs(len);
      c.Attend(q, h, out, probs, o);
      std::vector<double> ref;
      const double scale = o.scale != 0 ? o.scale : 1.0 / std::sqrt(static_cast<double>(D));
      ReferenceF64(q, side.k[h], side.v[h], D, scale, o.first, o.softcap, ref);
      double ref_max = 0, err = 0;
      for (size_t i = 0; i < D; ++i) {
        ref_max = std::max(ref_max, std::abs(ref[i]));
        err = std::max(err, std::abs(out[i] - ref[i]));
      }
      worst = std::max(worst, err / ref_max);
      EXPECT_LT(err / ref_max, 1e-5);
    }
  }
  std::printf("[ f32 vs f64 ] max relative output error %.3g\n", worst);
}

TEST(LayerKvCacheTest, Int8ErrorAgainstF32IsMeasuredAndBounded) {
  // Random N(0,1) rows, head_dim 128, 512 positions, GQA 4:1. Reported:
  //  logits:  max |Δ logit| (scaled scores before softmax) and max |logit|;
  //  probs:   max |Δ p|;
  //  outputs: per head max |Δ out| / max |out_f32| and ‖Δ out‖₂ / ‖out_f32‖₂.
  // Expected size: per-row rounding error ~ U(±s/2), s = max|k| / 127 ≈ 0.025,
  // so one logit errs by ≈ s/√12 ≈ 0.007 (std, unit-variance logits); the max
  // over 8k logits lands near 4σ ≈ 0.03. The output error is of the same
  // relative order.
  const size_t H = 4, D = 128, len = 512, G = 4;
  std::mt19937 rng(6);
  LayerKvCache f(H, D, KvMode::kF32), q8(H, D, KvMode::kInt8);
  for (size_t t = 0; t < len; ++t) {
    auto k = RandomVec(rng, H * D);
    auto v = RandomVec(rng, H * D);
    f.Append(k, v);
    q8.Append(k, v);
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  double logit_err = 0, logit_max = 0, prob_err = 0, out_rel = 0, out_l2 = 0;
  for (size_t kv = 0; kv < H; ++kv) {
    auto q = RandomVec(rng, G * D);
    std::vector<float> of(G * D), oq(G * D), pf(G * len), pq(G * len);
    f.AttendGroup(q, kv, G, of, pf, {});
    q8.AttendGroup(q, kv, G, oq, pq, {});
    const auto kf = f.HeadKeys(kv);
    const auto ki = q8.HeadKeysI8(kv);
    const auto ks = q8.HeadKeyScales(kv);
    ASSERT_EQ(ki.size(), len * D);
    ASSERT_EQ(ks.size(), len);
    for (size_t j = 0; j < G; ++j) {
      const float* qj = q.data() + j * D;
      for (size_t t = 0; t < len; ++t) {
        const double lf = scale * math::Dot(qj, kf.data() + t * D, D);
        const double lq = scale * ks[t] * math::DotI8(qj, ki.data() + t * D, D);
        logit_err = std::max(logit_err, std::abs(lf - lq));
        logit_max = std::max(logit_max, std::abs(lf));
      }
      double omax = 0, oerr = 0, n2 = 0, e2 = 0;
      for (size_t i = 0; i < D; ++i) {
        const double r = of[j * D + i], d = static_cast<double>(oq[j * D + i]) - r;
        omax = std::max(omax, std::abs(r));
        oerr = std::max(oerr, std::abs(d));
        n2 += r * r;
        e2 += d * d;
      }
      out_rel = std::max(out_rel, oerr / omax);
      out_l2 = std::max(out_l2, std::sqrt(e2 / n2));
    }
    for (size_t i = 0; i < G * len; ++i) {
      prob_err = std::max(prob_err, static_cast<double>(std::abs(pf[i] - pq[i])));
    }
  }
  std::printf(
      "[ int8 vs f32 ] H=%zu D=%zu len=%zu G=%zu: max|dlogit| %.3g (max|logit| "
      "%.3g), max|dp| %.3g, output error max-rel %.3g, rel-L2 %.3g\n",
      H, D, len, G, logit_err, logit_max, prob_err, out_rel, out_l2);
  EXPECT_LT(logit_err, 5e-2);
  EXPECT_LT(prob_err, 5e-3);
  EXPECT_LT(out_rel, 3e-2);
  EXPECT_LT(out_l2, 2e-2);
  // int8 stores a quarter of the f32 rows plus one scale per row.
  EXPECT_LT(q8.MemoryBytes() * 3, f.MemoryBytes());
}

TEST(LayerKvCacheTest, Int8ViewsAndF32ViewsAreExclusive) {
  LayerKvCache f(1, 8), q(1, 8, KvMode::kInt8);
  std::vector<float> row = {1, -2, 3, -4, 5, -6, 7, -127};
  f.Append(row, row);
  q.Append(row, row);
  EXPECT_TRUE(f.HeadKeysI8(0).empty());
  EXPECT_TRUE(f.HeadKeyScales(0).empty());
  EXPECT_TRUE(q.HeadKeys(0).empty());
  EXPECT_TRUE(q.HeadValues(0).empty());
  ASSERT_EQ(q.HeadValuesI8(0).size(), 8u);
  EXPECT_FLOAT_EQ(q.HeadValueScales(0)[0], 1.0f);  // max|x| / 127
  EXPECT_EQ(q.HeadKeysI8(0)[7], -127);
  EXPECT_EQ(q.HeadKeysI8(0)[0], 1);
}

TEST(LayerKvCacheTest, NothingVisibleGivesZeros) {
  LayerKvCache c(1, 4);
  std::vector<float> out(4, 9.0f), probs(8, 9.0f);
  c.Attend(std::vector<float>(4, 1.0f), 0, out, probs);  // empty cache
  EXPECT_EQ(out, std::vector<float>(4, 0.0f));
  c.Append(std::vector<float>(4, 1.0f), std::vector<float>(4, 1.0f));
  c.Append(std::vector<float>(4, 1.0f), std::vector<float>(4, 1.0f));
  c.Attend(std::vector<float>(4, 1.0f), 0, out, probs, {.first = 2});
  EXPECT_EQ(out, std::vector<float>(4, 0.0f));
  EXPECT_EQ(probs[0], 0.0f);
  EXPECT_EQ(probs[1], 0.0f);
}

// Compares everything observable between two caches except capacity (and so
// MemoryBytes): callers check those explicitly.
void ExpectSameState(const LayerKvCache& a, const LayerKvCache& b, std::mt19937& rng) {
  ASSERT_EQ(a.seq_len(), b.seq_len());
  ASSERT_EQ(a.mode(), b.mode());
  EXPECT_EQ(a.HasImportance(), b.HasImportance());
  if (a.HasImportance() && b.HasImportance()) {
    EXPECT_TRUE(SameBits(a.Importance().first(a.seq_len()), b.Importance().first(b.seq_len())));
  }
  const size_t D = a.head_dim();
  for (size_t h = 0; h < a.num_kv_heads(); ++h) {
    ASSERT_EQ(a.HeadLen(h), b.HeadLen(h)) << h;
    EXPECT_TRUE(SameBits(a.HeadKeys(h), b.HeadKeys(h)));
    EXPECT_TRUE(SameBits(a.HeadValues(h), b.HeadValues(h)));
    EXPECT_TRUE(SameBits(a.HeadKeyScales(h), b.HeadKeyScales(h)));
    EXPECT_TRUE(SameBits(a.HeadValueScales(h), b.HeadValueScales(h)));
    auto ai = a.HeadKeysI8(h), bi = b.HeadKeysI8(h);
    EXPECT_TRUE(std::equal(ai.begin(), ai.end(), bi.begin(), bi.end()));
    auto q = RandomVec(rng, D);
    const size_t n = a.HeadLen(h);
    std::vector<float> oa(D), ob(D), pa(n), pb(n);
    a.Attend(q, h, oa, pa);
    b.Attend(q, h, ob, pb);
    EXPECT_TRUE(SameBits(oa, ob));
    EXPECT_TRUE(SameBits(pa, pb));
  }
}

TEST(LayerKvCacheTest, TruncateLastThenReappendEqualsNeverAppended) {
  const size_t H = 3, D = 16;
  for (KvMode mode : {KvMode::kF32, KvMode::kInt8}) {
    for (bool dead : {false, true}) {
      std::mt19937 rng(7);
      std::vector<std::vector<float>> ks, vs;
      for (int t = 0; t < 30; ++t) {
        ks.push_back(RandomVec(rng, H * D));
        vs.push_back(RandomVec(rng, H * D));
      }
      const Mask m1{true, false, true}, m2{false, true, true};
      auto alive = [&](size_t t) -> std::span<const bool> {
        if (!dead) return {};
        return t % 2 ? m1.span() : m2.span();
      };
      LayerKvCache a(H, D, mode), b(H, D, mode);
      // a: 12 good, 5 speculative (rejected), 8 good.  b: the 20 good only.
      for (size_t t = 0; t < 12; ++t) a.Append(ks[t], vs[t], alive(t));
      std::vector<float> imp_probs(12, 0.5f);
      a.AccumulateImp(imp_probs);
      for (size_t t = 12; t < 17; ++t) a.Append(ks[25 + t - 12], vs[t], alive(t + 1));
      std::vector<float> spec_probs(17, 0.125f);
      a.AccumulateImp(spec_probs);  // touched rows the rollback must clear
      ASSERT_TRUE(a.TruncateLast(5).ok());
      EXPECT_EQ(a.seq_len(), 12u);
      for (size_t t = 12; t < 20; ++t) a.Append(ks[t], vs[t], alive(t));

      for (size_t t = 0; t < 12; ++t) b.Append(ks[t], vs[t], alive(t));
      b.AccumulateImp(imp_probs);
      b.AccumulateImp(
          std::span<const float>(spec_probs).first(std::min<size_t>(12, spec_probs.size())));
      for (size_t t = 12; t < 20; ++t) b.Append(ks[t], vs[t], alive(t));
      ExpectSameState(a, b, rng);
      EXPECT_EQ(a.capacity(), b.capacity());
      EXPECT_EQ(a.MemoryBytes(), b.MemoryBytes());
      EXPECT_EQ(a.HasDeadHeads(), dead);
    }
  }
}

TEST(LayerKvCacheTest, TruncateEverything) {
  std::mt19937 rng(8);
  LayerKvCache c(2, 8);
  Fill(c, nullptr, rng, 5);
  ASSERT_TRUE(c.TruncateLast(5).ok());
  EXPECT_EQ(c.seq_len(), 0u);
  EXPECT_EQ(c.HeadLen(0), 0u);
  EXPECT_EQ(c.HeadLen(1), 0u);
  ASSERT_TRUE(c.TruncateLast(0).ok());
  EXPECT_EQ(c.seq_len(), 0u);
}

TEST(LayerKvCacheTest, AccumulateImpSumsOverHeadsAndIsLazy) {
  const size_t H = 2, D = 8, len = 20;
  std::mt19937 rng(9);
  LayerKvCache c(H, D);
  c.Reserve(64);
  Fill(c, nullptr, rng, len);
  const size_t before = c.MemoryBytes();
  EXPECT_FALSE(c.HasImportance());
  std::vector<float> total(len, 0.0f);
  for (size_t h = 0; h < H; ++h) {
    std::vector<float> out(D), probs(len);
    c.Attend(RandomVec(rng, D), h, out, probs);
    c.AccumulateImp(probs);
    for (size_t t = 0; t < len; ++t) total[t] += probs[t];
  }
  ASSERT_TRUE(c.HasImportance());
  EXPECT_EQ(c.MemoryBytes(), before + Round64(64 * 4));
  ASSERT_EQ(c.Importance().size(), 64u);
  EXPECT_TRUE(SameBits(c.Importance().first(len), total));
  for (size_t t = len; t < 64; ++t) EXPECT_EQ(c.Importance()[t], 0.0f);
  float mass = 0;
  for (float x : c.Importance()) mass += x;
  EXPECT_NEAR(mass, static_cast<float>(H), 1e-5);
  // Importance survives growth and is forgotten by Clear.
  Fill(c, nullptr, rng, 100);
  EXPECT_TRUE(SameBits(c.Importance().first(len), total));
  c.Clear();
  EXPECT_FALSE(c.HasImportance());
}

TEST(LayerKvCacheTest, MemoryBytesIsExactAcrossTheLifecycle) {
  for (KvMode mode : {KvMode::kF32, KvMode::kInt8}) {
    const size_t H = 8, D = 128;
    std::mt19937 rng(10);
    LayerKvCache c(H, D, mode);
    EXPECT_EQ(c.MemoryBytes(), 0u);
    c.Reserve(100);
    EXPECT_EQ(c.capacity(), 100u);
    EXPECT_EQ(c.MemoryBytes(), ExpectedBytes(H, D, mode, 100));
    EXPECT_EQ(c.MemoryBytes(), LayerKvCache::ProjectedBytes(H, D, mode, 100));
    c.Reserve(50);  // never shrinks
    EXPECT_EQ(c.capacity(), 100u);
    Fill(c, nullptr, rng, 100);
    EXPECT_EQ(c.MemoryBytes(), ExpectedBytes(H, D, mode, 100));
    Fill(c, nullptr, rng, 1);  // geometric growth
    EXPECT_EQ(c.capacity(), 200u);
    EXPECT_EQ(c.MemoryBytes(), ExpectedBytes(H, D, mode, 200));
    // First dead head: the alive log, [capacity × H] bytes.
    bool alive[H] = {true, false, true, true, true, true, true, true};
    c.Append(RandomVec(rng, H * D), RandomVec(rng, H * D), {alive, H});
    EXPECT_EQ(c.MemoryBytes(), ExpectedBytes(H, D, mode, 200) + Round64(200 * H));
    std::vector<float> probs(c.seq_len(), 0.1f);
    c.AccumulateImp(probs);
    const size_t full = ExpectedBytes(H, D, mode, 200) + Round64(200 * H) + Round64(200 * 4);
    EXPECT_EQ(c.MemoryBytes(), full);

    LayerKvCache copy = c.Copy();
    EXPECT_EQ(copy.MemoryBytes(), full);
    ExpectSameState(c, copy, rng);

    LayerKvCache moved = std::move(copy);
    EXPECT_EQ(moved.MemoryBytes(), full);
    EXPECT_EQ(copy.MemoryBytes(), 0u);  // NOLINT(bugprone-use-after-move)
    EXPECT_EQ(copy.seq_len(), 0u);      // NOLINT(bugprone-use-after-move)

    c.ShrinkToFit();
    EXPECT_EQ(c.capacity(), 102u);
    EXPECT_EQ(c.MemoryBytes(),
              ExpectedBytes(H, D, mode, 102) + Round64(102 * H) + Round64(102 * 4));
    ExpectSameState(c, moved, rng);  // shrinking kept every row
  }
}

TEST(LayerKvCacheTest, ClearKeepsCapacityReleaseFreesAll) {
  const size_t H = 2, D = 32;
  std::mt19937 rng(11);
  LayerKvCache c(H, D, KvMode::kInt8);
  c.Reserve(40);
  Fill(c, nullptr, rng, 10);
  std::vector<float> p(10, 1.0f);
  c.AccumulateImp(p);
  c.Clear();
  EXPECT_EQ(c.seq_len(), 0u);
  EXPECT_EQ(c.HeadLen(1), 0u);
  EXPECT_EQ(c.capacity(), 40u);
  EXPECT_FALSE(c.HasImportance());
  EXPECT_EQ(c.MemoryBytes(), ExpectedBytes(H, D, KvMode::kInt8, 40));
  Fill(c, nullptr, rng, 3);
  EXPECT_EQ(c.HeadLen(0), 3u);
  c.Release();
  EXPECT_EQ(c.MemoryBytes(), 0u);
  EXPECT_EQ(c.capacity(), 0u);
  EXPECT_EQ(c.seq_len(), 0u);
  Fill(c, nullptr, rng, 3);  // still usable
  EXPECT_EQ(c.HeadLen(0), 3u);
  EXPECT_EQ(c.capacity(), 16u);
  ASSERT_TRUE(c.TruncateLast(3).ok());
  c.ShrinkToFit();  // seq_len 0 → releases
  EXPECT_EQ(c.MemoryBytes(), 0u);
}

TEST(LayerKvCacheDeathTest, WrongBufferSizesAbort) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  LayerKvCache c(2, 4);
  std::vector<float> row(8, 1.0f), short_row(7, 1.0f), q(4), out(4), p(1);
  EXPECT_DEATH(c.Append(short_row, row), "check failed");
  c.Append(row, row);
  c.Append(row, row);
  EXPECT_DEATH(c.Attend(q, 0, out, p), "check failed");  // probs too short
  EXPECT_DEATH(c.TruncateLast(3), "check failed");
  EXPECT_DEATH((void)c.HeadLen(2), "check failed");
}

}  // namespace
}  // namespace cortiq::kv
