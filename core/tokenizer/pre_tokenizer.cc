// Pre-tokenizer regex matchers. See pre_tokenizer.h for the patterns; each
// branch below names the alternative it implements and why backtracking
// yields the span it returns.

#include "core/tokenizer/pre_tokenizer.h"

#include "core/tokenizer/unicode.h"

namespace cortiq::tokenizer {
namespace {

constexpr std::string_view kQwen2Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr std::string_view kLlama3Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr std::string_view kGpt2Regex =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

using internal::kFlagLetter;
using internal::kFlagNumber;
using internal::kFlagSpace;

// Flags of the ASCII characters, so the common case needs no table walk
// (constexpr, hence usable during static initialization; a unit test checks
// it against the generated table).
struct AsciiFlags {
  uint8_t flags[128] = {};
  constexpr AsciiFlags() {
    for (int c = 'A'; c <= 'Z'; ++c) flags[c] = kFlagLetter;
    for (int c = 'a'; c <= 'z'; ++c) flags[c] = kFlagLetter;
    for (int c = '0'; c <= '9'; ++c) flags[c] = kFlagNumber;
    for (int c : {9, 10, 11, 12, 13, 32}) flags[c] = kFlagSpace;  // \t \n \v \f \r ' '
  }
};
constexpr AsciiFlags kAscii;

// One decoded character.
struct Char {
  char32_t cp;
  uint8_t flags;
  uint8_t len;
};

inline Char At(std::string_view text, size_t pos) {
  const auto b = static_cast<unsigned char>(text[pos]);
  if (b < 0x80) return {b, kAscii.flags[b], 1};
  size_t len = 0;
  const char32_t cp = DecodeUtf8Valid(text.data() + pos, &len);
  return {cp, CodePointFlags(cp), static_cast<uint8_t>(len)};
}

inline bool IsCrLf(char32_t cp) { return cp == '\r' || cp == '\n'; }
// [^\s\p{L}\p{N}]
inline bool IsOther(uint8_t flags) {
  return (flags & (kFlagSpace | kFlagLetter | kFlagNumber)) == 0;
}

// End of the run of characters at pos whose flags intersect mask.
inline size_t RunEnd(std::string_view text, size_t pos, uint8_t mask) {
  while (pos < text.size()) {
    const Char c = At(text, pos);
    if (!(c.flags & mask)) break;
    pos += c.len;
  }
  return pos;
}

// End of the run of [^\s\p{L}\p{N}] characters at pos.
inline size_t OtherRunEnd(std::string_view text, size_t pos) {
  while (pos < text.size()) {
    const Char c = At(text, pos);
    if (!IsOther(c.flags)) break;
    pos += c.len;
  }
  return pos;
}

// Length of the contraction ('s 't 're 've 'm 'll 'd) at text[pos] == '\'',
// 0 when there is none. fold: ASCII case-insensitive.
inline size_t ContractionLength(std::string_view text, size_t pos, bool fold) {
  auto lower = [&](size_t i) -> char {
    if (i >= text.size()) return 0;
    const char c = text[i];
    return (fold && c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
  };
  const char a = lower(pos + 1);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  const char b = lower(pos + 2);
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

// The whitespace alternatives shared by both patterns, at a whitespace
// character: \s+(?!\S) then \s+.
inline size_t MatchSpaceRun(std::string_view text, size_t pos) {
  // \s+ runs greedily to the end of the run; (?!\S) holds there only at the
  // end of text. Otherwise backtracking gives up one character, where the
  // lookahead sees whitespace and holds, provided one character remains.
  size_t last_start = pos;
  size_t end = pos;
  while (end < text.size()) {
    const Char c = At(text, end);
    if (!(c.flags & kFlagSpace)) break;
    last_start = end;
    end += c.len;
  }
  if (end == text.size()) return end - pos;
  if (last_start > pos) return last_start - pos;
  return end - pos;  // \s+ : a single whitespace character before \S
}

// kQwen2 (max_digits 1) and kLlama3 (max_digits 3): the two differ only in
// the \p{N} alternative, \p{N} versus \p{N}{1,3}.
size_t MatchQwen2Family(std::string_view text, size_t pos, int max_digits) {
  const Char c = At(text, pos);
  // (?i:'s|'t|'re|'ve|'m|'ll|'d)
  if (c.cp == '\'') {
    if (const size_t n = ContractionLength(text, pos, /*fold=*/true)) return n;
  }
  // [^\r\n\p{L}\p{N}]?\p{L}+ : a letter run, optionally preceded by one
  // character that is none of \r \n \p{L} \p{N} (a space, punctuation, ...).
  if (c.flags & kFlagLetter) return RunEnd(text, pos, kFlagLetter) - pos;
  if (!(c.flags & kFlagNumber) && !IsCrLf(c.cp)) {
    const size_t next = pos + c.len;
    if (next < text.size() && (At(text, next).flags & kFlagLetter)) {
      return RunEnd(text, next, kFlagLetter) - pos;
    }
  }
  // \p{N} or \p{N}{1,3}: greedy, up to max_digits digit-like characters.
  if (c.flags & kFlagNumber) {
    size_t end = pos + c.len;
    for (int n = 1; n < max_digits && end < text.size(); ++n) {
      const Char d = At(text, end);
      if (!(d.flags & kFlagNumber)) break;
      end += d.len;
    }
    return end - pos;
  }
  // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
  {
    const size_t start = c.cp == ' ' ? pos + 1 : pos;
    if (start < text.size() && IsOther(At(text, start).flags)) {
      size_t end = OtherRunEnd(text, start);
      while (end < text.size() && IsCrLf(static_cast<unsigned char>(text[end]))) ++end;
      return end - pos;
    }
  }
  // Only whitespace remains (c is \s here).
  // \s*[\r\n]+ : \s* backtracks from the end of the whitespace run to the
  // last \r or \n in it, which [\r\n]+ then takes; the match ends there.
  {
    size_t end = pos;
    size_t after_last_crlf = 0;
    while (end < text.size()) {
      const Char w = At(text, end);
      if (!(w.flags & kFlagSpace)) break;
      end += w.len;
      if (IsCrLf(w.cp)) after_last_crlf = end;
    }
    if (after_last_crlf != 0) return after_last_crlf - pos;
  }
  return MatchSpaceRun(text, pos);
}

size_t MatchGpt2(std::string_view text, size_t pos) {
  const Char c = At(text, pos);
  // 's|'t|'re|'ve|'m|'ll|'d (case-sensitive)
  if (c.cp == '\'') {
    if (const size_t n = ContractionLength(text, pos, /*fold=*/false)) return n;
  }
  // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': with the optional space
  // taken when it is followed by a character of the class.
  const size_t start = c.cp == ' ' ? pos + 1 : pos;
  if (start < text.size()) {
    const Char d = At(text, start);
    if (d.flags & kFlagLetter) return RunEnd(text, start, kFlagLetter) - pos;
    if (d.flags & kFlagNumber) return RunEnd(text, start, kFlagNumber) - pos;
    if (IsOther(d.flags)) return OtherRunEnd(text, start) - pos;
  }
  return MatchSpaceRun(text, pos);
}

}  // namespace

std::string_view PreTokenizerRegex(PreTokenizerPattern pattern) {
  switch (pattern) {
    case PreTokenizerPattern::kQwen2:
      return kQwen2Regex;
    case PreTokenizerPattern::kLlama3:
      return kLlama3Regex;
    case PreTokenizerPattern::kGpt2:
      break;
  }
  return kGpt2Regex;
}

size_t MatchPreToken(PreTokenizerPattern pattern, std::string_view text, size_t pos) {
  switch (pattern) {
    case PreTokenizerPattern::kQwen2:
      return MatchQwen2Family(text, pos, /*max_digits=*/1);
    case PreTokenizerPattern::kLlama3:
      return MatchQwen2Family(text, pos, /*max_digits=*/3);
    case PreTokenizerPattern::kGpt2:
      break;
  }
  return MatchGpt2(text, pos);
}

std::vector<std::string> PreTokenize(PreTokenizerPattern pattern, std::string_view text) {
  std::vector<std::string> pieces;
  ForEachPreToken(pattern, text, [&](std::string_view piece) { pieces.emplace_back(piece); });
  return pieces;
}

}  // namespace cortiq::tokenizer
