// Character classes, UTF-8 repair and NFC (core/tokenizer/unicode.h).

#include "core/tokenizer/unicode.h"

#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace cortiq::tokenizer {
namespace {

std::string Hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

std::string Utf8(char32_t cp) {
  std::string s;
  AppendUtf8(cp, &s);
  return s;
}

const std::string kFffd = "\xEF\xBF\xBD";

TEST(UnicodeTest, VersionIsRecorded) { EXPECT_STREQ(UnicodeVersion(), "14.0.0"); }

TEST(UnicodeTest, AsciiClasses) {
  // The pre-tokenizer's constexpr ASCII table assumes exactly these classes.
  for (char32_t c = 0; c < 128; ++c) {
    const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    const bool digit = c >= '0' && c <= '9';
    const bool space = c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r' || c == ' ';
    const auto code = static_cast<uint32_t>(c);
    EXPECT_EQ(IsLetter(c), letter) << code;
    EXPECT_EQ(IsNumber(c), digit) << code;
    EXPECT_EQ(IsSpace(c), space) << code;
    EXPECT_TRUE(IsNfcQuick(std::string(1, static_cast<char>(c)))) << code;
  }
}

TEST(UnicodeTest, LettersAndNumbers) {
  for (char32_t c : {U'é', U'ß', U'Ω', U'ж', U'中', U'あ', U'ア', U'한', U'ǅ' /* Lt */,
                     U'ʰ' /* Lm */, U'ا', U'क', U'ก', U'𝐀', U'𠀀'}) {
    EXPECT_TRUE(IsLetter(c)) << static_cast<uint32_t>(c);
    EXPECT_FALSE(IsNumber(c)) << static_cast<uint32_t>(c);
  }
  for (char32_t c : {U'٣', U'३', U'Ⅻ' /* Nl */, U'½' /* No */, U'²', U'𝟙', U'１'}) {
    EXPECT_TRUE(IsNumber(c)) << static_cast<uint32_t>(c);
    EXPECT_FALSE(IsLetter(c)) << static_cast<uint32_t>(c);
  }
  // Marks, symbols, punctuation, emoji: neither.
  for (char32_t c : {U'\u0301', U'\u093F', U'_', U'$', U'€', U'。', U'😀', U'\u200D', U'\uFE0F'}) {
    EXPECT_FALSE(IsLetter(c)) << static_cast<uint32_t>(c);
    EXPECT_FALSE(IsNumber(c)) << static_cast<uint32_t>(c);
  }
  EXPECT_FALSE(IsLetter(0x110000));
}

TEST(UnicodeTest, WhitespaceIsEcmaScriptBackslashS) {
  for (char32_t c : {U'\u00A0', U'\u1680', U'\u2000', U'\u200A', U'\u2028', U'\u2029', U'\u202F',
                     U'\u205F', U'\u3000', U'\uFEFF'}) {
    EXPECT_TRUE(IsSpace(c)) << static_cast<uint32_t>(c);
  }
  // U+0085 is White_Space in Unicode (Rust regex, Oniguruma) but not \s in
  // JavaScript; zero-width space is neither.
  EXPECT_FALSE(IsSpace(0x85));
  EXPECT_FALSE(IsSpace(0x200B));
  EXPECT_FALSE(IsSpace(0x180E));
}

struct SanitizeCase {
  const char* hex;
  std::string expected;
};

TEST(UnicodeTest, SanitizeReplacesMaximalSubparts) {
  const std::vector<SanitizeCase> cases = {
      {"", ""},
      {"61", "a"},
      {"c3a9", "é"},
      {"ff", kFffd},
      {"c3", kFffd},      // truncated at the end
      {"e282", kFffd},    // one subpart
      {"f09f98", kFffd},  // one subpart
      {"f09f9880", "😀"},
      {"eda080", kFffd + kFffd + kFffd},            // surrogate: ED is alone
      {"c080", kFffd + kFffd},                      // overlong lead
      {"e080af", kFffd + kFffd + kFffd},            // overlong 3-byte
      {"f4908080", kFffd + kFffd + kFffd + kFffd},  // > U+10FFFF
      {"61ff62", "a" + kFffd + "b"},
      {"e2ffac", kFffd + kFffd + kFffd},
      {"f09f9880e2", "😀" + kFffd},
      {"80808080", kFffd + kFffd + kFffd + kFffd},
      {"c328", kFffd + "("},
      {"f0288c28", kFffd + "(" + kFffd + "("},
      {"e28228", kFffd + "("},
  };
  for (const SanitizeCase& c : cases) {
    const std::string in = Hex(c.hex);
    EXPECT_EQ(SanitizeUtf8(in), c.expected) << c.hex;
    EXPECT_EQ(IsValidUtf8(in), SanitizeUtf8(in) == in) << c.hex;
    EXPECT_TRUE(IsValidUtf8(SanitizeUtf8(in))) << c.hex;
  }
}

TEST(UnicodeTest, IncompleteTail) {
  EXPECT_EQ(IncompleteUtf8TailLength(""), 0u);
  EXPECT_EQ(IncompleteUtf8TailLength("abc"), 0u);
  EXPECT_EQ(IncompleteUtf8TailLength(Hex("61c3")), 1u);
  EXPECT_EQ(IncompleteUtf8TailLength(Hex("c3a9")), 0u);
  EXPECT_EQ(IncompleteUtf8TailLength(Hex("e282")), 2u);
  EXPECT_EQ(IncompleteUtf8TailLength(Hex("f09f98")), 3u);
  EXPECT_EQ(IncompleteUtf8TailLength(Hex("f09f9880")), 0u);
  EXPECT_EQ(IncompleteUtf8TailLength(Hex("eda0")), 0u);  // can never complete
  EXPECT_EQ(IncompleteUtf8TailLength(Hex("f490")), 0u);  // > U+10FFFF
  EXPECT_EQ(IncompleteUtf8TailLength(Hex("ff")), 0u);
  EXPECT_EQ(IncompleteUtf8TailLength(Hex("9f98")), 0u);  // continuation bytes only
  EXPECT_EQ(IncompleteUtf8TailLength(Hex("e2e2")), 1u);
}

TEST(UnicodeTest, StreamingCutNeverChangesTheResult) {
  // Sanitize(prefix minus tail) + Sanitize(tail + rest) == Sanitize(all).
  std::mt19937 rng(7);
  const std::vector<uint8_t> alphabet = {0x41, 0x80, 0x9F, 0xA0, 0xBF, 0xC2, 0xC3, 0xDF, 0xE0,
                                         0xE2, 0xED, 0xEF, 0xF0, 0xF4, 0xF5, 0xFF, 0x98, 0x82};
  for (int trial = 0; trial < 20000; ++trial) {
    std::string s;
    const int n = rng() % 10;
    for (int i = 0; i < n; ++i) s.push_back(static_cast<char>(alphabet[rng() % alphabet.size()]));
    const size_t cut = n == 0 ? 0 : rng() % (n + 1);
    const std::string head = s.substr(0, cut);
    const size_t tail = IncompleteUtf8TailLength(head);
    const std::string streamed = SanitizeUtf8(head.substr(0, cut - tail)) +
                                 SanitizeUtf8(head.substr(cut - tail) + s.substr(cut));
    ASSERT_EQ(streamed, SanitizeUtf8(s));
  }
}

// A long run of combining marks of two alternating classes (a client's
// text can be one run) is ordered by class, stably, then composed: "a",
// then n x (U+0301 ccc 230, U+0316 ccc 220) is U+00E1, n x U+0316, n - 1 x
// U+0301. The run is sorted in O(n log n) now; the insertion sort before
// took seconds at 40k marks and minutes at a 1 MiB prompt's 500k.
TEST(UnicodeTest, NfcOrdersALongRunOfMarksByClass) {
  constexpr int kPairs = 20000;
  std::string in = "a";
  std::string want = "\u00E1";
  for (int i = 0; i < kPairs; ++i) in += "\u0301\u0316";
  for (int i = 0; i < kPairs; ++i) want += "\u0316";
  for (int i = 1; i < kPairs; ++i) want += "\u0301";
  EXPECT_EQ(ToNfc(in), want);
  // Starters split the runs: each is ordered on its own (b has no acute
  // composite, c does).
  EXPECT_EQ(ToNfc("b\u0301\u0316c\u0301\u0316"), "b\u0316\u0301\u0107\u0316");
}

TEST(UnicodeTest, NfcExamples) {
  EXPECT_EQ(ToNfc("e\u0301"), "\u00E9");
  EXPECT_EQ(ToNfc("\u00E9"), "\u00E9");
  EXPECT_EQ(ToNfc("\u212B"), "\u00C5");  // singleton
  EXPECT_EQ(ToNfc("\u2126"), "\u03A9");
  EXPECT_EQ(ToNfc("\u1E9B\u0323"), "\u1E9B\u0323");   // UAX #15 example
  EXPECT_EQ(ToNfc("e\u0301\u0323"), "\u1EB9\u0301");  // reordered, then composed
  EXPECT_EQ(ToNfc("\u0344"), "\u0308\u0301");         // non-starter decomposition
  EXPECT_EQ(ToNfc("\u0958"), "\u0915\u093C");         // composition exclusion
  EXPECT_EQ(ToNfc("\u1100\u1161\u11A8"), "\uAC01");   // Hangul L V T
  EXPECT_EQ(ToNfc("\uAC00\u11A8"), "\uAC01");         // Hangul LV + T
  EXPECT_EQ(ToNfc("\u0CBF\u0CD5"), "\u0CC0");         // starter + starter
  EXPECT_EQ(ToNfc("a\u0301b\u0301"), "\u00E1b\u0301");
  EXPECT_EQ(ToNfc("\u0301"), "\u0301");
  EXPECT_EQ(ToNfc("abc"), "abc");
  EXPECT_EQ(ToNfc(""), "");
  EXPECT_FALSE(IsNfcQuick("e\u0301"));
  EXPECT_TRUE(IsNfcQuick("caf\u00E9 \u4E2D\u6587 \U0001F600"));
}

TEST(UnicodeTest, NfcMatchesPythonOnGeneratedCases) {
  std::ifstream in(CORTIQ_SOURCE_DIR "/tests/tokenizer/data/nfc_cases.jsonl");
  ASSERT_TRUE(in) << "tests/tokenizer/data/nfc_cases.jsonl missing";
  std::string line;
  int cases = 0;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    const std::string input = j.at("in").get<std::string>();
    const std::string expected = j.at("nfc").get<std::string>();
    ASSERT_EQ(ToNfc(input), expected) << line;
    ASSERT_EQ(ToNfc(expected), expected) << line;  // idempotent
    if (IsNfcQuick(input)) {
      ASSERT_EQ(input, expected) << line;
    }
    ++cases;
  }
  EXPECT_GT(cases, 5000);
}

TEST(UnicodeTest, NfcSegmentsMatchWholeString) {
  // Segment-wise normalization equals one pass over the whole text.
  std::mt19937 rng(11);
  const std::vector<char32_t> pool = {U'a',      U'e',      U' ',      U'\u0301', U'\u0323',
                                      U'\u0308', U'\u00E9', U'\u1100', U'\u1161', U'\u11A8',
                                      U'\uAC00', U'\u212B', U'\u0344', U'x',      U'\u4E2D'};
  for (int trial = 0; trial < 2000; ++trial) {
    std::string s;
    const int n = rng() % 12;
    for (int i = 0; i < n; ++i) s += Utf8(pool[rng() % pool.size()]);
    const std::string once = ToNfc(s);
    EXPECT_EQ(ToNfc(once), once);
    // NFC never acts across a safe character: text may be split before one.
    EXPECT_EQ(ToNfc(s + "x" + s), once + ToNfc("x" + s));
  }
}

}  // namespace
}  // namespace cortiq::tokenizer
