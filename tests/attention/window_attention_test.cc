// WindowAttention (sink + sliding window) against its definition: each
// position t attends over [0, min(sink, t + 1)) ∪ [max(sink, t − window + 1), t],
// exactly — kv::AttentionHead over those rows gathered in position order,
// bit for bit — whatever the block sizes the rows arrive in; constant memory;
// rollback only before eviction; the wire form round-trips.
#include "core/attention/window_attention.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/attention/attention_scratch.h"
#include "core/attention/registry.h"
#include "core/kv/layer_kv_cache.h"
#include "core/util/thread_pool.h"
#include "gtest/gtest.h"

namespace cortiq::attention {
namespace {

constexpr size_t kQ = 4, kKv = 2, kHd = 16;

AttentionGeometry Geo() {
  AttentionGeometry g;
  g.hidden = 32;
  g.num_q_heads = kQ;
  g.num_kv_heads = kKv;
  g.head_dim = kHd;
  g.max_positions = 4096;
  g.scale = 1.0f / std::sqrt(float(kHd));
  return g;
}

struct Rows {
  std::vector<float> q, k, v;
  explicit Rows(size_t n, uint32_t seed) : q(n * kQ * kHd), k(n * kKv * kHd), v(n * kKv * kHd) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (auto* b : {&q, &k, &v}) {
      for (float& x : *b) x = d(rng);
    }
  }
};

// The reference: AttentionHead of each query head over the visible rows.
std::vector<float> Reference(const Rows& r, size_t t, size_t sink, size_t window) {
  std::vector<size_t> visible;
  for (size_t j = 0; j <= t; ++j) {
    if (j < sink || t - j < window) visible.push_back(j);
  }
  std::vector<float> out(kQ * kHd), probs(visible.size());
  const size_t hpk = kQ / kKv;
  for (size_t h = 0; h < kQ; ++h) {
    const size_t g = h / hpk;
    std::vector<float> keys, values;
    for (size_t j : visible) {
      const float* k = r.k.data() + (j * kKv + g) * kHd;
      const float* v = r.v.data() + (j * kKv + g) * kHd;
      keys.insert(keys.end(), k, k + kHd);
      values.insert(values.end(), v, v + kHd);
    }
    kv::AttendOptions opt;
    opt.scale = Geo().scale;
    kv::AttentionHead({r.q.data() + (t * kQ + h) * kHd, kHd}, keys, values, kHd, opt,
                      {out.data() + h * kHd, kHd}, probs);
  }
  return out;
}

class WindowTest : public ::testing::Test {
 protected:
  // Feeds positions [at, at + n) of `r` as one prefill block; returns outputs.
  std::vector<float> Prefill(WindowAttention& w, const Rows& r, size_t at, size_t n) {
    std::vector<float> out(n * kQ * kHd);
    AttentionRows rows;
    rows.start = at;
    rows.count = n;
    rows.q = r.q.data() + at * kQ * kHd;
    rows.k = r.k.data() + at * kKv * kHd;
    rows.v = r.v.data() + at * kKv * kHd;
    rows.out = out.data();
    AttentionContext ctx{geo_, &pool_, scratch_};
    EXPECT_TRUE(w.Prefill(rows, ctx).ok());
    return out;
  }
  std::vector<float> Decode(WindowAttention& w, const Rows& r, size_t at) {
    std::vector<float> out(kQ * kHd);
    AttentionRows row;
    row.start = at;
    row.count = 1;
    row.q = r.q.data() + at * kQ * kHd;
    row.k = r.k.data() + at * kKv * kHd;
    row.v = r.v.data() + at * kKv * kHd;
    row.out = out.data();
    AttentionContext ctx{geo_, &pool_, scratch_};
    auto tasks = w.BeginDecode(row, ctx);
    EXPECT_TRUE(tasks.ok());
    for (size_t t = 0; t < *tasks; ++t) w.DecodeTask(row, t, scratch_.SerialSlot());
    EXPECT_TRUE(w.EndDecode(row, ctx).ok());
    return out;
  }

  AttentionGeometry geo_ = Geo();
  util::ThreadPool pool_{2};
  AttentionScratch scratch_;
};

WindowConfig Config(size_t sink, size_t window) {
  WindowConfig c;
  c.layers = {0};
  c.sink = sink;
  c.window = window;
  return c;
}

TEST_F(WindowTest, EveryPositionIsAttentionHeadOverItsVisibleRowsInAnyBlocking) {
  const size_t n = 90;
  const Rows r(n, 7);
  for (auto [sink, window] : {std::pair<size_t, size_t>{4, 16}, {0, 1}, {3, 200}, {0, 32}}) {
    for (size_t block : {size_t(1), size_t(5), size_t(17), size_t(64)}) {
      SCOPED_TRACE(::testing::Message()
                   << "sink " << sink << " window " << window << " block " << block);
      WindowAttention w(geo_, 0, Config(sink, window));
      size_t at = 0;
      while (at < n) {
        const size_t take = std::min(block, n - at);
        // Blocks of one row go through the decode path, the others prefill.
        const std::vector<float> got = take == 1 ? Decode(w, r, at) : Prefill(w, r, at, take);
        for (size_t i = 0; i < take; ++i) {
          const std::vector<float> want = Reference(r, at + i, sink, window);
          ASSERT_EQ(
              0, std::memcmp(got.data() + i * kQ * kHd, want.data(), want.size() * sizeof(float)))
              << "position " << at + i;
        }
        at += take;
      }
      EXPECT_EQ(w.position(), n);
    }
  }
}

TEST_F(WindowTest, MemoryIsConstantAndReleaseFreesEveryByte) {
  const WindowConfig c = Config(4, 16);
  WindowAttention w(geo_, 0, c);
  EXPECT_EQ(w.MemoryBytes(), 0u);
  const Rows r(200, 3);
  Prefill(w, r, 0, 10);
  const size_t bytes = w.MemoryBytes();
  EXPECT_EQ(bytes, c.LayerBytes(kKv, kHd));
  EXPECT_EQ(w.Memory()[MemoryKind::kKvF32], bytes);
  Prefill(w, r, 10, 150);
  for (size_t p = 160; p < 200; ++p) Decode(w, r, p);
  EXPECT_EQ(w.MemoryBytes(), bytes);  // 200 positions, the same bytes as 10
  w.Release();
  EXPECT_EQ(w.MemoryBytes(), 0u);
  EXPECT_EQ(w.position(), 0u);
  w.Release();  // idempotent
  // Usable again from position 0.
  const std::vector<float> got = Prefill(w, r, 0, 3);
  const std::vector<float> want = Reference(r, 2, 4, 16);
  EXPECT_EQ(0, std::memcmp(got.data() + 2 * kQ * kHd, want.data(), want.size() * sizeof(float)));
}

TEST_F(WindowTest, RollbackOnlyWhileNothingWasDropped) {
  WindowAttention w(geo_, 0, Config(2, 8));
  const Rows r(40, 5);
  Prefill(w, r, 0, 10);  // 10 = sink + window: nothing dropped yet
  ASSERT_TRUE(w.CanTruncate(3).ok());
  w.TruncateLast(3);
  EXPECT_EQ(w.position(), 7u);
  // Re-appending the same positions gives what never truncating gives.
  const std::vector<float> again = Prefill(w, r, 7, 5);
  const std::vector<float> want = Reference(r, 11, 2, 8);
  EXPECT_EQ(0, std::memcmp(again.data() + 4 * kQ * kHd, want.data(), want.size() * sizeof(float)));
  // Position 12 > 10: row 2 was dropped, so no rollback.
  EXPECT_EQ(w.CanTruncate(1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(w.CanTruncate(0).ok());
  EXPECT_EQ(w.CanTruncate(13).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(WindowTest, ExportedRowsInstallIntoAStateThatDecodesIdentically) {
  const WindowConfig c = Config(3, 12);
  const Rows r(80, 9);
  for (size_t at : {size_t(0), size_t(5), size_t(15), size_t(60)}) {
    SCOPED_TRACE(::testing::Message() << "at " << at);
    WindowAttention a(geo_, 0, c);
    if (at > 0) Prefill(a, r, 0, at);
    absl::StatusOr<kv::LayerKvCache> rows = a.ExportRows();
    ASSERT_TRUE(rows.ok()) << rows.status();
    EXPECT_EQ(rows->seq_len(), std::min<size_t>(at, 15));
    WindowAttention b(geo_, 0, c);
    ASSERT_TRUE(b.InstallCache(*std::move(rows), at).ok());
    EXPECT_EQ(b.position(), at);
    EXPECT_EQ(b.MemoryBytes(), a.MemoryBytes());
    for (size_t p = at; p < at + 20; ++p) {
      const std::vector<float> x = Decode(a, r, p), y = Decode(b, r, p);
      ASSERT_EQ(0, std::memcmp(x.data(), y.data(), x.size() * sizeof(float))) << p;
    }
    // A blob that disagrees with the positions changes nothing: b holds
    // 15 rows (sink + window), a sequence at 3 positions holds 3.
    WindowAttention d(geo_, 0, c);
    auto wrong = b.ExportRows();
    ASSERT_TRUE(wrong.ok());
    EXPECT_EQ(d.InstallCache(*std::move(wrong), 3).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(d.position(), 0u);
    EXPECT_EQ(d.MemoryBytes(), 0u);
  }
}

TEST(WindowConfigTest, BadConfigurationsNameTheField) {
  auto bad_window = MakeWindowConfig("all", 4, 0, 2);
  EXPECT_EQ(bad_window.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad_window.status().message().find("window.window"), std::string::npos);
  EXPECT_EQ(MakeWindowConfig("5", 4, 16, 2).status().code(), absl::StatusCode::kInvalidArgument);
  auto ok = MakeWindowConfig("deep1", 4, 16, 3);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->layers, std::vector<size_t>{2});
  // Rows must be f32, and the mode does not compose with another.
  AttentionConfig c;
  c.window = *ok;
  EXPECT_TRUE(c.Validate(3).ok());
  c.rows = kv::KvMode::kInt8;
  EXPECT_EQ(c.Validate(3).code(), absl::StatusCode::kInvalidArgument);
  c.rows = kv::KvMode::kF32;
  c.qsa = QsaConfig{};
  c.qsa->layers = {0};
  EXPECT_EQ(c.Validate(3).code(), absl::StatusCode::kInvalidArgument);
  // The registry hands the window layers a WindowAttention, the rest exact.
  c.qsa.reset();
  EXPECT_EQ(MakeLayerState(c, 2, Geo())->name(), "window");
  EXPECT_EQ(MakeLayerState(c, 0, Geo())->name(), "exact_f32");
}

}  // namespace
}  // namespace cortiq::attention
