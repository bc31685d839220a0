// AttendOptions::end: attending with end = k over a cache holding more rows
// equals, bit for bit, attending over a cache that holds only the first k rows
// (the causal mask a prefill chunk relies on), for f32 and int8 rows.
#include <cstring>
#include <random>
#include <vector>

#include "core/kv/layer_kv_cache.h"
#include "gtest/gtest.h"

namespace cortiq::kv {
namespace {

TEST(LayerKvCacheEndTest, EndHidesLaterRowsBitForBit) {
  const size_t H = 2, D = 24, G = 3, T = 19;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  std::vector<std::vector<float>> ks(T), vs(T);
  for (size_t t = 0; t < T; ++t) {
    ks[t].resize(H * D);
    vs[t].resize(H * D);
    for (auto& x : ks[t]) x = nd(rng);
    for (auto& x : vs[t]) x = nd(rng);
  }
  std::vector<float> q(G * D);
  for (auto& x : q) x = nd(rng);
  for (KvMode mode : {KvMode::kF32, KvMode::kInt8}) {
    LayerKvCache full(H, D, mode);
    for (size_t t = 0; t < T; ++t) full.Append(ks[t], vs[t]);
    for (size_t k = 1; k <= T; ++k) {
      LayerKvCache prefix(H, D, mode);
      for (size_t t = 0; t < k; ++t) prefix.Append(ks[t], vs[t]);
      for (size_t h = 0; h < H; ++h) {
        std::vector<float> out_a(G * D), out_b(G * D), pa(G * T), pb(G * T);
        AttendOptions opt;
        opt.end = k;
        full.AttendGroup(q, h, G, out_a, pa, {}, opt);
        prefix.AttendGroup(q, h, G, out_b, pb, {}, {});
        ASSERT_EQ(0, std::memcmp(out_a.data(), out_b.data(), out_a.size() * sizeof(float)))
            << KvModeName(mode) << " k=" << k << " head " << h;
        std::vector<float> o1(D), p1(T), o2(D), p2(T);
        full.Attend(std::span(q).first(D), h, o1, p1, opt);
        prefix.Attend(std::span(q).first(D), h, o2, p2, {});
        ASSERT_EQ(0, std::memcmp(o1.data(), o2.data(), D * sizeof(float)));
      }
    }
  }
}

}  // namespace
}  // namespace cortiq::kv
