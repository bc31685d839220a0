// Runtime values and JavaScript text semantics: see jinja_value.h.
#include "core/chat/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "core/tokenizer/unicode.h"

namespace cortiq::chat::jinja {
namespace {

using tokenizer::AppendUtf8;
using tokenizer::DecodeUtf8Valid;

// Decodes the code point at s[i] of valid UTF-8; advances i.
char32_t Next(std::string_view s, size_t* i) {
  size_t len = 1;
  const char32_t cp = DecodeUtf8Valid(s.data() + *i, &len);
  *i += len;
  return cp;
}

// Start of the code point that ends at s[end - 1] (valid UTF-8).
size_t PrevStart(std::string_view s, size_t end) {
  size_t i = end - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return i;
}

void AppendHex4(unsigned v, std::string* out) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "\\u%04x", v & 0xFFFF);
  out->append(buf);
}

// Simple case pairs for the scripts covered (see JsToUpper in the header).
char32_t UpperOf(char32_t c) {
  if (c >= 'a' && c <= 'z') return c - 32;
  if (c < 0x80) return c;
  if ((c >= 0xE0 && c <= 0xFE && c != 0xF7)) return c - 32;
  if (c == 0xFF) return 0x178;
  if (c == 0xB5) return 0x39C;
  if (c >= 0x100 && c <= 0x17F) {
    if (c == 0x131) return 'I';
    if (c == 0x17F) return 'S';
    const bool odd_lower = (c <= 0x137 && c != 0x130) || (c >= 0x14A && c <= 0x177);
    const bool even_lower = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E);
    if (odd_lower && (c & 1)) return c - 1;
    if (even_lower && !(c & 1)) return c - 1;
    return c;
  }
  if (c >= 0x3B1 && c <= 0x3C9 && c != 0x3C2) return c - 32;
  if (c == 0x3C2) return 0x3A3;
  if (c == 0x3AC) return 0x386;
  if (c >= 0x3AD && c <= 0x3AF) return c - 37;
  if (c == 0x3CC) return 0x38C;
  if (c == 0x3CD || c == 0x3CE) return c - 63;
  if (c >= 0x430 && c <= 0x44F) return c - 32;
  if (c >= 0x450 && c <= 0x45F) return c - 80;
  return c;
}

char32_t LowerOf(char32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if (c < 0x80) return c;
  if (c >= 0xC0 && c <= 0xDE && c != 0xD7) return c + 32;
  if (c == 0x178) return 0xFF;
  if (c >= 0x100 && c <= 0x17F) {
    const bool even_upper = (c <= 0x137 && c != 0x131) || (c >= 0x14A && c <= 0x177);
    const bool odd_upper = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E);
    if (even_upper && !(c & 1) && c != 0x130) return c + 1;
    if (odd_upper && (c & 1)) return c + 1;
    return c;
  }
  if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 32;
  if (c == 0x386) return 0x3AC;
  if (c >= 0x388 && c <= 0x38A) return c + 37;
  if (c == 0x38C) return 0x3CC;
  if (c == 0x38E || c == 0x38F) return c + 63;
  if (c >= 0x410 && c <= 0x42F) return c + 32;
  if (c >= 0x400 && c <= 0x40F) return c + 80;
  return c;
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// A backstop for AppendJson's recursion (values are depth-limited when built).
constexpr int kMaxJsonDepth = 512;

}  // namespace

// ---- ObjectMap / Value ------------------------------------------------------

const Value* ObjectMap::Find(std::string_view key) const {
  auto it = index_.find(std::string(key));
  return it == index_.end() ? nullptr : &entries_[it->second].second;
}

void ObjectMap::Set(std::string key, Value value) {
  auto it = index_.find(key);
  if (it != index_.end()) {
    entries_[it->second].second = std::move(value);
    return;
  }
  index_.emplace(key, entries_.size());
  entries_.emplace_back(std::move(key), std::move(value));
}

int Value::Depth() const {
  if (IsArray()) return array->depth;
  if (IsAttributeContainer()) return object->depth;
  return 0;
}

Value Value::Array(std::vector<Value> items, Kind kind) {
  Value v = Of(kind);
  auto data = std::make_shared<ArrayData>();
  int depth = 0;
  for (const Value& item : items) depth = std::max(depth, item.Depth());
  data->depth = depth + 1;
  data->items = std::move(items);
  v.array = std::move(data);
  return v;
}

Value Value::Object(ObjectMap map, Kind kind) {
  Value v = Of(kind);
  auto data = std::make_shared<ObjectData>();
  int depth = 0;
  for (const auto& [key, item] : map.entries()) depth = std::max(depth, item.Depth());
  data->depth = depth + 1;
  data->map = std::move(map);
  v.object = std::move(data);
  return v;
}

const char* TypeName(Kind kind) {
  switch (kind) {
    case Kind::kUndefined:
      return "UndefinedValue";
    case Kind::kNull:
      return "NullValue";
    case Kind::kBool:
      return "BooleanValue";
    case Kind::kInt:
      return "IntegerValue";
    case Kind::kFloat:
      return "FloatValue";
    case Kind::kString:
      return "StringValue";
    case Kind::kArray:
      return "ArrayValue";
    case Kind::kTuple:
      return "TupleValue";
    case Kind::kObject:
      return "ObjectValue";
    case Kind::kKwargs:
      return "KeywordArgumentsValue";
    case Kind::kNamespace:
      return "NamespaceValue";
    case Kind::kFunction:
      return "FunctionValue";
  }
  return "?";
}

bool Truthy(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
    case Kind::kNull:
      return false;
    case Kind::kBool:
      return v.boolean;
    case Kind::kInt:
    case Kind::kFloat:
      return v.number != 0 && !std::isnan(v.number);
    case Kind::kString:
      return !v.s().empty();
    case Kind::kArray:
    case Kind::kTuple:
      return !v.items().empty();
    case Kind::kObject:
    case Kind::kKwargs:
      return v.object->map.size() > 0;
    case Kind::kNamespace:  // !!Map: always true in the reference
    case Kind::kFunction:
      return true;
  }
  return false;
}

// ---- numbers ----------------------------------------------------------------

std::string JsNumberToString(double n) {
  if (std::isnan(n)) return "NaN";
  if (n == 0) return "0";
  if (std::isinf(n)) return n < 0 ? "-Infinity" : "Infinity";
  std::string out;
  if (n < 0) {
    out.push_back('-');
    n = -n;
  }
  // Shortest round-trip digits, as ECMAScript's Number::toString requires.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), n, std::chars_format::scientific);
  std::string_view sci(buf, res.ptr - buf);
  const size_t e_pos = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e_pos)) {
    if (c != '.') digits.push_back(c);
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  const int exp10 = std::atoi(std::string(sci.substr(e_pos + 1)).c_str());
  const int k = static_cast<int>(digits.size());
  const int point = exp10 + 1;  // value = 0.digits * 10^point
  if (k <= point && point <= 21) {
    out += digits;
    out.append(point - k, '0');
  } else if (0 < point && point <= 21) {
    out += digits.substr(0, point);
    out.push_back('.');
    out += digits.substr(point);
  } else if (-6 < point && point <= 0) {
    out += "0.";
    out.append(-point, '0');
    out += digits;
  } else {
    out.push_back(digits[0]);
    if (k > 1) {
      out.push_back('.');
      out += digits.substr(1);
    }
    out.push_back('e');
    out.push_back(point - 1 < 0 ? '-' : '+');
    out += std::to_string(std::abs(point - 1));
  }
  return out;
}

std::string JsFloatToString(double n) {
  if (n == 0 && std::signbit(n)) return "-0.0";
  if (std::isfinite(n) && std::fmod(n, 1.0) == 0) {
    // toFixed(1): exact integer digits below 1e21, toString() above.
    if (std::fabs(n) >= 1e21) return JsNumberToString(n);
    char buf[64];
    auto res = std::to_chars(buf, buf + sizeof(buf), n, std::chars_format::fixed, 0);
    return std::string(buf, res.ptr - buf) + ".0";
  }
  return JsNumberToString(n);
}

bool JsParseInt(std::string_view s, double* out) {
  s = JsTrimStart(s);
  size_t i = 0;
  bool negative = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) negative = s[i++] == '-';
  const size_t start = i;
  while (i < s.size() && IsDigit(s[i])) ++i;
  if (i == start) return false;
  const double v = std::strtod(std::string(s.substr(start, i - start)).c_str(), nullptr);
  *out = negative ? -v : v;
  return true;
}

bool JsParseFloat(std::string_view s, double* out) {
  s = JsTrimStart(s);
  size_t i = 0;
  bool negative = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) negative = s[i++] == '-';
  if (s.substr(i, 8) == "Infinity") {
    *out = negative ? -INFINITY : INFINITY;
    return true;
  }
  const size_t start = i;
  size_t int_digits = 0, frac_digits = 0;
  while (i < s.size() && IsDigit(s[i])) ++i, ++int_digits;
  size_t end = i;
  if (i < s.size() && s[i] == '.') {
    ++i;
    while (i < s.size() && IsDigit(s[i])) ++i, ++frac_digits;
    if (int_digits + frac_digits > 0) end = i;
  }
  if (int_digits + frac_digits == 0) return false;
  if (end < s.size() && (s[end] == 'e' || s[end] == 'E')) {
    size_t j = end + 1;
    if (j < s.size() && (s[j] == '+' || s[j] == '-')) ++j;
    const size_t exp_start = j;
    while (j < s.size() && IsDigit(s[j])) ++j;
    if (j > exp_start) end = j;
  }
  const double v = std::strtod(std::string(s.substr(start, end - start)).c_str(), nullptr);
  *out = negative ? -v : v;
  return true;
}

// ---- strings ----------------------------------------------------------------

bool IsJsSpace(char32_t cp) { return tokenizer::IsSpace(cp); }

std::string_view JsTrimStart(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t next = i;
    if (!IsJsSpace(Next(s, &next))) break;
    i = next;
  }
  return s.substr(i);
}

std::string_view JsTrimEnd(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    const size_t start = PrevStart(s, end);
    size_t i = start;
    if (!IsJsSpace(Next(s, &i))) break;
    end = start;
  }
  return s.substr(0, end);
}

size_t Utf16Length(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size();) n += Next(s, &i) > 0xFFFF ? 2 : 1;
  return n;
}

std::vector<std::string> CodePoints(std::string_view s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    Next(s, &i);
    out.emplace_back(s.substr(start, i - start));
  }
  return out;
}

bool Utf16At(std::string_view s, double index, std::string* out) {
  const double length = static_cast<double>(Utf16Length(s));
  double k = std::trunc(std::isnan(index) ? 0 : index);
  if (k < 0) k += length;
  if (k < 0 || k >= length) return false;
  size_t unit = 0;
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    const char32_t cp = Next(s, &i);
    const size_t width = cp > 0xFFFF ? 2 : 1;
    if (k < static_cast<double>(unit + width)) {
      if (width == 2) {
        AppendUtf8(tokenizer::kReplacementChar, out);
      } else {
        out->append(s.substr(start, i - start));
      }
      return true;
    }
    unit += width;
  }
  return false;
}

int CompareUtf16(std::string_view a, std::string_view b) {
  // UTF-8 byte order equals code point order; UTF-16 unit order differs only
  // where a supplementary character (surrogates D800..DFFF) meets E000..FFFF.
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    char32_t x = Next(a, &i), y = Next(b, &j);
    if (x == y) continue;
    auto key = [](char32_t c) -> uint32_t {
      return c > 0xFFFF ? 0xD800 + ((c - 0x10000) >> 10) : (c >= 0xD800 ? c + 0x10000 : c);
    };
    return key(x) < key(y) ? -1 : 1;
  }
  if (i < a.size()) return 1;
  if (j < b.size()) return -1;
  return 0;
}

std::string JsToUpper(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const char32_t c = Next(s, &i);
    if (c == 0xDF) {
      out += "SS";
    } else {
      AppendUtf8(UpperOf(c), &out);
    }
  }
  return out;
}

std::string JsToLower(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  char32_t prev = 0;
  for (size_t i = 0; i < s.size();) {
    const char32_t c = Next(s, &i);
    if (c == 0x3A3) {
      // Final sigma: after a letter and not before one.
      size_t j = i;
      const bool next_letter = j < s.size() && tokenizer::IsLetter(Next(s, &j));
      AppendUtf8(prev != 0 && tokenizer::IsLetter(prev) && !next_letter ? 0x3C2 : 0x3C3, &out);
    } else if (c == 0x130) {
      out += "i\xCC\x87";
    } else {
      AppendUtf8(LowerOf(c), &out);
    }
    prev = c;
  }
  return out;
}

void AppendJsonQuoted(std::string_view s, std::string* out) {
  out->push_back('"');
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      default:
        if (c < 0x20) {
          AppendHex4(c, out);
        } else {
          out->push_back(ch);
        }
    }
  }
  out->push_back('"');
}

namespace {

// makeAsciiSafe: every UTF-16 unit in [0x7F, 0xFFFF] becomes \uXXXX.
void AppendAsciiSafe(std::string_view json, std::string* out) {
  for (size_t i = 0; i < json.size();) {
    const char32_t cp = Next(json, &i);
    if (cp < 0x7F) {
      out->push_back(static_cast<char>(cp));
    } else if (cp <= 0xFFFF) {
      AppendHex4(cp, out);
    } else {
      const char32_t v = cp - 0x10000;
      AppendHex4(0xD800 + (v >> 10), out);
      AppendHex4(0xDC00 + (v & 0x3FF), out);
    }
  }
}

void AppendJsonString(std::string_view s, const JsonOptions& options, std::string* out) {
  if (!options.ensure_ascii) {
    AppendJsonQuoted(s, out);
    return;
  }
  std::string quoted;
  AppendJsonQuoted(s, &quoted);
  AppendAsciiSafe(quoted, out);
}

}  // namespace

void AppendJson(const Value& v, const JsonOptions& options, int depth, bool undefined_to_null,
                std::string* out) {
  std::string item_sep, key_sep;
  if (options.has_separators) {
    item_sep = options.item_separator;
    key_sep = options.key_separator;
  } else if (options.indent > 0) {
    item_sep = ",";
    key_sep = ": ";
  } else {
    item_sep = ", ";
    key_sep = ": ";
  }
  switch (v.kind) {
    case Kind::kNull:
      *out += "null";
      return;
    case Kind::kUndefined:
      *out += undefined_to_null ? "null" : "undefined";
      return;
    case Kind::kInt:
    case Kind::kFloat:
      *out += std::isfinite(v.number) ? JsNumberToString(v.number) : "null";
      return;
    case Kind::kBool:
      *out += v.boolean ? "true" : "false";
      return;
    case Kind::kString:
      AppendJsonString(v.s(), options, out);
      return;
    case Kind::kFunction:
      throw RenderError("Cannot convert to JSON: FunctionValue");
    default:
      break;
  }
  if (depth > kMaxJsonDepth) throw RenderError("value nested too deeply to convert to JSON");
  const std::string indent_unit = options.indent > 0 ? std::string(options.indent, ' ') : "";
  std::string base_padding = "\n";
  for (int i = 0; i < depth; ++i) base_padding += indent_unit;
  const std::string children_padding = base_padding + indent_unit;
  const bool pretty = options.indent > 0;
  auto check_size = [&] {
    if (out->size() > options.max_bytes) {
      throw RenderError("tojson: the output passes the limit of " +
                        std::to_string(options.max_bytes) + " bytes");
    }
  };
  if (v.IsArray()) {
    const auto& items = v.items();
    out->push_back('[');
    if (pretty && !items.empty()) *out += children_padding;
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) {
        *out += item_sep;
        if (pretty) *out += children_padding;
      }
      AppendJson(items[i], options, depth + 1, undefined_to_null, out);
      check_size();
    }
    if (pretty && !items.empty()) *out += base_padding;
    out->push_back(']');
    return;
  }
  const auto& entries = v.object->map.entries();
  out->push_back('{');
  for (size_t i = 0; i < entries.size(); ++i) {
    if (i > 0) *out += item_sep;
    if (pretty) *out += children_padding;
    AppendJsonString(entries[i].first, options, out);
    *out += key_sep;
    AppendJson(entries[i].second, options, depth + 1, undefined_to_null, out);
    check_size();
  }
  if (pretty && !entries.empty()) *out += base_padding;
  out->push_back('}');
}

std::string ToOutputString(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
      return "undefined";
    case Kind::kNull:
      return "null";
    case Kind::kBool:
      return v.boolean ? "true" : "false";
    case Kind::kInt:
      return JsNumberToString(v.number);
    case Kind::kFloat:
      return JsFloatToString(v.number);
    case Kind::kString:
      return v.s();
    case Kind::kFunction:
      return "[function]";
    default: {
      std::string out;
      AppendJson(v, JsonOptions{}, 0, /*undefined_to_null=*/false, &out);
      return out;
    }
  }
}

std::string ToJsString(const Value& v) {
  switch (v.kind) {
    case Kind::kInt:
    case Kind::kFloat:
      return JsNumberToString(v.number);
    case Kind::kArray:
    case Kind::kTuple: {
      std::string out;
      for (size_t i = 0; i < v.items().size(); ++i) {
        if (i > 0) out.push_back(',');
        out += ToOutputString(v.items()[i]);
      }
      return out;
    }
    case Kind::kObject:
    case Kind::kKwargs:
    case Kind::kNamespace:
      return "[object Map]";
    default:
      return ToOutputString(v);
  }
}

std::string ToJoinString(const Value& v) {
  if (v.kind == Kind::kNull || v.kind == Kind::kUndefined) return "";
  return ToJsString(v);
}

namespace {

// The JavaScript type of `value.value`.
enum class JsType { kUndefined, kNull, kBoolean, kNumber, kString, kObject };

JsType TypeOf(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
      return JsType::kUndefined;
    case Kind::kNull:
      return JsType::kNull;
    case Kind::kBool:
      return JsType::kBoolean;
    case Kind::kInt:
    case Kind::kFloat:
      return JsType::kNumber;
    case Kind::kString:
      return JsType::kString;
    default:
      return JsType::kObject;
  }
}

const void* Identity(const Value& v) {
  if (v.IsArray()) return v.array.get();
  if (v.IsAttributeContainer()) return v.object.get();
  return v.function.get();
}

// ToNumber of a string: StringToNumber (whitespace-trimmed, "" -> 0).
double StringToNumber(std::string_view s) {
  s = JsTrim(s);
  if (s.empty()) return 0;
  if (s.size() > 2 && s[0] == '0' &&
      (s[1] == 'x' || s[1] == 'X' || s[1] == 'o' || s[1] == 'O' || s[1] == 'b' || s[1] == 'B')) {
    const int base = (s[1] == 'x' || s[1] == 'X') ? 16 : (s[1] == 'o' || s[1] == 'O') ? 8 : 2;
    double v = 0;
    for (char c : s.substr(2)) {
      int d = IsDigit(c)               ? c - '0'
              : (c >= 'a' && c <= 'f') ? c - 'a' + 10
              : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                                       : 99;
      if (d >= base) return NAN;
      v = v * base + d;
    }
    return v;
  }
  double v = 0;
  const std::string str(s);
  size_t body = (str[0] == '+' || str[0] == '-') ? 1 : 0;
  if (str.compare(body, std::string::npos, "Infinity") == 0)
    return str[0] == '-' ? -INFINITY : INFINITY;
  if (!JsParseFloat(str, &v)) return NAN;
  // The whole string must be the literal (parseFloat takes a prefix).
  for (char c : str.substr(body)) {
    if (!(IsDigit(c) || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-')) return NAN;
  }
  char* end = nullptr;
  const double strict = std::strtod(str.c_str(), &end);
  if (end != str.c_str() + str.size()) return NAN;
  return strict;
}

}  // namespace

bool StrictEquals(const Value& a, const Value& b) {
  const JsType ta = TypeOf(a), tb = TypeOf(b);
  if (ta != tb) return false;
  switch (ta) {
    case JsType::kUndefined:
    case JsType::kNull:
      return true;
    case JsType::kBoolean:
      return a.boolean == b.boolean;
    case JsType::kNumber:
      return a.number == b.number;
    case JsType::kString:
      return a.s() == b.s();
    case JsType::kObject:
      return Identity(a) == Identity(b);
  }
  return false;
}

bool LooseEquals(const Value& a, const Value& b) {
  const JsType ta = TypeOf(a), tb = TypeOf(b);
  if (ta == tb) return StrictEquals(a, b);
  const bool a_nullish = ta == JsType::kNull || ta == JsType::kUndefined;
  const bool b_nullish = tb == JsType::kNull || tb == JsType::kUndefined;
  if (a_nullish || b_nullish) return a_nullish && b_nullish;
  if (ta == JsType::kBoolean) return LooseEquals(Value::Int(a.boolean ? 1 : 0), b);
  if (tb == JsType::kBoolean) return LooseEquals(a, Value::Int(b.boolean ? 1 : 0));
  if (ta == JsType::kNumber && tb == JsType::kString) return a.number == StringToNumber(b.s());
  if (ta == JsType::kString && tb == JsType::kNumber) return StringToNumber(a.s()) == b.number;
  // An object against a primitive: compare its string form (ToPrimitive).
  if (ta == JsType::kObject) return LooseEquals(Value::String(ToJsString(a)), b);
  if (tb == JsType::kObject) return LooseEquals(a, Value::String(ToJsString(b)));
  return false;
}

}  // namespace cortiq::chat::jinja
