// QsaSeqState lifetime and accounting (issue "The seed kernels", req. 6):
//   (c) releasing twice is a no-op, and after 100 sequences are created and
//       released the backend's live allocations are zero;
//   (d) a failure injected into the first free still frees the second;
// plus: MemoryBytes() is exactly what the backend holds for the state.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

#include "core/qsa/cpu_backend.h"
#include "core/qsa/qsa_indexer.h"
#include "tests/qsa/qsa_test_util.h"

namespace cortiq::qsa {
namespace {

constexpr size_t kHidden = 24, kHeads = 2, kHd = 8, kRatio = 4;

QsaGeometry Geometry() {
  QsaGeometry g;
  g.n_heads = kHeads;
  g.hd = kHd;
  g.ratio = kRatio;
  g.budget = 3;
  g.rot = kHd;
  g.hidden = kHidden;
  g.nkv_attn = 1;
  g.hd_attn = 8;
  return g;
}

std::unique_ptr<QsaIndexer> MakeIndexer(Backend* backend) {
  std::mt19937 rng(1);
  auto ix = QsaIndexer::New(backend, testing::RandomWeights(rng, kHeads, kHd, kHidden, true, true),
                            Geometry());
  EXPECT_TRUE(ix.ok()) << ix.status();
  return ix.ok() ? std::move(*ix) : nullptr;
}

DevicePtr H(const void* p) { return DevicePtr::FromHost(p); }

TEST(QsaReleaseTest, ReleaseTwiceIsANoOp) {
  CpuBackend backend;
  auto ix = MakeIndexer(&backend);
  ASSERT_NE(ix, nullptr);
  const size_t base = backend.stats().live_allocations;
  auto st = ix->NewSeqState(64);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(backend.stats().live_allocations, base + 2);
  EXPECT_GT(st->MemoryBytes(), 0u);

  QSA_ASSERT_OK(ix->ReleaseSeqState(*st));
  EXPECT_TRUE(st->raw_keys().null());
  EXPECT_TRUE(st->block_keys().null());
  EXPECT_EQ(st->MemoryBytes(), 0u);
  EXPECT_EQ(st->ingested(), 0u);
  EXPECT_EQ(backend.stats().live_allocations, base);
  const size_t frees = backend.stats().total_allocations;
  QSA_ASSERT_OK(ix->ReleaseSeqState(*st));  // second call: nothing to free
  EXPECT_EQ(backend.stats().live_allocations, base);
  EXPECT_EQ(backend.stats().total_allocations, frees);

  // A default-constructed (never used) state releases as a no-op too.
  QsaSeqState never;
  QSA_EXPECT_OK(ix->ReleaseSeqState(never));
}

TEST(QsaReleaseTest, HundredSequencesLeaveNoLiveAllocations) {
  CpuBackend backend;
  {
    auto ix = MakeIndexer(&backend);
    ASSERT_NE(ix, nullptr);
    QsaScratch scratch(&backend);
    const size_t weights = backend.stats().live_allocations;
    EXPECT_EQ(backend.stats().live_bytes, ix->WeightBytes());
    std::mt19937 rng(2);
    const std::vector<float> x = testing::RandomVec(rng, 50 * kHidden);
    std::vector<QsaSeqState> states;
    size_t held = 0;
    for (size_t i = 0; i < 100; ++i) {
      auto st = ix->NewSeqState(i % 3 == 0 ? 0 : 8 + i % 7);
      ASSERT_TRUE(st.ok());
      EXPECT_EQ(st->MemoryBytes(), ix->StateBytes(st->capacity()));
      // Some grow past their capacity (reallocation), some stay empty.
      if (i % 5 != 0) QSA_ASSERT_OK(ix->PrefillIngest(*st, H(x.data()), 10 + i % 40, 0, scratch));
      held += st->MemoryBytes();
      states.push_back(std::move(*st));
    }
    // The states' bytes are exactly what the backend holds for them.
    EXPECT_EQ(backend.stats().live_bytes, ix->WeightBytes() + scratch.MemoryBytes() + held);
    for (auto& st : states) QSA_ASSERT_OK(ix->ReleaseSeqState(st));
    for (auto& st : states) QSA_ASSERT_OK(ix->ReleaseSeqState(st));
    EXPECT_EQ(backend.stats().live_allocations, weights + 1);  // + the scratch
    QSA_ASSERT_OK(scratch.Release());
    EXPECT_EQ(backend.stats().live_allocations, weights);
  }
  // The indexer frees its weights: nothing is left.
  EXPECT_EQ(backend.stats().live_allocations, 0u);
  EXPECT_EQ(backend.stats().live_bytes, 0u);
}

TEST(QsaReleaseTest, FailureInFirstFreeStillFreesTheSecond) {
  CpuBackend inner;
  testing::FailingBackend backend(&inner);
  auto ix = MakeIndexer(&backend);
  ASSERT_NE(ix, nullptr);
  auto st = ix->NewSeqState(32);
  ASSERT_TRUE(st.ok());
  const size_t before = inner.stats().live_allocations;
  const DevicePtr raw = st->raw_keys(), blocks = st->block_keys();
  ASSERT_FALSE(raw.null());
  ASSERT_FALSE(blocks.null());

  backend.fail_frees = {backend.free_calls + 1};  // the next Free: the raw keys
  const absl::Status s = ix->ReleaseSeqState(*st);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_NE(s.message().find("injected"), std::string::npos);
  // The second buffer was freed; the first is the (simulated) leak.
  EXPECT_EQ(inner.stats().live_allocations, before - 1);
  ASSERT_EQ(backend.leaked.size(), 1u);
  EXPECT_EQ(backend.leaked[0], raw);
  // Every pointer is nulled: a retry cannot double-free.
  EXPECT_TRUE(st->raw_keys().null());
  EXPECT_TRUE(st->block_keys().null());
  EXPECT_EQ(st->MemoryBytes(), 0u);
  const size_t calls = backend.free_calls;
  QSA_EXPECT_OK(ix->ReleaseSeqState(*st));
  EXPECT_EQ(backend.free_calls, calls);

  // A failure on the SECOND buffer: the first is freed, the error returned.
  auto st2 = ix->NewSeqState(32);
  ASSERT_TRUE(st2.ok());
  const size_t before2 = inner.stats().live_allocations;
  const DevicePtr blocks2 = st2->block_keys();
  backend.fail_frees = {backend.free_calls + 2};
  EXPECT_EQ(ix->ReleaseSeqState(*st2).code(), absl::StatusCode::kInternal);
  EXPECT_EQ(inner.stats().live_allocations, before2 - 1);
  EXPECT_EQ(backend.leaked.back(), blocks2);
  EXPECT_TRUE(st2->raw_keys().null() && st2->block_keys().null());
  EXPECT_EQ(st2->MemoryBytes(), 0u);

  // Clean up the simulated leaks on the real backend.
  for (DevicePtr p : backend.leaked) QSA_EXPECT_OK(inner.Free(p));
  backend.fail_frees.clear();
  ix.reset();
  EXPECT_EQ(inner.stats().live_allocations, 0u);
}

TEST(QsaReleaseTest, ReleasedStateIsReusable) {
  CpuBackend backend;
  auto ix = MakeIndexer(&backend);
  ASSERT_NE(ix, nullptr);
  QsaScratch scratch(&backend);
  std::mt19937 rng(3);
  const std::vector<float> x = testing::RandomVec(rng, 9 * kHidden);
  auto st = ix->NewSeqState();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->MemoryBytes(), 0u);  // capacity 0: nothing yet
  QSA_ASSERT_OK(ix->PrefillIngest(*st, H(x.data()), 9, 0, scratch));
  QSA_ASSERT_OK(ix->ReleaseSeqState(*st));
  QSA_ASSERT_OK(ix->PrefillIngest(*st, H(x.data()), 9, 0, scratch));
  EXPECT_EQ(st->ingested(), 9u);
  EXPECT_EQ(st->pooled(), 2u);
  EXPECT_EQ(st->MemoryBytes(), ix->StateBytes(9));
  QSA_ASSERT_OK(ix->ReleaseSeqState(*st));
}

TEST(QsaReleaseTest, CpuBackendRefusesUnknownAndDoubleFrees) {
  CpuBackend backend;
  auto p = backend.Allocate(100);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(backend.stats().live_bytes, 100u);
  QSA_EXPECT_OK(backend.Free(*p));
  EXPECT_EQ(backend.Free(*p).code(), absl::StatusCode::kInvalidArgument);
  QSA_EXPECT_OK(backend.Free(DevicePtr{}));
  EXPECT_EQ(backend.Allocate(0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend.stats().live_allocations, 0u);
  EXPECT_EQ(backend.stats().total_allocations, 1u);
}

}  // namespace
}  // namespace cortiq::qsa
