// Helpers shared by the tests/kv tests: random rows, bit equality, exact
// attention of every Q head, and the synthetic O(1) layer input (a stream of
// per-position queries and K/V rows drawn around clusters).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <vector>

#include "core/kv/layer_kv_cache.h"

namespace cortiq::kv::kvtest {

using Vec = std::vector<float>;

inline Vec RandomVec(std::mt19937& rng, size_t n, float stddev = 1.0f) {
  std::normal_distribution<float> d(0.0f, stddev);
  Vec v(n);
  for (float& x : v) x = d(rng);
  return v;
}

template <typename T>
bool SameBytes(std::span<const T> a, std::span<const T> b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size_bytes()) == 0);
}
inline bool BitEqual(const Vec& a, const Vec& b) { return SameBytes<float>(a, b); }

// Appends `len` positions of random rows to every head.
inline void Fill(LayerKvCache& c, std::mt19937& rng, size_t len, float stddev = 1.0f) {
  const size_t n = c.num_kv_heads() * c.head_dim();
  for (size_t t = 0; t < len; ++t) c.Append(RandomVec(rng, n, stddev), RandomVec(rng, n, stddev));
}

// Every Q head of every group over c's exact rows (hpk Q heads per KV head,
// contiguous); out: [q_all.size()].
inline Vec AttendAll(const LayerKvCache& c, const Vec& q_all, size_t hpk) {
  const size_t D = c.head_dim();
  Vec out(q_all.size()), probs(c.GroupProbsSize(hpk));
  for (size_t g = 0; g < c.num_kv_heads(); ++g) {
    c.AttendGroup(std::span<const float>(q_all).subspan(g * hpk * D, hpk * D), g, hpk,
                  std::span<float>(out).subspan(g * hpk * D, hpk * D), probs, {});
  }
  return out;
}

// ---- the synthetic O(1) layer input -----------------------------------------

// A layer's geometry and O(1) settings.
struct O1Geom {
  size_t kv, d, heads, m, w, sink;
  size_t hpk() const { return heads / kv; }
};

// Per position the rotated queries of every head [heads × d] and the new K/V
// rows [kv × d].
struct Stream {
  size_t n = 0;
  std::vector<Vec> q, k, v;  // [n] rows
};

// Positions of the prompt come from clusters in order (segment means recover
// the centres, so the landmark kernel is well conditioned); decode positions
// pick a cluster. Deterministic in seed.
inline Stream MakeStream(const O1Geom& g, size_t n, size_t prompt, uint64_t seed,
                         size_t clusters = 12) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto centre = [&](size_t len) {
    Vec c(len);
    for (float& x : c) x = nd(rng);
    return c;
  };
  std::vector<Vec> qc, kc, vc;
  for (size_t c = 0; c < clusters; ++c) {
    qc.push_back(centre(g.heads * g.d));
    kc.push_back(centre(g.kv * g.d));
    vc.push_back(centre(g.kv * g.d));
  }
  std::uniform_int_distribution<size_t> pick(0, clusters - 1);
  Stream s;
  s.n = n;
  for (size_t j = 0; j < n; ++j) {
    const size_t c = j < prompt ? j * clusters / prompt : pick(rng);
    auto noisy = [&](const Vec& base) {
      Vec r(base);
      for (float& x : r) x += 0.4f * nd(rng);
      return r;
    };
    s.q.push_back(noisy(qc[c]));
    s.k.push_back(noisy(kc[c]));
    s.v.push_back(noisy(vc[c]));
  }
  return s;
}

// The forward pass's prompt protocol: Append + O1PushQ per position.
inline void Absorb(LayerKvCache& c, const Stream& s, size_t from, size_t to) {
  for (size_t j = from; j < to; ++j) {
    c.Append(s.k[j], s.v[j]);
    c.O1PushQ(s.q[j]);
  }
}

}  // namespace cortiq::kv::kvtest
