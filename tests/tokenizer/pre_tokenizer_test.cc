// The hand-written pre-tokenizer regexes (core/tokenizer/pre_tokenizer.h):
// one expectation per alternative and per backtracking subtlety. Expected
// splits follow ECMAScript regex semantics (the JS reference).

#include "core/tokenizer/pre_tokenizer.h"

#include <random>
#include <string>
#include <vector>

#include "core/tokenizer/unicode.h"
#include "gtest/gtest.h"

namespace cortiq::tokenizer {
namespace {

using Pieces = std::vector<std::string>;

Pieces Qwen(std::string_view text) { return PreTokenize(PreTokenizerPattern::kQwen2, text); }
Pieces Gpt2(std::string_view text) { return PreTokenize(PreTokenizerPattern::kGpt2, text); }
Pieces Llama3(std::string_view text) { return PreTokenize(PreTokenizerPattern::kLlama3, text); }

TEST(PreTokenizerTest, QwenContractionsFoldAsciiCase) {
  EXPECT_EQ(Qwen("it's"), (Pieces{"it", "'s"}));
  EXPECT_EQ(Qwen("IT'S"), (Pieces{"IT", "'S"}));
  EXPECT_EQ(Qwen("we'Re"), (Pieces{"we", "'Re"}));
  EXPECT_EQ(Qwen("we'rE"), (Pieces{"we", "'rE"}));
  EXPECT_EQ(Qwen("they'LL"), (Pieces{"they", "'LL"}));
  EXPECT_EQ(Qwen("I'M"), (Pieces{"I", "'M"}));
  EXPECT_EQ(Qwen("you'VE'd"), (Pieces{"you", "'VE", "'d"}));
  // The contraction alternative comes first, even when a longer match exists.
  EXPECT_EQ(Qwen("'sorry"), (Pieces{"'s", "orry"}));
  EXPECT_EQ(Qwen("'Tis"), (Pieces{"'T", "is"}));
  // No contraction: the apostrophe prefixes the letters.
  EXPECT_EQ(Qwen("'hello"), (Pieces{"'hello"}));
  EXPECT_EQ(Qwen("'x"), (Pieces{"'x"}));
  // Long s is not folded to s (JS reference); it is a letter.
  EXPECT_EQ(Qwen("'\u017F"), (Pieces{"'\u017F"}));
  // Curly apostrophe is punctuation, not a contraction.
  EXPECT_EQ(Qwen("it\u2019s"), (Pieces{"it", "\u2019s"}));
}

TEST(PreTokenizerTest, QwenLettersWithOptionalPrefix) {
  EXPECT_EQ(Qwen("Hello world"), (Pieces{"Hello", " world"}));
  EXPECT_EQ(Qwen("(hello"), (Pieces{"(hello"}));
  EXPECT_EQ(Qwen("\thello"), (Pieces{"\thello"}));
  EXPECT_EQ(Qwen("\u00A0word"), (Pieces{"\u00A0word"}));
  EXPECT_EQ(Qwen("\nword"), (Pieces{"\n", "word"}));  // \r \n never prefix letters
  EXPECT_EQ(Qwen("\r\nword"), (Pieces{"\r\n", "word"}));
  EXPECT_EQ(Qwen("1abc"), (Pieces{"1", "abc"}));  // nor do digits
  EXPECT_EQ(Qwen("\u4E2D\u6587abc"), (Pieces{"\u4E2D\u6587abc"}));
  EXPECT_EQ(Qwen("e\u0301t\u00E9"), (Pieces{"e", "\u0301t\u00E9"}));  // marks are not \p{L}
}

TEST(PreTokenizerTest, QwenDigitsOneByOne) {
  EXPECT_EQ(Qwen("12345"), (Pieces{"1", "2", "3", "4", "5"}));
  EXPECT_EQ(Qwen(" 42"), (Pieces{" ", "4", "2"}));
  EXPECT_EQ(Qwen("3.14"), (Pieces{"3", ".", "1", "4"}));
  EXPECT_EQ(Qwen("\u00BD\u2167"), (Pieces{"\u00BD", "\u2167"}));
}

TEST(PreTokenizerTest, QwenPunctuationWithTrailingNewlines) {
  EXPECT_EQ(Qwen("Hi!!!"), (Pieces{"Hi", "!!!"}));
  EXPECT_EQ(Qwen("a !!\n\nb"), (Pieces{"a", " !!\n\n", "b"}));
  EXPECT_EQ(Qwen("x.\r\n\r\ny"), (Pieces{"x", ".\r\n\r\n", "y"}));
  EXPECT_EQ(Qwen("a .\n \nb"), (Pieces{"a", " .\n", " \n", "b"}));
  EXPECT_EQ(Qwen("  ..."), (Pieces{" ", " ..."}));
  EXPECT_EQ(Qwen("\U0001F600\U0001F600 ok"), (Pieces{"\U0001F600\U0001F600", " ok"}));
}

TEST(PreTokenizerTest, QwenWhitespaceRuns) {
  // \s*[\r\n]+ ends at the last newline of the whitespace run.
  EXPECT_EQ(Qwen("a  \n\n  b"), (Pieces{"a", "  \n\n", " ", " b"}));
  EXPECT_EQ(Qwen("  \n\n  x  "), (Pieces{"  \n\n", " ", " x", "  "}));
  EXPECT_EQ(Qwen("\n \n"), (Pieces{"\n \n"}));
  // \s+(?!\S) leaves one space for the next word; at the end it takes all.
  EXPECT_EQ(Qwen("a   b"), (Pieces{"a", "  ", " b"}));
  EXPECT_EQ(Qwen("a   "), (Pieces{"a", "   "}));
  EXPECT_EQ(Qwen("   "), (Pieces{"   "}));
  // A single whitespace before a digit or a newline-less symbol run.
  EXPECT_EQ(Qwen("a\t1"), (Pieces{"a", "\t", "1"}));
  EXPECT_EQ(Qwen("a  1"), (Pieces{"a", " ", " ", "1"}));
  EXPECT_EQ(Qwen("a \t!"), (Pieces{"a", " ", "\t", "!"}));
  EXPECT_EQ(Qwen("a\u3000\u3000b"), (Pieces{"a", "\u3000", "\u3000b"}));
  // U+FEFF is \s in JavaScript; U+0085 is not.
  EXPECT_EQ(Qwen(" \uFEFFc"), (Pieces{" ", "\uFEFFc"}));
  EXPECT_EQ(Qwen("a\u0085b"), (Pieces{"a", "\u0085b"}));
}

TEST(PreTokenizerTest, Gpt2Pattern) {
  EXPECT_EQ(Gpt2("Hello world"), (Pieces{"Hello", " world"}));
  EXPECT_EQ(Gpt2("it's IT'S"), (Pieces{"it", "'s", " IT", "'", "S"}));
  EXPECT_EQ(Gpt2("12345 678"), (Pieces{"12345", " 678"}));
  EXPECT_EQ(Gpt2("a  !!\n\nb"), (Pieces{"a", " ", " !!", "\n", "\n", "b"}));
  EXPECT_EQ(Gpt2("a   b  "), (Pieces{"a", "  ", " b", "  "}));
  EXPECT_EQ(Gpt2("(hello"), (Pieces{"(", "hello"}));
  EXPECT_EQ(Gpt2(" "), (Pieces{" "}));
}

// Llama 3's regex (llama.cpp's "llama-bpe") is Qwen2's with \p{N}{1,3}.
TEST(PreTokenizerTest, Llama3DigitsInGroupsOfUpToThree) {
  EXPECT_EQ(PreTokenizerRegex(PreTokenizerPattern::kLlama3),
            "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
            "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+");
  EXPECT_EQ(Llama3("12345"), (Pieces{"123", "45"}));
  EXPECT_EQ(Llama3("1234567"), (Pieces{"123", "456", "7"}));
  EXPECT_EQ(Llama3("123"), (Pieces{"123"}));
  EXPECT_EQ(Llama3(" 42"), (Pieces{" ", "42"}));
  EXPECT_EQ(Llama3("a  1000"), (Pieces{"a", " ", " ", "100", "0"}));
  EXPECT_EQ(Llama3("3.14159"), (Pieces{"3", ".", "141", "59"}));
  EXPECT_EQ(Llama3("abc123def"), (Pieces{"abc", "123", "def"}));
  EXPECT_EQ(Llama3("1abc"), (Pieces{"1", "abc"}));  // digits never prefix letters
  // \p{N} beyond ASCII: vulgar fraction, Roman numeral, Arabic-Indic digits.
  EXPECT_EQ(Llama3("\u00BD\u2167\u0661\u0662"), (Pieces{"\u00BD\u2167\u0661", "\u0662"}));
  // The other alternatives are Qwen2's.
  EXPECT_EQ(Llama3("I'LL go, ok?\n\n  x"),
            (Pieces{"I", "'LL", " go", ",", " ok", "?\n\n", " ", " x"}));
  EXPECT_EQ(Llama3("a   "), (Pieces{"a", "   "}));
}

// Independently of the matcher: Llama 3's pieces are Qwen2's with each run of
// single-digit pieces regrouped left to right into groups of up to three.
TEST(PreTokenizerTest, Llama3IsQwen2WithDigitRunsGrouped) {
  std::mt19937 rng(5);
  const std::vector<std::string> pool = {"a", "1",      "7",      " ",      "\n", "'", "s",
                                         "!", "\u00BD", "\u0661", "\u4E2D", "\t", "x"};
  for (int trial = 0; trial < 3000; ++trial) {
    std::string s;
    const int n = rng() % 20;
    for (int i = 0; i < n; ++i) s += pool[rng() % pool.size()];
    Pieces expected;
    int run = 0;  // digits in the current group of expected.back()
    for (const std::string& piece : Qwen(s)) {
      const bool digit = piece == "1" || piece == "7" || piece == "\u00BD" || piece == "\u0661";
      if (digit && run > 0 && run < 3) {
        expected.back() += piece;
        ++run;
      } else {
        expected.push_back(piece);
        run = digit ? 1 : 0;
      }
    }
    ASSERT_EQ(Llama3(s), expected) << "text: " << s;
  }
}

TEST(PreTokenizerTest, PiecesTileAnyText) {
  std::mt19937 rng(3);
  const std::vector<std::string> pool = {"a",      "Z",      "1",      " ",      "\t",
                                         "\n",     "\r",     "'",      "s",      "L",
                                         "!",      "\u00E9", "\u0301", "\u4E2D", "\U0001F600",
                                         "\u00A0", "\u3000", "\uFEFF", "\u0085", "\u00BD"};
  for (PreTokenizerPattern pattern :
       {PreTokenizerPattern::kQwen2, PreTokenizerPattern::kGpt2, PreTokenizerPattern::kLlama3}) {
    for (int trial = 0; trial < 3000; ++trial) {
      std::string s;
      const int n = rng() % 16;
      for (int i = 0; i < n; ++i) s += pool[rng() % pool.size()];
      std::string joined;
      ForEachPreToken(pattern, s, [&](std::string_view piece) {
        ASSERT_FALSE(piece.empty());
        ASSERT_TRUE(IsValidUtf8(piece));
        joined += piece;
      });
      ASSERT_EQ(joined, s);
    }
  }
}

}  // namespace
}  // namespace cortiq::tokenizer
