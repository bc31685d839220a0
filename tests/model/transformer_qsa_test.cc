// QSA block-sparse attention wired into the forward pass (SequenceKv::EnableQsa,
// docs/QSA.md), on random checkpoints the test writes:
//   * configs: layer specs, ratio/budget limits, fresh-sequence only, no
//     composition with O(1);
//   * a budget covering every block, and a short prompt inside the inert
//     bound, give the logits of exact attention bit for bit (prefill, decode);
//   * a long context (ratio 8, budget 4, 200 tokens) runs, differs from
//     exact, stays finite; QSA bytes are exact and grow only with ingestion;
//   * Release (and the destructor) return every backend byte; idempotent;
//   * copies and truncation continue identically; a mixed decode batch
//     equals its sequences decoded alone; chunked prefill vs one-shot;
//   * a warm decode step with a QSA sequence past the bound does not allocate.
//
// This binary replaces the global operator new to count allocations (the
// last test); the counter is only read there.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <new>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/model/random_checkpoint.h"
#include "core/model/transformer.h"
#include "gtest/gtest.h"
#include "tests/common/alloc_counter.h"
#include "tests/common/model_test_util.h"

namespace cortiq::model {
namespace {

using cortiq::testing::MaxRelErr;
using cortiq::testing::TempModel;
using cortiq::testing::TestIds;

bool AllFinite(const std::vector<float>& x) {
  return std::all_of(x.begin(), x.end(), [](float v) { return std::isfinite(v); });
}
bool Same(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class QsaFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tf = Transformer::Load(TempModel("tiny-gqa"));
    ASSERT_TRUE(tf.ok()) << tf.status();
    tf_ = std::move(*tf);
    V_ = size_t(tf_->config().vocab_size);
    L_ = size_t(tf_->config().num_hidden_layers);
  }
  const ModelConfig& config() const { return tf_->config(); }
  QsaConfig Qsa(size_t ratio, size_t budget, const std::string& spec = "all") {
    auto c = MakeQsaConfig(spec, ratio, budget, L_);
    EXPECT_TRUE(c.ok()) << c.status();
    return *c;
  }
  SequenceKv NewSeq(std::optional<QsaConfig> qsa, kv::KvMode mode = kv::KvMode::kF32) {
    SequenceKv s(config(), mode);
    if (qsa.has_value()) {
      EXPECT_TRUE(s.EnableQsa(*qsa).ok());
    }
    return s;
  }
  void Prefill(SequenceKv& seq, std::span<const int32_t> ids, std::vector<float>& out) {
    out.resize(V_);
    absl::Status st = tf_->Prefill(ids, seq, scratch_, out.data());
    ASSERT_TRUE(st.ok()) << st;
  }
  void Decode(SequenceKv& seq, int32_t token, std::vector<float>& out) {
    out.resize(V_);
    SequenceKv* p[1] = {&seq};
    const int32_t t[1] = {token};
    absl::Status st = tf_->DecodeBatch(t, p, scratch_, out.data());
    ASSERT_TRUE(st.ok()) << st;
  }

  std::unique_ptr<Transformer> tf_;
  size_t V_ = 0, L_ = 0;
  ForwardScratch scratch_;
};

TEST_F(QsaFixture, ConfigsAreValidatedAndRefusedClearly) {
  EXPECT_EQ(Qsa(8, 4, "deep1").layers, std::vector<size_t>{L_ - 1});
  EXPECT_EQ(Qsa(8, 4, "0,0").layers, std::vector<size_t>{0});
  EXPECT_EQ(MakeQsaConfig("all", 0, 4, L_).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeQsaConfig("all", 8, 1, L_).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeQsaConfig("deep9", 8, 4, L_).status().code(), absl::StatusCode::kInvalidArgument);
  SequenceKv s(config(), kv::KvMode::kF32);
  QsaConfig bad = Qsa(8, 4);
  bad.layers.push_back(L_);
  absl::Status st = s.EnableQsa(bad);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("qsa.layers"), std::string::npos) << st;
  // O(1) and QSA refuse each other, both orders.
  kv::O1Config o1;
  o1.layers = {0};
  SequenceKv a(config(), kv::KvMode::kF32), b(config(), kv::KvMode::kF32);
  ASSERT_TRUE(a.EnableO1(o1).ok());
  EXPECT_EQ(a.EnableQsa(Qsa(8, 4)).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(b.EnableQsa(Qsa(8, 4)).ok());
  EXPECT_EQ(b.EnableO1(o1).code(), absl::StatusCode::kInvalidArgument);
  // Only on a fresh sequence.
  std::vector<float> logits;
  SequenceKv c(config(), kv::KvMode::kF32);
  Prefill(c, TestIds(5, config().vocab_size, 1), logits);
  EXPECT_EQ(c.EnableQsa(Qsa(8, 4)).code(), absl::StatusCode::kFailedPrecondition);
}

// budget · ratio >= every position: every block selected = dense, by design
// bit for bit (rows below the inert bound keep the dense output).
TEST_F(QsaFixture, BudgetCoveringEveryBlockEqualsExact) {
  const std::vector<int32_t> ids = TestIds(170, config().vocab_size, 7);
  for (kv::KvMode mode : {kv::KvMode::kF32, kv::KvMode::kInt8}) {
    SequenceKv exact = NewSeq(std::nullopt, mode), sparse = NewSeq(Qsa(8, 32), mode);
    std::vector<float> all_e(120 * V_), all_s(120 * V_), e, q;
    const auto p = std::span(ids).first(120);
    ASSERT_TRUE(tf_->Prefill(p, exact, scratch_, nullptr, all_e.data()).ok());
    ASSERT_TRUE(tf_->Prefill(p, sparse, scratch_, nullptr, all_s.data()).ok());
    EXPECT_TRUE(Same(all_e, all_s));
    for (size_t i = 120; i < ids.size(); ++i) {
      Decode(exact, ids[i], e);
      Decode(sparse, ids[i], q);
      ASSERT_TRUE(Same(e, q)) << "decode at position " << i;
    }
    EXPECT_GT(sparse.QsaMemoryBytes(), 0u);
  }
}

// Caches reserved past 1 MiB of rows, which KvRows pages (head blocks a
// page-aligned stride apart, not the capacity), select and attend exactly as
// small ones: the selected set reads the rows through that stride. It
// refused them with INTERNAL ("KV head 1 is not at head · capacity rows"),
// so every QSA layer call of a real model failed once a session reserved
// ~256 positions (Qwen3-0.6B, f32 K/V).
TEST_F(QsaFixture, PagedCachesSelectAsSmallOnes) {
  const std::vector<int32_t> ids = TestIds(150, config().vocab_size, 7);
  for (kv::KvMode mode : {kv::KvMode::kF32, kv::KvMode::kInt8}) {
    // 2 KV heads × 32 dims: 256 bytes a position (f32), 64 (int8); budget ·
    // ratio = 32 positions, so the selection is sparse from the start.
    const size_t reserve = mode == kv::KvMode::kF32 ? 5000 : 17000;
    SequenceKv paged = NewSeq(Qsa(8, 4), mode), small = NewSeq(Qsa(8, 4), mode);
    paged.Reserve(reserve);
    std::vector<float> a, b;
    const auto p = std::span(ids).first(120);
    Prefill(paged, p, a);
    Prefill(small, p, b);
    ASSERT_TRUE(AllFinite(a));
    ASSERT_TRUE(Same(a, b));
    for (size_t i = 120; i < ids.size(); ++i) {
      Decode(paged, ids[i], a);
      Decode(small, ids[i], b);
      ASSERT_TRUE(Same(a, b)) << "decode at position " << i;
    }
  }
}

TEST_F(QsaFixture, ShortPromptInsideTheInertBoundEqualsExact) {
  // ratio 8, budget 4: bound 32. Positions < 32 are exact; later ones are not.
  const std::vector<int32_t> ids = TestIds(80, config().vocab_size, 9);
  SequenceKv exact = NewSeq(std::nullopt), sparse = NewSeq(Qsa(8, 4));
  std::vector<float> e, q;
  Prefill(exact, std::span(ids).first(20), e);
  Prefill(sparse, std::span(ids).first(20), q);
  EXPECT_TRUE(Same(e, q));
  bool differed = false;
  for (size_t i = 20; i < ids.size(); ++i) {
    Decode(exact, ids[i], e);
    Decode(sparse, ids[i], q);
    if (i < 32) {
      ASSERT_TRUE(Same(e, q)) << "decode at position " << i << " is inside the bound";
    } else {
      differed = differed || !Same(e, q);
    }
  }
  EXPECT_TRUE(differed) << "positions past the bound should select a strict subset";
}

TEST_F(QsaFixture, LongContextRunsDiffersAndCountsItsBytes) {
  const std::vector<int32_t> ids = TestIds(230, config().vocab_size, 11);
  SequenceKv exact = NewSeq(std::nullopt), sparse = NewSeq(Qsa(8, 4));
  std::vector<float> e, q;
  Prefill(exact, std::span(ids).first(200), e);
  Prefill(sparse, std::span(ids).first(200), q);
  EXPECT_TRUE(AllFinite(q));
  double worst = MaxRelErr(q.data(), e.data(), V_);
  size_t last_bytes = sparse.QsaMemoryBytes();
  EXPECT_GT(last_bytes, 0u);
  for (size_t i = 200; i < ids.size(); ++i) {
    Decode(exact, ids[i], e);
    Decode(sparse, ids[i], q);
    ASSERT_TRUE(AllFinite(q));
    worst = std::max(worst, MaxRelErr(q.data(), e.data(), V_));
    // Bytes: exactly the states', never shrinking, capacity >= ingested.
    size_t states = 0;
    for (size_t l = 0; l < L_; ++l) {
      const qsa::QsaSeqState* st = sparse.qsa_state(l);
      ASSERT_NE(st, nullptr);
      EXPECT_EQ(st->ingested(), sparse.position());
      EXPECT_GE(st->capacity(), st->ingested());
      states += st->MemoryBytes();
    }
    EXPECT_EQ(sparse.QsaMemoryBytes(), states);
    EXPECT_GE(sparse.QsaMemoryBytes(), last_bytes);
    last_bytes = sparse.QsaMemoryBytes();
  }
  EXPECT_EQ(sparse.MemoryBytes(), exact.MemoryBytes() + sparse.QsaMemoryBytes());
  EXPECT_GT(worst, 0.0);
  std::printf(
      "qsa ratio 8 budget 4, 200-token prompt + 30 decodes: max rel logit diff %.4g, "
      "qsa bytes %zu\n",
      worst, sparse.QsaMemoryBytes());
}

TEST_F(QsaFixture, ReleaseFreesEveryBackendByteAndIsIdempotent) {
  const std::vector<int32_t> ids = TestIds(120, config().vocab_size, 13);
  std::vector<float> q;
  {
    // Warm the indexers (built on first use), then measure the baseline.
    SequenceKv warm = NewSeq(Qsa(8, 4));
    Prefill(warm, std::span(ids).first(2), q);
  }
  scratch_ = ForwardScratch();
  const qsa::BackendStats base = tf_->QsaBackendStats();
  EXPECT_EQ(base.live_bytes, tf_->QsaWeightBytes());
  {
    ForwardScratch scratch;
    SequenceKv a = NewSeq(Qsa(8, 4)), b = NewSeq(Qsa(8, 4, "deep1"));
    a.Reserve(150);
    ASSERT_TRUE(tf_->Prefill(std::span(ids).first(100), a, scratch, nullptr).ok());
    ASSERT_TRUE(tf_->Prefill(std::span(ids).first(60), b, scratch, nullptr).ok());
    EXPECT_GT(tf_->QsaBackendStats().live_bytes, base.live_bytes);
    const size_t a_bytes = a.QsaMemoryBytes();
    a.Release();
    EXPECT_EQ(a.QsaMemoryBytes(), 0u);
    EXPECT_EQ(a.MemoryBytes(), 0u);
    a.Release();  // idempotent
    EXPECT_EQ(tf_->QsaBackendStats().live_bytes,
              base.live_bytes + b.QsaMemoryBytes() + scratch.attention.QsaMemoryBytes());
    EXPECT_GT(a_bytes, 0u);
    // A released sequence starts over and stays usable.
    std::vector<float> e;
    SequenceKv exact = NewSeq(std::nullopt);
    ASSERT_TRUE(tf_->Prefill(std::span(ids).first(40), a, scratch, q.data()).ok());
    ASSERT_TRUE(tf_->Prefill(std::span(ids).first(40), exact, scratch, e.data()).ok());
    // b is destroyed unreleased: the destructor frees it.
  }
  const qsa::BackendStats after = tf_->QsaBackendStats();
  EXPECT_EQ(after.live_bytes, base.live_bytes);
  EXPECT_EQ(after.live_allocations, base.live_allocations);
}

TEST_F(QsaFixture, CopyAndTruncateContinueIdentically) {
  const std::vector<int32_t> ids = TestIds(140, config().vocab_size, 17);
  SequenceKv a = NewSeq(Qsa(8, 4));
  std::vector<float> x, y;
  Prefill(a, std::span(ids).first(100), x);
  SequenceKv b = a.Copy();
  EXPECT_EQ(b.QsaMemoryBytes(), a.QsaMemoryBytes());
  for (size_t i = 100; i < 120; ++i) {
    Decode(a, ids[i], x);
    Decode(b, ids[i], y);
    ASSERT_TRUE(Same(x, y)) << "copy diverged at " << i;
  }
  // b: three wrong tokens, rolled back, then the right ones.
  for (int32_t t : {1, 2, 3}) Decode(b, t, y);
  ASSERT_TRUE(b.TruncateLast(3).ok());
  EXPECT_EQ(b.qsa_state(0)->ingested(), b.position());
  for (size_t i = 120; i < 140; ++i) {
    Decode(a, ids[i], x);
    Decode(b, ids[i], y);
    ASSERT_TRUE(Same(x, y)) << "truncated sequence diverged at " << i;
  }
}

TEST_F(QsaFixture, MixedDecodeBatchEqualsSequencesAlone) {
  const std::vector<int32_t> ids = TestIds(90, config().vocab_size, 19);
  SequenceKv e1 = NewSeq(std::nullopt), q1 = NewSeq(Qsa(8, 4)), e2 = NewSeq(std::nullopt),
             q2 = NewSeq(Qsa(8, 4));
  std::vector<float> tmp;
  for (SequenceKv* s : {&e1, &q1, &e2, &q2}) Prefill(*s, std::span(ids).first(60), tmp);
  std::vector<float> batch(2 * V_), a, b;
  for (size_t i = 60; i < 90; ++i) {
    SequenceKv* p[2] = {&e1, &q1};
    const int32_t t[2] = {ids[i], ids[i]};
    ASSERT_TRUE(tf_->DecodeBatch(t, p, scratch_, batch.data()).ok());
    Decode(e2, ids[i], a);
    Decode(q2, ids[i], b);
    ASSERT_EQ(0, std::memcmp(batch.data(), a.data(), V_ * sizeof(float))) << i;
    ASSERT_EQ(0, std::memcmp(batch.data() + V_, b.data(), V_ * sizeof(float))) << i;
  }
}

TEST_F(QsaFixture, ChunkedPrefillVersusOneShot) {
  // Below 64 rows every MatMul gives the same bits at any batch, so chunks of
  // 20 and of 30 agree bit for bit; the 120-row one-shot takes the GEMM path
  // (exact attention differs from its own chunked run in the last bits too).
  const std::vector<int32_t> ids = TestIds(120, config().vocab_size, 23);
  auto run = [&](size_t chunk, kv::KvMode mode, std::optional<QsaConfig> qsa) {
    SequenceKv s = NewSeq(qsa, mode);
    std::vector<float> out(V_);
    for (size_t i = 0; i < ids.size(); i += chunk) {
      const size_t n = std::min(chunk, ids.size() - i);
      EXPECT_TRUE(tf_->Prefill(std::span(ids).subspan(i, n), s, scratch_, out.data()).ok());
    }
    return out;
  };
  const auto c20 = run(20, kv::KvMode::kF32, Qsa(8, 4)), c30 = run(30, kv::KvMode::kF32, Qsa(8, 4));
  const auto one = run(120, kv::KvMode::kF32, Qsa(8, 4));
  const auto e20 = run(20, kv::KvMode::kF32, std::nullopt),
             e120 = run(120, kv::KvMode::kF32, std::nullopt);
  EXPECT_TRUE(Same(c20, c30));
  EXPECT_TRUE(AllFinite(one));
  std::printf("chunked (20) vs one-shot (120) prefill: qsa %s (rel %.3g), exact %s (rel %.3g)\n",
              Same(c20, one) ? "bit-equal" : "differs", MaxRelErr(c20.data(), one.data(), V_),
              Same(e20, e120) ? "bit-equal" : "differs", MaxRelErr(e20.data(), e120.data(), V_));
  EXPECT_LT(MaxRelErr(c20.data(), one.data(), V_), 1e-3);
}

TEST_F(QsaFixture, WarmDecodeWithQsaDoesNotAllocate) {
  const std::vector<int32_t> ids = TestIds(60, config().vocab_size, 29);
  SequenceKv e = NewSeq(std::nullopt), q = NewSeq(Qsa(8, 4)),
             q8 = NewSeq(Qsa(8, 4), kv::KvMode::kInt8);
  std::vector<float> tmp;
  for (SequenceKv* s : {&e, &q, &q8}) {
    s->Reserve(128);
    Prefill(*s, std::span(ids).first(50), tmp);  // past the bound of 32
  }
  std::vector<SequenceKv*> ptrs = {&e, &q, &q8};
  std::vector<int32_t> next = {10, 20, 30};
  std::vector<float> logits(3 * V_);
  for (int i = 0; i < 3; ++i)
    ASSERT_TRUE(tf_->DecodeBatch(next, ptrs, scratch_, logits.data()).ok());
  {
    // CpuBackend::SelectTopK's per-thread candidate list grows by exactly one
    // entry per new block count (core/qsa/cpu_backend.cc), so warm it past
    // the block counts measured below with one longer throwaway decode.
    SequenceKv longer = NewSeq(Qsa(8, 4));
    Prefill(longer, TestIds(150, config().vocab_size, 31), tmp);
    Decode(longer, 1, tmp);
  }
  const size_t before = cortiq::testing::AllocCount();
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(tf_->DecodeBatch(next, ptrs, scratch_, logits.data()).ok());
  }
  EXPECT_EQ(cortiq::testing::AllocCount() - before, 0u)
      << "heap allocations during 20 decode steps";
}

}  // namespace
}  // namespace cortiq::model
