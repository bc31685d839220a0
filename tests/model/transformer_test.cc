// Transformer forward pass against an independent float64 reference written
// here from the architecture (not from the engine's code), on random
// checkpoints the test writes: several shapes, including GQA 4:1 with
// head_dim != hidden/heads, qwen2 biases and llama. Also: prefill-then-decode,
// token-by-token decode and one long prefill agree; a batched decode equals
// the same sequences decoded alone; bad input changes nothing.
#include "core/model/transformer.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/math/kernels.h"
#include "core/model/checkpoint.h"
#include "core/model/random_checkpoint.h"
#include "gtest/gtest.h"
#include "tests/common/model_test_util.h"
#include "tests/common/rss.h"

namespace cortiq::model {
namespace {

std::string TempModel(const std::string& shape, math::DType dtype = math::DType::kF32,
                      uint64_t seed = 3) {
  return cortiq::testing::TempModel(shape, dtype, seed);
}

// ------------------------------------------------------------ f64 reference
using Vec = std::vector<double>;

struct RefModel {
  ModelConfig c;
  std::map<std::string, Vec> t;

  explicit RefModel(const Checkpoint& ckpt) : c(ckpt.config()) {
    for (const std::string& name : ckpt.TensorNames()) {
      auto view = ckpt.GetAnyShape(name);
      EXPECT_TRUE(view.ok());
      std::vector<float> f(size_t(view->numel()));
      math::ConvertToF32(view->data, view->dtype, f.size(), f.data());
      t[name] = Vec(f.begin(), f.end());
    }
  }
  const Vec& W(const std::string& n) const {
    auto it = t.find(n);
    EXPECT_TRUE(it != t.end()) << n;
    return it->second;
  }
  bool HasW(const std::string& n) const { return t.count(n) > 0; }

  static Vec Linear(const Vec& x, const Vec& w, size_t out, size_t in) {
    Vec y(out, 0.0);
    for (size_t r = 0; r < out; ++r) {
      double s = 0;
      for (size_t k = 0; k < in; ++k) s += w[r * in + k] * x[k];
      y[r] = s;
    }
    return y;
  }
  Vec RmsNorm(const double* x, const Vec& w, size_t n) const {
    double ss = 0;
    for (size_t i = 0; i < n; ++i) ss += x[i] * x[i];
    const double inv = 1.0 / std::sqrt(ss / double(n) + c.rms_norm_eps);
    Vec y(n);
    for (size_t i = 0; i < n; ++i) y[i] = x[i] * inv * w[i];
    return y;
  }
  void Rope(double* x, size_t pos) const {
    const size_t hd = c.head_dim, half = hd / 2;
    for (size_t i = 0; i < half; ++i) {
      const double inv_freq = std::pow(c.rope_theta, -2.0 * double(i) / double(hd));
      const double a = double(pos) * inv_freq;
      const double x0 = x[i], x1 = x[i + half];
      x[i] = x0 * std::cos(a) - x1 * std::sin(a);
      x[i + half] = x1 * std::cos(a) + x0 * std::sin(a);
    }
  }

  // Logits of every position: [T][vocab].
  std::vector<Vec> Forward(const std::vector<int32_t>& ids) const {
    const size_t T = ids.size(), H = c.hidden_size, hd = c.head_dim, nq = c.num_attention_heads,
                 nkv = c.num_key_value_heads, I = c.intermediate_size, V = c.vocab_size;
    std::vector<Vec> x(T, Vec(H));
    const Vec& emb = W("model.embed_tokens.weight");
    for (size_t i = 0; i < T; ++i)
      for (size_t j = 0; j < H; ++j) x[i][j] = emb[size_t(ids[i]) * H + j];
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const std::string p = absl::StrCat("model.layers.", l, ".");
      std::vector<Vec> q(T), k(T), v(T);
      for (size_t i = 0; i < T; ++i) {
        Vec n = RmsNorm(x[i].data(), W(p + "input_layernorm.weight"), H);
        q[i] = Linear(n, W(p + "self_attn.q_proj.weight"), nq * hd, H);
        k[i] = Linear(n, W(p + "self_attn.k_proj.weight"), nkv * hd, H);
        v[i] = Linear(n, W(p + "self_attn.v_proj.weight"), nkv * hd, H);
        if (HasW(p + "self_attn.q_proj.bias")) {
          for (size_t j = 0; j < nq * hd; ++j) q[i][j] += W(p + "self_attn.q_proj.bias")[j];
          for (size_t j = 0; j < nkv * hd; ++j) k[i][j] += W(p + "self_attn.k_proj.bias")[j];
          for (size_t j = 0; j < nkv * hd; ++j) v[i][j] += W(p + "self_attn.v_proj.bias")[j];
        }
        for (size_t h = 0; h < nq; ++h) {
          if (HasW(p + "self_attn.q_norm.weight")) {
            Vec r = RmsNorm(&q[i][h * hd], W(p + "self_attn.q_norm.weight"), hd);
            std::copy(r.begin(), r.end(), q[i].begin() + h * hd);
          }
          Rope(&q[i][h * hd], i);
        }
        for (size_t h = 0; h < nkv; ++h) {
          if (HasW(p + "self_attn.k_norm.weight")) {
            Vec r = RmsNorm(&k[i][h * hd], W(p + "self_attn.k_norm.weight"), hd);
            std::copy(r.begin(), r.end(), k[i].begin() + h * hd);
          }
          Rope(&k[i][h * hd], i);
        }
      }
      for (size_t i = 0; i < T; ++i) {
        Vec att(nq * hd, 0.0);
        for (size_t h = 0; h < nq; ++h) {
          const size_t g = h / (nq / nkv);
          std::vector<double> s(i + 1);
          double mx = -1e300;
          for (size_t j = 0; j <= i; ++j) {
            double d = 0;
            for (size_t e = 0; e < hd; ++e) d += q[i][h * hd + e] * k[j][g * hd + e];
            s[j] = d / std::sqrt(double(hd));
            mx = std::max(mx, s[j]);
          }
          double z = 0;
          for (auto& e : s) z += (e = std::exp(e - mx));
          for (size_t j = 0; j <= i; ++j)
            for (size_t e = 0; e < hd; ++e) att[h * hd + e] += s[j] / z * v[j][g * hd + e];
        }
        Vec o = Linear(att, W(p + "self_attn.o_proj.weight"), H, nq * hd);
        for (size_t j = 0; j < H; ++j) x[i][j] += o[j];
        Vec n = RmsNorm(x[i].data(), W(p + "post_attention_layernorm.weight"), H);
        Vec gt = Linear(n, W(p + "mlp.gate_proj.weight"), I, H);
        Vec up = Linear(n, W(p + "mlp.up_proj.weight"), I, H);
        for (size_t j = 0; j < I; ++j) gt[j] = gt[j] / (1.0 + std::exp(-gt[j])) * up[j];
        Vec d = Linear(gt, W(p + "mlp.down_proj.weight"), H, I);
        for (size_t j = 0; j < H; ++j) x[i][j] += d[j];
      }
    }
    const Vec& head = HasW("lm_head.weight") ? W("lm_head.weight") : emb;
    std::vector<Vec> logits(T);
    for (size_t i = 0; i < T; ++i)
      logits[i] = Linear(RmsNorm(x[i].data(), W("model.norm.weight"), H), head, V, H);
    return logits;
  }
};

double RelErr(const float* a, const double* b, size_t n) {
  return cortiq::testing::MaxRelErr(a, b, n);
}
double RelErr(const float* a, const float* b, size_t n) {
  return cortiq::testing::MaxRelErr(a, b, n);
}

std::vector<int32_t> Ids(size_t n, int64_t vocab, uint32_t seed) {
  return cortiq::testing::TestIds(n, vocab, seed);
}

class ReferenceTest : public ::testing::TestWithParam<const char*> {};

TEST_P(ReferenceTest, LogitsMatchFloat64Reference) {
  const std::string dir = TempModel(GetParam());
  auto tf = Transformer::Load(dir);
  ASSERT_TRUE(tf.ok()) << tf.status();
  const ModelConfig& c = (*tf)->config();
  auto ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok());
  RefModel ref(*ckpt);
  // 100 tokens: the projections take the GEMM path and attention the tiled one.
  const std::vector<int32_t> ids = Ids(100, c.vocab_size, 11);
  const std::vector<Vec> want = ref.Forward(ids);

  SequenceKv kv(c, kv::KvMode::kF32);
  ForwardScratch scratch;
  const size_t V = c.vocab_size;
  std::vector<float> all(ids.size() * V), last(V);
  ASSERT_TRUE((*tf)->Prefill(ids, kv, scratch, last.data(), all.data()).ok());
  double worst = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    worst = std::max(worst, RelErr(all.data() + i * V, want[i].data(), V));
  }
  std::printf("[%s] max relative logit error vs f64 over %zu positions: %.3g\n", GetParam(),
              ids.size(), worst);
  EXPECT_LT(worst, 1e-4);
  EXPECT_EQ(0, std::memcmp(last.data(), all.data() + (ids.size() - 1) * V, V * sizeof(float)));
  EXPECT_EQ(kv.position(), ids.size());
}

INSTANTIATE_TEST_SUITE_P(Shapes, ReferenceTest,
                         ::testing::Values("tiny", "tiny-gqa", "tiny-qwen2", "tiny-llama"));

class AgreementTest : public ::testing::TestWithParam<const char*> {};

// Decodes `ids` token by token into the empty `seq` (the first token by a
// one-token prefill) and returns the worst relative error of each
// position's logits against `want` ([ids.size()][V]).
double WorstTokenByToken(Transformer& tf, std::span<const int32_t> ids, SequenceKv& seq,
                         const std::vector<float>& want, size_t V) {
  ForwardScratch scratch;
  std::vector<float> logits(V);
  EXPECT_TRUE(tf.Prefill(ids.first(1), seq, scratch, logits.data()).ok());
  double worst = RelErr(logits.data(), want.data(), V);
  SequenceKv* p[1] = {&seq};
  for (size_t i = 1; i < ids.size(); ++i) {
    EXPECT_TRUE(tf.DecodeBatch(ids.subspan(i, 1), p, scratch, logits.data()).ok());
    worst = std::max(worst, RelErr(logits.data(), want.data() + i * V, V));
  }
  return worst;
}

TEST_P(AgreementTest, PrefillDecodeAndLongPrefillAgree) {
  auto tf = Transformer::Load(TempModel(GetParam()));
  ASSERT_TRUE(tf.ok()) << tf.status();
  const ModelConfig& c = (*tf)->config();
  const size_t V = c.vocab_size, T = 100, split = 70;  // both prefills take the GEMM path
  const std::vector<int32_t> ids = Ids(T, c.vocab_size, 5);
  ForwardScratch scratch;

  // (a) one long prefill, every position's logits.
  std::vector<float> long_all(T * V);
  SequenceKv a(c, kv::KvMode::kF32);
  ASSERT_TRUE((*tf)->Prefill(ids, a, scratch, nullptr, long_all.data()).ok());

  // (b) prefill of `split` tokens, then decode one by one.
  SequenceKv b(c, kv::KvMode::kF32);
  std::vector<float> logits(V);
  ASSERT_TRUE((*tf)->Prefill(std::span(ids).first(split), b, scratch, logits.data()).ok());
  double worst_b = RelErr(logits.data(), long_all.data() + (split - 1) * V, V);
  SequenceKv* pb[1] = {&b};
  for (size_t i = split; i < T; ++i) {
    ASSERT_TRUE((*tf)->DecodeBatch(std::span(ids).subspan(i, 1), pb, scratch, logits.data()).ok());
    worst_b = std::max(worst_b, RelErr(logits.data(), long_all.data() + i * V, V));
  }
  // (c) token by token from the first token.
  SequenceKv d(c, kv::KvMode::kF32);
  const double worst_c = WorstTokenByToken(**tf, ids, d, long_all, V);
  std::printf("[%s] prefill+decode vs long prefill: %.3g; token-by-token: %.3g\n", GetParam(),
              worst_b, worst_c);
  EXPECT_LT(worst_b, 1e-5);
  EXPECT_LT(worst_c, 1e-5);
}

// int8 K/V: a long prefill (attention as tiled matrix products over the
// widened rows) against the same tokens decoded one by one (DotI8 / AxpyI8
// per row). The rows are quantized the same way on both paths, so the two
// differ by summation order, and by a row whose rounding flips when its
// input differs in the last bits.
TEST_P(AgreementTest, Int8KvLongPrefillAgreesWithTokenByToken) {
  auto tf = Transformer::Load(TempModel(GetParam()));
  ASSERT_TRUE(tf.ok()) << tf.status();
  const ModelConfig& c = (*tf)->config();
  const size_t V = c.vocab_size, T = 100;
  const std::vector<int32_t> ids = Ids(T, c.vocab_size, 7);
  ForwardScratch scratch;
  std::vector<float> long_all(T * V);
  SequenceKv a(c, kv::KvMode::kInt8), d(c, kv::KvMode::kInt8);
  ASSERT_TRUE((*tf)->Prefill(ids, a, scratch, nullptr, long_all.data()).ok());
  const double worst = WorstTokenByToken(**tf, ids, d, long_all, V);
  std::printf("[%s] int8 KV, long prefill vs token-by-token: %.3g\n", GetParam(), worst);
  EXPECT_LT(worst, 1e-3);
}

TEST_P(AgreementTest, BatchedDecodeEqualsEachSequenceAlone) {
  auto tf = Transformer::Load(TempModel(GetParam()));
  ASSERT_TRUE(tf.ok()) << tf.status();
  const ModelConfig& c = (*tf)->config();
  const size_t V = c.vocab_size, B = 4, steps = 6;
  ForwardScratch scratch;
  std::vector<SequenceKv> batched, alone;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<float> logits(B * V);
  for (size_t b = 0; b < B; ++b) {
    prompts.push_back(Ids(3 + 7 * b, c.vocab_size, uint32_t(100 + b)));  // different lengths
    batched.emplace_back(c, kv::KvMode::kF32);
    alone.emplace_back(c, kv::KvMode::kF32);
    ASSERT_TRUE((*tf)->Prefill(prompts[b], batched[b], scratch, logits.data()).ok());
    ASSERT_TRUE((*tf)->Prefill(prompts[b], alone[b], scratch, logits.data()).ok());
  }
  std::vector<SequenceKv*> ptrs;
  for (auto& s : batched) ptrs.push_back(&s);
  double worst = 0;
  size_t identical = 0;
  for (size_t step = 0; step < steps; ++step) {
    const std::vector<int32_t> next = Ids(B, c.vocab_size, uint32_t(7 * step + 1));
    ASSERT_TRUE((*tf)->DecodeBatch(next, ptrs, scratch, logits.data()).ok());
    for (size_t b = 0; b < B; ++b) {
      std::vector<float> one(V);
      SequenceKv* p1[1] = {&alone[b]};
      ASSERT_TRUE((*tf)->DecodeBatch(std::span(next).subspan(b, 1), p1, scratch, one.data()).ok());
      worst = std::max(worst, RelErr(logits.data() + b * V, one.data(), V));
      identical += std::memcmp(logits.data() + b * V, one.data(), V * sizeof(float)) == 0;
    }
  }
  std::printf("[%s] batched vs alone: max rel %.3g, %zu/%zu rows bit-identical\n", GetParam(),
              worst, identical, B * steps);
  EXPECT_LT(worst, 1e-6);
  for (size_t b = 0; b < B; ++b) EXPECT_EQ(batched[b].position(), alone[b].position());
}

INSTANTIATE_TEST_SUITE_P(Shapes, AgreementTest, ::testing::Values("tiny", "tiny-gqa"));

TEST(TransformerTest, BadInputChangesNothing) {
  auto tf = Transformer::Load(TempModel("tiny"));
  ASSERT_TRUE(tf.ok());
  const ModelConfig& c = (*tf)->config();
  SequenceKv kv(c, kv::KvMode::kF32);
  ForwardScratch scratch;
  std::vector<float> logits(c.vocab_size);
  const std::vector<int32_t> good = {1, 2, 3};
  ASSERT_TRUE((*tf)->Prefill(good, kv, scratch, logits.data()).ok());
  const size_t bytes = kv.MemoryBytes();

  const std::vector<int32_t> bad = {4, int32_t(c.vocab_size), 5};
  absl::Status s = (*tf)->Prefill(bad, kv, scratch, logits.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("tokens[1]"), std::string::npos) << s;
  EXPECT_EQ(kv.position(), 3u);
  EXPECT_EQ(kv.MemoryBytes(), bytes);

  const std::vector<int32_t> neg = {-1};
  SequenceKv* p[1] = {&kv};
  EXPECT_EQ((*tf)->DecodeBatch(neg, p, scratch, logits.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*tf)->Prefill({}, kv, scratch, logits.data()).code(),
            absl::StatusCode::kInvalidArgument);
  SequenceKv* twice[2] = {&kv, &kv};
  const std::vector<int32_t> two = {1, 2};
  EXPECT_EQ((*tf)->DecodeBatch(two, twice, scratch, logits.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kv.position(), 3u);

  std::vector<int32_t> too_long(size_t(c.max_position_embeddings), 1);
  EXPECT_EQ((*tf)->Prefill(too_long, kv, scratch, logits.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kv.position(), 3u);
}

TEST(TransformerTest, Bf16AndF16CheckpointsTrackF32) {
  const std::vector<int32_t> ids = Ids(20, 259, 9);
  std::vector<std::vector<float>> out;
  for (math::DType dt : {math::DType::kF32, math::DType::kBF16, math::DType::kF16}) {
    auto tf = Transformer::Load(TempModel("tiny", dt, 21));
    ASSERT_TRUE(tf.ok()) << tf.status();
    SequenceKv kv((*tf)->config(), kv::KvMode::kF32);
    ForwardScratch scratch;
    out.emplace_back((*tf)->config().vocab_size);
    ASSERT_TRUE((*tf)->Prefill(ids, kv, scratch, out.back().data()).ok());
  }
  const double e_bf16 = RelErr(out[1].data(), out[0].data(), out[0].size());
  const double e_f16 = RelErr(out[2].data(), out[0].data(), out[0].size());
  std::printf("weights rounded to bf16: rel logit error %.3g; f16: %.3g\n", e_bf16, e_f16);
  EXPECT_LT(e_bf16, 5e-2);
  EXPECT_LT(e_f16, 5e-3);
}

// bf16 weights with bf16 activations (the default; LoadOptions): on the
// active ISA (AMX or AVX512_BF16 where the CPU has them) batched decode is
// still bit-identical to each sequence alone, decode agrees with prefill,
// and the logits stay close to f32 activations. Decode and a long (GEMM)
// prefill sum in another order; with f32 activations that costs ~1e-6, but
// here a last-bit difference can flip the bf16 rounding of an activation at
// the next layer (a 2^-9 step), so the two agree to ~1e-3 (measured 1.1e-3),
// the same order as the bf16-vs-f32 activation difference itself.
TEST(TransformerTest, Bf16ActivationsOnBf16Weights) {
  const std::string dir = TempModel("tiny-gqa", math::DType::kBF16, 31);
  LoadOptions f32_act;
  f32_act.bf16_activations = false;
  auto tf = Transformer::Load(dir, LoadOptions{});
  auto ref = Transformer::Load(dir, f32_act);
  ASSERT_TRUE(tf.ok() && ref.ok());
  EXPECT_TRUE((*tf)->bf16_activations());
  EXPECT_FALSE((*ref)->bf16_activations());
  // On AMX the projections run on a tile-order copy; never with f32 activations.
  EXPECT_EQ((*tf)->AmxTileBytes() > 0, math::AmxTilesUsed());
  EXPECT_EQ((*ref)->AmxTileBytes(), 0u);
  const ModelConfig& c = (*tf)->config();
  const size_t V = c.vocab_size, B = 5, steps = 5;
  ForwardScratch scratch;
  std::vector<SequenceKv> batched, alone, f32;
  std::vector<std::vector<int32_t>> seqs;
  std::vector<float> logits(B * V), one(V), f32_logits(V);
  for (size_t b = 0; b < B; ++b) {
    seqs.push_back(Ids(4 + 20 * b + steps, c.vocab_size, uint32_t(200 + b)));  // up to 89: GEMM
    const auto prompt = std::span(seqs[b]).first(seqs[b].size() - steps);
    for (auto* v : {&batched, &alone, &f32}) {
      v->emplace_back(c, kv::KvMode::kF32);
    }
    ASSERT_TRUE((*tf)->Prefill(prompt, batched[b], scratch, one.data()).ok());
    ASSERT_TRUE((*tf)->Prefill(prompt, alone[b], scratch, one.data()).ok());
    ASSERT_TRUE((*ref)->Prefill(prompt, f32[b], scratch, one.data()).ok());
  }
  std::vector<SequenceKv*> ptrs;
  for (auto& s : batched) ptrs.push_back(&s);
  double vs_prefill = 0, vs_f32 = 0;
  size_t identical = 0;
  for (size_t step = 0; step < steps; ++step) {
    std::vector<int32_t> next(B);
    for (size_t b = 0; b < B; ++b) next[b] = seqs[b][seqs[b].size() - steps + step];
    ASSERT_TRUE((*tf)->DecodeBatch(next, ptrs, scratch, logits.data()).ok());
    for (size_t b = 0; b < B; ++b) {
      SequenceKv* p1[1] = {&alone[b]};
      ASSERT_TRUE((*tf)->DecodeBatch(std::span(next).subspan(b, 1), p1, scratch, one.data()).ok());
      identical += std::memcmp(logits.data() + b * V, one.data(), V * sizeof(float)) == 0;
      SequenceKv* pf[1] = {&f32[b]};
      ASSERT_TRUE(
          (*ref)->DecodeBatch(std::span(next).subspan(b, 1), pf, scratch, f32_logits.data()).ok());
      vs_f32 = std::max(vs_f32, RelErr(one.data(), f32_logits.data(), V));
      // The same sequence as one prefill: its last logits.
      const size_t upto = seqs[b].size() - steps + step + 1;
      SequenceKv whole(c, kv::KvMode::kF32);
      std::vector<float> pre(V);
      ASSERT_TRUE((*tf)->Prefill(std::span(seqs[b]).first(upto), whole, scratch, pre.data()).ok());
      vs_prefill = std::max(vs_prefill, RelErr(one.data(), pre.data(), V));
    }
  }
  std::printf(
      "[%s] bf16 activations: %zu/%zu batched rows bit-identical; decode vs prefill %.3g; "
      "vs f32 activations %.3g\n",
      math::IsaName(math::ActiveIsa()), identical, B * steps, vs_prefill, vs_f32);
  EXPECT_EQ(identical, B * steps);
  EXPECT_LT(vs_prefill, 5e-3);
  EXPECT_LT(vs_f32, 5e-2);
  EXPECT_GT(vs_f32, 0.0);  // the rounding is real: f32 activations differ
}

TEST(TransformerTest, Int8KvLogitErrorIsSmall) {
  auto tf = Transformer::Load(TempModel("tiny-gqa"));
  ASSERT_TRUE(tf.ok());
  const ModelConfig& c = (*tf)->config();
  const size_t V = c.vocab_size;
  const std::vector<int32_t> ids = Ids(64, c.vocab_size, 17);
  ForwardScratch scratch;
  std::vector<float> f32(ids.size() * V), i8(ids.size() * V);
  SequenceKv a(c, kv::KvMode::kF32), b(c, kv::KvMode::kInt8);
  ASSERT_TRUE((*tf)->Prefill(ids, a, scratch, nullptr, f32.data()).ok());
  ASSERT_TRUE((*tf)->Prefill(ids, b, scratch, nullptr, i8.data()).ok());
  double worst = 0;
  for (size_t i = 0; i < ids.size(); ++i)
    worst = std::max(worst, RelErr(i8.data() + i * V, f32.data() + i * V, V));
  std::printf(
      "int8 KV vs f32 KV: max relative logit error %.3g over %zu positions; bytes %zu vs %zu\n",
      worst, ids.size(), b.MemoryBytes(), a.MemoryBytes());
  EXPECT_LT(worst, 3e-2);
  EXPECT_LT(b.MemoryBytes(), a.MemoryBytes() / 2);
}

// ---- int8 weights (LoadOptions::weights = kInt8) ----

// The float64 reference on the quantized weights: every matrix replaced by
// its Q8_0 round trip (what the int8 model multiplies by); only the int8
// activations remain between the two.
void QuantizeReferenceWeights(RefModel& ref) {
  for (auto& [name, values] : ref.t) {
    if (name.find("norm") != std::string::npos || name.find("bias") != std::string::npos) continue;
    std::vector<float> f(values.begin(), values.end());
    std::vector<uint8_t> q(math::RowBytes(math::DType::kQ8_0, f.size()));
    math::QuantizeQ8_0(f.data(), f.size(), q.data());
    math::DequantizeQ8_0(q.data(), f.size(), f.data());
    values.assign(f.begin(), f.end());
  }
}

// The largest relative error of `tf`'s prefill logits over `ids` against
// the reference's (every position).
double MaxPrefillRelErr(const Transformer& tf, const std::vector<int32_t>& ids,
                        const std::vector<Vec>& want) {
  SequenceKv kv(tf.config(), kv::KvMode::kF32);
  ForwardScratch scratch;
  const size_t V = tf.config().vocab_size;
  std::vector<float> all(ids.size() * V);
  EXPECT_TRUE(tf.Prefill(ids, kv, scratch, nullptr, all.data()).ok());
  double worst = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    worst = std::max(worst, RelErr(all.data() + i * V, want[i].data(), V));
  }
  return worst;
}

// Bytes of the int8 copies: multiplied matrices in lane order where the ISA
// uses it (math::Q8LanesUsed), else Q8_0 rows; an untied embedding in rows.
size_t Int8Bytes(const ModelConfig& c, bool with_embedding) {
  auto rows_bytes = [](int64_t rows, int64_t cols) {
    return size_t(rows) * math::RowBytes(math::DType::kQ8_0, size_t(cols));
  };
  auto m = [&](int64_t rows, int64_t cols) {
    return math::Q8LanesUsed() ? math::Q8LaneBytes(size_t(rows), size_t(cols))
                               : rows_bytes(rows, cols);
  };
  size_t per_layer = m(c.q_dim(), c.hidden_size) + 2 * m(c.kv_dim(), c.hidden_size) +
                     m(c.hidden_size, c.q_dim()) + 2 * m(c.intermediate_size, c.hidden_size) +
                     m(c.hidden_size, c.intermediate_size);
  size_t total = per_layer * size_t(c.num_hidden_layers) + m(c.vocab_size, c.hidden_size);
  if (with_embedding) total += rows_bytes(c.vocab_size, c.hidden_size);
  return total;
}

class Int8WeightsTest : public ::testing::TestWithParam<std::tuple<const char*, math::DType>> {};

TEST_P(Int8WeightsTest, QuantizedAtLoadMatchTheReferenceOnQuantizedWeights) {
  const auto [shape, dtype] = GetParam();
  const std::string dir = TempModel(shape, dtype);
  LoadOptions lo;
  lo.weights = LoadOptions::Weights::kInt8;
  auto tf = Transformer::Load(dir, lo);
  ASSERT_TRUE(tf.ok()) << tf.status();
  const ModelConfig& c = (*tf)->config();
  EXPECT_EQ((*tf)->weights(), LoadOptions::Weights::kInt8);
  // Every matrix once in the copy (tied: embedding and lm_head share it),
  // nothing read from the checkpoint in place.
  const bool untied = !c.tie_word_embeddings;
  EXPECT_EQ((*tf)->WeightBytesPerStep(), Int8Bytes(c, false));
  EXPECT_GE((*tf)->Int8CopyBytes(), Int8Bytes(c, untied));
  // (each matrix at a 4 KiB boundary, each mapping whole 2 MiB pages: two
  // mappings when an untied embedding keeps rows beside the lane order)
  const size_t mappings = untied && math::Q8LanesUsed() ? 2 : 1;
  EXPECT_LE((*tf)->Int8CopyBytes(),
            (Int8Bytes(c, untied) + 20 * 4096 + (2 << 20) - 1) / (2 << 20) * (2 << 20) +
                (mappings - 1) * (2 << 20));
  EXPECT_EQ((*tf)->CheckpointWeightBytesInUse(), 0u);

  auto ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok());
  RefModel ref(*ckpt);
  QuantizeReferenceWeights(ref);
  const std::vector<int32_t> ids = Ids(40, c.vocab_size, 5);
  const std::vector<Vec> want = ref.Forward(ids);
  const double worst = MaxPrefillRelErr(**tf, ids, want);
  // int8 activations (per 32-block, |error| <= amax / 254 each): measured
  // ~1e-2 on these shapes; a wrong scale or block would be O(1).
  std::printf("[%s/%s] int8 weights: max relative logit error vs f64 on quantized weights: %.3g\n",
              shape, math::DTypeName(dtype), worst);
  EXPECT_LT(worst, 0.05);
}

// A batched decode row is bit-identical to the same sequence decoded alone
// (the int8 MatMul is exact per row), and prefill agrees with decode.
TEST_P(Int8WeightsTest, BatchedDecodeRowsEqualEachSequenceAlone) {
  const auto [shape, dtype] = GetParam();
  LoadOptions lo;
  lo.weights = LoadOptions::Weights::kInt8;
  auto tf = Transformer::Load(TempModel(shape, dtype), lo);
  ASSERT_TRUE(tf.ok()) << tf.status();
  const ModelConfig& c = (*tf)->config();
  // 9 rows: on AMX the batch runs on the int8 tiles (math::kQ8AmxMinBatch),
  // each row alone on VPDPBUSD.
  const size_t V = c.vocab_size, B = 9;
  static_assert(B >= math::kQ8AmxMinBatch);
  std::vector<std::unique_ptr<SequenceKv>> batch, alone;
  ForwardScratch scratch;
  for (size_t b = 0; b < B; ++b) {
    const std::vector<int32_t> prompt = Ids(3 + 4 * b, c.vocab_size, uint32_t(20 + b));
    for (auto* set : {&batch, &alone}) {
      set->push_back(std::make_unique<SequenceKv>(c, kv::KvMode::kF32));
      ASSERT_TRUE((*tf)->Prefill(prompt, *set->back(), scratch, nullptr).ok());
    }
  }
  std::vector<float> logits(B * V), one(V);
  std::vector<SequenceKv*> ptrs;
  for (auto& k : batch) ptrs.push_back(k.get());
  for (int step = 0; step < 4; ++step) {
    const std::vector<int32_t> next = Ids(B, c.vocab_size, uint32_t(100 + step));
    ASSERT_TRUE((*tf)->DecodeBatch(next, ptrs, scratch, logits.data()).ok());
    for (size_t b = 0; b < B; ++b) {
      SequenceKv* p[1] = {alone[b].get()};
      ASSERT_TRUE((*tf)->DecodeBatch(std::span(next).subspan(b, 1), p, scratch, one.data()).ok());
      ASSERT_EQ(0, std::memcmp(one.data(), logits.data() + b * V, V * sizeof(float)))
          << shape << " step " << step << " sequence " << b;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Int8WeightsTest,
                         ::testing::Combine(::testing::Values("tiny", "tiny-qwen2", "tiny-llama"),
                                            ::testing::Values(math::DType::kF32,
                                                              math::DType::kBF16)),
                         [](const auto& info) {
                           std::string s = std::string(std::get<0>(info.param)) + "_" +
                                           math::DTypeName(std::get<1>(info.param));
                           for (char& ch : s) ch = ch == '-' ? '_' : ch;
                           return s;
                         });

// tiny-gqa has hidden 48 (head_dim 32 × 4 q heads = 128): int8 blocks of 32
// tile only the matrices whose input is q_dim (o_proj) or intermediate
// (down_proj); the others stay in the checkpoint's dtype and are read in
// place, and the model still matches its reference.
TEST(Int8WeightsMixedTest, MatricesWhoseInputIsNotAMultipleOf32StayAsStored) {
  const std::string dir = TempModel("tiny-gqa");
  LoadOptions lo;
  lo.weights = LoadOptions::Weights::kInt8;
  auto tf = Transformer::Load(dir, lo);
  ASSERT_TRUE(tf.ok()) << tf.status();
  const ModelConfig& c = (*tf)->config();
  ASSERT_NE(c.hidden_size % 32, 0);
  EXPECT_EQ((*tf)->weights(), LoadOptions::Weights::kInt8);
  EXPECT_GT((*tf)->Int8CopyBytes(), 0u);
  EXPECT_GT((*tf)->CheckpointWeightBytesInUse(), 0u);
  auto ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok());
  RefModel ref(*ckpt);
  const std::vector<int32_t> ids = Ids(20, c.vocab_size, 5);
  const std::vector<Vec> want = ref.Forward(ids);
  const double worst = MaxPrefillRelErr(**tf, ids, want);
  EXPECT_LT(worst, 0.1);
}

// Converting at load hands the checkpoint's pages back: the process holds
// the int8 copy, not the bf16 file as well (RSS, not only the gauges).
TEST(Int8WeightsMemoryTest, ResidentMemoryHoldsTheInt8CopyNotTheCheckpoint) {
  auto c = NamedShape("tiny");
  ASSERT_TRUE(c.ok());
  c->hidden_size = 512;
  c->intermediate_size = 1536;
  c->num_hidden_layers = 4;
  c->num_attention_heads = 8;
  c->num_key_value_heads = 4;
  c->head_dim = 64;
  c->vocab_size = 32000;
  const std::string dir = ::testing::TempDir() + "/int8_rss_model";
  RandomCheckpointOptions ro;
  ro.dtype = math::DType::kBF16;
  ASSERT_TRUE(WriteRandomCheckpoint(*c, dir, ro).ok());
  const size_t bf16_bytes = std::filesystem::file_size(dir + "/model.safetensors");
  const size_t before = testing::RssBytes();
  LoadOptions lo;
  lo.weights = LoadOptions::Weights::kInt8;
  auto tf = Transformer::Load(dir, lo);
  ASSERT_TRUE(tf.ok()) << tf.status();
  const size_t after = testing::RssBytes();
  const size_t int8 = (*tf)->Int8CopyBytes();
  std::printf("checkpoint %.1f MB bf16, int8 copy %.1f MB, RSS grew %.1f MB at load\n",
              bf16_bytes / 1e6, int8 / 1e6, (after - before) / 1e6);
  EXPECT_GT(int8, bf16_bytes / 2 - bf16_bytes / 20);  // 34 bytes per 32 values
  EXPECT_LT(int8, bf16_bytes * 6 / 10);
  EXPECT_LT(after - before, int8 + bf16_bytes / 5);  // the bf16 pages are not held
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace cortiq::model
