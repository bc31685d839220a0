// IncrementalDetokenizer (core/tokenizer/detokenizer.h) on the byte-level
// tokenizer, where id b is byte b, so any split of a character is easy to
// produce.

#include "core/tokenizer/detokenizer.h"

#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/tokenizer/tokenizer.h"
#include "core/tokenizer/unicode.h"
#include "gtest/gtest.h"

namespace cortiq::tokenizer {
namespace {

const std::string kFffd = "\uFFFD";

Tokenizer ByteTokenizer() {
  auto tok = Tokenizer::FromJson(MakeByteLevelTokenizerJson(), "byte-level");
  EXPECT_TRUE(tok.ok()) << tok.status();
  return *std::move(tok);
}

std::vector<int32_t> BytesToIds(std::string_view bytes) {
  std::vector<int32_t> ids;
  for (char c : bytes) ids.push_back(static_cast<uint8_t>(c));
  return ids;
}

// Push outputs, one per id, then the Flush output.
std::vector<std::string> Stream(IncrementalDetokenizer& detok, const std::vector<int32_t>& ids) {
  std::vector<std::string> out;
  for (int32_t id : ids) out.push_back(detok.Push(id));
  out.push_back(detok.Flush());
  return out;
}

using Outputs = std::vector<std::string>;

TEST(DetokenizerTest, AsciiPassesThrough) {
  IncrementalDetokenizer detok(ByteTokenizer());
  EXPECT_EQ(Stream(detok, BytesToIds("hi!")), (Outputs{"h", "i", "!", ""}));
}

TEST(DetokenizerTest, MultiByteCharactersWaitForTheirLastByte) {
  IncrementalDetokenizer detok(ByteTokenizer());
  EXPECT_EQ(Stream(detok, BytesToIds("\u00E9")), (Outputs{"", "\u00E9", ""}));
  EXPECT_EQ(Stream(detok, BytesToIds("\u4E2D")), (Outputs{"", "", "\u4E2D", ""}));
  EXPECT_EQ(Stream(detok, BytesToIds("\U0001F600")), (Outputs{"", "", "", "\U0001F600", ""}));
  EXPECT_EQ(detok.Push(0xF0), "");
  EXPECT_EQ(detok.pending_bytes(), "\xF0");
  EXPECT_EQ(detok.Push(0x9F), "");
  EXPECT_EQ(detok.pending_bytes(), "\xF0\x9F");
}

TEST(DetokenizerTest, EmojiSequencesAndSkinTones) {
  const std::string family = "\U0001F468\u200D\U0001F469\u200D\U0001F467 \U0001F44D\U0001F3FD";
  IncrementalDetokenizer detok(ByteTokenizer());
  std::string joined;
  for (int32_t id : BytesToIds(family)) {
    const std::string piece = detok.Push(id);
    EXPECT_TRUE(IsValidUtf8(piece));
    joined += piece;
  }
  joined += detok.Flush();
  EXPECT_EQ(joined, family);
}

TEST(DetokenizerTest, InvalidSequencesBecomeReplacementCharacters) {
  IncrementalDetokenizer detok(ByteTokenizer());
  EXPECT_EQ(Stream(detok, {0xFF}), (Outputs{kFffd, ""}));
  EXPECT_EQ(Stream(detok, {0xC3, 'A'}), (Outputs{"", kFffd + "A", ""}));
  EXPECT_EQ(Stream(detok, {0xE2, 0x82}), (Outputs{"", "", kFffd}));  // cut at the end
  EXPECT_EQ(Stream(detok, {0xED, 0xA0, 0x80}), (Outputs{"", kFffd + kFffd, kFffd, ""}));
  EXPECT_EQ(Stream(detok, {0xE2, 0xF0, 0x9F, 0x98, 0x80}),
            (Outputs{"", kFffd, "", "", "\U0001F600", ""}));
  EXPECT_EQ(Stream(detok, {0x80, 0x80}), (Outputs{kFffd, kFffd, ""}));
}

TEST(DetokenizerTest, SpecialTokensAndUnknownIds) {
  IncrementalDetokenizer detok(ByteTokenizer());
  EXPECT_EQ(detok.Push(257), "<|im_start|>");
  EXPECT_EQ(detok.Push(0xC3), "");
  EXPECT_EQ(detok.Push(-1), "");  // unknown ids are skipped and keep the pending bytes
  EXPECT_EQ(detok.Push(100000), "");
  EXPECT_EQ(detok.pending_bytes(), "\xC3");
  EXPECT_EQ(detok.Push(258), kFffd + "<|im_end|>");
  EXPECT_EQ(detok.Flush(), "");
}

TEST(DetokenizerTest, MatchesDecodeOnRandomStreams) {
  const Tokenizer tok = ByteTokenizer();
  std::mt19937 rng(17);
  // Mostly bytes of real characters, some garbage, some special tokens.
  const std::string text = "a\u00E9\u4E2D\U0001F600\u200D\u0301 ";
  for (int trial = 0; trial < 5000; ++trial) {
    std::vector<int32_t> ids;
    const int n = rng() % 24;
    for (int i = 0; i < n; ++i) {
      const int kind = rng() % 10;
      if (kind < 7) {
        ids.push_back(static_cast<uint8_t>(text[rng() % text.size()]));
      } else if (kind < 9) {
        ids.push_back(static_cast<int32_t>(rng() % 256));
      } else {
        ids.push_back(256 + static_cast<int32_t>(rng() % 3));
      }
    }
    IncrementalDetokenizer detok(tok);
    std::string streamed;
    for (int32_t id : ids) {
      const std::string piece = detok.Push(id);
      ASSERT_TRUE(IsValidUtf8(piece));
      ASSERT_LE(detok.pending_bytes().size(), 3u);
      streamed += piece;
    }
    streamed += detok.Flush();
    ASSERT_EQ(streamed, tok.Decode(ids));
  }
}

TEST(DetokenizerTest, PendingStateMigratesBetweenDetokenizers) {
  const Tokenizer tok = ByteTokenizer();
  std::mt19937 rng(23);
  const std::vector<int32_t> ids = BytesToIds("x\u00E9\u4E2D\U0001F600y\xE2\x82z");
  const std::string expected = tok.Decode(ids);
  for (size_t cut = 0; cut <= ids.size(); ++cut) {
    IncrementalDetokenizer first(tok);
    std::string out;
    for (size_t i = 0; i < cut; ++i) out += first.Push(ids[i]);
    const std::string exported(first.pending_bytes());
    // "Another server": a detokenizer built from a different Tokenizer object
    // loaded from the same tokenizer.json.
    IncrementalDetokenizer second(ByteTokenizer());
    ASSERT_TRUE(second.RestorePending(exported).ok());
    for (size_t i = cut; i < ids.size(); ++i) out += second.Push(ids[i]);
    out += second.Flush();
    EXPECT_EQ(out, expected) << "cut at " << cut;
  }
}

TEST(DetokenizerTest, RestoreRejectsWhatCannotBePending) {
  IncrementalDetokenizer detok(ByteTokenizer());
  for (const std::string bad :
       {"\x80", "a", "\xC3\xA9", "abcd", "\xED\xA0", "\xF5", "\xF0\x9F\x98\x80"}) {
    EXPECT_FALSE(detok.RestorePending(bad).ok()) << bad.size();
    EXPECT_EQ(detok.pending_bytes(), "");  // unchanged
  }
  for (const std::string good : {"", "\xC3", "\xE2\x82", "\xF0\x9F\x98"}) {
    EXPECT_TRUE(detok.RestorePending(good).ok());
    EXPECT_EQ(detok.pending_bytes(), good);
  }
  detok.Reset();
  EXPECT_EQ(detok.pending_bytes(), "");
}

TEST(DetokenizerTest, OutlivesTheTokenizerItWasBuiltFrom) {
  std::optional<IncrementalDetokenizer> detok;
  {
    Tokenizer tok = ByteTokenizer();
    detok.emplace(tok);
  }
  EXPECT_EQ(detok->Push('o'), "o");
  EXPECT_EQ(detok->Push(0xC3), "");
  EXPECT_EQ(detok->Push(0xA9), "\u00E9");
}

TEST(DetokenizerTest, PushToAppends) {
  IncrementalDetokenizer detok(ByteTokenizer());
  std::string out = "> ";
  for (int32_t id : BytesToIds("\u00E9t\u00E9")) detok.PushTo(id, &out);
  EXPECT_EQ(out, "> \u00E9t\u00E9");
}

}  // namespace
}  // namespace cortiq::tokenizer
