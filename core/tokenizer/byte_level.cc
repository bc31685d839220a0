// ByteLevel alphabet tables. See byte_level.h.

#include "core/tokenizer/byte_level.h"

#include <array>

#include "core/tokenizer/unicode.h"

namespace cortiq::tokenizer {
namespace {

struct Tables {
  std::array<char32_t, 256> char_of{};
  std::array<char, 256 * 2> utf8{};  // 2 bytes per entry (ASCII uses 1)
  std::array<uint8_t, 256> utf8_len{};
  std::array<int16_t, 324> byte_of{};  // code point (< 0x144) -> byte, -1 if none

  Tables() {
    byte_of.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable =
          (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      char_of[b] = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      byte_of[char_of[b]] = static_cast<int16_t>(b);
      std::string s;
      AppendUtf8(char_of[b], &s);
      utf8_len[b] = static_cast<uint8_t>(s.size());
      for (size_t i = 0; i < s.size(); ++i) utf8[b * 2 + i] = s[i];
    }
  }
};

const Tables& GetTables() {
  static const Tables* tables = new Tables();
  return *tables;
}

}  // namespace

char32_t ByteLevelCharOf(uint8_t b) { return GetTables().char_of[b]; }

std::string_view ByteLevelUtf8Of(uint8_t b) {
  const Tables& t = GetTables();
  return std::string_view(t.utf8.data() + b * 2, t.utf8_len[b]);
}

std::optional<uint8_t> ByteOfByteLevelChar(char32_t cp) {
  const Tables& t = GetTables();
  if (cp >= t.byte_of.size() || t.byte_of[cp] < 0) return std::nullopt;
  return static_cast<uint8_t>(t.byte_of[cp]);
}

std::string ByteLevelEncode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out.append(ByteLevelUtf8Of(static_cast<uint8_t>(c)));
  return out;
}

std::string ByteLevelDecode(std::string_view byte_level_utf8) {
  std::string out;
  out.reserve(byte_level_utf8.size());
  const std::string valid = SanitizeUtf8(byte_level_utf8);
  for (size_t i = 0; i < valid.size();) {
    size_t len = 0;
    const char32_t cp = DecodeUtf8Valid(valid.data() + i, &len);
    if (auto b = ByteOfByteLevelChar(cp)) {
      out.push_back(static_cast<char>(*b));
    } else {
      out.append(valid, i, len);
    }
    i += len;
  }
  return out;
}

}  // namespace cortiq::tokenizer
