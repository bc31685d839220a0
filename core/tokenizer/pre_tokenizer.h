// Hand-written matchers for the three pre-tokenizer regexes byte-level BPE
// tokenizers use, with exactly the semantics of a backtracking regex engine
// (ECMAScript, as in the JS reference encoder) scanning with the g flag:
// ordered alternation, greedy quantifiers, and the \s+(?!\S) lookahead.
//
//   kQwen2: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|
//           ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//           (Qwen2 / Qwen2.5 / Qwen3 Split pre-tokenizer, behavior Isolated;
//           llama.cpp's pre-tokenizer "qwen2")
//   kLlama3: kQwen2 with \p{N}{1,3} in place of \p{N}: digits in groups of
//           up to three (Llama 3's Split pre-tokenizer; llama.cpp's
//           "llama-bpe" / "llama3")
//   kGpt2:  's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|
//           \s+(?!\S)|\s+
//           (ByteLevel pre-tokenizer with use_regex=true; llama.cpp's "gpt-2")
//
// \p{L}, \p{N} and \s come from unicode.h (\s is ECMAScript's). The (?i:...)
// contractions fold ASCII case only ('S, 'LL, 'Re, ...), as the JS reference
// does.
//
// Contract: pure functions; thread-safe. Input must be valid UTF-8.
//
// Example:
//   ForEachPreToken(PreTokenizerPattern::kQwen2, "Hello world",
//                   [](std::string_view piece) { ... });  // "Hello", " world"
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace cortiq::tokenizer {

enum class PreTokenizerPattern {
  kQwen2,
  kGpt2,
  kLlama3,
};

// The regex source of a pattern, exactly as tokenizer.json spells it.
std::string_view PreTokenizerRegex(PreTokenizerPattern pattern);

// Byte length of the match starting at text[pos] (pos < text.size(), on a
// character boundary). Every character is matched by some alternative of every
// pattern, so the result is always >= 1 and the pieces tile the text.
size_t MatchPreToken(PreTokenizerPattern pattern, std::string_view text, size_t pos);

// Calls fn(piece) for each consecutive piece of text, left to right.
template <typename Fn>
void ForEachPreToken(PreTokenizerPattern pattern, std::string_view text, Fn&& fn) {
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t len = MatchPreToken(pattern, text, pos);
    fn(text.substr(pos, len));
    pos += len;
  }
}

// Convenience for tests: the pieces as strings.
std::vector<std::string> PreTokenize(PreTokenizerPattern pattern, std::string_view text);

}  // namespace cortiq::tokenizer
