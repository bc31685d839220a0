// The wire-import fuzz corpus (tests/fuzz/corpus/wire_import) as a
// regression suite in the normal build (and under scripts/test.sh
// --sanitize): every file goes through the same calls as the fuzz target
// (tests/fuzz/wire_import_fuzz.cc) — as is and with its checksums
// recomputed — and must be refused with DATA_LOSS / FAILED_PRECONDITION or
// imported into a state that re-exports, imports again and decodes. Files
// named valid_* (written by tests/fuzz/make_corpus.cc) must import.
#include <algorithm>
#include <string>
#include <vector>

#include "core/kv/layer_kv_cache.h"
#include "core/model/transformer.h"
#include "core/session/session_store.h"
#include "core/session/session_wire.h"
#include "gtest/gtest.h"
#include "tests/common/corpus_util.h"
#include "tests/common/model_test_util.h"
#include "tests/fuzz/wire_fuzz_util.h"

namespace cortiq::session {
namespace {

using fuzz::kWireFuzzFingerprint;

using testing::CorpusFile;

std::vector<CorpusFile> ReadCorpus() {
  return testing::ReadCorpusDir(CORTIQ_SOURCE_DIR "/tests/fuzz/corpus/wire_import");
}

bool IsRefusal(const absl::Status& s) {
  return absl::IsDataLoss(s) || absl::IsFailedPrecondition(s);
}

class WireCorpusTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The shape and seed the corpus was made with (RandomCheckpointOptions{}).
    auto m = model::Transformer::Load(
        testing::TempModel(fuzz::kWireFuzzShape, math::DType::kF32, /*seed=*/1));
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = *std::move(m);
    files_ = ReadCorpus();
    ASSERT_FALSE(files_.empty());
  }

  // The fuzz target's session path; true when `wire` imported.
  bool Session(std::string_view wire) {
    auto s = ImportSessionWire(wire, *model_, kWireFuzzFingerprint, "corpus");
    if (!s.ok()) {
      EXPECT_TRUE(IsRefusal(s.status())) << s.status();
      return false;
    }
    (void)(*s)->kv().MemoryBytes();
    auto again = ExportSessionWire(**s, kWireFuzzFingerprint, {.version = 2, .f16 = false});
    EXPECT_TRUE(again.ok()) << again.status();
    if (!again.ok()) return true;
    auto copy = ImportSessionWire(*again, *model_, kWireFuzzFingerprint, "copy");
    EXPECT_TRUE(copy.ok()) << copy.status();
    // One decode step, as the engine would continue (installed in a store,
    // the model run on the lease's sequence): errors are fine.
    SessionStore store({});
    absl::StatusOr<SessionStore::Lease> lease = store.Install(*std::move(s));
    EXPECT_TRUE(lease.ok()) << lease.status();
    if (!lease.ok()) return true;
    model::SequenceKv& kv = lease->sequence();
    const auto& tokens = (*lease)->tokens();
    const int32_t next = kv.position() < tokens.size() ? tokens[kv.position()] : 1;
    model::SequenceKv* kvs[1] = {&kv};
    const int32_t ids[1] = {next};
    std::vector<float> logits(static_cast<size_t>(model_->config().vocab_size));
    model::ForwardScratch scratch;
    (void)model_->DecodeBatch(ids, kvs, scratch, logits.data());
    return true;
  }

  // The fuzz target's layer path; true when `blob` imported.
  bool Layer(std::string_view blob, kv::KvMode mode) {
    const kv::WireImportExpect expect{fuzz::kFuzzQHeads, fuzz::kFuzzMaxPositions};
    kv::LayerKvCache cache(fuzz::kFuzzKvHeads, fuzz::kFuzzHeadDim, mode);
    const absl::Status st = cache.ImportWire(blob, expect);
    if (!st.ok()) {
      EXPECT_TRUE(IsRefusal(st)) << st;
      EXPECT_EQ(cache.seq_len(), 0u);
      return false;
    }
    (void)cache.MemoryBytes();
    auto again = cache.ExportWire({});
    EXPECT_TRUE(again.ok()) << again.status();
    if (!again.ok()) return true;
    kv::LayerKvCache copy(fuzz::kFuzzKvHeads, fuzz::kFuzzHeadDim, mode);
    EXPECT_TRUE(copy.ImportWire(*again, expect).ok());
    auto third = copy.ExportWire({});
    EXPECT_TRUE(third.ok() && *third == *again) << "re-export is not stable";
    return true;
  }

  std::unique_ptr<model::Transformer> model_;
  std::vector<CorpusFile> files_;
};

TEST_F(WireCorpusTest, EveryFileIsRefusedOrImportsCleanly) {
  for (const CorpusFile& f : files_) {
    SCOPED_TRACE(f.name);
    const std::string fixed = fuzz::FixWireChecksums(f.bytes);
    for (const std::string_view in : {std::string_view(f.bytes), std::string_view(fixed)}) {
      Session(in);
      if (in.substr(0, 4) == "CQKV") {
        Layer(in, kv::KvMode::kF32);
        Layer(in, kv::KvMode::kInt8);
      }
    }
  }
}

// regress_impossible_*: streams whose checksums are all valid but whose
// state is impossible (non-finite O(1) or QSA values, a position count the
// rows disagree with). Each is refused with DATA_LOSS and installs nothing.
TEST_F(WireCorpusTest, ImpossibleStateIsRefused) {
  size_t n = 0;
  for (const CorpusFile& f : files_) {
    if (f.name.rfind("regress_impossible_", 0) != 0) continue;
    SCOPED_TRACE(f.name);
    ++n;
    EXPECT_EQ(fuzz::FixWireChecksums(f.bytes), f.bytes) << "the checksums are valid";
    auto s = session::ImportSessionWire(f.bytes, *model_, fuzz::kWireFuzzFingerprint, "x");
    EXPECT_TRUE(absl::IsDataLoss(s.status())) << s.status();
  }
  EXPECT_GE(n, 4u);
}

TEST_F(WireCorpusTest, ValidSeedsImport) {
  size_t valid = 0;
  for (const CorpusFile& f : files_) {
    if (f.name.rfind("valid_", 0) != 0) continue;
    SCOPED_TRACE(f.name);
    ++valid;
    // A seed is exactly what an exporter wrote: fixing it changes nothing.
    EXPECT_EQ(fuzz::FixWireChecksums(f.bytes), f.bytes);
    if (f.bytes.substr(0, 4) == "CQKV") {
      const bool f32 = Layer(f.bytes, kv::KvMode::kF32);
      const bool int8 = Layer(f.bytes, kv::KvMode::kInt8);
      EXPECT_TRUE(f32 != int8) << "a layer blob imports into exactly one KV mode";
    } else {
      EXPECT_TRUE(Session(f.bytes)) << "a valid session stream was refused";
    }
  }
  EXPECT_GE(valid, 10u);
}

}  // namespace
}  // namespace cortiq::session
