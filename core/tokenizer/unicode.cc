// UTF-8 repair and NFC normalization over the generated tables. See unicode.h.

#include "core/tokenizer/unicode.h"

#include <algorithm>
#include <vector>

namespace cortiq::tokenizer {
namespace {

using internal::kFlagNfcUnsafe;

// Hangul syllable constants (Unicode §3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28;
constexpr char32_t kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

// Accepted range of the second byte after a lead byte (WHATWG / Unicode
// Table 3-7); {0, 0} for bytes that cannot start a multi-byte sequence.
struct LeadInfo {
  uint8_t needed;  // continuation bytes still to come
  uint8_t lower;   // bounds of the first continuation byte
  uint8_t upper;
};

inline LeadInfo Lead(unsigned char b) {
  if (b >= 0xC2 && b <= 0xDF) return {1, 0x80, 0xBF};
  if (b == 0xE0) return {2, 0xA0, 0xBF};
  if (b >= 0xE1 && b <= 0xEC) return {2, 0x80, 0xBF};
  if (b == 0xED) return {2, 0x80, 0x9F};
  if (b >= 0xEE && b <= 0xEF) return {2, 0x80, 0xBF};
  if (b == 0xF0) return {3, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {3, 0x80, 0xBF};
  if (b == 0xF4) return {3, 0x80, 0x8F};
  return {0, 0, 0};
}

// Length of the well-formed sequence at bytes[i], or 0 when bytes[i] starts an
// ill-formed subpart; *subpart gets that subpart's length (>= 1) then.
inline size_t WellFormedLength(std::string_view bytes, size_t i, size_t* subpart) {
  const auto b0 = static_cast<unsigned char>(bytes[i]);
  if (b0 < 0x80) return 1;
  const LeadInfo lead = Lead(b0);
  if (lead.needed == 0) {
    *subpart = 1;
    return 0;
  }
  size_t k = 1;
  for (; k <= lead.needed; ++k) {
    if (i + k >= bytes.size()) break;
    const auto b = static_cast<unsigned char>(bytes[i + k]);
    const uint8_t lo = k == 1 ? lead.lower : 0x80;
    const uint8_t hi = k == 1 ? lead.upper : 0xBF;
    if (b < lo || b > hi) break;
  }
  if (k == lead.needed + 1u) return k;
  *subpart = k;  // the lead plus the continuation bytes that fit
  return 0;
}

uint8_t LookupCcc(char32_t cp) {
  const auto* begin = internal::kCombiningClasses;
  const auto* end = begin + internal::kNumCombiningClasses;
  const auto* it = std::lower_bound(
      begin, end, cp,
      [](const internal::CombiningClassEntry& e, char32_t c) { return e.code_point < c; });
  return (it != end && it->code_point == cp) ? it->ccc : 0;
}

void Decompose(char32_t cp, std::vector<char32_t>* out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const char32_t s = cp - kSBase;
    out->push_back(kLBase + s / kNCount);
    out->push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out->push_back(kTBase + s % kTCount);
    return;
  }
  const auto* begin = internal::kDecompositions;
  const auto* end = begin + internal::kNumDecompositions;
  const auto* it = std::lower_bound(
      begin, end, cp,
      [](const internal::DecompositionEntry& e, char32_t c) { return e.code_point < c; });
  if (it != end && it->code_point == cp) {
    out->insert(out->end(), internal::kDecompositionPool + it->offset,
                internal::kDecompositionPool + it->offset + it->length);
  } else {
    out->push_back(cp);
  }
}

// Primary composite of (first, second), or 0 when there is none.
char32_t Compose(char32_t first, char32_t second) {
  if (first >= kLBase && first < kLBase + kLCount && second >= kVBase &&
      second < kVBase + kVCount) {
    return kSBase + ((first - kLBase) * kVCount + (second - kVBase)) * kTCount;
  }
  if (first >= kSBase && first < kSBase + kSCount && (first - kSBase) % kTCount == 0 &&
      second > kTBase && second < kTBase + kTCount) {
    return first + (second - kTBase);
  }
  const uint64_t key = (static_cast<uint64_t>(first) << 21) | second;
  const auto* begin = internal::kCompositions;
  const auto* end = begin + internal::kNumCompositions;
  const auto* it = std::lower_bound(
      begin, end, key, [](const internal::CompositionEntry& e, uint64_t k) { return e.key < k; });
  return (it != end && it->key == key) ? it->composite : 0;
}

// NFC of one segment (valid UTF-8) appended to *out.
void NormalizeSegment(std::string_view segment, std::vector<char32_t>* scratch, std::string* out) {
  scratch->clear();
  for (size_t i = 0; i < segment.size();) {
    size_t len = 0;
    const char32_t cp = DecodeUtf8Valid(segment.data() + i, &len);
    Decompose(cp, scratch);
    i += len;
  }
  // Canonical ordering: each run of non-starters sorted stably by combining
  // class, in O(n log n). (An insertion sort is quadratic in the run, and a
  // client's text can be one run: "a" and 500k marks of two alternating
  // classes took minutes.)
  std::vector<char32_t>& s = *scratch;
  for (size_t i = 0; i < s.size();) {
    if (LookupCcc(s[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i + 1;
    while (j < s.size() && LookupCcc(s[j]) != 0) ++j;
    if (j - i > 1) {
      std::stable_sort(s.begin() + static_cast<ptrdiff_t>(i), s.begin() + static_cast<ptrdiff_t>(j),
                       [](char32_t a, char32_t b) { return LookupCcc(a) < LookupCcc(b); });
    }
    i = j;
  }
  // Canonical composition.
  size_t write = 0;
  ptrdiff_t starter = -1;
  uint8_t last_cc = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char32_t c = s[i];
    const uint8_t cc = LookupCcc(c);
    if (starter >= 0) {
      const bool adjacent = write == static_cast<size_t>(starter) + 1;
      if (adjacent || (last_cc != 0 && last_cc < cc)) {
        const char32_t composite = Compose(s[starter], c);
        if (composite != 0) {
          s[starter] = composite;
          continue;
        }
      }
    }
    if (cc == 0) starter = static_cast<ptrdiff_t>(write);
    last_cc = cc;
    s[write++] = c;
  }
  for (size_t i = 0; i < write; ++i) AppendUtf8(s[i], out);
}

inline bool IsNfcSafe(char32_t cp) { return !(CodePointFlags(cp) & kFlagNfcUnsafe); }

}  // namespace

const char* UnicodeVersion() { return internal::kUnicodeVersion; }

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool IsValidUtf8(std::string_view bytes) {
  size_t i = 0;
  while (i < bytes.size()) {
    if (static_cast<unsigned char>(bytes[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t subpart = 0;
    const size_t len = WellFormedLength(bytes, i, &subpart);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

void AppendSanitizedUtf8(std::string_view bytes, std::string* out) {
  out->reserve(out->size() + bytes.size());
  size_t copied = 0;  // bytes[copied, i) are well-formed and not yet copied
  size_t i = 0;
  while (i < bytes.size()) {
    if (static_cast<unsigned char>(bytes[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t subpart = 0;
    const size_t len = WellFormedLength(bytes, i, &subpart);
    if (len != 0) {
      i += len;
      continue;
    }
    out->append(bytes.data() + copied, i - copied);
    AppendUtf8(kReplacementChar, out);
    i += subpart;
    copied = i;
  }
  out->append(bytes.data() + copied, bytes.size() - copied);
}

size_t NextUtf8Sequence(std::string_view bytes, size_t pos, bool* well_formed) {
  size_t subpart = 0;
  const size_t len = WellFormedLength(bytes, pos, &subpart);
  *well_formed = len != 0;
  return len != 0 ? len : subpart;
}

size_t IncompleteUtf8TailLength(std::string_view bytes) {
  // The decoder is in its initial state at every byte that is not a
  // continuation byte, so only the last lead byte within reach matters.
  const size_t n = bytes.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto b = static_cast<unsigned char>(bytes[n - back]);
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: look further back
    const LeadInfo lead = Lead(b);
    if (lead.needed < back) return 0;  // ASCII, invalid lead, or complete
    for (size_t k = 1; k < back; ++k) {
      const auto c = static_cast<unsigned char>(bytes[n - back + k]);
      const uint8_t lo = k == 1 ? lead.lower : 0x80;
      const uint8_t hi = k == 1 ? lead.upper : 0xBF;
      if (c < lo || c > hi) return 0;
    }
    return back;
  }
  return 0;
}

uint8_t CombiningClass(char32_t cp) {
  if (IsNfcSafe(cp)) return 0;
  return LookupCcc(cp);
}

bool IsNfcQuick(std::string_view valid_utf8) {
  for (size_t i = 0; i < valid_utf8.size();) {
    if (static_cast<unsigned char>(valid_utf8[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    const char32_t cp = DecodeUtf8Valid(valid_utf8.data() + i, &len);
    if (!IsNfcSafe(cp)) return false;
    i += len;
  }
  return true;
}

void AppendNfc(std::string_view text, std::string* out) {
  // NFC never acts across a safe character (combining class 0 and
  // NFC_Quick_Check=Yes), so each unsafe run is normalized together with the
  // safe character before it, and everything else is copied.
  std::vector<char32_t> scratch;
  size_t copied = 0;     // text[copied, ...) not yet emitted
  size_t last_safe = 0;  // start of the last safe character seen
  size_t i = 0;
  while (i < text.size()) {
    if (static_cast<unsigned char>(text[i]) < 0x80) {
      last_safe = i++;
      continue;
    }
    size_t len = 0;
    const char32_t cp = DecodeUtf8Valid(text.data() + i, &len);
    if (IsNfcSafe(cp)) {
      last_safe = i;
      i += len;
      continue;
    }
    const size_t begin = std::max(last_safe, copied);
    size_t end = i + len;
    while (end < text.size()) {
      size_t l = 0;
      const char32_t c = DecodeUtf8Valid(text.data() + end, &l);
      if (IsNfcSafe(c)) break;
      end += l;
    }
    out->append(text.data() + copied, begin - copied);
    NormalizeSegment(text.substr(begin, end - begin), &scratch, out);
    copied = end;
    last_safe = end;
    i = end;
  }
  out->append(text.data() + copied, text.size() - copied);
}

std::string ToNfc(std::string_view valid_utf8) {
  std::string out;
  out.reserve(valid_utf8.size());
  AppendNfc(valid_utf8, &out);
  return out;
}

}  // namespace cortiq::tokenizer
