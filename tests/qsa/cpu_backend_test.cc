// CpuBackend kernels and LayerKvPool: pooling arithmetic, selection ties,
// thread-count independence, and the identity view of LayerKvCache.
#include "core/qsa/cpu_backend.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <random>
#include <vector>

#include "core/qsa/kv_pool.h"
#include "core/qsa/qsa_indexer.h"
#include "core/util/thread_pool.h"
#include "tests/qsa/qsa_test_util.h"

namespace cortiq::qsa {
namespace {

DevicePtr H(const void* p) { return DevicePtr::FromHost(p); }

TEST(CpuBackendTest, PoolBlocksIsTheMeanRoundedToBf16) {
  CpuBackend backend;
  const size_t hd = 3, ratio = 4;
  std::vector<float> raw_f = {1, 2, 3, 3, 2, 1, 0.5f, 0, -1, 0.5f, 4, 1,   // block 0
                              8, 8, 8, 8, 8, 8, 8,    8, 8,  9,    9, 9};  // block 1
  std::vector<uint16_t> raw(raw_f.size()), pooled(2 * hd, 0xFFFF);
  math::ConvertFromF32(raw_f.data(), math::DType::kBF16, raw_f.size(), raw.data());
  PoolArgs a{H(raw.data()), H(pooled.data()), hd, ratio, /*first=*/1, /*end=*/2};
  QSA_ASSERT_OK(backend.PoolBlocks(a, kDefaultStream));
  EXPECT_EQ(pooled[0], 0xFFFF);  // block 0 not in [1, 2): untouched
  EXPECT_EQ(math::Bf16ToF32(pooled[3]), math::Bf16ToF32(math::F32ToBf16(33.0f / 4)));
  a.first_block = 0;
  QSA_ASSERT_OK(backend.PoolBlocks(a, kDefaultStream));
  EXPECT_EQ(math::Bf16ToF32(pooled[0]), 1.25f);
  EXPECT_EQ(math::Bf16ToF32(pooled[1]), 2.0f);
  EXPECT_EQ(math::Bf16ToF32(pooled[2]), 1.0f);
}

TEST(CpuBackendTest, SelectTopKKeepsSinkAndCurrentAndBreaksTiesLow) {
  CpuBackend backend;
  const size_t ratio = 2, budget = 4, ld = 8;
  // Row 0: position 16 → current block 8; scored blocks 1..7.
  std::vector<float> scores(2 * ld, -1.0f);
  const float s0[8] = {0, 5, 7, 7, 1, 7, 0, 2};  // three 7s: blocks 2, 3 win (lower first)
  std::copy(s0, s0 + 8, scores.begin());
  // Row 1: position 17 → current block 8 as well; same scores reversed.
  for (size_t b = 1; b < 8; ++b) scores[ld + b] = s0[8 - b];
  std::vector<uint32_t> sel(2 * budget, 99), counts(2);
  SelectArgs a{H(scores.data()), 2, ld, /*pos0=*/16, ratio, budget, H(sel.data()),
               H(counts.data())};
  QSA_ASSERT_OK(backend.SelectTopK(a, kDefaultStream));
  EXPECT_EQ(counts[0], budget);
  EXPECT_EQ(std::vector<uint32_t>(sel.begin(), sel.begin() + 4),
            (std::vector<uint32_t>{0, 2, 3, 8}));
  // Row 1 scores: b → s0[8 - b]: 7s at blocks 3, 5, 6 → 3 and 5.
  EXPECT_EQ(std::vector<uint32_t>(sel.begin() + 4, sel.end()), (std::vector<uint32_t>{0, 3, 5, 8}));
  // Early positions select every block.
  a.rows = 1;
  a.pos0 = 5;  // current block 2 < budget
  QSA_ASSERT_OK(backend.SelectTopK(a, kDefaultStream));
  EXPECT_EQ(counts[0], 3u);
  EXPECT_EQ(std::vector<uint32_t>(sel.begin(), sel.begin() + 3), (std::vector<uint32_t>{0, 1, 2}));
}

// The whole prefill path (GEMM-sized chunk included) gives the same bits on
// a 3-thread pool as on the calling thread alone.
TEST(CpuBackendTest, ThreadCountDoesNotChangeTheBits) {
  const size_t hidden = 32, nq = 4, nkv = 2, D = 16, T = 90;
  std::mt19937 rng(1);
  testing::LayerData L(rng, T, hidden, nq, nkv, D, kv::KvMode::kF32);
  const IndexerWeights w = testing::RandomWeights(rng, 2, 16, hidden, true, true);
  QsaGeometry g;
  g.n_heads = 2;
  g.hd = 16;
  g.ratio = 4;
  g.budget = 4;
  g.rot = 16;
  g.hidden = hidden;
  g.nkv_attn = nkv;
  g.hd_attn = D;
  LayerKvPool pool;
  QSA_ASSERT_OK(pool.Bind(L.cache, 16));
  util::ThreadPool threads(3, std::chrono::microseconds(0));
  std::vector<std::vector<float>> outs;
  std::vector<std::vector<uint8_t>> blobs;
  for (util::ThreadPool* tp : {static_cast<util::ThreadPool*>(nullptr), &threads}) {
    CpuBackend backend(tp);
    auto ix = QsaIndexer::New(&backend, w, g);
    ASSERT_TRUE(ix.ok());
    QsaScratch scratch(&backend);
    auto st = (*ix)->NewSeqState();
    ASSERT_TRUE(st.ok());
    std::vector<float> ctx = L.DenseAll();
    QSA_ASSERT_OK((*ix)->PrefillIngest(*st, H(L.x.data()), 70, 0, scratch));
    QSA_ASSERT_OK((*ix)->PrefillSelect(*st, H(L.x.data()), H(L.q.data()), H(ctx.data()),
                                       pool.pool(), pool.table(), 0, 70, nq, L.scale(), scratch));
    QSA_ASSERT_OK((*ix)->PrefillIngest(*st, H(L.x_row(70)), 20, 70, scratch));
    QSA_ASSERT_OK((*ix)->PrefillSelect(*st, H(L.x_row(70)), H(L.q_row(70)),
                                       H(ctx.data() + 70 * nq * D), pool.pool(), pool.table(), 70,
                                       20, nq, L.scale(), scratch));
    outs.push_back(ctx);
    blobs.push_back(*(*ix)->SnapshotAux(*st));
    QSA_ASSERT_OK((*ix)->ReleaseSeqState(*st));
  }
  EXPECT_TRUE(testing::SameBits(outs[0].data(), outs[1].data(), outs[0].size()));
  EXPECT_EQ(blobs[0], blobs[1]);
}

TEST(LayerKvPoolTest, IdentityViewOfTheCache) {
  std::mt19937 rng(2);
  for (kv::KvMode mode : {kv::KvMode::kF32, kv::KvMode::kInt8}) {
    kv::LayerKvCache cache(3, 8, mode);
    LayerKvPool pool;
    EXPECT_EQ(pool.Bind(cache, 4).code(), absl::StatusCode::kFailedPrecondition);  // no storage
    cache.Reserve(10);
    for (int t = 0; t < 7; ++t) {
      cache.Append(testing::RandomVec(rng, 24), testing::RandomVec(rng, 24));
    }
    QSA_ASSERT_OK(pool.Bind(cache, 4));
    const KvPool& p = pool.pool();
    EXPECT_EQ(p.block_size, 4u);
    EXPECT_EQ(p.strides.block, 32u);
    EXPECT_EQ(p.strides.row, 8u);
    EXPECT_EQ(p.strides.head, 80u);  // capacity 10 × head_dim 8
    EXPECT_EQ(pool.table().num_blocks, 3u);
    const auto* ids = pool.table().ids.AsHost<const uint32_t>();
    EXPECT_EQ(ids[2], 2u);
    // Position 6 of head 2 through the formula is the cache's own row.
    const size_t off = ids[6 / 4] * p.strides.block + (6 % 4) * p.strides.row + 2 * p.strides.head;
    if (mode == kv::KvMode::kF32) {
      EXPECT_EQ(p.dtype, KvDType::kF32);
      EXPECT_EQ(p.k.AsHost<const float>() + off, cache.HeadKeys(2).data() + 6 * 8);
      EXPECT_EQ(p.v.AsHost<const float>() + off, cache.HeadValues(2).data() + 6 * 8);
    } else {
      EXPECT_EQ(p.dtype, KvDType::kInt8);
      EXPECT_EQ(p.k.AsHost<const int8_t>() + off, cache.HeadKeysI8(2).data() + 6 * 8);
      const size_t soff =
          1 * p.scale_strides.block + 2 * p.scale_strides.row + 2 * p.scale_strides.head;
      EXPECT_EQ(p.v_scale.AsHost<const float>() + soff, cache.HeadValueScales(2).data() + 6);
    }
  }
}

// Row buffers of 1 MiB and up are paged (kv_rows.h): each head's block
// starts on a page, a stride of rows apart that is not the capacity. Bind
// describes that stride, so every position of every head is the cache's own
// row (it refused such a cache with INTERNAL, so a QSA layer of a real model
// failed every call once a session reserved ~256 positions).
TEST(LayerKvPoolTest, PagedCacheHeadsAreTheirStrideApart) {
  std::mt19937 rng(5);
  for (kv::KvMode mode : {kv::KvMode::kF32, kv::KvMode::kInt8}) {
    constexpr size_t kHeads = 8, kD = 128;
    const size_t rows = mode == kv::KvMode::kF32 ? 300 : 1100;  // > 1 MiB of K rows
    kv::LayerKvCache cache(kHeads, kD, mode);
    cache.Reserve(rows);
    for (size_t t = 0; t < 40; ++t) {
      cache.Append(testing::RandomVec(rng, kHeads * kD), testing::RandomVec(rng, kHeads * kD));
    }
    const size_t cap = cache.capacity();
    LayerKvPool pool;
    QSA_ASSERT_OK(pool.Bind(cache, 16));
    const KvPool& p = pool.pool();
    const auto* ids = pool.table().ids.AsHost<const uint32_t>();
    for (size_t h = 0; h < kHeads; ++h) {
      for (size_t t : {size_t{0}, size_t{17}, size_t{39}}) {
        const size_t off =
            ids[t / 16] * p.strides.block + (t % 16) * p.strides.row + h * p.strides.head;
        const size_t soff = ids[t / 16] * p.scale_strides.block + (t % 16) * p.scale_strides.row +
                            h * p.scale_strides.head;
        if (mode == kv::KvMode::kF32) {
          ASSERT_EQ(p.k.AsHost<const float>() + off, cache.HeadKeys(h).data() + t * kD);
          ASSERT_EQ(p.v.AsHost<const float>() + off, cache.HeadValues(h).data() + t * kD);
        } else {
          ASSERT_EQ(p.k.AsHost<const int8_t>() + off, cache.HeadKeysI8(h).data() + t * kD);
          ASSERT_EQ(p.v.AsHost<const int8_t>() + off, cache.HeadValuesI8(h).data() + t * kD);
          ASSERT_EQ(p.k_scale.AsHost<const float>() + soff, cache.HeadKeyScales(h).data() + t);
          ASSERT_EQ(p.v_scale.AsHost<const float>() + soff, cache.HeadValueScales(h).data() + t);
        }
      }
    }
    // The layout this test is about: the heads are further apart than the capacity.
    EXPECT_GT(p.strides.head, cap * kD) << "the cache is not paged at " << rows << " rows";
  }
}

TEST(LayerKvPoolTest, DeadHeadsAreRefused) {
  kv::LayerKvCache cache(2, 4);
  cache.Reserve(4);
  const bool alive[2] = {true, false};
  cache.Append(std::vector<float>(8, 1.0f), std::vector<float>(8, 1.0f), alive);
  LayerKvPool pool;
  EXPECT_EQ(pool.Bind(cache, 2).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(pool.Bind(cache, 0).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cortiq::qsa
