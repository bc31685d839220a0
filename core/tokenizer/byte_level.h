// GPT-2 ByteLevel alphabet: every byte maps to one printable code point so
// that BPE tokens are strings without spaces or control characters (bytes
// '!'..'~', 0xA1..0xAC and 0xAE..0xFF map to themselves, the other 68 bytes to
// U+0100.. in byte order; e.g. ' ' -> 'Ġ' U+0120, '\n' -> 'Ċ' U+010A).
//
// Contract: pure functions over constant tables; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace cortiq::tokenizer {

// The code point standing for byte b.
char32_t ByteLevelCharOf(uint8_t b);

// The UTF-8 encoding of ByteLevelCharOf(b) (2 bytes at most).
std::string_view ByteLevelUtf8Of(uint8_t b);

// The byte a ByteLevel code point stands for; nullopt for any other code point.
std::optional<uint8_t> ByteOfByteLevelChar(char32_t cp);

// Maps raw bytes to their ByteLevel string (what tokenizer.json vocab keys
// look like).
std::string ByteLevelEncode(std::string_view bytes);

// Maps a ByteLevel string back to bytes. A code point outside the alphabet is
// kept as its own UTF-8 bytes (the vocab of a well-formed file has none).
std::string ByteLevelDecode(std::string_view byte_level_utf8);

}  // namespace cortiq::tokenizer
