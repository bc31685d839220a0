// Typed export refusals (core/kv/wire_refusal.h): every refusal site of the
// layer exporter (LayerWireSource::Make, hence LayerKvCache::ExportWire)
// carries its WireRefusal, the reason survives a wrapper that names the layer
// (PrefixStatus, as a session export does), and only the payload decides it:
// no text in a message can change or forge a reason.
#include "core/kv/wire_refusal.h"

#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/kv/layer_kv_cache.h"
#include "core/kv/layer_wire.h"
#include "gtest/gtest.h"
#include "tests/kv/kv_test_util.h"

namespace cortiq::kv {
namespace {

using kvtest::Fill;
using kvtest::RandomVec;
using kvtest::Vec;

// Both export entry points refuse with FailedPrecondition carrying `want`.
void ExpectReason(const LayerKvCache& c, WireOptions o, WireRefusal want) {
  SCOPED_TRACE(::testing::Message() << "want " << WireRefusalName(want) << ", version " << o.version
                                    << ", f16 " << o.f16);
  const absl::Status whole = c.ExportWire(o).status();
  EXPECT_EQ(whole.code(), absl::StatusCode::kFailedPrecondition) << whole;
  EXPECT_EQ(WireRefusalOf(whole), want) << whole;
  const absl::Status pieces = LayerWireSource::Make(c, o).status();
  EXPECT_EQ(pieces, whole);
  EXPECT_EQ(WireRefusalOf(pieces), want) << pieces;
}

TEST(WireRefusalTest, EveryExportRefusalSiteCarriesItsReason) {
  constexpr size_t kKv = 2, kD = 8, kHeads = 4;
  std::mt19937 rng(11);

  LayerKvCache collecting(kKv, kD);
  ASSERT_TRUE(collecting.O1Begin(8, 4, 1, O1Rect::kAggregate).ok());
  LayerKvCache importance(kKv, kD);
  Fill(importance, rng, 4);
  importance.AccumulateImp(Vec{0.5f, 0.5f});
  LayerKvCache dead(kKv, kD);
  const bool alive[kKv] = {true, false};
  dead.Append(RandomVec(rng, kKv * kD), RandomVec(rng, kKv * kD), alive);
  for (uint32_t version : {1u, 2u}) {
    for (bool f16 : {false, true}) {
      ExpectReason(collecting, {version, f16}, WireRefusal::kO1Collecting);
      ExpectReason(importance, {version, f16}, WireRefusal::kImportance);
      ExpectReason(dead, {version, f16}, WireRefusal::kDeadHeads);
    }
  }

  LayerKvCache int8(kKv, kD, KvMode::kInt8);
  Fill(int8, rng, 3);
  ExpectReason(int8, {.version = 1}, WireRefusal::kInt8Rows);

  LayerKvCache sealed(kKv, kD);
  ASSERT_TRUE(sealed.O1Begin(8, 4, 1, O1Rect::kAggregate).ok());
  for (size_t t = 0; t < 64; ++t) {  // 64: enough for the landmark budget
    sealed.Append(RandomVec(rng, kKv * kD), RandomVec(rng, kKv * kD));
    sealed.O1PushQ(RandomVec(rng, kHeads * kD));
  }
  ASSERT_TRUE(sealed.O1Seal(kHeads).ok());
  ExpectReason(sealed, {.version = 1}, WireRefusal::kO1Overlay);

  LayerKvCache wide(kKv, kD);
  Vec k(kKv * kD, 1.0f), v(kKv * kD, 1.0f);
  k[3] = -70000.0f;  // beyond f16's range
  wide.Append(k, v);
  ExpectReason(wide, {.version = 2, .f16 = true}, WireRefusal::kF16Range);

  // What is not a refusal carries no reason: an export that succeeds, and a
  // version this build does not write (InvalidArgument).
  EXPECT_TRUE(int8.ExportWire({.version = 2}).ok());
  EXPECT_TRUE(sealed.ExportWire({.version = 2}).ok());
  EXPECT_TRUE(wide.ExportWire({.version = 2}).ok());
  const absl::Status bad_version = wide.ExportWire({.version = 9}).status();
  EXPECT_EQ(bad_version.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WireRefusalOf(bad_version), std::nullopt);
}

TEST(WireRefusalTest, TheReasonSurvivesAWrapperThatNamesTheLayer) {
  LayerKvCache int8(1, 4, KvMode::kInt8);
  const absl::Status layer = int8.ExportWire({.version = 1}).status();
  const absl::Status session = PrefixStatus("layer 3: ", layer);
  EXPECT_EQ(session.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(session.message(), "layer 3: " + std::string(layer.message()));
  EXPECT_EQ(WireRefusalOf(session), WireRefusal::kInt8Rows);
  EXPECT_EQ(WireRefusalOf(PrefixStatus("session: ", session)), WireRefusal::kInt8Rows);
  EXPECT_TRUE(PrefixStatus("layer 0: ", absl::OkStatus()).ok());
  // Rebuilding a status from its code and text (what the wrapper used to
  // do) loses the reason: the typed refusal is in the payload only.
  EXPECT_EQ(WireRefusalOf(absl::Status(session.code(), session.message())), std::nullopt);
}

TEST(WireRefusalTest, OnlyThePayloadDecidesTheReason) {
  std::set<std::string_view> names;
  for (size_t i = 0; i < kNumWireRefusals; ++i) {
    const auto reason = static_cast<WireRefusal>(i);
    names.insert(WireRefusalName(reason));
    // A message naming every other reason changes nothing.
    const absl::Status st =
        WireRefused(reason, "accumulated importance, O(1) overlay, int8 rows, dead heads, f16");
    EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(WireRefusalOf(st), reason) << WireRefusalName(reason);
    EXPECT_EQ(WireRefusalOf(WireRefused(reason, "")), reason);
  }
  EXPECT_EQ(names.size(), kNumWireRefusals) << "one name per reason";
  // A refusal's exact text without the payload is no refusal.
  EXPECT_EQ(WireRefusalOf(absl::FailedPreconditionError(
                "ExportWire refused: int8 rows (version 1): version 1 carries f32 rows only")),
            std::nullopt);
  EXPECT_EQ(WireRefusalOf(absl::OkStatus()), std::nullopt);
  // A payload this build does not name (a newer producer) is kOther.
  absl::Status newer = absl::FailedPreconditionError("refused");
  newer.SetPayload(std::string(kWireRefusalTypeUrl), absl::Cord("a_reason_from_the_future"));
  EXPECT_EQ(WireRefusalOf(newer), WireRefusal::kOther);
}

}  // namespace
}  // namespace cortiq::kv
