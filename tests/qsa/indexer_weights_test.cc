// LoadIndexerWeights: checkpoint tensors when present, else derived from the
// layer's own q/k projections (group 0) — one struct either way.
#include "core/qsa/indexer_weights.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/math/kernels.h"
#include "core/qsa/cpu_backend.h"
#include "core/qsa/qsa_indexer.h"
#include "tests/qsa/qsa_test_util.h"

namespace cortiq::qsa {
namespace {

using testing::MapTensorSource;
using testing::RandomVec;

constexpr int64_t kHidden = 32, kNq = 4, kNkv = 2, kHd = 8;
const AttentionGeometry kGeo{kHidden, kNq, kNkv, kHd};

std::string Attn(size_t layer, const std::string& what) {
  return "model.layers." + std::to_string(layer) + ".self_attn." + what;
}

// A qwen3-style layer 3: q/k projections (dtype) and q/k norms.
struct Layer {
  std::vector<float> wq, wk, qn, kn, bq, bk;
  MapTensorSource src;
  explicit Layer(std::mt19937& rng, math::DType dtype = math::DType::kBF16, bool norms = true,
                 bool bias = false, math::DType k_dtype = math::DType::kBF16) {
    wq = RandomVec(rng, kNq * kHd * kHidden, 0.2f);
    wk = RandomVec(rng, kNkv * kHd * kHidden, 0.2f);
    src.Add(Attn(3, "q_proj.weight"), {kNq * kHd, kHidden}, wq, dtype);
    src.Add(Attn(3, "k_proj.weight"), {kNkv * kHd, kHidden}, wk, k_dtype);
    if (norms) {
      qn = RandomVec(rng, kHd, 0.1f, 1.0f);
      kn = RandomVec(rng, kHd, 0.1f, 1.0f);
      src.Add(Attn(3, "q_norm.weight"), {kHd}, qn);
      src.Add(Attn(3, "k_norm.weight"), {kHd}, kn);
    }
    if (bias) {
      bq = RandomVec(rng, kNq * kHd, 0.1f);
      bk = RandomVec(rng, kNkv * kHd, 0.1f);
      src.Add(Attn(3, "q_proj.bias"), {kNq * kHd}, bq);
      src.Add(Attn(3, "k_proj.bias"), {kNkv * kHd}, bk);
    }
  }
};

TEST(IndexerWeightsTest, TensorNames) {
  EXPECT_EQ(IndexerTensorName(7, "qk_proj.weight"),
            "model.layers.7.self_attn.indexer.qk_proj.weight");
}

TEST(IndexerWeightsTest, DerivedIsGroupZeroOfTheLayer) {
  std::mt19937 rng(1);
  Layer layer(rng);
  auto w = LoadIndexerWeights(layer.src, 3, kGeo);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->origin, IndexerOrigin::kDerived);
  EXPECT_EQ(w->n_heads, size_t(kNq / kNkv));
  EXPECT_EQ(w->hd, size_t(kHd));
  EXPECT_EQ(w->dtype, math::DType::kBF16);
  // Bytes: q_proj rows [0, 2·hd) then k_proj rows [0, hd), unconverted.
  const HostTensor q = *layer.src.Get(Attn(3, "q_proj.weight"));
  const HostTensor k = *layer.src.Get(Attn(3, "k_proj.weight"));
  const size_t qbytes = 2 * kHd * kHidden * 2, kbytes = kHd * kHidden * 2;
  ASSERT_EQ(w->qk_proj.size(), qbytes + kbytes);
  EXPECT_EQ(std::memcmp(w->qk_proj.data(), q.data, qbytes), 0);
  EXPECT_EQ(std::memcmp(w->qk_proj.data() + qbytes, k.data, kbytes), 0);
  EXPECT_EQ(w->q_norm, layer.qn);
  EXPECT_EQ(w->k_norm, layer.kn);
  EXPECT_TRUE(w->qk_bias.empty());
}

TEST(IndexerWeightsTest, DerivedWithBiasesAndNoNormsAndMixedDtypes) {
  std::mt19937 rng(2);
  Layer layer(rng, math::DType::kBF16, /*norms=*/false, /*bias=*/true, math::DType::kF32);
  auto w = LoadIndexerWeights(layer.src, 3, kGeo);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->dtype, math::DType::kF32);  // bf16 q + f32 k → both f32
  EXPECT_TRUE(w->q_norm.empty() && w->k_norm.empty());
  ASSERT_EQ(w->qk_bias.size(), size_t(3 * kHd));
  for (size_t i = 0; i < size_t(2 * kHd); ++i) EXPECT_EQ(w->qk_bias[i], layer.bq[i]);
  for (size_t i = 0; i < size_t(kHd); ++i) EXPECT_EQ(w->qk_bias[2 * kHd + i], layer.bk[i]);
  const float* m = reinterpret_cast<const float*>(w->qk_proj.data());
  EXPECT_EQ(m[0], math::Bf16ToF32(math::F32ToBf16(layer.wq[0])));
  EXPECT_EQ(m[2 * kHd * kHidden + 5], layer.wk[5]);
}

TEST(IndexerWeightsTest, CheckpointTensorsWin) {
  std::mt19937 rng(3);
  Layer layer(rng);
  const int64_t heads = 3, hd = 4;
  layer.src.Add(IndexerTensorName(3, "qk_proj.weight"), {(heads + 1) * hd, kHidden},
                RandomVec(rng, (heads + 1) * hd * kHidden), math::DType::kF16);
  layer.src.Add(IndexerTensorName(3, "q_norm.weight"), {hd}, RandomVec(rng, hd));
  layer.src.Add(IndexerTensorName(3, "k_norm.weight"), {hd}, RandomVec(rng, hd));
  auto w = LoadIndexerWeights(layer.src, 3, kGeo);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->origin, IndexerOrigin::kCheckpoint);
  EXPECT_EQ(w->n_heads, size_t(heads));
  EXPECT_EQ(w->hd, size_t(hd));
  EXPECT_EQ(w->dtype, math::DType::kF16);
  EXPECT_EQ(w->qk_proj.size(), size_t((heads + 1) * hd * kHidden * 2));
  // Another layer of the same checkpoint has none: derived.
  Layer other(rng);
  auto d = LoadIndexerWeights(other.src, 3, kGeo);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->origin, IndexerOrigin::kDerived);
}

TEST(IndexerWeightsTest, PartialOrMisshapenIndexerIsRefusedByName) {
  std::mt19937 rng(4);
  Layer partial(rng);
  partial.src.Add(IndexerTensorName(3, "qk_proj.weight"), {3 * kHd, kHidden},
                  RandomVec(rng, 3 * kHd * kHidden));
  auto w = LoadIndexerWeights(partial.src, 3, kGeo);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(w.status().message().find("indexer.q_norm.weight"), std::string::npos) << w.status();

  Layer bad(rng);
  bad.src.Add(IndexerTensorName(3, "qk_proj.weight"), {3 * kHd, kHidden + 1},
              RandomVec(rng, 3 * kHd * (kHidden + 1)));
  bad.src.Add(IndexerTensorName(3, "q_norm.weight"), {kHd}, RandomVec(rng, kHd));
  bad.src.Add(IndexerTensorName(3, "k_norm.weight"), {kHd}, RandomVec(rng, kHd));
  w = LoadIndexerWeights(bad.src, 3, kGeo);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(w.status().message().find("indexer.qk_proj.weight"), std::string::npos);

  MapTensorSource empty;
  w = LoadIndexerWeights(empty, 3, kGeo);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(LoadIndexerWeights(empty, 3, {kHidden, 3, 2, kHd}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// With rot = head_dim and the model's theta, the derived indexer's parked key
// is the layer's own KV-head-0 key (k_norm + RoPE, as the transformer forms
// it) up to the bf16 parking.
TEST(IndexerWeightsTest, DerivedKeyIsTheLayersOwnKeyHeadZero) {
  std::mt19937 rng(5);
  Layer layer(rng, math::DType::kF32, true, false, math::DType::kF32);
  auto w = LoadIndexerWeights(layer.src, 3, kGeo);
  ASSERT_TRUE(w.ok());
  CpuBackend backend;
  QsaGeometry g;
  g.n_heads = w->n_heads;
  g.hd = w->hd;
  g.ratio = 2;
  g.budget = 2;
  g.rot = kHd;
  g.theta = 1e6;
  g.hidden = kHidden;
  g.nkv_attn = kNkv;
  g.hd_attn = kHd;
  auto ix = QsaIndexer::New(&backend, *w, g);
  ASSERT_TRUE(ix.ok()) << ix.status();
  QsaScratch scratch(&backend);
  auto st = (*ix)->NewSeqState();
  ASSERT_TRUE(st.ok());
  const size_t T = 6;
  const std::vector<float> x = RandomVec(rng, T * kHidden);
  QSA_ASSERT_OK((*ix)->PrefillIngest(*st, DevicePtr::FromHost(x.data()), T, 0, scratch));
  auto blob = (*ix)->SnapshotAux(*st);
  ASSERT_TRUE(blob.ok());

  const math::WeightView wk{layer.wk.data(), math::DType::kF32, size_t(kNkv * kHd),
                            size_t(kHidden)};
  std::vector<float> k(kNkv * kHd), cs(kHd);
  for (size_t t = 0; t < T; ++t) {
    math::MatMul(x.data() + t * kHidden, 1, wk, k.data(), nullptr);
    math::RmsNorm(k.data(), layer.kn.data(), 1e-6f, kHd, k.data());
    for (size_t i = 0; i < size_t(kHd / 2); ++i) {  // the transformer's RopeTables
      const float inv = static_cast<float>(std::pow(1e6, -2.0 * double(i) / double(kHd)));
      const double angle = double(t) * double(inv);
      cs[i] = static_cast<float>(std::cos(angle));
      cs[kHd / 2 + i] = static_cast<float>(std::sin(angle));
    }
    math::RopeRotateHalf(k.data(), kHd, cs.data(), cs.data() + kHd / 2);
    for (size_t i = 0; i < size_t(kHd); ++i) {
      uint16_t parked;
      std::memcpy(&parked, blob->data() + 16 + (t * kHd + i) * 2, 2);
      EXPECT_NEAR(math::Bf16ToF32(parked), k[i], 1e-2f * (1.0f + std::fabs(k[i])))
          << "t " << t << " i " << i;
    }
  }
  QSA_EXPECT_OK((*ix)->ReleaseSeqState(*st));
}

}  // namespace
}  // namespace cortiq::qsa
