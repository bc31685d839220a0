// Unicode support for the tokenizer: character classes (\p{L}, \p{N}, \s),
// UTF-8 decoding / repair, and NFC normalization, all from the generated
// tables in unicode_tables.cc (Unicode version: UnicodeVersion()).
//
// Contract: free functions over immutable tables; thread-safe. Functions named
// *Valid* require valid UTF-8 (what SanitizeUtf8 returns); the others accept
// any bytes.
//
// Invalid UTF-8 policy (shared by Tokenizer::Encode, Tokenizer::Decode and the
// IncrementalDetokenizer): every maximal ill-formed subpart becomes one U+FFFD,
// exactly as the WHATWG Encoding Standard's UTF-8 decoder (JavaScript's
// TextDecoder, Rust's String::from_utf8_lossy) does.
//
// Example:
//   std::string text = SanitizeUtf8(bytes);   // now valid UTF-8
//   std::string nfc = ToNfc(text);
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/tokenizer/unicode_tables.h"

namespace cortiq::tokenizer {

inline constexpr char32_t kReplacementChar = 0xFFFD;

// The Unicode version of the generated tables, e.g. "14.0.0".
const char* UnicodeVersion();

// Flag byte (internal::kFlag*) of a code point; 0 for cp > U+10FFFF.
inline uint8_t CodePointFlags(char32_t cp) {
  if (cp >= 0x110000) return 0;
  const uint32_t block = internal::kFlagsStage1[cp >> internal::kFlagsShift];
  return internal::kFlagsStage2[(block << internal::kFlagsShift) |
                                (cp & ((1u << internal::kFlagsShift) - 1))];
}
inline bool IsLetter(char32_t cp) { return CodePointFlags(cp) & internal::kFlagLetter; }
inline bool IsNumber(char32_t cp) { return CodePointFlags(cp) & internal::kFlagNumber; }
// ECMAScript \s: TAB LF VT FF CR SP NBSP U+FEFF U+2028 U+2029 and every Zs.
inline bool IsSpace(char32_t cp) { return CodePointFlags(cp) & internal::kFlagSpace; }

// ---- UTF-8 ----------------------------------------------------------------

// Decodes the code point at p (valid UTF-8, at least one byte); *length gets
// its byte count (1..4).
inline char32_t DecodeUtf8Valid(const char* p, size_t* length) {
  const auto b0 = static_cast<unsigned char>(p[0]);
  if (b0 < 0x80) {
    *length = 1;
    return b0;
  }
  const auto b1 = static_cast<unsigned char>(p[1]) & 0x3Fu;
  if (b0 < 0xE0) {
    *length = 2;
    return ((b0 & 0x1Fu) << 6) | b1;
  }
  const auto b2 = static_cast<unsigned char>(p[2]) & 0x3Fu;
  if (b0 < 0xF0) {
    *length = 3;
    return ((b0 & 0x0Fu) << 12) | (b1 << 6) | b2;
  }
  const auto b3 = static_cast<unsigned char>(p[3]) & 0x3Fu;
  *length = 4;
  return ((b0 & 0x07u) << 18) | (b1 << 12) | (b2 << 6) | b3;
}

// Appends the UTF-8 encoding of cp (a scalar value) to *out.
void AppendUtf8(char32_t cp, std::string* out);

// True when bytes is well-formed UTF-8 (no surrogates, no overlongs).
bool IsValidUtf8(std::string_view bytes);

// Appends bytes to *out with every maximal ill-formed subpart replaced by
// U+FFFD (WHATWG decoder semantics; a truncated sequence at the end is one
// subpart).
void AppendSanitizedUtf8(std::string_view bytes, std::string* out);
inline std::string SanitizeUtf8(std::string_view bytes) {
  std::string out;
  AppendSanitizedUtf8(bytes, &out);
  return out;
}

// At bytes[pos] (pos < size): when a well-formed character starts there,
// returns its length and sets *well_formed; otherwise returns the length of the
// maximal ill-formed subpart there (>= 1: the bytes one U+FFFD replaces).
size_t NextUtf8Sequence(std::string_view bytes, size_t pos, bool* well_formed);

// Length (0..3) of the trailing bytes that form a proper prefix of a
// well-formed multi-byte sequence, i.e. what a streaming decoder must hold back
// because the next bytes may complete it. Everything before that tail decodes
// the same whatever follows.
size_t IncompleteUtf8TailLength(std::string_view bytes);

// ---- NFC ------------------------------------------------------------------

// Canonical combining class of cp (0 for starters).
uint8_t CombiningClass(char32_t cp);

// Fast check: true when no character of the valid UTF-8 text can change under
// NFC (all NFC_Quick_Check=Yes with combining class 0); then ToNfc(text)==text.
bool IsNfcQuick(std::string_view valid_utf8);

// Unicode Normalization Form C of valid UTF-8 text. Only the segments around
// characters that may change are re-normalized, so mostly-NFC text is cheap.
std::string ToNfc(std::string_view valid_utf8);
void AppendNfc(std::string_view valid_utf8, std::string* out);

}  // namespace cortiq::tokenizer
