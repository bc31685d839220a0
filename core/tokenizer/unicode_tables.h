// Generated Unicode tables (core/tokenizer/unicode_tables.cc, written by
// tools/tokenizer/gen_unicode_tables.py from Python's unicodedata; the version
// is kUnicodeVersion). Internal to the tokenizer: use core/tokenizer/unicode.h.
//
// Contract: immutable constant data; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cortiq::tokenizer::internal {

inline constexpr int kFlagsShift = 7;         // stage-2 block = 128 code points
inline constexpr uint8_t kFlagLetter = 1;     // \p{L}
inline constexpr uint8_t kFlagNumber = 2;     // \p{N}
inline constexpr uint8_t kFlagSpace = 4;      // ECMAScript \s
inline constexpr uint8_t kFlagNfcUnsafe = 8;  // may change / interact under NFC

struct CombiningClassEntry {
  char32_t code_point;
  uint8_t ccc;  // canonical combining class, never 0 in the table
};

struct DecompositionEntry {
  char32_t code_point;
  uint32_t offset;  // into kDecompositionPool
  uint32_t length;  // full canonical decomposition length
};

struct CompositionEntry {
  uint64_t key;  // first << 21 | second
  char32_t composite;
};

extern const char kUnicodeVersion[];
extern const uint16_t kFlagsStage1[0x110000 >> kFlagsShift];
extern const uint8_t kFlagsStage2[];
extern const CombiningClassEntry kCombiningClasses[];
extern const DecompositionEntry kDecompositions[];
extern const char32_t kDecompositionPool[];
extern const CompositionEntry kCompositions[];
extern const size_t kNumCombiningClasses;
extern const size_t kNumDecompositions;
extern const size_t kNumCompositions;

}  // namespace cortiq::tokenizer::internal
