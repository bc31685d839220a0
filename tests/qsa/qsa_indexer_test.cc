// QsaIndexer behaviour (issue "The seed kernels", req. 6):
//   (a) inside the inert bound the output is bit-identical to dense;
//   (b) with a budget that covers every block, identical to dense at every
//       position — and the selected-set attention over every block is the
//       dense attention bit for bit, through the identity table and through a
//       shuffled paged pool;
//   (e) snapshot → restore into a fresh state gives identical later
//       selections and outputs;
//   (f) selection equals a brute-force top-k over the pooled block scores,
//       and those scores match an independent scalar reference.
// Both KV modes (f32, int8) run every test. Bit-exactness is memcmp.
#include "core/qsa/qsa_indexer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "core/qsa/cpu_backend.h"
#include "core/qsa/kv_pool.h"
#include "tests/qsa/qsa_test_util.h"

namespace cortiq::qsa {
namespace {

using testing::LayerData;
using testing::SameBits;

constexpr size_t kHidden = 32, kNq = 4, kNkv = 2, kD = 16;
constexpr size_t kIdxHeads = 2, kIdxHd = 16, kRatio = 4, kRot = 8;

QsaGeometry Geometry(size_t budget) {
  QsaGeometry g;
  g.n_heads = kIdxHeads;
  g.hd = kIdxHd;
  g.ratio = kRatio;
  g.budget = budget;
  g.rot = kRot;
  g.theta = 10000.0;
  g.eps = 1e-6f;
  g.hidden = kHidden;
  g.nkv_attn = kNkv;
  g.hd_attn = kD;
  return g;
}

DevicePtr H(const void* p) { return DevicePtr::FromHost(p); }

class QsaFixture : public ::testing::Test {
 protected:
  // Member order matters: the backend outlives everything allocated on it.
  CpuBackend backend_;
  std::unique_ptr<QsaIndexer> ix_;
  std::unique_ptr<QsaScratch> scratch_;
  std::vector<std::unique_ptr<QsaSeqState>> states_;  // released in TearDown

  void SetUp() override { scratch_ = std::make_unique<QsaScratch>(&backend_); }
  void TearDown() override {
    for (auto& st : states_) QSA_EXPECT_OK(ix_->ReleaseSeqState(*st));
    for (auto& st : states_) QSA_EXPECT_OK(ix_->ReleaseSeqState(*st));  // idempotent
    states_.clear();
    scratch_.reset();
    ix_.reset();
    EXPECT_EQ(backend_.stats().live_allocations, 0u);
  }

  void MakeIndexer(size_t budget, uint32_t seed = 7) {
    std::mt19937 rng(seed);
    auto w = testing::RandomWeights(rng, kIdxHeads, kIdxHd, kHidden, /*bias=*/true, /*norms=*/true);
    auto ix = QsaIndexer::New(&backend_, w, Geometry(budget));
    ASSERT_TRUE(ix.ok()) << ix.status();
    ix_ = std::move(*ix);
  }

  QsaSeqState& NewState(size_t capacity = 0) {
    auto st = ix_->NewSeqState(capacity);
    EXPECT_TRUE(st.ok()) << st.status();
    states_.push_back(std::make_unique<QsaSeqState>(std::move(*st)));
    return *states_.back();
  }

  // Chunked prefill of positions [from, to): ingest, dense attention into
  // ctx, then PrefillSelect — the transformer's order.
  void Prefill(QsaSeqState& st, const LayerData& L, const LayerKvPool& pool, size_t from, size_t to,
               size_t chunk, std::vector<float>& ctx) {
    const size_t row = L.nq * L.D;
    for (size_t s = from; s < to; s += chunk) {
      const size_t n = std::min(chunk, to - s);
      QSA_ASSERT_OK(ix_->PrefillIngest(st, H(L.x_row(s)), n, s, *scratch_));
      for (size_t r = 0; r < n; ++r) L.Dense(s + r, ctx.data() + (s + r) * row);
      QSA_ASSERT_OK(ix_->PrefillSelect(st, H(L.x_row(s)), H(L.q_row(s)), H(ctx.data() + s * row),
                                       pool.pool(), pool.table(), s, n, L.nq, L.scale(),
                                       *scratch_));
    }
  }

  // One decode position: select, then attend (sparse when active, else dense).
  void Decode(QsaSeqState& st, const LayerData& L, const LayerKvPool& pool, size_t p,
              QsaSelection& sel, float* out) {
    QSA_ASSERT_OK(ix_->DecodeSelect(st, H(L.x_row(p)), p, *scratch_, &sel));
    if (sel.active) {
      QSA_ASSERT_OK(ix_->AttendSelection(sel, H(L.q_row(p)), H(out), pool.pool(), pool.table(),
                                         L.nq, L.scale(), *scratch_));
    } else {
      L.Dense(p, out);
    }
  }
};

class QsaIndexerTest : public QsaFixture, public ::testing::WithParamInterface<kv::KvMode> {};

// (a) -----------------------------------------------------------------------

TEST_P(QsaIndexerTest, InsideInertBoundPrefillIsBitIdenticalToDense) {
  MakeIndexer(/*budget=*/3);
  ASSERT_EQ(ix_->InertBound(), 12u);
  std::mt19937 rng(1);
  LayerData L(rng, 48, kHidden, kNq, kNkv, kD, GetParam());
  LayerKvPool pool;
  QSA_ASSERT_OK(pool.Bind(L.cache, kRatio));
  const std::vector<float> dense = L.DenseAll();
  const size_t row = kNq * kD;

  // Chunks of 7 straddle the bound (chunk [7, 14) holds positions 12, 13).
  QsaSeqState& st = NewState();
  std::vector<float> ctx(L.T * row);
  Prefill(st, L, pool, 0, L.T, 7, ctx);
  size_t differing = 0;
  for (size_t p = 0; p < L.T; ++p) {
    const bool same = SameBits(ctx.data() + p * row, dense.data() + p * row, row);
    if (p < ix_->InertBound()) {
      EXPECT_TRUE(same) << "position " << p;
    } else {
      differing += !same;
    }
  }
  // Past the bound the selection is a strict subset: outputs must move.
  EXPECT_GT(differing, (L.T - ix_->InertBound()) / 2);
  EXPECT_EQ(st.ingested(), L.T);
  EXPECT_EQ(st.pooled(), L.T / kRatio);
}

TEST_P(QsaIndexerTest, InsideInertBoundDecodeIsInactiveAndDense) {
  MakeIndexer(/*budget=*/3);
  std::mt19937 rng(2);
  LayerData L(rng, 30, kHidden, kNq, kNkv, kD, GetParam());
  LayerKvPool pool;
  QSA_ASSERT_OK(pool.Bind(L.cache, kRatio));
  const size_t row = kNq * kD;
  QsaSeqState& st = NewState(4);  // grows while decoding
  QsaSelection sel;
  std::vector<float> out(row), dense(row);
  for (size_t p = 0; p < L.T; ++p) {
    Decode(st, L, pool, p, sel, out.data());
    EXPECT_EQ(sel.position, p);
    if (p < ix_->InertBound()) {
      EXPECT_FALSE(sel.active) << p;
    } else {
      ASSERT_TRUE(sel.active) << p;
      EXPECT_EQ(sel.blocks.size(), 3u);
      EXPECT_EQ(sel.blocks.front(), 0u);
      EXPECT_EQ(sel.blocks.back(), p / kRatio);
    }
  }
  EXPECT_EQ(st.ingested(), L.T);
  EXPECT_EQ(st.pooled(), L.T / kRatio);
  EXPECT_GE(st.capacity(), L.T);
}

// (b) -----------------------------------------------------------------------

TEST_P(QsaIndexerTest, BudgetCoveringEveryBlockIsDenseEverywhere) {
  std::mt19937 rng(3);
  LayerData L(rng, 41, kHidden, kNq, kNkv, kD, GetParam());
  MakeIndexer(/*budget=*/L.T / kRatio + 1);  // every block of every query fits
  ASSERT_GE(ix_->InertBound(), L.T);
  LayerKvPool pool;
  QSA_ASSERT_OK(pool.Bind(L.cache, kRatio));
  const std::vector<float> dense = L.DenseAll();
  const size_t row = kNq * kD;

  QsaSeqState& st = NewState();
  std::vector<float> ctx(L.T * row);
  Prefill(st, L, pool, 0, 20, 9, ctx);
  QsaSelection sel;
  for (size_t p = 20; p < L.T; ++p) {
    Decode(st, L, pool, p, sel, ctx.data() + p * row);
    EXPECT_FALSE(sel.active);
  }
  EXPECT_TRUE(SameBits(ctx.data(), dense.data(), ctx.size()));
}

// The sparse kernel itself, given every block, is the dense attention bit for
// bit — at every position, so also past any inert bound.
TEST_P(QsaIndexerTest, SelectedSetOfEveryBlockEqualsDenseBitForBit) {
  MakeIndexer(/*budget=*/2);
  std::mt19937 rng(4);
  LayerData L(rng, 37, kHidden, kNq, kNkv, kD, GetParam());
  LayerKvPool pool;
  QSA_ASSERT_OK(pool.Bind(L.cache, /*block_size=*/5));  // pool paging != ratio
  const size_t row = kNq * kD;
  std::vector<float> out(row), dense(row);
  QsaSelection sel;
  for (size_t p = 0; p < L.T; ++p) {
    sel.position = p;
    sel.blocks.resize(p / kRatio + 1);
    std::iota(sel.blocks.begin(), sel.blocks.end(), 0u);
    QSA_ASSERT_OK(ix_->AttendSelection(sel, H(L.q_row(p)), H(out.data()), pool.pool(), pool.table(),
                                       kNq, L.scale(), *scratch_));
    L.Dense(p, dense.data());
    EXPECT_TRUE(SameBits(out.data(), dense.data(), row)) << "position " << p;
  }
}

// A real paged pool ([blocks][block_size][heads][D], blocks shuffled) read
// through its table gives the same bits as the identity view of the cache.
TEST_P(QsaIndexerTest, ShuffledPagedPoolEqualsIdentityView) {
  MakeIndexer(/*budget=*/3);
  std::mt19937 rng(5);
  LayerData L(rng, 40, kHidden, kNq, kNkv, kD, GetParam());
  const size_t bs = 8, nblk = (L.T + bs - 1) / bs, Hh = kNkv, D = kD;
  const bool i8 = GetParam() == kv::KvMode::kInt8;
  std::vector<uint32_t> table(nblk);
  std::iota(table.begin(), table.end(), 0u);
  std::shuffle(table.begin(), table.end(), rng);
  // Element size 4 (f32) or 1 (int8): keep bytes and copy rows bytewise.
  const size_t esz = i8 ? 1 : 4;
  std::vector<uint8_t> k(nblk * bs * Hh * D * esz), v(k.size());
  std::vector<float> ks(nblk * bs * Hh), vs(ks.size());
  for (size_t h = 0; h < Hh; ++h) {
    for (size_t t = 0; t < L.T; ++t) {
      const size_t dst = (size_t(table[t / bs]) * bs * Hh + (t % bs) * Hh + h);
      if (i8) {
        std::memcpy(&k[dst * D], L.cache.HeadKeysI8(h).data() + t * D, D);
        std::memcpy(&v[dst * D], L.cache.HeadValuesI8(h).data() + t * D, D);
        ks[dst] = L.cache.HeadKeyScales(h)[t];
        vs[dst] = L.cache.HeadValueScales(h)[t];
      } else {
        std::memcpy(&k[dst * D * 4], L.cache.HeadKeys(h).data() + t * D, D * 4);
        std::memcpy(&v[dst * D * 4], L.cache.HeadValues(h).data() + t * D, D * 4);
      }
    }
  }
  KvPool paged;
  paged.dtype = i8 ? KvDType::kInt8 : KvDType::kF32;
  paged.k = H(k.data());
  paged.v = H(v.data());
  paged.num_kv_heads = Hh;
  paged.head_dim = D;
  paged.block_size = bs;
  paged.strides = PoolStrides{bs * Hh * D, Hh * D, D};
  if (i8) {
    paged.k_scale = H(ks.data());
    paged.v_scale = H(vs.data());
    paged.scale_strides = PoolStrides{bs * Hh, Hh, 1};
  }
  const BlockTable paged_table{H(table.data()), nblk};
  LayerKvPool ident;
  QSA_ASSERT_OK(ident.Bind(L.cache, kRatio));

  const size_t row = kNq * kD;
  std::vector<float> a(L.T * row), b(L.T * row);
  QsaSeqState& st = NewState();
  QSA_ASSERT_OK(ix_->PrefillIngest(st, H(L.x.data()), L.T, 0, *scratch_));
  QSA_ASSERT_OK(ix_->PrefillSelect(st, H(L.x.data()), H(L.q.data()), H(a.data()), ident.pool(),
                                   ident.table(), 0, L.T, kNq, L.scale(), *scratch_));
  QSA_ASSERT_OK(ix_->PrefillSelect(st, H(L.x.data()), H(L.q.data()), H(b.data()), paged,
                                   paged_table, 0, L.T, kNq, L.scale(), *scratch_));
  const size_t from = ix_->InertBound() * row;
  EXPECT_TRUE(SameBits(a.data() + from, b.data() + from, a.size() - from));
}

// (e) -----------------------------------------------------------------------

TEST_P(QsaIndexerTest, SnapshotRestoreGivesIdenticalLaterSelectionsAndOutputs) {
  MakeIndexer(/*budget=*/3);
  std::mt19937 rng(6);
  LayerData L(rng, 60, kHidden, kNq, kNkv, kD, GetParam());
  LayerKvPool pool;
  QSA_ASSERT_OK(pool.Bind(L.cache, kRatio));
  const size_t row = kNq * kD;

  QsaSeqState& a = NewState();
  QsaSeqState& b = NewState();
  std::vector<float> ctx_a(L.T * row), ctx_b(L.T * row);
  Prefill(a, L, pool, 0, 25, 7, ctx_a);

  auto blob = ix_->SnapshotAux(a);
  ASSERT_TRUE(blob.ok()) << blob.status();
  ASSERT_EQ(blob->size(), 16 + 25 * kIdxHd * 2);
  EXPECT_EQ((*blob)[0], 25);           // ingested, little-endian
  EXPECT_EQ((*blob)[8], 25 / kRatio);  // pooled
  QSA_ASSERT_OK(ix_->RestoreAux(b, *blob));
  EXPECT_EQ(b.ingested(), 25u);
  EXPECT_EQ(b.pooled(), 25 / kRatio);
  // Re-pooled block keys equal the original ones byte for byte.
  std::vector<uint8_t> pa(b.pooled() * kIdxHd * 2), pb(pa.size());
  QSA_ASSERT_OK(backend_.CopyToHost(pa.data(), a.block_keys(), pa.size(), kDefaultStream));
  QSA_ASSERT_OK(backend_.CopyToHost(pb.data(), b.block_keys(), pb.size(), kDefaultStream));
  EXPECT_EQ(pa, pb);

  // Both continue identically: a prefill chunk, then decode steps.
  Prefill(a, L, pool, 25, 41, 5, ctx_a);
  Prefill(b, L, pool, 25, 41, 5, ctx_b);
  QsaSelection sa, sb;
  for (size_t p = 41; p < L.T; ++p) {
    Decode(a, L, pool, p, sa, ctx_a.data() + p * row);
    Decode(b, L, pool, p, sb, ctx_b.data() + p * row);
    ASSERT_TRUE(sa.active && sb.active);
    EXPECT_EQ(sa.blocks, sb.blocks) << "position " << p;
  }
  const size_t from = 25 * row;
  EXPECT_TRUE(SameBits(ctx_a.data() + from, ctx_b.data() + from, ctx_a.size() - from));
  auto blob_a = ix_->SnapshotAux(a), blob_b = ix_->SnapshotAux(b);
  ASSERT_TRUE(blob_a.ok() && blob_b.ok());
  EXPECT_EQ(*blob_a, *blob_b);
}

TEST_P(QsaIndexerTest, MalformedAuxBlobIsDataLossAndLeavesTheStateAlone) {
  MakeIndexer(/*budget=*/3);
  std::mt19937 rng(7);
  LayerData L(rng, 10, kHidden, kNq, kNkv, kD, GetParam());
  QsaSeqState& a = NewState();
  QsaSeqState& b = NewState();
  QSA_ASSERT_OK(ix_->PrefillIngest(a, H(L.x.data()), 10, 0, *scratch_));
  QSA_ASSERT_OK(ix_->PrefillIngest(b, H(L.x.data()), 3, 0, *scratch_));
  auto blob = ix_->SnapshotAux(a);
  ASSERT_TRUE(blob.ok());

  std::vector<uint8_t> truncated(blob->begin(), blob->end() - 1);
  std::vector<uint8_t> longer(*blob);
  longer.push_back(0);
  std::vector<uint8_t> bad_pooled(*blob);
  bad_pooled[8] = 1;  // 10 tokens at ratio 4 pool 2 blocks
  std::vector<uint8_t> header_only(blob->begin(), blob->begin() + 7);
  for (const auto* bad : {&truncated, &longer, &bad_pooled, &header_only}) {
    const absl::Status s = ix_->RestoreAux(b, *bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_EQ(b.ingested(), 3u);
    EXPECT_EQ(b.pooled(), 0u);
  }
  // An empty state's blob restores to an empty state.
  QsaSeqState& c = NewState();
  auto empty = ix_->SnapshotAux(c);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->size(), 16u);
  QSA_EXPECT_OK(ix_->RestoreAux(b, *empty));
  EXPECT_EQ(b.ingested(), 0u);
}

// (f) -----------------------------------------------------------------------

TEST_P(QsaIndexerTest, SelectionEqualsBruteForceTopK) {
  MakeIndexer(/*budget=*/5);
  std::mt19937 rng(8);
  LayerData L(rng, 100, kHidden, kNq, kNkv, kD, GetParam());
  LayerKvPool pool;
  QSA_ASSERT_OK(pool.Bind(L.cache, kRatio));
  const size_t row = kNq * kD;

  // Decode: the returned selection against BlockScores + brute force.
  QsaSeqState& st = NewState(L.T);
  QsaSelection sel;
  std::vector<float> out(row);
  size_t checked = 0;
  for (size_t p = 0; p < L.T; ++p) {
    Decode(st, L, pool, p, sel, out.data());
    if (!sel.active) continue;
    auto scores = ix_->BlockScores(st, H(L.x_row(p)), p, *scratch_);
    ASSERT_TRUE(scores.ok()) << scores.status();
    ASSERT_EQ(scores->size(), p / kRatio);
    EXPECT_EQ(sel.blocks, testing::BruteForceSelect(*scores, p, kRatio, 5)) << "position " << p;
    ++checked;
  }
  EXPECT_EQ(checked, L.T - ix_->InertBound());

  // Prefill (chunks < 64 rows: the projection is batch-invariant): every row
  // past the bound equals attention over the brute-force selection.
  QsaSeqState& pst = NewState();
  std::vector<float> ctx(L.T * row);
  Prefill(pst, L, pool, 0, L.T, 13, ctx);
  for (size_t p = ix_->InertBound(); p < L.T; ++p) {
    auto scores = ix_->BlockScores(pst, H(L.x_row(p)), p, *scratch_);
    ASSERT_TRUE(scores.ok());
    QsaSelection brute{true, p, testing::BruteForceSelect(*scores, p, kRatio, 5)};
    QSA_ASSERT_OK(ix_->AttendSelection(brute, H(L.q_row(p)), H(out.data()), pool.pool(),
                                       pool.table(), kNq, L.scale(), *scratch_));
    EXPECT_TRUE(SameBits(out.data(), ctx.data() + p * row, row)) << "position " << p;
  }
}

// The indexer math (projection, RmsNorm, partial RoPE, bf16 parking, mean
// pooling, relu-sum scoring) against a scalar double-precision reference.
TEST_P(QsaIndexerTest, BlockScoresMatchScalarReference) {
  std::mt19937 wrng(9);
  IndexerWeights w = testing::RandomWeights(wrng, kIdxHeads, kIdxHd, kHidden, true, true);
  auto made = QsaIndexer::New(&backend_, w, Geometry(3));
  ASSERT_TRUE(made.ok());
  ix_ = std::move(*made);
  std::mt19937 rng(10);
  LayerData L(rng, 33, kHidden, kNq, kNkv, kD, GetParam());
  QsaSeqState& st = NewState();
  QSA_ASSERT_OK(ix_->PrefillIngest(st, H(L.x.data()), L.T, 0, *scratch_));

  const float* W = reinterpret_cast<const float*>(w.qk_proj.data());
  auto project = [&](size_t t, size_t head, bool key) {  // head: row block index
    std::vector<double> y(kIdxHd);
    for (size_t i = 0; i < kIdxHd; ++i) {
      const size_t r = head * kIdxHd + i;
      double acc = w.qk_bias[r];
      for (size_t c = 0; c < kHidden; ++c) acc += double(W[r * kHidden + c]) * L.x_row(t)[c];
      y[i] = acc;
    }
    double ms = 0;
    for (double v : y) ms += v * v;
    const double inv = 1.0 / std::sqrt(ms / kIdxHd + 1e-6);
    const std::vector<float>& nw = key ? w.k_norm : w.q_norm;
    for (size_t i = 0; i < kIdxHd; ++i) y[i] = y[i] * inv * nw[i];
    for (size_t i = 0; i < kRot / 2; ++i) {
      const double f = std::pow(10000.0, -2.0 * double(i) / double(kRot));
      const double c = std::cos(double(t) * f), s = std::sin(double(t) * f);
      const double a = y[i], b = y[i + kRot / 2];
      y[i] = a * c - b * s;
      y[i + kRot / 2] = b * c + a * s;
    }
    return y;
  };
  auto bf16 = [](double v) { return math::Bf16ToF32(math::F32ToBf16(float(v))); };
  const size_t nb = L.T / kRatio;
  std::vector<std::vector<double>> pooled(nb, std::vector<double>(kIdxHd, 0.0));
  for (size_t b = 0; b < nb; ++b) {
    for (size_t t = b * kRatio; t < (b + 1) * kRatio; ++t) {
      const auto k = project(t, kIdxHeads, true);
      for (size_t i = 0; i < kIdxHd; ++i) pooled[b][i] += bf16(k[i]);
    }
    for (size_t i = 0; i < kIdxHd; ++i) pooled[b][i] = bf16(pooled[b][i] / kRatio);
  }
  for (size_t p : {size_t{13}, size_t{24}, size_t{32}}) {
    auto got = ix_->BlockScores(st, H(L.x_row(p)), p, *scratch_);
    ASSERT_TRUE(got.ok());
    ASSERT_EQ(got->size(), p / kRatio);
    EXPECT_TRUE(std::isnan((*got)[0]));
    for (size_t b = 1; b < p / kRatio; ++b) {
      double want = 0;
      for (size_t j = 0; j < kIdxHeads; ++j) {
        const auto q = project(p, j, false);
        double d = 0;
        for (size_t i = 0; i < kIdxHd; ++i) d += q[i] * pooled[b][i];
        want += std::max(0.0, d);
      }
      EXPECT_NEAR((*got)[b], want, 2e-2 * (1.0 + std::fabs(want))) << "p " << p << " b " << b;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(KvModes, QsaIndexerTest,
                         ::testing::Values(kv::KvMode::kF32, kv::KvMode::kInt8),
                         [](const auto& info) { return std::string(kv::KvModeName(info.param)); });

// ---------------------------------------------------------------------------
// Argument validation (one mode is enough).

class QsaIndexerArgsTest : public QsaFixture {};

TEST_F(QsaIndexerArgsTest, CallsOutOfOrderAreRefused) {
  MakeIndexer(3);
  std::mt19937 rng(11);
  LayerData L(rng, 20, kHidden, kNq, kNkv, kD, kv::KvMode::kF32);
  LayerKvPool pool;
  QSA_ASSERT_OK(pool.Bind(L.cache, kRatio));
  QsaSeqState& st = NewState();
  std::vector<float> ctx(L.T * kNq * kD);
  // Select before ingest.
  EXPECT_EQ(ix_->PrefillSelect(st, H(L.x.data()), H(L.q.data()), H(ctx.data()), pool.pool(),
                               pool.table(), 0, 5, kNq, L.scale(), *scratch_)
                .code(),
            absl::StatusCode::kFailedPrecondition);
  QSA_ASSERT_OK(ix_->PrefillIngest(st, H(L.x.data()), 5, 0, *scratch_));
  // A gap in positions.
  EXPECT_EQ(ix_->PrefillIngest(st, H(L.x.data()), 5, 7, *scratch_).code(),
            absl::StatusCode::kFailedPrecondition);
  QsaSelection sel;
  EXPECT_EQ(ix_->DecodeSelect(st, H(L.x.data()), 9, *scratch_, &sel).code(),
            absl::StatusCode::kFailedPrecondition);
  // Wrong head count / pool geometry.
  EXPECT_EQ(ix_->PrefillSelect(st, H(L.x.data()), H(L.q.data()), H(ctx.data()), pool.pool(),
                               pool.table(), 0, 5, 3, L.scale(), *scratch_)
                .code(),
            absl::StatusCode::kInvalidArgument);
  // A selection that is not ascending or reaches past its position.
  QsaSelection bad{true, 9, {0, 3}};
  EXPECT_EQ(ix_->AttendSelection(bad, H(L.q.data()), H(ctx.data()), pool.pool(), pool.table(), kNq,
                                 L.scale(), *scratch_)
                .code(),
            absl::StatusCode::kInvalidArgument);
  // A state of another indexer.
  CpuBackend other_backend;
  std::mt19937 wrng(1);
  auto other = QsaIndexer::New(
      &other_backend, testing::RandomWeights(wrng, kIdxHeads, kIdxHd, kHidden, false, false),
      Geometry(3));
  ASSERT_TRUE(other.ok());
  EXPECT_EQ((*other)->PrefillIngest(st, H(L.x.data()), 1, 0, *scratch_).code(),
            absl::StatusCode::kInvalidArgument);
  // Truncate, then re-ingest from the cut.
  QSA_ASSERT_OK(ix_->Truncate(st, 2));
  EXPECT_EQ(st.ingested(), 2u);
  QSA_EXPECT_OK(ix_->PrefillIngest(st, H(L.x_row(2)), 6, 2, *scratch_));
  EXPECT_EQ(st.pooled(), 2u);
}

TEST_F(QsaIndexerArgsTest, NewNamesTheBadField) {
  std::mt19937 rng(12);
  const IndexerWeights w = testing::RandomWeights(rng, kIdxHeads, kIdxHd, kHidden, false, true);
  auto expect_bad = [&](QsaGeometry g, const char* field) {
    auto ix = QsaIndexer::New(&backend_, w, g);
    ASSERT_FALSE(ix.ok());
    EXPECT_EQ(ix.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(ix.status().message().find(field), std::string::npos) << ix.status();
  };
  QsaGeometry g = Geometry(3);
  g.budget = 1;
  expect_bad(g, "budget");
  g = Geometry(3);
  g.ratio = 0;
  expect_bad(g, "ratio");
  g = Geometry(3);
  g.rot = 5;
  expect_bad(g, "rot");
  g = Geometry(3);
  g.n_heads = 3;
  expect_bad(g, "n_heads");
  g = Geometry(3);
  g.hidden = 31;
  expect_bad(g, "hidden");
  EXPECT_EQ(backend_.stats().live_allocations, 0u);
}

}  // namespace
}  // namespace cortiq::qsa
