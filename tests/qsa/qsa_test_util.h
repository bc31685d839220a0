// Test helpers for core/qsa: a failure-injecting Backend wrapper, an in-memory
// TensorSource, random layers and the dense reference attention the sparse
// path must equal. Header-only; test code only.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/kv/layer_kv_cache.h"
#include "core/math/kernels.h"
#include "core/qsa/backend.h"
#include "core/qsa/indexer_weights.h"
#include "core/qsa/qsa_indexer.h"

// Status assertions (Abseil 20220623 has no status matchers).
#define QSA_ASSERT_OK(expr)                       \
  do {                                            \
    const ::absl::Status qsa_status_ = (expr);    \
    ASSERT_TRUE(qsa_status_.ok()) << qsa_status_; \
  } while (0)
#define QSA_EXPECT_OK(expr)                       \
  do {                                            \
    const ::absl::Status qsa_status_ = (expr);    \
    EXPECT_TRUE(qsa_status_.ok()) << qsa_status_; \
  } while (0)

namespace cortiq::qsa::testing {

// Forwards everything to `inner`, except that the Free calls numbered in
// `fail_frees` (1-based, counting every Free call) return an injected
// INTERNAL error WITHOUT freeing: the pointer is remembered in `leaked` so
// the test can free it itself.
class FailingBackend final : public Backend {
 public:
  explicit FailingBackend(Backend* inner) : inner_(inner) {}

  std::vector<size_t> fail_frees;
  std::vector<DevicePtr> leaked;
  size_t free_calls = 0;

  const char* name() const override { return "failing"; }
  bool HostAddressable() const override { return inner_->HostAddressable(); }
  absl::StatusOr<DevicePtr> Allocate(size_t bytes) override { return inner_->Allocate(bytes); }
  absl::Status Free(DevicePtr p) override {
    ++free_calls;
    for (size_t n : fail_frees) {
      if (n == free_calls) {
        leaked.push_back(p);
        return absl::InternalError("injected Free failure #" + std::to_string(n));
      }
    }
    return inner_->Free(p);
  }
  absl::Status CopyToDevice(DevicePtr d, const void* s, size_t n, Stream st) override {
    return inner_->CopyToDevice(d, s, n, st);
  }
  absl::Status CopyToHost(void* d, DevicePtr s, size_t n, Stream st) override {
    return inner_->CopyToHost(d, s, n, st);
  }
  absl::Status CopyOnDevice(DevicePtr d, DevicePtr s, size_t n, Stream st) override {
    return inner_->CopyOnDevice(d, s, n, st);
  }
  absl::Status Synchronize(Stream st) override { return inner_->Synchronize(st); }
  BackendStats stats() const override { return inner_->stats(); }
  absl::Status Project(const ProjectArgs& a, Stream s) override { return inner_->Project(a, s); }
  absl::Status StoreBf16(DevicePtr a, DevicePtr b, size_t n, Stream s) override {
    return inner_->StoreBf16(a, b, n, s);
  }
  absl::Status PoolBlocks(const PoolArgs& a, Stream s) override { return inner_->PoolBlocks(a, s); }
  absl::Status ScoreBlocks(const ScoreArgs& a, Stream s) override {
    return inner_->ScoreBlocks(a, s);
  }
  absl::Status SelectTopK(const SelectArgs& a, Stream s) override {
    return inner_->SelectTopK(a, s);
  }
  absl::Status AttendSelected(const AttendArgs& a, Stream s) override {
    return inner_->AttendSelected(a, s);
  }

 private:
  Backend* inner_;
};

// Tensors held in memory, by name.
class MapTensorSource final : public TensorSource {
 public:
  // Adds an f32 tensor (or converts it to `dtype`).
  void Add(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& values,
           math::DType dtype = math::DType::kF32) {
    Entry& e = map_[name];
    e.shape = std::move(shape);
    e.dtype = dtype;
    e.bytes.resize(values.size() * math::DTypeSize(dtype));
    math::ConvertFromF32(values.data(), dtype, values.size(), e.bytes.data());
  }
  bool Has(std::string_view name) const override { return map_.count(std::string(name)) != 0; }
  absl::StatusOr<HostTensor> Get(std::string_view name) const override {
    auto it = map_.find(std::string(name));
    if (it == map_.end()) return absl::NotFoundError("no tensor " + std::string(name));
    return HostTensor{it->second.bytes.data(), it->second.dtype, it->second.shape};
  }

 private:
  struct Entry {
    std::vector<int64_t> shape;
    math::DType dtype;
    std::vector<uint8_t> bytes;
  };
  std::map<std::string, Entry> map_;
};

inline std::vector<float> RandomVec(std::mt19937& rng, size_t n, float stddev = 1.0f,
                                    float mean = 0.0f) {
  std::normal_distribution<float> d(mean, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

inline bool SameBits(const float* a, const float* b, size_t n) {
  return n == 0 || std::memcmp(a, b, n * sizeof(float)) == 0;
}

// Random f32 indexer weights of the given geometry.
inline IndexerWeights RandomWeights(std::mt19937& rng, size_t n_heads, size_t hd, size_t hidden,
                                    bool bias, bool norms) {
  IndexerWeights w;
  w.n_heads = n_heads;
  w.hd = hd;
  w.hidden = hidden;
  w.dtype = math::DType::kF32;
  const std::vector<float> m = RandomVec(rng, (n_heads + 1) * hd * hidden, 0.2f);
  w.qk_proj.resize(m.size() * sizeof(float));
  std::memcpy(w.qk_proj.data(), m.data(), w.qk_proj.size());
  if (bias) w.qk_bias = RandomVec(rng, (n_heads + 1) * hd, 0.1f);
  if (norms) {
    w.q_norm = RandomVec(rng, hd, 0.1f, 1.0f);
    w.k_norm = RandomVec(rng, hd, 0.1f, 1.0f);
  }
  return w;
}

// One attention layer's worth of random data for a sequence of T positions:
// normed inputs x [T × hidden], roped queries q [T × nq × D], and a
// LayerKvCache holding all T positions' K/V.
struct LayerData {
  size_t T, hidden, nq, nkv, D;
  std::vector<float> x, q;
  kv::LayerKvCache cache;

  LayerData(std::mt19937& rng, size_t T_, size_t hidden_, size_t nq_, size_t nkv_, size_t D_,
            kv::KvMode mode)
      : T(T_), hidden(hidden_), nq(nq_), nkv(nkv_), D(D_), cache(nkv_, D_, mode) {
    x = RandomVec(rng, T * hidden);
    q = RandomVec(rng, T * nq * D);
    cache.Reserve(T);
    for (size_t t = 0; t < T; ++t) {
      cache.Append(RandomVec(rng, nkv * D), RandomVec(rng, nkv * D));
    }
  }
  float scale() const { return 1.0f / std::sqrt(static_cast<float>(D)); }
  const float* x_row(size_t t) const { return x.data() + t * hidden; }
  const float* q_row(size_t t) const { return q.data() + t * nq * D; }

  // The transformer's dense attention for the query at position p (rows [0,
  // p] visible): AttendGroup per KV group. out: [nq × D].
  void Dense(size_t p, float* out) const {
    const size_t G = nq / nkv;
    std::vector<float> probs(G * (p + 1));
    kv::AttendOptions opt;
    opt.scale = scale();
    opt.end = p + 1;
    for (size_t g = 0; g < nkv; ++g) {
      cache.AttendGroup({q_row(p) + g * G * D, G * D}, g, G, {out + g * G * D, G * D}, probs, {},
                        opt);
    }
  }
  std::vector<float> DenseAll() const {
    std::vector<float> out(T * nq * D);
    for (size_t p = 0; p < T; ++p) Dense(p, out.data() + p * nq * D);
    return out;
  }
};

// Brute force: the selection rule of qsa_indexer.h over explicit scores
// (scores[b] for b in [1, cur)).
inline std::vector<uint32_t> BruteForceSelect(const std::vector<float>& scores, size_t pos,
                                              size_t ratio, size_t budget) {
  const size_t cur = pos / ratio;
  std::vector<uint32_t> out;
  if (cur < budget) {
    for (size_t b = 0; b <= cur; ++b) out.push_back(static_cast<uint32_t>(b));
    return out;
  }
  std::vector<uint32_t> cand;
  for (size_t b = 1; b < cur; ++b) cand.push_back(static_cast<uint32_t>(b));
  // Full sort (not partial): an independent formulation of the same order.
  std::sort(cand.begin(), cand.end(), [&](uint32_t a, uint32_t b) {
    if (scores[a] != scores[b]) return scores[a] > scores[b];
    return a < b;
  });
  cand.resize(budget - 2);
  out.push_back(0);
  out.insert(out.end(), cand.begin(), cand.end());
  out.push_back(static_cast<uint32_t>(cur));
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace cortiq::qsa::testing
