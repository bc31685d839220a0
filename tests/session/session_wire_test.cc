// The session wire format: round trips that are byte-exact and
// continuation-identical in every attention mode, refusals by version, and
// hostile streams — every flipped byte and every truncation is refused and
// installs nothing. Piece by piece (SessionWireSource / SessionWireSink, as
// the gRPC chunks use them): any piece size gives the whole-buffer bytes,
// session and errors.
#include "core/session/session_wire.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "core/kv/wire_refusal.h"
#include "core/model/random_checkpoint.h"
#include "core/session/engine.h"
#include "core/session/session_store.h"
#include "core/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "tests/common/engine_test_util.h"
#include "tests/common/model_test_util.h"
#include "tests/fuzz/wire_fuzz_util.h"

namespace cortiq::session {
namespace {

constexpr uint64_t kFingerprint = 0x1234abcd5678ef01ull;

class SessionWireTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(testing::LoadTempModel("tiny", &model_, &tok_));
    engine_ = std::make_unique<Engine>(*model_, *tok_, EngineOptions{});
  }

  static SessionConfig Mode(int mode) { return testing::ModeConfig(mode); }

  static GenerationRequest Req(std::vector<int32_t> prompt, size_t n, bool sampled) {
    GenerationRequest r = testing::FixedRequest(std::move(prompt), n, sampled);
    r.seed_given = false;  // a continuation keeps the session's RNG
    return r;
  }

  std::vector<int32_t> Run(SessionStore& store, const std::string& id, GenerationRequest r) {
    return testing::RunKept(*engine_, store, id, std::move(r));
  }

  // A kept session of `mode` after a 150-token prompt and 10 generated tokens.
  std::string MakeSession(SessionStore& store, int mode, bool sampled, std::string tenant = "") {
    auto lease = store.Create(*model_, Mode(mode), 0, std::move(tenant));
    EXPECT_TRUE(lease.ok()) << lease.status();
    const std::string id = (*lease)->id();
    lease->Return();
    GenerationRequest r = Req(testing::TestIds(150, 259, 5), 10, sampled);
    r.seed_given = true;
    Run(store, id, r);
    return id;
  }

  // A kept int8 session after a 4-token prompt and 3 sampled tokens: a
  // stream small enough to try every byte position.
  std::string MakeShortSession(SessionStore& store) {
    auto lease = store.Create(*model_, Mode(1), 0);
    EXPECT_TRUE(lease.ok()) << lease.status();
    if (!lease.ok()) return "";
    const std::string id = (*lease)->id();
    lease->Return();
    Run(store, id, Req({1, 2, 3, 4}, 3, true));
    return id;
  }

  absl::StatusOr<std::string> Export(SessionStore& store, const std::string& id,
                                     SessionWireOptions o = {}) {
    auto lease = store.Acquire(id);
    if (!lease.ok()) return lease.status();
    return ExportSessionWire(**lease, kFingerprint, o);
  }

  std::unique_ptr<model::Transformer> model_;
  std::unique_ptr<tokenizer::Tokenizer> tok_;
  std::unique_ptr<Engine> engine_;
};

TEST_F(SessionWireTest, RoundTripIsByteExactAndContinuesIdentically) {
  for (int mode = 0; mode < 4; ++mode) {
    for (bool sampled : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "mode " << mode << " sampled " << sampled);
      // The copy lands in another store (another node): it keeps the id.
      SessionStore store({}), other({});
      const std::string id = MakeSession(store, mode, sampled);
      auto wire = Export(store, id);
      ASSERT_TRUE(wire.ok()) << wire.status();
      auto imported = ImportSessionWire(*wire, *model_, kFingerprint, SessionStore::RandomId());
      ASSERT_TRUE(imported.ok()) << imported.status();
      EXPECT_EQ((*imported)->id(), id);
      const auto src = store.Get(id);
      EXPECT_EQ((*imported)->tokens().size(), src->tokens);
      EXPECT_EQ((*imported)->kv().position(), src->cached_tokens);
      EXPECT_EQ((*imported)->Memory().bytes, src->memory.bytes);
      auto installed = other.Install(*std::move(imported));
      ASSERT_TRUE(installed.ok()) << installed.status();
      installed->Return();
      // Re-exporting the copy gives the same bytes: every layer, the tokens
      // and the sampler travelled exactly.
      auto again = Export(other, id);
      ASSERT_TRUE(again.ok());
      EXPECT_TRUE(*again == *wire) << "re-export differs";
      // The same continuation on both gives the same tokens.
      const auto prompt = testing::TestIds(7, 259, 9);
      EXPECT_EQ(Run(store, id, Req(prompt, 12, sampled)), Run(other, id, Req(prompt, 12, sampled)));
    }
  }
}

// A session whose sampler holds the penalties and a logit_bias (a version-2
// sampler blob) travels exactly: the re-export is byte-identical and the
// same continuation samples the same tokens on both nodes.
TEST_F(SessionWireTest, TheVersion2SamplerTravelsWithItsPenalties) {
  SessionStore store({}), other({});
  auto lease = store.Create(*model_, Mode(0), 0);
  ASSERT_TRUE(lease.ok()) << lease.status();
  const std::string id = (*lease)->id();
  lease->Return();
  GenerationRequest r = Req(testing::TestIds(40, 259, 6), 10, /*sampled=*/true);
  r.seed_given = true;
  r.sampling.presence_penalty = 0.8f;
  r.sampling.frequency_penalty = -0.5f;
  r.sampling.logit_bias = {{3, 4.0f}, {200, -2.0f}};
  Run(store, id, r);
  auto wire = Export(store, id);
  ASSERT_TRUE(wire.ok()) << wire.status();
  const std::string blob_v2 = "CQSM\x02";
  EXPECT_NE(wire->find(blob_v2), std::string::npos) << "a version-2 sampler blob";
  auto imported = ImportSessionWire(*wire, *model_, kFingerprint, SessionStore::RandomId());
  ASSERT_TRUE(imported.ok()) << imported.status();
  ASSERT_TRUE((*imported)->sampler().has_value());
  EXPECT_EQ((*imported)->sampler()->params(), r.sampling);
  auto installed = other.Install(*std::move(imported));
  ASSERT_TRUE(installed.ok()) << installed.status();
  installed->Return();
  auto again = Export(other, id);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(*again == *wire) << "re-export differs";
  // Continue with the session's sampler (no seed, same parameters).
  GenerationRequest more = r;
  more.prompt = testing::TestIds(5, 259, 8);
  more.seed_given = false;
  EXPECT_EQ(Run(store, id, more), Run(other, id, more));

  // A sampler section claiming more than a sampler state can be is refused
  // at its header (nothing of it is buffered).
  size_t off = 24;
  for (int section = 0; section < 2; ++section) {
    uint64_t len;
    std::memcpy(&len, wire->data() + off + 8, 8);
    off += 16 + len + 4;
  }
  uint32_t type;
  std::memcpy(&type, wire->data() + off, 4);
  ASSERT_EQ(type, 3u);  // the sampler section
  std::string bad = *wire;
  const uint64_t huge = 1 << 20;
  std::memcpy(bad.data() + off + 8, &huge, 8);
  auto refused = ImportSessionWire(bad, *model_, kFingerprint, "x");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kDataLoss) << refused.status();
  EXPECT_NE(refused.status().message().find("(sampler): length 1048576, at most 8281"),
            std::string::npos)
      << refused.status();
}

// Version 4 carries the session's identity: the id and the tenant travel,
// and an import into a store that holds the id is ALREADY_EXISTS. Version 3
// carries none: the import takes the id it is given and no tenant.
TEST_F(SessionWireTest, VersionFourCarriesTheIdAndTheTenant) {
  SessionStore store({});
  const std::string id = MakeSession(store, 0, false, "team-a.prod_1");
  auto v4 = Export(store, id);
  ASSERT_TRUE(v4.ok()) << v4.status();
  auto imported = ImportSessionWire(*v4, *model_, kFingerprint, SessionStore::RandomId());
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_EQ((*imported)->id(), id);
  EXPECT_EQ((*imported)->tenant(), "team-a.prod_1");
  EXPECT_EQ(store.Install(*std::move(imported)).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(store.num_sessions(), 1u);

  auto v3 = Export(store, id, {.version = 3});
  ASSERT_TRUE(v3.ok()) << v3.status();
  EXPECT_LT(v3->size(), v4->size());
  const std::string fresh = SessionStore::RandomId();
  auto old = ImportSessionWire(*v3, *model_, kFingerprint, fresh);
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ((*old)->id(), fresh);
  EXPECT_EQ((*old)->tenant(), "");
}

TEST_F(SessionWireTest, F16HalvesThePayloadAndStillContinues) {
  SessionStore store({});
  const std::string id = MakeSession(store, 0, false);
  auto f32 = Export(store, id);
  auto f16 = Export(store, id, {.version = 2, .f16 = true});
  ASSERT_TRUE(f32.ok() && f16.ok()) << f16.status();
  EXPECT_LT(f16->size(), f32->size() * 0.55);
  auto imported = ImportSessionWire(*f16, *model_, kFingerprint, SessionStore::RandomId());
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_EQ((*imported)->Memory().total(), store.Get(id)->memory.total());
}

TEST_F(SessionWireTest, VersionOneRefusesWhatItCannotDescribe) {
  SessionStore store({});
  const std::string exact = MakeSession(store, 0, false);
  EXPECT_TRUE(Export(store, exact, {.version = 1}).ok());
  for (int mode : {1, 2}) {
    const std::string id = MakeSession(store, mode, false);
    auto w = Export(store, id, {.version = 1});
    EXPECT_EQ(w.status().code(), absl::StatusCode::kFailedPrecondition) << w.status();
    EXPECT_TRUE(Export(store, id, {.version = 2}).ok());
  }
  // Sink + window needs version 3: versions 1 and 2 refuse, naming it.
  const std::string window = MakeSession(store, 4, false);
  for (uint32_t v : {1u, 2u}) {
    auto w = Export(store, window, {.version = v});
    EXPECT_EQ(w.status().code(), absl::StatusCode::kFailedPrecondition) << w.status();
    EXPECT_NE(w.status().message().find("version 3"), std::string::npos) << w.status();
    EXPECT_EQ(kv::WireRefusalOf(w.status()), kv::WireRefusal::kWireVersion);
  }
  EXPECT_TRUE(Export(store, window, {.version = 3}).ok());
  EXPECT_EQ(Export(store, exact, {.version = kSessionWireMaxVersion + 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*NegotiateWireVersion({1, 2, 7}), 2u);
  EXPECT_EQ(*NegotiateWireVersion({1}), 1u);
  EXPECT_EQ(NegotiateWireVersion({}).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(SessionWireTest, AnotherModelIsFailedPrecondition) {
  SessionStore store({});
  const std::string id = MakeSession(store, 0, false);
  auto wire = Export(store, id);
  ASSERT_TRUE(wire.ok());
  auto other_fp = ImportSessionWire(*wire, *model_, kFingerprint + 1, "x");
  EXPECT_EQ(other_fp.status().code(), absl::StatusCode::kFailedPrecondition) << other_fp.status();
  auto gqa = model::Transformer::Load(testing::TempModel("tiny-gqa"));
  ASSERT_TRUE(gqa.ok());
  auto other_geometry = ImportSessionWire(*wire, **gqa, kFingerprint, "x");
  EXPECT_EQ(other_geometry.status().code(), absl::StatusCode::kFailedPrecondition)
      << other_geometry.status();
}

TEST_F(SessionWireTest, EveryFlippedByteAndEveryTruncationIsRefused) {
  SessionStore store({});
  const std::string id = MakeShortSession(store);
  auto wire = Export(store, id);
  ASSERT_TRUE(wire.ok());
  ASSERT_LT(wire->size(), 40000u);
  for (size_t i = 0; i < wire->size(); ++i) {
    std::string bad = *wire;
    bad[i] ^= 0x5a;
    auto r = ImportSessionWire(bad, *model_, kFingerprint, "x");
    ASSERT_FALSE(r.ok()) << "flipped byte " << i << " was accepted";
    const auto code = r.status().code();
    // The version field answers FAILED_PRECONDITION ("this server reads
    // 1..2"); everything else is DATA_LOSS.
    if (i >= 4 && i < 8) {
      EXPECT_EQ(code, absl::StatusCode::kFailedPrecondition) << i << ": " << r.status();
    } else {
      ASSERT_EQ(code, absl::StatusCode::kDataLoss) << "byte " << i << ": " << r.status();
    }
  }
  for (size_t n = 0; n < wire->size(); ++n) {
    auto r = ImportSessionWire(std::string_view(*wire).substr(0, n), *model_, kFingerprint, "x");
    ASSERT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << "truncated to " << n;
  }
  EXPECT_EQ(store.num_sessions(), 1u);
}

// Impossible state is refused even when every checksum holds: a history
// longer than the importing model's context (here: the same geometry with a
// 64-position context, so the stream's 160 tokens cannot be real), and K/V
// rows with a NaN or an infinity.
TEST_F(SessionWireTest, ImpossibleStateIsRefusedWithValidChecksums) {
  SessionStore store({});
  const std::string id = MakeSession(store, 0, false);  // 150 + 10 tokens
  auto wire = Export(store, id);
  ASSERT_TRUE(wire.ok()) << wire.status();
  auto shape = model::NamedShape("tiny");
  ASSERT_TRUE(shape.ok());
  shape->max_position_embeddings = 64;
  const std::string short_dir = ::testing::TempDir() + "/cortiq_wire_short_context";
  ASSERT_TRUE(model::WriteRandomCheckpoint(*shape, short_dir, {}).ok());
  auto short_model = model::Transformer::Load(short_dir);
  ASSERT_TRUE(short_model.ok()) << short_model.status();
  auto beyond = ImportSessionWire(*wire, **short_model, kFingerprint, "x");
  EXPECT_EQ(beyond.status().code(), absl::StatusCode::kDataLoss) << beyond.status();
  EXPECT_NE(beyond.status().message().find("beyond the model's context of 64"), std::string::npos)
      << beyond.status();

  for (const float bad : {std::nanf(""), std::numeric_limits<float>::infinity()}) {
    SCOPED_TRACE(::testing::Message() << "value " << bad);
    const std::string poisoned = MakeSession(store, 0, false);
    {
      auto lease = store.Acquire(poisoned);
      ASSERT_TRUE(lease.ok());
      model::SequenceKv& seq = lease->sequence();
      kv::LayerKvCache rows = seq.layer(1).cache()->Copy();
      const size_t positions = rows.seq_len();
      ASSERT_TRUE(rows.TruncateLast(1).ok());
      std::vector<float> k(rows.num_kv_heads() * rows.head_dim(), 0.5f), v(k.size(), 0.5f);
      v[3] = bad;  // one value of the last position
      rows.Append(k, v);
      ASSERT_TRUE(seq.layer(1).InstallCache(std::move(rows), positions).ok());
    }
    auto forged = Export(store, poisoned);
    ASSERT_TRUE(forged.ok()) << forged.status();
    auto imported = ImportSessionWire(*forged, *model_, kFingerprint, "y");
    EXPECT_EQ(imported.status().code(), absl::StatusCode::kDataLoss) << imported.status();
    EXPECT_NE(imported.status().message().find("non-finite value in head 0"), std::string::npos)
        << imported.status();
  }
}

// O(1) and QSA state holding a NaN, with every checksum valid (the bytes
// changed, then FixWireChecksums recomputes what an exporter would write):
// DATA_LOSS naming the array, nothing installed.
TEST_F(SessionWireTest, NonFiniteO1AndQsaStateIsRefusedWithValidChecksums) {
  SessionStore store({});
  const float nan = std::nanf("");
  {  // A sealed O(1) layer: one value of its window keys becomes NaN.
    const std::string id = MakeSession(store, 2, false);
    float v;
    {
      auto lease = store.Acquire(id);
      ASSERT_TRUE(lease.ok());
      const kv::LayerKvCache* cache = (*lease)->kv().layer(0).cache();
      ASSERT_TRUE(cache != nullptr && cache->O1Sealed());
      v = cache->O1States()[0].group().win_k.at(0);
    }
    auto wire = Export(store, id);
    ASSERT_TRUE(wire.ok()) << wire.status();
    const size_t at = wire->find(std::string_view(reinterpret_cast<const char*>(&v), sizeof(v)));
    ASSERT_NE(at, std::string::npos);
    std::string forged = *wire;
    std::memcpy(forged.data() + at, &nan, sizeof(nan));
    forged = fuzz::FixWireChecksums(forged);
    auto imported = ImportSessionWire(forged, *model_, kFingerprint, "x");
    EXPECT_EQ(imported.status().code(), absl::StatusCode::kDataLoss) << imported.status();
    EXPECT_NE(imported.status().message().find("non-finite value in win_k"), std::string::npos)
        << imported.status();
  }
  {  // A QSA layer's aux blob: the last raw key (bf16) becomes NaN. The
     // last aux section's payload ends 4 + 36 bytes before the stream does
     // (its CRC, then the end section).
    const std::string id = MakeSession(store, 3, false);
    auto wire = Export(store, id);
    ASSERT_TRUE(wire.ok()) << wire.status();
    std::string forged = *wire;
    const size_t at = forged.size() - 36 - 4 - 2;
    forged[at] = static_cast<char>(0xC0);  // bf16 quiet NaN 0x7FC0, little-endian
    forged[at + 1] = 0x7F;
    forged = fuzz::FixWireChecksums(forged);
    auto imported = ImportSessionWire(forged, *model_, kFingerprint, "y");
    EXPECT_EQ(imported.status().code(), absl::StatusCode::kDataLoss) << imported.status();
    EXPECT_NE(imported.status().message().find("non-finite key value"), std::string::npos)
        << imported.status();
  }
}

// Positions that disagree with the rows, checksums valid: the tokens
// section's cached count one less or one more than every layer holds.
// (A sink + window layer past its sink + window positions holds the same
// rows at every position, so there the stream cannot show the difference:
// see WIRE_FORMAT.md.)
TEST_F(SessionWireTest, PositionsDisagreeingWithTheRowsAreRefused) {
  SessionStore store({});
  for (int mode : {0, 1, 2, 3}) {  // exact f32, int8 rows, sealed O(1) layers, QSA
    SCOPED_TRACE(::testing::Message() << "mode " << mode);
    const std::string id = MakeSession(store, mode, false);
    auto wire = Export(store, id);
    ASSERT_TRUE(wire.ok()) << wire.status();
    // Stream header (24), header section (16 + len + 4), then the tokens
    // section's payload: u64 n, n × i32, u64 cached, ...
    uint64_t header_len, n, cached;
    std::memcpy(&header_len, wire->data() + 24 + 8, 8);
    const size_t tokens_at = 24 + 16 + header_len + 4 + 16;
    std::memcpy(&n, wire->data() + tokens_at, 8);
    const size_t cached_at = tokens_at + 8 + 4 * n;
    std::memcpy(&cached, wire->data() + cached_at, 8);
    ASSERT_GT(cached, 0u);
    for (const uint64_t forged_cached : {cached - 1, cached + 1}) {
      std::string forged = *wire;
      std::memcpy(forged.data() + cached_at, &forged_cached, 8);
      forged = fuzz::FixWireChecksums(forged);
      auto imported = ImportSessionWire(forged, *model_, kFingerprint, "x");
      EXPECT_EQ(imported.status().code(), absl::StatusCode::kDataLoss) << imported.status();
      EXPECT_NE(imported.status().message().find("layer 0:"), std::string::npos)
          << imported.status();
    }
  }
}

// Fuzzing regression (tests/fuzz): a session nothing ran in travels too.
// Its empty token list once reached memcpy(nullptr, ..., 0) in ByteReader.
TEST_F(SessionWireTest, FreshSessionRoundTrips) {
  SessionStore store({});
  for (int mode = 0; mode < 5; ++mode) {
    SCOPED_TRACE(::testing::Message() << "mode " << mode);
    auto lease = store.Create(*model_, Mode(mode), 0);
    ASSERT_TRUE(lease.ok());
    const std::string id = (*lease)->id();
    lease->Return();
    auto wire = Export(store, id);
    ASSERT_TRUE(wire.ok()) << wire.status();
    auto imported = ImportSessionWire(*wire, *model_, kFingerprint, "x");
    ASSERT_TRUE(imported.ok()) << imported.status();
    EXPECT_TRUE((*imported)->tokens().empty());
    EXPECT_EQ((*imported)->kv().position(), 0u);
  }
}

// Fuzzing regression (tests/fuzz): O(1) and QSA sizes steer allocations on
// the first step after an import (the QSA scratch is budget × 4 bytes), so a
// stream naming one beyond the model's context is refused, even with every
// checksum right.
TEST_F(SessionWireTest, SizesBeyondTheContextAreRefused) {
  // Offsets in the stream: header section payload at 24 + 16; in it, the
  // geometry (20 bytes), kv_mode, attention, then o1 m, w, sink (u32), rect,
  // the O(1) layer list (u32 n + n u32), qsa ratio, budget.
  constexpr size_t kPayload = 40;
  SessionStore store({});
  struct Case {
    int mode;
    size_t offset;  // of the u32 to overwrite
    const char* field;
  };
  const Case cases[] = {{2, kPayload + 22, "o1.m"},
                        {2, kPayload + 26, "o1.w"},
                        {2, kPayload + 30, "o1.sink"},
                        {3, kPayload + 39, "qsa.ratio"},
                        {3, kPayload + 43, "qsa.budget"}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.field);
    const std::string id = MakeSession(store, c.mode, false);
    auto wire = Export(store, id);
    ASSERT_TRUE(wire.ok());
    ASSERT_TRUE(ImportSessionWire(*wire, *model_, kFingerprint, "x").ok());
    for (uint32_t v : {uint32_t(model_->config().max_position_embeddings + 1), 0x7fffffffu}) {
      std::string bad = *wire;
      std::memcpy(bad.data() + c.offset, &v, 4);
      bad = fuzz::FixWireChecksums(bad);
      auto r = ImportSessionWire(bad, *model_, kFingerprint, "x");
      EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
      EXPECT_NE(r.status().message().find(c.field), std::string::npos) << r.status();
    }
  }
}

// SessionWireSource read in pieces of `step` bytes.
std::string ReadInPieces(const Session& s, size_t step, SessionWireOptions o = {}) {
  auto src = SessionWireSource::Make(s, kFingerprint, o);
  EXPECT_TRUE(src.ok()) << src.status();
  if (!src.ok()) return {};
  std::string out, buf(step, '\0');
  while (src->left() > 0) out.append(buf.data(), src->Read(buf.data(), step));
  EXPECT_EQ(out.size(), src->size());
  return out;
}

// SessionWireSink fed `wire` in pieces of `step` bytes; a Write error ends the
// stream there, as the import RPC does.
absl::StatusOr<std::unique_ptr<Session>> WriteInPieces(const model::Transformer& m,
                                                       std::string_view wire, size_t step) {
  SessionWireSink sink(m, kFingerprint, "x", wire.size());
  for (size_t at = 0; at < wire.size(); at += step) {
    if (absl::Status st = sink.Write(wire.substr(at, step)); !st.ok()) {
      EXPECT_EQ(sink.Finish().status(), st) << "Finish repeats the Write error";
      return st;
    }
  }
  return sink.Finish();
}

TEST_F(SessionWireTest, PiecesOfAnySizeGiveTheWholeStreamAndSession) {
  for (int mode = 0; mode < 5; ++mode) {
    SCOPED_TRACE(::testing::Message() << "mode " << mode);
    SessionStore store({});
    const std::string id = MakeSession(store, mode, true);
    auto wire = Export(store, id);
    ASSERT_TRUE(wire.ok()) << wire.status();
    const uint32_t f16_version = mode == 4 ? 3u : 2u;  // window sessions need 3
    auto f16 = Export(store, id, {.version = f16_version, .f16 = true});
    ASSERT_TRUE(f16.ok()) << f16.status();
    for (size_t step : {1, 7, 4096, 1 << 20}) {
      SCOPED_TRACE(::testing::Message() << "step " << step);
      {
        auto lease = store.Acquire(id);
        ASSERT_TRUE(lease.ok());
        EXPECT_TRUE(ReadInPieces(**lease, step) == *wire);
        EXPECT_TRUE(ReadInPieces(**lease, step, {.version = f16_version, .f16 = true}) == *f16);
      }
      for (const std::string* w : {&*wire, &*f16}) {
        auto imported = WriteInPieces(*model_, *w, step);
        ASSERT_TRUE(imported.ok()) << imported.status();
        const uint32_t version = w == &*f16 ? f16_version : kSessionWireMaxVersion;
        auto again =
            ExportSessionWire(**imported, kFingerprint, {.version = version, .f16 = w == &*f16});
        ASSERT_TRUE(again.ok()) << again.status();
        EXPECT_TRUE(*again == *w) << "re-export differs";
      }
    }
  }
}

// SetAdmit sees every allocation the layers make before it is made: with
// every request admitted, what was admitted covers what the sink holds at the
// end; with a budget of half of that, the stream stops with
// RESOURCE_EXHAUSTED and the sink never holds more than was admitted (plus
// the small sections it gathers, which are not layer rows).
TEST_F(SessionWireTest, AdmitSeesEveryLayerAllocationBeforeItIsMade) {
  constexpr size_t kGatherSlack = 64 << 10;  // history, sampler and header sections
  for (int mode = 0; mode < 5; ++mode) {
    SCOPED_TRACE(::testing::Message() << "mode " << mode);
    SessionStore store({});
    const std::string id = MakeSession(store, mode, false);
    auto wire = Export(store, id);
    ASSERT_TRUE(wire.ok()) << wire.status();
    size_t all = 0;
    {
      SessionWireSink sink(*model_, kFingerprint, "x", wire->size());
      sink.SetAdmit([&](size_t b) {
        all += b;
        return absl::OkStatus();
      });
      for (size_t at = 0; at < wire->size(); at += 4096) {
        ASSERT_TRUE(sink.Write(std::string_view(*wire).substr(at, 4096)).ok());
      }
      EXPECT_LE(sink.held_bytes(), all + kGatherSlack);
      ASSERT_TRUE(sink.Finish().ok());
    }
    ASSERT_GT(all, 0u);
    std::printf("mode %d: stream %zu bytes, %zu admitted\n", mode, wire->size(), all);
    const size_t budget = all / 2;
    size_t admitted = 0;
    SessionWireSink sink(*model_, kFingerprint, "x", wire->size());
    sink.SetAdmit([&](size_t b) {
      if (admitted + b > budget) return absl::ResourceExhaustedError("over the test's budget");
      admitted += b;
      return absl::OkStatus();
    });
    absl::Status st;
    for (size_t at = 0; at < wire->size() && st.ok(); at += 4096) {
      st = sink.Write(std::string_view(*wire).substr(at, 4096));
      EXPECT_LE(sink.held_bytes(), admitted + kGatherSlack);
    }
    EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
    EXPECT_LE(admitted, budget);
  }
}

TEST_F(SessionWireTest, PiecesGiveTheWholeBuffersErrorForEveryFlippedByteAndTruncation) {
  SessionStore store({});
  auto wire = Export(store, MakeShortSession(store));
  ASSERT_TRUE(wire.ok());
  auto same = [&](std::string_view w, const std::string& what) {
    const absl::Status whole = ImportSessionWire(w, *model_, kFingerprint, "x").status();
    for (size_t step : {1, 5, 64}) {
      ASSERT_EQ(WriteInPieces(*model_, w, step).status(), whole) << what << " step " << step;
    }
  };
  for (size_t i = 0; i < wire->size(); ++i) {
    std::string bad = *wire;
    bad[i] ^= 0x5a;
    same(bad, "byte " + std::to_string(i));
    same(fuzz::FixWireChecksums(bad), "fixed byte " + std::to_string(i));
  }
  for (size_t n = 0; n < wire->size(); n += 3) {
    same(std::string_view(*wire).substr(0, n), "truncated " + std::to_string(n));
  }
  same(*wire + *wire, "twice");
}

}  // namespace
}  // namespace cortiq::session
