// The O(1) Nyström override of LayerKvCache (seeds 001/002): every seal
// precondition refused with the layer left exact and its K/V kept; the exact
// rows freed by a seal (MemoryBytes falls to exactly O1MemoryBytes, checked
// against the live heap); O1Step bit-for-bit the per-group NystromStates run
// directly; the exact-only mode equal to exact attention; copies, install
// from parts, views; the exact path closed on a sealed layer; no allocation
// in a skeleton-mode O1Step.
//
// This binary replaces the global operator new/delete to count allocations
// and live heap bytes (the Nyström states live in std::vectors; the exact
// rows use aligned_alloc, which is not counted — the live-byte probe below
// therefore sees exactly the override's bytes).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <random>
#include <vector>

#include "core/kv/layer_kv_cache.h"
#include "core/kv/nystrom.h"
#include "gtest/gtest.h"
#include "tests/common/alloc_counter.h"
#include "tests/kv/kv_test_util.h"

namespace cortiq::kv {
namespace {

using Vec = std::vector<float>;

// Layer geometry of the tests: GQA 4:1, as in Qwen3-style models.
constexpr size_t kKv = 2, kD = 32, kHeads = 8, kHpk = kHeads / kKv;
constexpr size_t kM = 16, kW = 32, kSink = 4;

using kvtest::Absorb;
using kvtest::BitEqual;
using kvtest::Stream;

// A synthetic layer input (kv_test_util.h) of this geometry.
constexpr kvtest::O1Geom kGeom{kKv, kD, kHeads, kM, kW, kSink};
Stream MakeStream(size_t n, size_t prompt, uint64_t seed, size_t clusters = 12) {
  return kvtest::MakeStream(kGeom, n, prompt, seed, clusters);
}

// An armed layer that absorbed the first `prompt` positions.
LayerKvCache Collected(const Stream& s, size_t prompt, KvMode mode = KvMode::kF32) {
  LayerKvCache c(kKv, kD, mode);
  c.Reserve(prompt);
  EXPECT_TRUE(c.O1Begin(kM, kW, kSink, O1Rect::kAggregate).ok());
  Absorb(c, s, 0, prompt);
  return c;
}

// Exact attention of position j's queries over c's stored rows.
Vec ExactOut(const LayerKvCache& c, const Vec& q_all) { return kvtest::AttendAll(c, q_all, kHpk); }

double RelErr(const Vec& got, const Vec& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num = std::max(num, std::abs(double(got[i]) - double(want[i])));
    den = std::max(den, std::abs(double(want[i])));
  }
  return num / std::max(den, 1e-300);
}

// A refused seal: FailedPrecondition naming `what`, nothing collecting or
// sealed, the exact rows untouched (same bytes as a cache that never armed,
// same keys, same attention output).
void ExpectRefusedAndExact(LayerKvCache& c, const LayerKvCache& plain, size_t num_heads,
                           const char* what, const Vec& probe_q) {
  const absl::Status st = c.O1Seal(num_heads);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << what << ": " << st;
  EXPECT_NE(st.message().find(what), absl::string_view::npos) << st;
  EXPECT_FALSE(c.O1Sealed());
  EXPECT_FALSE(c.O1Collecting());
  EXPECT_EQ(c.O1MemoryBytes(), 0u);
  EXPECT_EQ(c.MemoryBytes(), plain.MemoryBytes()) << what;
  EXPECT_EQ(c.seq_len(), plain.seq_len());
  for (size_t g = 0; g < kKv; ++g) {
    EXPECT_EQ(c.HeadLen(g), plain.HeadLen(g));
    if (c.mode() == KvMode::kF32) {
      ASSERT_EQ(c.HeadKeys(g).size(), plain.HeadKeys(g).size());
      EXPECT_EQ(0, std::memcmp(c.HeadKeys(g).data(), plain.HeadKeys(g).data(),
                               c.HeadKeys(g).size_bytes()));
    }
  }
  EXPECT_TRUE(BitEqual(ExactOut(c, probe_q), ExactOut(plain, probe_q))) << what;
}

// ---- seal preconditions -----------------------------------------------------------

TEST(LayerKvCacheO1Test, SealRefusesInt8Rows) {
  const size_t t = 120;
  Stream s = MakeStream(t + 1, t, 1);
  LayerKvCache c = Collected(s, t, KvMode::kInt8);
  LayerKvCache plain(kKv, kD, KvMode::kInt8);
  plain.Reserve(t);
  Absorb(plain, s, 0, t);
  ExpectRefusedAndExact(c, plain, kHeads, "int8", s.q[t]);
}

TEST(LayerKvCacheO1Test, SealRefusesADeadHead) {
  const size_t t = 120;
  Stream s = MakeStream(t + 1, t, 2);
  LayerKvCache c(kKv, kD), plain(kKv, kD);
  c.Reserve(t);
  plain.Reserve(t);
  ASSERT_TRUE(c.O1Begin(kM, kW, kSink, O1Rect::kAggregate).ok());
  const bool alive[kKv] = {true, false};
  for (size_t j = 0; j < t; ++j) {
    const std::span<const bool> a =
        j == 50 ? std::span<const bool>(alive, kKv) : std::span<const bool>();
    c.Append(s.k[j], s.v[j], a);
    c.O1PushQ(s.q[j]);
    plain.Append(s.k[j], s.v[j], a);
  }
  ExpectRefusedAndExact(c, plain, kHeads, "dead head", s.q[t]);
}

TEST(LayerKvCacheO1Test, SealRefusesAMissingOrShortTrace) {
  const size_t t = 120;
  Stream s = MakeStream(t + 1, t, 3);
  LayerKvCache plain(kKv, kD);
  plain.Reserve(t);
  Absorb(plain, s, 0, t);
  {  // never armed
    LayerKvCache c(kKv, kD);
    c.Reserve(t);
    Absorb(c, s, 0, t);  // pushes are no-ops
    EXPECT_EQ(c.O1TraceRows(), 0u);
    ExpectRefusedAndExact(c, plain, kHeads, "no query trace", s.q[t]);
  }
  {  // armed, but the last position's queries were never pushed
    LayerKvCache c(kKv, kD);
    c.Reserve(t);
    ASSERT_TRUE(c.O1Begin(kM, kW, kSink, O1Rect::kAggregate).ok());
    Absorb(c, s, 0, t - 1);
    c.Append(s.k[t - 1], s.v[t - 1]);
    EXPECT_EQ(c.O1TraceRows(), t - 1);
    ExpectRefusedAndExact(c, plain, kHeads, "query trace holds", s.q[t]);
  }
  {  // armed on an empty prompt
    LayerKvCache c(kKv, kD);
    ASSERT_TRUE(c.O1Begin(kM, kW, kSink, O1Rect::kAggregate).ok());
    EXPECT_EQ(c.O1Seal(kHeads).code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_FALSE(c.O1Collecting());
  }
}

TEST(LayerKvCacheO1Test, SealRefusesAFanOutThatDoesNotDivide) {
  const size_t t = 120;
  Stream s = MakeStream(t + 1, t, 4);
  LayerKvCache plain(kKv, kD);
  plain.Reserve(t);
  Absorb(plain, s, 0, t);
  {
    LayerKvCache c = Collected(s, t);
    ExpectRefusedAndExact(c, plain, /*num_heads=*/7, "does not divide", s.q[t]);
  }
  {
    LayerKvCache c = Collected(s, t);
    ExpectRefusedAndExact(c, plain, /*num_heads=*/0, "does not divide", s.q[t]);
  }
  {  // divides, but is not the head count the trace was recorded with
    LayerKvCache c = Collected(s, t);
    ExpectRefusedAndExact(c, plain, /*num_heads=*/4, "heads per position", s.q[t]);
  }
}

TEST(LayerKvCacheO1Test, BeginNeedsAnEmptyCacheAndValidSettings) {
  LayerKvCache c(kKv, kD);
  EXPECT_EQ(c.O1Begin(3, kW, kSink, O1Rect::kAggregate).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.O1Begin(kM, 0, kSink, O1Rect::kAggregate).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(c.O1Collecting());
  Vec row(kKv * kD, 1.0f);
  c.Append(row, row);
  EXPECT_EQ(c.O1Begin(kM, kW, kSink, O1Rect::kAggregate).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(c.O1Collecting());
  EXPECT_EQ(c.O1MemoryBytes(), 0u);
  // Armed but empty: nothing held yet.
  LayerKvCache e(kKv, kD);
  ASSERT_TRUE(e.O1Begin(kM, kW, kSink, O1Rect::kFm).ok());
  EXPECT_TRUE(e.O1Collecting());
  EXPECT_EQ(e.MemoryBytes(), 0u);
}

// ---- memory -------------------------------------------------------------------------

// The rows a call reserves hold its max_tokens as well as its prompt; the
// query trace is the prompt's alone (it used to reserve the rows' whole
// capacity: a 100-position prompt with 4,000 tokens to come held a trace of
// 4,100 positions per O(1) layer, where the plan had counted 128).
TEST(LayerKvCacheO1Test, TheQueryTraceIsThePromptsNotTheReservation) {
  Stream s = MakeStream(140, 100, 9);
  LayerKvCache c(kKv, kD);
  c.Reserve(100 + 4000);
  ASSERT_TRUE(c.O1Begin(kM, kW, kSink, O1Rect::kAggregate).ok());
  Absorb(c, s, 0, 100);
  EXPECT_EQ(c.O1MemoryBytes(), 128 * kHeads * kD * sizeof(float));
}

TEST(LayerKvCacheO1Test, SealFreesTheExactRowsAndMemoryIsExactlyTheStates) {
  const size_t t = 300;
  Stream s = MakeStream(t + 40, t, 5);
  Vec out(kHeads * kD);  // before the probe: the heap delta is the layer alone
  const long long live0 = cortiq::testing::LiveBytes();
  LayerKvCache c(kKv, kD);
  c.Reserve(t);
  ASSERT_TRUE(c.O1Begin(kM, kW, kSink, O1Rect::kAggregate).ok());
  Absorb(c, s, 0, t);
  const size_t exact = LayerKvCache::ProjectedBytes(kKv, kD, KvMode::kF32, t);
  // Collecting: the trace doubles as it grows, to a power of two of rows,
  // as the request plan projects (NextPow2 of the prompt's positions).
  EXPECT_EQ(c.O1MemoryBytes(), 512 * kHeads * kD * sizeof(float));
  EXPECT_EQ(c.MemoryBytes(), exact + c.O1MemoryBytes());
  EXPECT_EQ(cortiq::testing::LiveBytes() - live0, static_cast<long long>(c.O1MemoryBytes()));
  const size_t before = c.MemoryBytes();

  ASSERT_TRUE(c.O1Seal(kHeads).ok());
  ASSERT_TRUE(c.O1Sealed());
  EXPECT_FALSE(c.O1Collecting());
  EXPECT_EQ(c.seq_len(), t);
  EXPECT_EQ(c.capacity(), 0u);
  for (size_t g = 0; g < kKv; ++g) EXPECT_EQ(c.HeadLen(g), 0u);
  // No bookkeeping survives the seal: the layer's bytes ARE the states.
  EXPECT_EQ(c.MemoryBytes(), c.O1MemoryBytes());
  size_t states = kKv * sizeof(NystromState);
  for (const NystromState& st : c.O1States()) states += st.MemoryBytes();
  EXPECT_EQ(c.O1MemoryBytes(), states);
  // ... and they are what the heap holds (trace and seal temporaries freed).
  EXPECT_EQ(cortiq::testing::LiveBytes() - live0, static_cast<long long>(c.O1MemoryBytes()));
  EXPECT_LT(c.MemoryBytes(), before);
  std::printf("[ measured ] t=%zu: exact K/V %zu B + trace %zu B -> sealed states %zu B\n", t,
              exact, before - exact, c.MemoryBytes());

  // Constant in context: decoding does not grow the skeleton states.
  const size_t sealed_bytes = c.MemoryBytes();
  for (size_t j = t; j < t + 40; ++j) c.O1Step(s.q[j], s.k[j], s.v[j], kHeads, out);
  EXPECT_EQ(c.MemoryBytes(), sealed_bytes);
  EXPECT_EQ(c.seq_len(), t + 40);

  c.Release();
  EXPECT_EQ(c.MemoryBytes(), 0u);
  EXPECT_FALSE(c.O1Sealed());
  EXPECT_EQ(cortiq::testing::LiveBytes(), live0);
}

// ---- decode -------------------------------------------------------------------------

TEST(LayerKvCacheO1Test, StepEqualsTheNystromStatesRunDirectly) {
  for (O1Rect rect : {O1Rect::kAggregate, O1Rect::kFm}) {
    const size_t t = 300, steps = 60;
    Stream s = MakeStream(t + steps, t, 6);
    LayerKvCache c(kKv, kD);
    ASSERT_TRUE(c.O1Begin(kM, kW, kSink, rect).ok());
    Absorb(c, s, 0, t);
    // The reference: one NystromState per group from the same rows.
    std::vector<NystromState> ref;
    for (size_t g = 0; g < kKv; ++g) {
      std::vector<Vec> qs(kHpk, Vec(t * kD));
      Vec ks(t * kD), vs(t * kD);
      for (size_t j = 0; j < t; ++j) {
        for (size_t h = 0; h < kHpk; ++h) {
          std::copy_n(&s.q[j][(g * kHpk + h) * kD], kD, &qs[h][j * kD]);
        }
        std::copy_n(&s.k[j][g * kD], kD, &ks[j * kD]);
        std::copy_n(&s.v[j][g * kD], kD, &vs[j * kD]);
      }
      std::vector<std::span<const float>> spans(qs.begin(), qs.end());
      ref.push_back(NystromState::NewGroup(kM, kW, kSink, kHpk).WithRect(rect));
      ASSERT_TRUE(ref.back().PrefillGroup(spans, ks, vs, t, kD, kD).ok());
    }
    ASSERT_TRUE(c.O1Seal(kHeads).ok());
    ASSERT_EQ(c.O1States().size(), kKv);
    for (size_t g = 0; g < kKv; ++g) {
      EXPECT_FALSE(c.O1States()[g].ExactOnly());
      EXPECT_EQ(c.O1States()[g].NumQHeads(), kHpk);
      EXPECT_EQ(c.O1States()[g].MemoryBytes(), ref[g].MemoryBytes());
    }
    Vec out(kHeads * kD), want(kHeads * kD);
    size_t same = 0;
    for (size_t j = t; j < t + steps; ++j) {
      c.O1Step(s.q[j], s.k[j], s.v[j], kHeads, out);
      for (size_t g = 0; g < kKv; ++g) {
        ASSERT_TRUE(ref[g]
                        .StepGroup(std::span<const float>(s.q[j]).subspan(g * kHpk * kD, kHpk * kD),
                                   std::span<const float>(s.k[j]).subspan(g * kD, kD),
                                   std::span<const float>(s.v[j]).subspan(g * kD, kD),
                                   std::span<float>(want).subspan(g * kHpk * kD, kHpk * kD))
                        .ok());
      }
      same += BitEqual(out, want);
      for (float x : out) ASSERT_TRUE(std::isfinite(x));
    }
    EXPECT_EQ(same, steps) << O1RectName(rect);
    for (size_t g = 0; g < kKv; ++g) EXPECT_EQ(c.O1States()[g].FarLen(0), ref[g].FarLen(0));
  }
}

TEST(LayerKvCacheO1Test, ExactOnlyModeDecodesLikeExactAttention) {
  const size_t t = kW + kSink + kExactSlack, steps = 50;  // the bound itself
  Stream s = MakeStream(t + steps, t, 7);
  LayerKvCache c = Collected(s, t);
  LayerKvCache exact(kKv, kD);
  Absorb(exact, s, 0, t);
  ASSERT_TRUE(c.O1Seal(kHeads).ok());
  for (const NystromState& st : c.O1States()) ASSERT_TRUE(st.ExactOnly());
  EXPECT_FALSE(c.O1Views().has_value());  // exact-only groups are not portable
  Vec out(kHeads * kD);
  double worst = 0;
  for (size_t j = t; j < t + steps; ++j) {
    c.O1Step(s.q[j], s.k[j], s.v[j], kHeads, out);
    exact.Append(s.k[j], s.v[j]);
    worst = std::max(worst, RelErr(out, ExactOut(exact, s.q[j])));
  }
  std::printf("[ measured ] exact-only O1Step vs exact AttendGroup: max rel %.3g over %zu steps\n",
              worst, steps);
  EXPECT_LT(worst, 1e-6);
}

TEST(LayerKvCacheO1Test, CopyOfASealedLayerDecodesIdentically) {
  const size_t t = 260, steps = 40;
  Stream s = MakeStream(t + steps, t, 8);
  LayerKvCache c = Collected(s, t);
  {  // a copy while collecting carries the trace
    LayerKvCache cc = c.Copy();
    EXPECT_TRUE(cc.O1Collecting());
    EXPECT_EQ(cc.O1TraceRows(), t);
    EXPECT_EQ(cc.MemoryBytes(), c.MemoryBytes());
  }
  ASSERT_TRUE(c.O1Seal(kHeads).ok());
  Vec out(kHeads * kD), out_copy(kHeads * kD);
  c.O1Step(s.q[t], s.k[t], s.v[t], kHeads, out);  // diverge from the prompt first
  LayerKvCache copy = c.Copy();
  EXPECT_TRUE(copy.O1Sealed());
  EXPECT_EQ(copy.seq_len(), c.seq_len());
  EXPECT_EQ(copy.MemoryBytes(), c.MemoryBytes());
  for (size_t j = t + 1; j < t + steps; ++j) {
    c.O1Step(s.q[j], s.k[j], s.v[j], kHeads, out);
    copy.O1Step(s.q[j], s.k[j], s.v[j], kHeads, out_copy);
    ASSERT_TRUE(BitEqual(out, out_copy)) << j;
  }
  // Independent: releasing the original leaves the copy decoding.
  c.Release();
  copy.O1Step(s.q[0], s.k[0], s.v[0], kHeads, out_copy);
  EXPECT_EQ(copy.seq_len(), t + steps + 1);

  // Moves carry the override and leave an empty cache behind.
  LayerKvCache moved = std::move(copy);
  EXPECT_TRUE(moved.O1Sealed());
  EXPECT_FALSE(copy.O1Sealed());  // NOLINT(bugprone-use-after-move): documented state
  EXPECT_EQ(copy.MemoryBytes(), 0u);
}

TEST(LayerKvCacheO1Test, InstallFromPartsDecodesLikeTheSource) {
  const size_t t = 280, steps = 30;
  Stream s = MakeStream(t + steps, t, 9);
  LayerKvCache src = Collected(s, t);
  ASSERT_TRUE(src.O1Seal(kHeads).ok());
  Vec out(kHeads * kD), got(kHeads * kD);
  src.O1Step(s.q[t], s.k[t], s.v[t], kHeads, out);

  // What a wire import does: rebuild each group from its parts.
  auto rebuild = [&]() {
    std::vector<NystromState> states;
    for (const NystromState& st : src.O1States()) {
      auto r = NystromState::FromParts(st.group(), {st.heads().begin(), st.heads().end()});
      EXPECT_TRUE(r.ok()) << r.status();
      states.push_back(std::move(*r));
    }
    return states;
  };
  LayerKvCache dst(kKv, kD);
  dst.Reserve(64);  // exact capacity is freed by the install
  ASSERT_TRUE(dst.O1Install(rebuild(), src.seq_len()).ok());
  EXPECT_TRUE(dst.O1Sealed());
  EXPECT_EQ(dst.capacity(), 0u);
  EXPECT_EQ(dst.seq_len(), t + 1);
  EXPECT_EQ(dst.MemoryBytes(), dst.O1MemoryBytes());
  for (size_t j = t + 1; j < t + steps; ++j) {
    src.O1Step(s.q[j], s.k[j], s.v[j], kHeads, out);
    dst.O1Step(s.q[j], s.k[j], s.v[j], kHeads, got);
    ASSERT_TRUE(BitEqual(out, got)) << j;
  }

  // Refusals change nothing.
  EXPECT_EQ(dst.O1Install(rebuild(), src.seq_len()).code(),
            absl::StatusCode::kFailedPrecondition);  // already overridden
  LayerKvCache fresh(kKv, kD);
  auto one = rebuild();
  one.pop_back();
  EXPECT_EQ(fresh.O1Install(std::move(one), src.seq_len()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fresh.O1Install(rebuild(), src.seq_len() + 1).code(),
            absl::StatusCode::kInvalidArgument);
  LayerKvCache other_dim(kKv, kD * 2);
  EXPECT_EQ(other_dim.O1Install(rebuild(), src.seq_len()).code(),
            absl::StatusCode::kInvalidArgument);
  LayerKvCache int8(kKv, kD, KvMode::kInt8);
  EXPECT_EQ(int8.O1Install(rebuild(), src.seq_len()).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(fresh.O1Sealed());
  EXPECT_EQ(fresh.MemoryBytes(), 0u);
}

TEST(LayerKvCacheO1Test, ViewsPointAtTheSealedGroups) {
  const size_t t = 200;
  Stream s = MakeStream(t, t, 10);
  LayerKvCache c = Collected(s, t);
  EXPECT_FALSE(c.O1Views().has_value());  // collecting
  ASSERT_TRUE(c.O1Seal(kHeads).ok());
  auto views = c.O1Views();
  ASSERT_TRUE(views.has_value());
  ASSERT_EQ(views->size(), kKv);
  for (size_t g = 0; g < kKv; ++g) {
    const O1DeviceView& v = (*views)[g];
    EXPECT_FALSE(v.exact_only);
    EXPECT_EQ(v.d, kD);
    EXPECT_EQ(v.w, kW);
    EXPECT_EQ(v.sink_len, kSink);
    EXPECT_EQ(v.heads.size(), kHpk);
    EXPECT_EQ(v.win_k.data(), c.O1States()[g].group().win_k.data());
    EXPECT_EQ(v.win_len + v.sink_len + v.far_len, t);
  }
}

// ---- the exact path on a sealed layer ---------------------------------------------

TEST(LayerKvCacheO1Test, SealedLayerRefusesTruncateAndIgnoresReserve) {
  const size_t t = 150;
  Stream s = MakeStream(t + 1, t, 11);
  LayerKvCache c = Collected(s, t);
  ASSERT_TRUE(c.O1Seal(kHeads).ok());
  const size_t bytes = c.MemoryBytes();
  EXPECT_EQ(c.TruncateLast(1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(c.seq_len(), t);
  c.Reserve(4096);
  c.ShrinkToFit();
  EXPECT_EQ(c.capacity(), 0u);
  EXPECT_EQ(c.MemoryBytes(), bytes);
  EXPECT_EQ(c.O1Seal(kHeads).code(), absl::StatusCode::kFailedPrecondition);  // twice
  EXPECT_TRUE(c.O1Sealed());
  // Clear starts a new conversation on the exact path.
  c.Clear();
  EXPECT_FALSE(c.O1Sealed());
  EXPECT_EQ(c.seq_len(), 0u);
  EXPECT_EQ(c.MemoryBytes(), 0u);
  c.Append(s.k[0], s.v[0]);
  EXPECT_EQ(c.HeadLen(0), 1u);
}

TEST(LayerKvCacheO1Test, TruncateWhileCollectingDropsTraceRows) {
  const size_t t = 150;
  Stream s = MakeStream(t, t, 12);
  LayerKvCache c = Collected(s, t);
  ASSERT_TRUE(c.TruncateLast(10).ok());
  EXPECT_EQ(c.O1TraceRows(), t - 10);
  Absorb(c, s, t - 10, t);  // re-appending gives the full trace back
  EXPECT_EQ(c.O1TraceRows(), t);
  ASSERT_TRUE(c.O1Seal(kHeads).ok());
}

TEST(LayerKvCacheO1DeathTest, ExactPathOnASealedLayerAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const size_t t = 150;
  Stream s = MakeStream(t + 1, t, 13);
  LayerKvCache c = Collected(s, t);
  ASSERT_TRUE(c.O1Seal(kHeads).ok());
  Vec out(kHeads * kD), probs(1024), q(kD);
  EXPECT_DEATH(c.Append(s.k[t], s.v[t]), "check failed");
  EXPECT_DEATH(c.AttendGroup(std::span<const float>(s.q[t]).first(kHpk * kD), 0, kHpk,
                             std::span<float>(out).first(kHpk * kD), probs, {}),
               "check failed");
  EXPECT_DEATH(c.Attend(q, 0, std::span<float>(out).first(kD), probs), "check failed");
  EXPECT_DEATH(c.O1Step(s.q[t], s.k[t], s.v[t], /*num_heads=*/4, out), "check failed");
  LayerKvCache exact(kKv, kD);
  EXPECT_DEATH(exact.O1Step(s.q[t], s.k[t], s.v[t], kHeads, out), "check failed");
}

// ---- allocation ---------------------------------------------------------------------

TEST(LayerKvCacheO1Test, StepAllocatesNothingInSkeletonMode) {
  const size_t t = 300, steps = 200;
  Stream s = MakeStream(t + steps, t, 14);
  LayerKvCache c = Collected(s, t);
  ASSERT_TRUE(c.O1Seal(kHeads).ok());
  ASSERT_TRUE(c.O1Views().has_value());  // skeleton mode in every group
  Vec out(kHeads * kD);
  // Positive control: the counter sees std::vector.
  const size_t c0 = cortiq::testing::AllocCount();
  { Vec probe(3); }
  ASSERT_GT(cortiq::testing::AllocCount(), c0);
  const size_t before = cortiq::testing::AllocCount();
  for (size_t j = t; j < t + steps; ++j) c.O1Step(s.q[j], s.k[j], s.v[j], kHeads, out);
  EXPECT_EQ(cortiq::testing::AllocCount() - before, 0u)
      << "heap allocations in " << steps << " O1Steps";
}

}  // namespace
}  // namespace cortiq::kv
