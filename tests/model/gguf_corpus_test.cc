// The GGUF fuzz corpus (tests/fuzz/corpus/gguf) as a regression suite in the
// normal build: every file, and truncations and byte flips of each, goes
// through the fuzz target's calls (tests/fuzz/gguf_fuzz_util.h) with no
// finding; files named valid_* (tests/fuzz/make_gguf_corpus.cc) parse, and
// valid_model_* open as a Checkpoint and load as a Transformer. Files a
// campaign turns up (crash-*, found_*) are added to the corpus and run here.
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/common/corpus_util.h"
#include "tests/fuzz/gguf_fuzz_util.h"

namespace cortiq::model {
namespace {

using cortiq::testing::CorpusFile;

std::vector<CorpusFile> ReadCorpus() {
  return cortiq::testing::ReadCorpusDir(CORTIQ_SOURCE_DIR "/tests/fuzz/corpus/gguf");
}

std::string TempPath() {
  return absl::StrCat(::testing::TempDir(), "/cortiq_gguf_corpus_", getpid(), ".gguf");
}

TEST(GgufCorpusTest, EveryFileRunsCleanAndTheValidOnesOpen) {
  const std::vector<CorpusFile> files = ReadCorpus();
  ASSERT_GE(files.size(), 10u);
  size_t models = 0;
  for (const CorpusFile& f : files) {
    SCOPED_TRACE(f.name);
    fuzz::GgufRun run;
    const absl::Status s = fuzz::RunGgufInput(f.bytes, TempPath(), &run);
    EXPECT_TRUE(s.ok()) << s;
    if (f.name.rfind("valid_", 0) == 0) {
      EXPECT_TRUE(run.parsed);
    }
    if (f.name.rfind("valid_model_", 0) == 0) {
      ++models;
      EXPECT_TRUE(run.config && run.opened && run.loaded);
    }
  }
  EXPECT_GE(models, 7u);
}

// Damaged copies of every valid file: cut at 97 points, and one byte set to
// 0x00 / 0xff / +1 at 97 points. Refused or accepted, never a finding.
TEST(GgufCorpusTest, TruncationsAndByteFlipsRunClean) {
  const std::string tmp = TempPath();
  for (const CorpusFile& f : ReadCorpus()) {
    if (f.name.rfind("valid_", 0) != 0 || f.bytes.empty()) continue;
    SCOPED_TRACE(f.name);
    const size_t n = f.bytes.size();
    for (size_t i = 0; i < 97; ++i) {
      const size_t at = i * n / 97;
      absl::Status s = fuzz::RunGgufInput(std::string_view(f.bytes).substr(0, at), tmp);
      ASSERT_TRUE(s.ok()) << "cut at " << at << ": " << s;
      for (int kind = 0; kind < 3; ++kind) {
        std::string b = f.bytes;
        b[at] = kind == 0 ? '\0' : kind == 1 ? '\xff' : static_cast<char>(b[at] + 1);
        s = fuzz::RunGgufInput(b, tmp);
        ASSERT_TRUE(s.ok()) << "byte " << at << " kind " << kind << ": " << s;
      }
    }
  }
}

}  // namespace
}  // namespace cortiq::model
