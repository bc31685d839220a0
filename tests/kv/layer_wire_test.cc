// The per-layer wire format (LayerKvCache::ExportWire / ImportWire, layout in
// core/kv/layer_wire.cc and docs/WIRE_FORMAT.md):
//   * round trips: f32 byte-exact with the same capacity and MemoryBytes()
//     and bit-identical attention afterwards; f16 within its rounding bound
//     at half the bytes; int8 (v2) exact; sealed O(1) (v2) with 50 O1Step
//     calls bit-identical to the original's; empty caches; re-export of an
//     imported blob gives the same bytes;
//   * refusals: v1 refuses int8 and O(1), every version refuses importance,
//     a query trace being collected and dead heads, each with its reason;
//   * hostile input: every single-byte change and every truncation of a
//     blob is DataLoss (FailedPrecondition for the version field) and leaves
//     the target unchanged; geometry mismatches are FailedPrecondition
//     naming both values; forged lengths with a valid checksum are DataLoss
//     before anything is allocated;
//   * piece by piece (layer_wire.h): reading a blob in pieces of any size
//     gives ExportWire's bytes, and writing one in pieces of any size gives
//     what ImportWire gives, bytes and errors alike.
//
// Bit-exactness is checked with memcmp (EXPECT_EQ on floats would pass
// -0.0 == 0.0).
#include "core/kv/layer_wire.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/kv/layer_kv_cache.h"
#include "core/kv/nystrom.h"
#include "core/math/kernels.h"
#include "core/util/crc32c.h"
#include "tests/kv/kv_test_util.h"

namespace cortiq::kv {
namespace {

using Vec = std::vector<float>;

constexpr size_t kHeader = 44;  // bytes before the body
constexpr size_t kMaxPos = 1 << 20;

using kvtest::AttendAll;
using kvtest::BitEqual;
using kvtest::Fill;
using kvtest::MakeStream;
using kvtest::O1Geom;
using kvtest::RandomVec;
using kvtest::SameBytes;
using kvtest::Stream;

WireImportExpect Expect(size_t num_q_heads = 0, size_t max_positions = kMaxPos) {
  return WireImportExpect{num_q_heads, max_positions};
}

std::string MustExport(const LayerKvCache& c, WireOptions o = {}) {
  absl::StatusOr<std::string> b = c.ExportWire(o);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? *b : std::string();
}

uint32_t U32At(const std::string& b, size_t off) {
  uint32_t v;
  std::memcpy(&v, b.data() + off, 4);
  return v;
}
template <typename T>
void PutAt(std::string& b, size_t off, T v) {
  std::memcpy(b.data() + off, &v, sizeof(v));
}
// Recomputes the trailing CRC after a deliberate edit (a forged blob).
void Reseal(std::string& b) {
  PutAt<uint32_t>(b, b.size() - 4, util::Crc32c(b.data(), b.size() - 4));
}

void ExpectSameRows(const LayerKvCache& a, const LayerKvCache& b) {
  ASSERT_EQ(a.num_kv_heads(), b.num_kv_heads());
  ASSERT_EQ(a.mode(), b.mode());
  EXPECT_EQ(a.seq_len(), b.seq_len());
  for (size_t h = 0; h < a.num_kv_heads(); ++h) {
    EXPECT_EQ(a.HeadLen(h), b.HeadLen(h)) << h;
    EXPECT_TRUE(SameBytes(a.HeadKeys(h), b.HeadKeys(h))) << h;
    EXPECT_TRUE(SameBytes(a.HeadValues(h), b.HeadValues(h))) << h;
    EXPECT_TRUE(SameBytes(a.HeadKeysI8(h), b.HeadKeysI8(h))) << h;
    EXPECT_TRUE(SameBytes(a.HeadValuesI8(h), b.HeadValuesI8(h))) << h;
    EXPECT_TRUE(SameBytes(a.HeadKeyScales(h), b.HeadKeyScales(h))) << h;
    EXPECT_TRUE(SameBytes(a.HeadValueScales(h), b.HeadValueScales(h))) << h;
  }
}

// ---- O(1) layers (as in layer_kv_cache_o1_test.cc) ---------------------------

constexpr O1Geom kO1{2, 32, 8, 16, 32, 4};  // Qwen3-like GQA 4:1
constexpr O1Geom kTiny{1, 4, 2, 4, 4, 1};   // small enough to flip every byte

LayerKvCache Sealed(const O1Geom& g, const Stream& s, size_t prompt,
                    O1Rect rect = O1Rect::kAggregate) {
  LayerKvCache c(g.kv, g.d);
  c.Reserve(prompt);
  EXPECT_TRUE(c.O1Begin(g.m, g.w, g.sink, rect).ok());
  kvtest::Absorb(c, s, 0, prompt);
  EXPECT_TRUE(c.O1Seal(g.heads).ok());
  return c;
}

// ---- round trips ------------------------------------------------------------

TEST(LayerWireTest, F32RoundTripIsByteExactWithTheSameCapacityAndMemory) {
  constexpr size_t H = 3, D = 16, S = 37, kHpk = 2;
  std::mt19937 rng(1);
  LayerKvCache src(H, D);
  src.Reserve(50);
  Fill(src, rng, S);
  for (uint32_t version : {1u, 2u}) {
    const std::string blob = MustExport(src, {.version = version});
    EXPECT_EQ(blob.size(), 48 + 2 * H * S * D * sizeof(float)) << "only the stored rows travel";
    if (version == 1) {  // the same bytes as version 2 but for the version and the checksum
      std::string v2 = MustExport(src, {.version = 2});
      ASSERT_EQ(v2.size(), blob.size());
      PutAt<uint32_t>(v2, 4, 1);
      Reseal(v2);
      EXPECT_EQ(v2, blob);
    }
    EXPECT_EQ(U32At(blob, 4), version);
    LayerKvCache dst(H, D);
    Fill(dst, rng, 5);  // whatever the target held is replaced
    ASSERT_TRUE(dst.ImportWire(blob, Expect()).ok());
    ExpectSameRows(src, dst);
    EXPECT_EQ(dst.capacity(), src.capacity());
    EXPECT_EQ(dst.MemoryBytes(), src.MemoryBytes());
    EXPECT_EQ(MustExport(dst, {.version = version}), blob) << "re-export gives the same bytes";

    // Both decode on identically.
    LayerKvCache a = src.Copy();
    const Vec k = RandomVec(rng, H * D), v = RandomVec(rng, H * D);
    a.Append(k, v);
    dst.Append(k, v);
    const Vec q = RandomVec(rng, H * kHpk * D);
    EXPECT_TRUE(BitEqual(AttendAll(a, q, kHpk), AttendAll(dst, q, kHpk)));
    EXPECT_EQ(dst.MemoryBytes(), a.MemoryBytes());
  }
}

TEST(LayerWireTest, F16RoundTripIsWithinTheRoundingBoundAtHalfTheBytes) {
  constexpr size_t H = 2, D = 24, S = 40;
  std::mt19937 rng(2);
  LayerKvCache src(H, D);
  for (size_t t = 0; t < S; ++t) {
    // Magnitudes from f16 subnormals to near its maximum.
    const float stddev = std::pow(10.0f, -6.0f + 10.0f * static_cast<float>(t) / S);
    src.Append(RandomVec(rng, H * D, stddev), RandomVec(rng, H * D, stddev));
  }
  Vec extreme(H * D, 65504.0f);  // f16's largest finite value travels as is
  extreme[1] = -65504.0f;
  extreme[2] = 0.0f;
  extreme[3] = -0.0f;
  src.Append(extreme, extreme);
  const std::string f32 = MustExport(src);
  const std::string f16 = MustExport(src, {.f16 = true});
  EXPECT_EQ(f16.size() - 48, (f32.size() - 48) / 2);
  EXPECT_EQ(U32At(f16, 8) & 1u, 1u) << "flag bit0: f16 payload";
  LayerKvCache dst(H, D);
  ASSERT_TRUE(dst.ImportWire(f16, Expect()).ok());
  EXPECT_EQ(dst.seq_len(), src.seq_len());
  EXPECT_EQ(dst.MemoryBytes(), src.MemoryBytes());
  // The documented bound: |x̂ − x| <= 2^-11·|x| in f16's normal range
  // (|x| >= 2^-14), <= 2^-25 below it; and exactly round-to-nearest-even.
  double worst_rel = 0;
  for (size_t h = 0; h < H; ++h) {
    for (auto [got, want] : {std::pair{dst.HeadKeys(h), src.HeadKeys(h)},
                             std::pair{dst.HeadValues(h), src.HeadValues(h)}}) {
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        const double x = want[i], err = std::abs(double(got[i]) - x);
        if (std::abs(x) >= std::ldexp(1.0, -14)) {
          ASSERT_LE(err, std::ldexp(std::abs(x), -11)) << x;
          worst_rel = std::max(worst_rel, err / std::abs(x));
        } else {
          ASSERT_LE(err, std::ldexp(1.0, -25)) << x;
        }
        const float rne = math::F16ToF32(math::F32ToF16(want[i]));
        ASSERT_EQ(0, std::memcmp(&got[i], &rne, sizeof(float))) << x;
      }
    }
  }
  std::printf("f16 wire: worst relative error %.3g (bound 2^-11 = %.3g)\n", worst_rel,
              std::ldexp(1.0, -11));
  // An f16 blob re-exported as f16 is the same blob (the rounding is idempotent).
  EXPECT_EQ(MustExport(dst, {.f16 = true}), f16);
}

TEST(LayerWireTest, F16RefusesAValueBeyondItsRange) {
  LayerKvCache c(2, 8);
  Vec k(16, 1.0f), v(16, 1.0f);
  v[13] = 65520.0f;  // rounds to f16 infinity
  c.Append(k, v);
  absl::StatusOr<std::string> b = c.ExportWire({.f16 = true});
  ASSERT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition) << b.status();
  EXPECT_NE(b.status().message().find("values of KV head 1"), absl::string_view::npos)
      << b.status();
  EXPECT_NE(b.status().message().find("export f32"), absl::string_view::npos);
  EXPECT_TRUE(c.ExportWire({}).ok()) << "f32 carries it";
  // Infinities and NaN are representable in f16 and the exporter writes them
  // unchanged; no importer installs them (NonFiniteRowsAreRefused): a
  // poisoned row would make every later step of the session garbage.
  LayerKvCache inf(1, 4);
  inf.Append(Vec{INFINITY, -INFINITY, NAN, 1.0f}, Vec(4, 0.0f));
  b = inf.ExportWire({.f16 = true});
  ASSERT_TRUE(b.ok()) << b.status();
  LayerKvCache dst(1, 4);
  EXPECT_EQ(dst.ImportWire(*b, Expect()).code(), absl::StatusCode::kDataLoss);
}

// A blob whose rows hold a NaN or an infinity is refused (DATA_LOSS) and the
// importing cache is unchanged: f32 rows, f16 rows (a NaN survives f16) and
// int8 rows with an infinite scale (an infinite input; a NaN one quantises
// to finite rows, which are then not what this checks).
TEST(LayerWireTest, NonFiniteRowsAreRefused) {
  const float nan = std::nanf(""), inf = std::numeric_limits<float>::infinity();
  for (KvMode mode : {KvMode::kF32, KvMode::kInt8}) {
    for (bool f16 : {false, true}) {
      if (mode == KvMode::kInt8 && f16) continue;  // int8 rows never travel as f16
      for (float bad : {nan, inf}) {
        if (mode == KvMode::kInt8 && bad != inf) continue;
        SCOPED_TRACE(::testing::Message() << KvModeName(mode) << " f16 " << f16 << " " << bad);
        LayerKvCache src(2, 8, mode);
        std::vector<float> k(16, 0.25f), v(16, -0.5f);
        src.Append(k, v);
        k[9] = bad;  // head 1, second row
        src.Append(k, v);
        auto blob = src.ExportWire({.version = 2, .f16 = f16});
        ASSERT_TRUE(blob.ok()) << blob.status();
        LayerKvCache dst(2, 8, mode);
        dst.Append(v, k);
        const size_t before = dst.MemoryBytes();
        const absl::Status st = dst.ImportWire(*blob, {.num_q_heads = 4, .max_positions = 64});
        EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
        EXPECT_NE(st.message().find("head 1 at row 1"), std::string::npos) << st;
        EXPECT_EQ(dst.seq_len(), 1u);
        EXPECT_EQ(dst.MemoryBytes(), before);
      }
    }
  }
}

TEST(LayerWireTest, Int8RoundTripIsExactInVersion2) {
  constexpr size_t H = 2, D = 32, S = 29, kHpk = 3;
  std::mt19937 rng(3);
  LayerKvCache src(H, D, KvMode::kInt8);
  src.Reserve(40);
  Fill(src, rng, S);
  const std::string blob = MustExport(src);
  EXPECT_EQ(blob.size(), 48 + 2 * H * S * (D + sizeof(float)));
  EXPECT_EQ(MustExport(src, {.f16 = true}), blob) << "f16 does not apply to int8 rows";
  LayerKvCache dst(H, D, KvMode::kInt8);
  ASSERT_TRUE(dst.ImportWire(blob, Expect()).ok());
  ExpectSameRows(src, dst);
  EXPECT_EQ(dst.capacity(), src.capacity());
  EXPECT_EQ(dst.MemoryBytes(), src.MemoryBytes());
  EXPECT_EQ(MustExport(dst), blob);
  const Vec q = RandomVec(rng, H * kHpk * D);
  EXPECT_TRUE(BitEqual(AttendAll(src, q, kHpk), AttendAll(dst, q, kHpk)));
}

// A sealed layer and its import step on bit for bit.
void ExpectSealedRoundTrip(const O1Geom& g, size_t prompt, O1Rect rect, bool memory_equal) {
  constexpr size_t kSteps = 50;
  const Stream s = MakeStream(g, prompt + kSteps, prompt, 40 + prompt);
  LayerKvCache src = Sealed(g, s, prompt, rect);
  ASSERT_TRUE(src.O1Sealed());
  const std::string blob = MustExport(src);
  EXPECT_EQ(U32At(blob, 8), 4u) << "flags: sealed O(1) only";
  EXPECT_EQ(MustExport(src, {.f16 = true}), blob) << "f16 does not apply to O(1) state";
  LayerKvCache dst(g.kv, g.d);
  std::mt19937 rng(5);
  Fill(dst, rng, 3);
  ASSERT_TRUE(dst.ImportWire(blob, Expect(g.heads)).ok());
  ASSERT_TRUE(dst.O1Sealed());
  EXPECT_EQ(dst.seq_len(), src.seq_len());
  EXPECT_EQ(dst.capacity(), 0u);
  if (memory_equal) {
    EXPECT_EQ(dst.MemoryBytes(), src.MemoryBytes());
  }
  EXPECT_EQ(MustExport(dst), blob);
  Vec a(g.heads * g.d), b(g.heads * g.d);
  size_t same = 0;
  for (size_t j = prompt; j < prompt + kSteps; ++j) {
    src.O1Step(s.q[j], s.k[j], s.v[j], g.heads, a);
    dst.O1Step(s.q[j], s.k[j], s.v[j], g.heads, b);
    same += BitEqual(a, b);
  }
  EXPECT_EQ(same, kSteps);
  EXPECT_EQ(MustExport(dst), MustExport(src)) << "and the states are still equal";
}

TEST(LayerWireTest, SealedO1RoundTripStepsBitIdentical) {
  ExpectSealedRoundTrip(kO1, 300, O1Rect::kAggregate, /*memory_equal=*/true);
  ExpectSealedRoundTrip(kO1, 300, O1Rect::kFm, /*memory_equal=*/true);
  // Exact-only (short prompt: the window holds every key). Its window
  // travels at its live length, not with the exporter's spare capacity.
  ExpectSealedRoundTrip(kO1, 20, O1Rect::kAggregate, /*memory_equal=*/false);
  ExpectSealedRoundTrip(kTiny, 30, O1Rect::kAggregate, /*memory_equal=*/true);
}

TEST(LayerWireTest, EmptyCachesRoundTrip) {
  auto round_trip = [](LayerKvCache& src, const char* what) {
    for (uint32_t version : {1u, 2u}) {
      if (version == 1 && src.mode() == KvMode::kInt8) continue;
      const std::string blob = MustExport(src, {.version = version});
      EXPECT_EQ(blob.size(), 48u) << what;
      LayerKvCache dst(src.num_kv_heads(), src.head_dim(), src.mode());
      std::mt19937 rng(6);
      Fill(dst, rng, 2);
      ASSERT_TRUE(dst.ImportWire(blob, Expect()).ok()) << what;
      EXPECT_EQ(dst.seq_len(), 0u) << what;
      EXPECT_EQ(dst.capacity(), src.capacity()) << what;
      EXPECT_EQ(dst.MemoryBytes(), src.MemoryBytes()) << what;
      for (size_t h = 0; h < dst.num_kv_heads(); ++h) EXPECT_EQ(dst.HeadLen(h), 0u);
    }
  };
  LayerKvCache fresh(4, 8);
  round_trip(fresh, "fresh");
  LayerKvCache reserved(4, 8);
  reserved.Reserve(33);
  round_trip(reserved, "reserved");
  LayerKvCache cleared(4, 8, KvMode::kInt8);
  std::mt19937 rng(7);
  Fill(cleared, rng, 20);
  cleared.Clear();
  round_trip(cleared, "cleared int8");
}

// ---- refusals ------------------------------------------------------------------

void ExpectRefused(const LayerKvCache& c, WireOptions o, const char* reason) {
  absl::StatusOr<std::string> b = c.ExportWire(o);
  ASSERT_FALSE(b.ok()) << reason;
  EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition) << b.status();
  EXPECT_NE(b.status().message().find(reason), absl::string_view::npos) << b.status();
}

TEST(LayerWireTest, Version1RefusesInt8RowsAndAnO1Overlay) {
  std::mt19937 rng(8);
  LayerKvCache int8(2, 8, KvMode::kInt8);
  Fill(int8, rng, 4);
  ExpectRefused(int8, {.version = 1}, "int8 rows (version 1)");
  ExpectRefused(int8, {.version = 1, .f16 = true}, "int8 rows (version 1)");
  LayerKvCache empty_int8(2, 8, KvMode::kInt8);
  ExpectRefused(empty_int8, {.version = 1}, "int8 rows (version 1)");  // the mode itself
  const Stream s = MakeStream(kO1, 130, 130, 9);
  LayerKvCache sealed = Sealed(kO1, s, 130);
  ExpectRefused(sealed, {.version = 1}, "O(1) overlay (version 1)");
  EXPECT_TRUE(int8.ExportWire({.version = 2}).ok());
  EXPECT_TRUE(sealed.ExportWire({.version = 2}).ok());
}

TEST(LayerWireTest, EveryVersionRefusesImportanceATraceAndDeadHeads) {
  std::mt19937 rng(10);
  LayerKvCache imp(2, 8);
  Fill(imp, rng, 4);
  imp.AccumulateImp(Vec{0.5f, 0.25f, 0.25f});
  LayerKvCache collecting(2, 8);
  ASSERT_TRUE(collecting.O1Begin(8, 4, 1, O1Rect::kAggregate).ok());
  collecting.Append(RandomVec(rng, 16), RandomVec(rng, 16));
  collecting.O1PushQ(RandomVec(rng, 32));
  LayerKvCache armed(2, 8);  // armed, nothing pushed yet: still a trace
  ASSERT_TRUE(armed.O1Begin(8, 4, 1, O1Rect::kAggregate).ok());
  LayerKvCache dead(2, 8);
  const bool alive[2] = {true, false};
  dead.Append(RandomVec(rng, 16), RandomVec(rng, 16), alive);
  for (uint32_t version : {1u, 2u}) {
    for (bool f16 : {false, true}) {
      ExpectRefused(imp, {version, f16}, "accumulated importance");
      ExpectRefused(collecting, {version, f16},
                    "O(1) trace being collected: seal or release first");
      ExpectRefused(armed, {version, f16}, "O(1) trace being collected");
      ExpectRefused(dead, {version, f16}, "dead heads");
    }
  }
  for (uint32_t version : {0u, 3u}) {
    absl::StatusOr<std::string> b = LayerKvCache(1, 4).ExportWire({.version = version});
    EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument) << b.status();
  }
}

// ---- hostile input ----------------------------------------------------------------

// The target's whole observable state, to prove a failed import left no trace.
struct Snapshot {
  explicit Snapshot(const LayerKvCache& c)
      : blob(MustExport(c)), bytes(c.MemoryBytes()), capacity(c.capacity()) {}
  bool operator==(const Snapshot&) const = default;
  std::string blob;
  size_t bytes, capacity;
};

struct Case {
  const char* name;
  std::string blob;
  size_t kv, d, q_heads;
  KvMode mode;
};

std::vector<Case> SmallBlobs() {
  std::vector<Case> cases;
  std::mt19937 rng(11);
  LayerKvCache f32(2, 4);
  Fill(f32, rng, 3);
  cases.push_back({"f32 v1", MustExport(f32, {.version = 1}), 2, 4, 0, KvMode::kF32});
  cases.push_back({"f16 v2", MustExport(f32, {.f16 = true}), 2, 4, 0, KvMode::kF32});
  LayerKvCache i8(2, 4, KvMode::kInt8);
  Fill(i8, rng, 3);
  cases.push_back({"int8 v2", MustExport(i8), 2, 4, 0, KvMode::kInt8});
  const Stream s = MakeStream(kTiny, 30, 30, 12);
  cases.push_back({"sealed v2", MustExport(Sealed(kTiny, s, 30)), kTiny.kv, kTiny.d, kTiny.heads,
                   KvMode::kF32});
  const Stream e = MakeStream(kTiny, 6, 6, 13);  // exact-only
  cases.push_back({"sealed exact-only v2", MustExport(Sealed(kTiny, e, 6)), kTiny.kv, kTiny.d,
                   kTiny.heads, KvMode::kF32});
  return cases;
}

LayerKvCache Target(const Case& c) {
  LayerKvCache t(c.kv, c.d, c.mode);
  std::mt19937 rng(14);
  Fill(t, rng, 5);
  return t;
}

TEST(LayerWireTest, EverySingleByteChangeIsRejectedAndLeavesTheTargetUnchanged) {
  for (const Case& c : SmallBlobs()) {
    LayerKvCache target = Target(c);
    const Snapshot before(target);
    {
      LayerKvCache probe = Target(c);
      ASSERT_TRUE(probe.ImportWire(c.blob, Expect(c.q_heads)).ok()) << c.name;
    }
    size_t tried = 0;
    for (size_t i = 0; i < c.blob.size(); ++i) {
      for (uint8_t mask : {0x01, 0x80, 0xFF}) {
        std::string bad = c.blob;
        bad[i] = static_cast<char>(bad[i] ^ mask);
        const absl::Status st = target.ImportWire(bad, Expect(c.q_heads));
        const bool version_field = i >= 4 && i < 8;
        if (version_field && st.code() == absl::StatusCode::kFailedPrecondition) {
          EXPECT_NE(st.message().find("this build reads 1..2"), absl::string_view::npos) << st;
        } else {
          ASSERT_EQ(st.code(), absl::StatusCode::kDataLoss)
              << c.name << " byte " << i << " ^ " << int(mask) << ": " << st;
        }
        ++tried;
      }
    }
    EXPECT_EQ(Snapshot(target), before) << c.name;
    std::printf("%s: %zu bytes, %zu changed blobs rejected\n", c.name, c.blob.size(), tried);
  }
}

TEST(LayerWireTest, EveryTruncationIsDataLossAndLeavesTheTargetUnchanged) {
  for (const Case& c : SmallBlobs()) {
    LayerKvCache target = Target(c);
    const Snapshot before(target);
    for (size_t len = 0; len < c.blob.size(); ++len) {
      const absl::Status st =
          target.ImportWire(std::string_view(c.blob).substr(0, len), Expect(c.q_heads));
      ASSERT_EQ(st.code(), absl::StatusCode::kDataLoss) << c.name << " len " << len << ": " << st;
    }
    const absl::Status longer = target.ImportWire(c.blob + '\0', Expect(c.q_heads));
    EXPECT_EQ(longer.code(), absl::StatusCode::kDataLoss) << longer;
    EXPECT_EQ(Snapshot(target), before) << c.name;
  }
}

TEST(LayerWireTest, MessagesNameTheCorruption) {
  std::mt19937 rng(15);
  LayerKvCache src(2, 4);
  Fill(src, rng, 3);
  const std::string blob = MustExport(src);
  LayerKvCache dst(2, 4);
  auto message = [&](const std::string& b) {
    return std::string(dst.ImportWire(b, Expect()).message());
  };
  std::string bad = blob;
  bad[0] = 'X';
  EXPECT_NE(message(bad).find("bad magic"), std::string::npos);
  bad = blob;
  bad[kHeader + 3] ^= 1;
  EXPECT_NE(message(bad).find("checksum mismatch"), std::string::npos);
  EXPECT_NE(message(blob.substr(0, blob.size() - 1)).find("truncated"), std::string::npos);
  EXPECT_NE(message(blob.substr(0, 10)).find("truncated"), std::string::npos);
  bad = blob;
  PutAt<uint32_t>(bad, 4, 7);
  const absl::Status st = dst.ImportWire(bad, Expect());
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("version 7: this build reads 1..2"), absl::string_view::npos) << st;
}

TEST(LayerWireTest, GeometryMismatchIsFailedPreconditionNamingBothValues) {
  std::mt19937 rng(16);
  LayerKvCache src(4, 8);
  src.Reserve(16);
  Fill(src, rng, 6);
  const std::string blob = MustExport(src);
  auto expect_mismatch = [&](LayerKvCache& dst, const WireImportExpect& e, const char* a,
                             const char* b) {
    const Snapshot before(dst);
    const absl::Status st = dst.ImportWire(blob, e);
    EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
    EXPECT_NE(st.message().find(a), absl::string_view::npos) << st;
    EXPECT_NE(st.message().find(b), absl::string_view::npos) << st;
    EXPECT_EQ(Snapshot(dst), before);
  };
  LayerKvCache heads(8, 8), dim(4, 16), int8(4, 8, KvMode::kInt8), ok(4, 8);
  Fill(heads, rng, 2);
  Fill(dim, rng, 2);
  expect_mismatch(heads, Expect(), "num_kv_heads 4", "this layer 8");
  expect_mismatch(dim, Expect(), "head_dim 8", "this layer 16");
  expect_mismatch(int8, Expect(), "f32 KV rows", "this layer int8");
  expect_mismatch(ok, Expect(0, 5), "seq_len 6", "max_positions is 5");

  // A sealed blob's query-head fan-out is checked against the model's.
  const Stream s = MakeStream(kO1, 130, 130, 17);
  const std::string sealed = MustExport(Sealed(kO1, s, 130));
  LayerKvCache o1(kO1.kv, kO1.d);
  const absl::Status st = o1.ImportWire(sealed, Expect(kO1.heads / 2));
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("num_q_heads 8, this layer 4"), absl::string_view::npos) << st;
  EXPECT_FALSE(o1.O1Sealed());
  // An int8 layer cannot take a sealed (f32) blob.
  LayerKvCache o1_int8(kO1.kv, kO1.d, KvMode::kInt8);
  EXPECT_EQ(o1_int8.ImportWire(sealed, Expect(kO1.heads)).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(LayerWireTest, CapacityIsClampedToTheModelsLimit) {
  std::mt19937 rng(18);
  LayerKvCache src(2, 4);
  src.Reserve(1000);
  Fill(src, rng, 10);
  LayerKvCache dst(2, 4);
  ASSERT_TRUE(dst.ImportWire(MustExport(src), Expect(0, 64)).ok());
  EXPECT_EQ(dst.capacity(), 64u);
  EXPECT_EQ(dst.seq_len(), 10u);
  ExpectSameRows(src, dst);
}

TEST(LayerWireTest, ForgedLengthsWithAValidChecksumAreDataLossBeforeAnyAllocation) {
  std::mt19937 rng(19);
  LayerKvCache src(2, 4);
  Fill(src, rng, 3);
  const std::string blob = MustExport(src);
  LayerKvCache dst(2, 4);
  const Snapshot before(dst);
  auto expect_data_loss = [&](std::string b, const char* what) {
    Reseal(b);
    const absl::Status st = dst.ImportWire(b, Expect(0, SIZE_MAX));
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << what << ": " << st;
  };
  // A huge seq_len with the body of 3 positions (a reserve of 2^50 rows
  // would abort the test with bad_alloc).
  std::string b = blob;
  PutAt<uint64_t>(b, 20, uint64_t{1} << 50);
  PutAt<uint64_t>(b, 28, uint64_t{1} << 50);
  expect_data_loss(b, "seq_len 2^50");
  // seq_len × row bytes overflowing u64.
  b = blob;
  PutAt<uint64_t>(b, 20, UINT64_MAX / 3);
  PutAt<uint64_t>(b, 28, UINT64_MAX);
  expect_data_loss(b, "seq_len overflow");
  // capacity below seq_len.
  b = blob;
  PutAt<uint64_t>(b, 28, 2);
  expect_data_loss(b, "capacity < seq_len");
  // Unknown flag bits, or flags the version does not define.
  b = blob;
  PutAt<uint32_t>(b, 8, 1u << 5);
  expect_data_loss(b, "unknown flag");
  b = blob;
  PutAt<uint32_t>(b, 4, 1);
  PutAt<uint32_t>(b, 8, 2);
  expect_data_loss(b, "int8 in version 1");
  // body_bytes disagreeing with the buffer (checked before the checksum).
  b = blob;
  PutAt<uint64_t>(b, 36, UINT64_MAX);
  expect_data_loss(b, "body_bytes");
  EXPECT_EQ(Snapshot(dst), before);

  // A sealed exact-only group whose window claims 2^61 keys.
  const Stream s = MakeStream(kTiny, 6, 6, 20);
  const std::string sealed = MustExport(Sealed(kTiny, s, 6));
  LayerKvCache o1(kTiny.kv, kTiny.d);
  // Body: u32 num_q_heads, then m, w, sink, m_eff (u64), exact_only (u8),
  // scale (f32), win_len (u64).
  constexpr size_t kWinLen = kHeader + 4 + 4 * 8 + 1 + 4;
  ASSERT_EQ(static_cast<uint8_t>(sealed[kHeader + 4 + 32]), 1u) << "exact_only";
  for (uint64_t huge : {uint64_t{1} << 61, UINT64_MAX}) {
    std::string f = sealed;
    PutAt<uint64_t>(f, kWinLen, huge);
    Reseal(f);
    const absl::Status st = o1.ImportWire(f, Expect(kTiny.heads));
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  }
  // far_len beyond seq_len (would let sink + window + far wrap around).
  const Stream s2 = MakeStream(kTiny, 30, 30, 21);
  LayerKvCache skel = Sealed(kTiny, s2, 30);
  const std::string sk = MustExport(skel);
  // Group: 4 u64, u8, f32, 3 u64, win_k/win_v [w×d], sink [sink×d] ×2,
  // k_tilde [m_eff×d]; then the first head: u8 rect, u64 far_len.
  const NystromGroup& g = skel.O1States()[0].group();
  const size_t far_at = kHeader + 4 + 32 + 1 + 4 + 24 +
                        4 * (2 * g.w * g.d + 2 * g.sink_len * g.d + g.m_eff * g.d) + 1;
  uint64_t far_len;
  std::memcpy(&far_len, sk.data() + far_at, 8);
  ASSERT_EQ(far_len, skel.O1States()[0].FarLen(0));
  std::string f = sk;
  PutAt<uint64_t>(f, far_at, UINT64_MAX);
  Reseal(f);
  EXPECT_EQ(o1.ImportWire(f, Expect(kTiny.heads)).code(), absl::StatusCode::kDataLoss);
  EXPECT_FALSE(o1.O1Sealed());
}

// ---- piece by piece (LayerWireSource / LayerWireSink) -------------------------

// The blob read through LayerWireSource in pieces of `step` bytes.
std::string ReadInPieces(const LayerKvCache& c, WireOptions o, size_t step) {
  absl::StatusOr<LayerWireSource> src = LayerWireSource::Make(c, o);
  EXPECT_TRUE(src.ok()) << src.status();
  if (!src.ok()) return {};
  std::string out, buf(step, '\0');
  while (src->left() > 0) out.append(buf.data(), src->Read(buf.data(), step));
  EXPECT_EQ(out.size(), src->size());
  EXPECT_EQ(src->body_crc(), util::Crc32c(out.data(), out.size() - 4));
  return out;
}

// `blob` written through LayerWireSink in pieces of `step` bytes, into a cache
// of c's geometry; the status ImportWire would give, the cache on success.
absl::StatusOr<LayerKvCache> WriteInPieces(const LayerKvCache& like, std::string_view blob,
                                           size_t step, WireImportExpect expect) {
  absl::StatusOr<LayerWireSink> sink =
      LayerWireSink::Begin(blob.substr(0, std::min<size_t>(blob.size(), kWireHeaderBytes)),
                           blob.size(), like.num_kv_heads(), like.head_dim(), like.mode(), expect);
  if (!sink.ok()) return sink.status();
  for (size_t at = kWireHeaderBytes; at < blob.size(); at += step) {
    sink->Write(blob.substr(at, step));
  }
  EXPECT_EQ(sink->left(), 0u);
  if (blob.size() >= kWireHeaderBytes + 4) {
    EXPECT_EQ(sink->body_crc(), util::Crc32c(blob.data(), blob.size() - 4));
    EXPECT_EQ(sink->stored_crc(), U32At(std::string(blob), blob.size() - 4));
  }
  return sink->Finish();
}

TEST(LayerWireTest, PiecesOfAnySizeGiveTheWholeBlobsBytesAndState) {
  std::mt19937 rng(5);
  LayerKvCache f32(2, 8), int8(2, 8, KvMode::kInt8);
  Fill(f32, rng, 37);
  Fill(int8, rng, 37);
  const Stream s = MakeStream(kO1, 300, 300, 3);
  const LayerKvCache sealed = Sealed(kO1, s, 300);
  struct Case {
    const LayerKvCache* cache;
    WireOptions options;
    size_t q_heads;
  };
  const Case cases[] = {{&f32, {}, 0},
                        {&f32, {.version = 1, .f16 = true}, 0},
                        {&int8, {}, 0},
                        {&sealed, {}, kO1.heads}};
  for (const Case& c : cases) {
    const std::string whole = MustExport(*c.cache, c.options);
    LayerKvCache want(c.cache->num_kv_heads(), c.cache->head_dim(), c.cache->mode());
    ASSERT_TRUE(want.ImportWire(whole, Expect(c.q_heads)).ok());
    for (size_t step : {1, 3, 7, 64, 1000, 1 << 20}) {
      SCOPED_TRACE(::testing::Message() << "f16 " << c.options.f16 << " step " << step);
      EXPECT_EQ(ReadInPieces(*c.cache, c.options, step), whole);
      absl::StatusOr<LayerKvCache> got = WriteInPieces(*c.cache, whole, step, Expect(c.q_heads));
      ASSERT_TRUE(got.ok()) << got.status();
      ExpectSameRows(*got, want);
      EXPECT_EQ(got->capacity(), want.capacity());
      EXPECT_EQ(got->MemoryBytes(), want.MemoryBytes());
      EXPECT_EQ(MustExport(*got, c.options), whole);
    }
  }
}

// A cache reserved ahead (on another thread, by a session import) is taken
// when it is exactly what the blob asks for, and left alone otherwise.
TEST(LayerWireTest, ACacheReservedAheadIsTakenOnlyWhenItMatches) {
  std::mt19937 rng(3);
  LayerKvCache src(2, 8);
  src.Reserve(50);
  Fill(src, rng, 37);
  const std::string blob = MustExport(src);
  LayerKvCache want(2, 8);
  ASSERT_TRUE(want.ImportWire(blob, Expect()).ok());
  auto begin = [&](LayerKvCache* reserved) {
    return LayerWireSink::Begin(std::string_view(blob).substr(0, kWireHeaderBytes), blob.size(), 2,
                                8, KvMode::kF32, Expect(), reserved);
  };
  struct Case {
    LayerKvCache spare;
    bool taken;
  };
  Case cases[] = {{LayerKvCache(2, 8), true},
                  {LayerKvCache(2, 8), false},                 // another capacity
                  {LayerKvCache(2, 8, KvMode::kInt8), false},  // another mode
                  {LayerKvCache(2, 8), false}};                // not fresh
  cases[0].spare.Reserve(50);
  cases[1].spare.Reserve(64);
  cases[2].spare.Reserve(50);
  cases[3].spare.Reserve(50);
  Fill(cases[3].spare, rng, 1);
  for (Case& c : cases) {
    const size_t before = c.spare.MemoryBytes();
    absl::StatusOr<LayerWireSink> sink = begin(&c.spare);
    ASSERT_TRUE(sink.ok()) << sink.status();
    EXPECT_EQ(sink->reserved_positions(), 50u);
    EXPECT_EQ(c.spare.MemoryBytes(), c.taken ? 0u : before);
    sink->Write(std::string_view(blob).substr(kWireHeaderBytes));
    absl::StatusOr<LayerKvCache> got = sink->Finish();
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectSameRows(*got, want);
    EXPECT_EQ(got->capacity(), want.capacity());
    EXPECT_EQ(got->MemoryBytes(), want.MemoryBytes());
  }
}

TEST(LayerWireTest, PiecesGiveImportWiresErrorForEveryChangedByteAndTruncation) {
  std::mt19937 rng(9);
  LayerKvCache c(1, 4);
  Fill(c, rng, 3);
  const std::string blob = MustExport(c);
  auto same = [&](const std::string& b, const std::string& what) {
    LayerKvCache target(1, 4);
    const absl::Status whole = target.ImportWire(b, Expect());
    for (size_t step : {1, 5}) {
      absl::StatusOr<LayerKvCache> got = WriteInPieces(c, b, step, Expect());
      EXPECT_EQ(got.status(), whole) << what << " step " << step;
    }
  };
  for (size_t i = 0; i < blob.size(); ++i) {
    std::string bad = blob;
    bad[i] ^= 0x21;
    same(bad, "byte " + std::to_string(i));
    Reseal(bad);  // past the checksum: the checks after it
    same(bad, "resealed byte " + std::to_string(i));
  }
  for (size_t n = 0; n < blob.size(); ++n)
    same(blob.substr(0, n), "truncated " + std::to_string(n));
}

}  // namespace
}  // namespace cortiq::kv
