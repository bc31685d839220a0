// Lexer: a port of @huggingface/jinja's lexer.ts (preprocess + tokenize),
// over UTF-8 with an offset map back to the original source.
#include "core/chat/jinja_lexer.h"

#include <utility>

#include "core/chat/jinja_value.h"
#include "core/tokenizer/unicode.h"

namespace cortiq::chat::jinja {
namespace {

// Text plus, for each byte, its offset in the original source.
struct Mapped {
  std::string text;
  std::vector<size_t> origin;

  void Append(const Mapped& from, size_t begin, size_t end) {
    text.append(from.text, begin, end - begin);
    origin.insert(origin.end(), from.origin.begin() + begin, from.origin.begin() + end);
  }
};

bool IsSpaceAt(std::string_view s, size_t i, size_t* length) {
  if (i >= s.size()) return false;
  size_t len = 1;
  const char32_t cp = tokenizer::DecodeUtf8Valid(s.data() + i, &len);
  *length = len;
  return IsJsSpace(cp);
}

// Length of the line terminator at s[i] (\n, \r, U+2028, U+2029), or 0.
size_t LineTerminatorAt(std::string_view s, size_t i) {
  if (s[i] == '\n' || s[i] == '\r') return 1;
  if (s.compare(i, 3, "\xE2\x80\xA8") == 0 || s.compare(i, 3, "\xE2\x80\xA9") == 0) return 3;
  return 0;
}

// template.replace(/^[ \t]*({[#%-])/gm, "$1")
Mapped LstripBlocks(const Mapped& in) {
  Mapped out;
  const std::string_view t = in.text;
  bool line_start = true;
  size_t i = 0;
  while (i < t.size()) {
    if (line_start) {
      line_start = false;
      size_t j = i;
      while (j < t.size() && (t[j] == ' ' || t[j] == '\t')) ++j;
      if (j + 1 < t.size() && t[j] == '{' && (t[j + 1] == '#' || t[j + 1] == '%' || t[j + 1] == '-')) {
        i = j;
      }
      continue;
    }
    const size_t term = LineTerminatorAt(t, i);
    const size_t n = term > 0 ? term : 1;
    out.Append(in, i, i + n);
    i += n;
    if (term > 0) line_start = true;
  }
  return out;
}

// template.replace(/([#%-]})\n/g, "$1")
Mapped TrimBlocks(const Mapped& in) {
  Mapped out;
  const std::string_view t = in.text;
  size_t i = 0;
  while (i < t.size()) {
    if ((t[i] == '#' || t[i] == '%' || t[i] == '-') && i + 2 < t.size() && t[i + 1] == '}' &&
        t[i + 2] == '\n') {
      out.Append(in, i, i + 2);
      i += 3;
      continue;
    }
    out.Append(in, i, i + 1);
    ++i;
  }
  return out;
}

// The end of a `{%-? (end)?generation -?%}` tag starting at t[q] ("{%"), or 0;
// *lstrip / *rstrip get the two hyphens.
size_t GenerationTagEnd(std::string_view t, size_t q, bool* lstrip, bool* rstrip) {
  size_t i = q + 2, len = 0;
  *lstrip = i < t.size() && t[i] == '-';
  if (*lstrip) ++i;
  while (IsSpaceAt(t, i, &len)) i += len;
  if (t.compare(i, 3, "end") == 0 && t.compare(i + 3, 10, "generation") == 0) i += 3;
  if (t.compare(i, 10, "generation") != 0) return 0;
  i += 10;
  while (IsSpaceAt(t, i, &len)) i += len;
  *rstrip = i < t.size() && t[i] == '-';
  if (*rstrip) ++i;
  if (t.compare(i, 2, "%}") != 0) return 0;
  return i + 2;
}

// template.replace(/(\s*){%(-?)\s*(?:end)?generation\s*(-?)%}(\s*)/gs, ...):
// the tag goes, and so does the whitespace on a side that has a hyphen.
Mapped RemoveGenerationTags(const Mapped& in) {
  const std::string_view t = in.text;
  if (t.find("generation") == std::string_view::npos) return in;
  Mapped out;
  size_t i = 0;  // start of what is not yet emitted
  size_t q = t.find("{%", 0);
  while (q != std::string_view::npos) {
    bool lstrip = false, rstrip = false;
    const size_t end = GenerationTagEnd(t, q, &lstrip, &rstrip);
    if (end == 0) {
      q = t.find("{%", q + 1);
      continue;
    }
    // Leading whitespace run, back to the end of the previous match.
    size_t before = q;
    while (before > i) {
      size_t start = before - 1;
      while (start > i && (static_cast<unsigned char>(t[start]) & 0xC0) == 0x80) --start;
      size_t len = 0;
      if (!IsSpaceAt(t, start, &len)) break;
      before = start;
    }
    size_t after = end, len = 0;
    while (IsSpaceAt(t, after, &len)) after += len;
    out.Append(in, i, before);
    if (!lstrip) out.Append(in, before, q);
    if (!rstrip) out.Append(in, end, after);
    i = after;
    q = t.find("{%", after);
  }
  out.Append(in, i, t.size());
  return out;
}

Mapped Preprocess(std::string_view source) {
  Mapped m;
  m.text = std::string(source);
  m.origin.resize(source.size());
  for (size_t i = 0; i < source.size(); ++i) m.origin[i] = i;
  if (!m.text.empty() && m.text.back() == '\n') {
    m.text.pop_back();
    m.origin.pop_back();
  }
  return RemoveGenerationTags(TrimBlocks(LstripBlocks(m)));
}

bool IsDigitChar(char c) { return c >= '0' && c <= '9'; }
bool IsWordChar(char c) {
  return IsDigitChar(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

struct TableEntry {
  std::string_view seq;
  TokenType type;
};

// ORDERED_MAPPING_TABLE: longer operators before their prefixes where it matters.
constexpr TableEntry kTable[] = {
    {"{%", TokenType::kOpenStatement},
    {"%}", TokenType::kCloseStatement},
    {"{{", TokenType::kOpenExpression},
    {"}}", TokenType::kCloseExpression},
    {"(", TokenType::kOpenParen},
    {")", TokenType::kCloseParen},
    {"{", TokenType::kOpenCurlyBracket},
    {"}", TokenType::kCloseCurlyBracket},
    {"[", TokenType::kOpenSquareBracket},
    {"]", TokenType::kCloseSquareBracket},
    {",", TokenType::kComma},
    {".", TokenType::kDot},
    {":", TokenType::kColon},
    {"|", TokenType::kPipe},
    {"<=", TokenType::kComparisonBinaryOperator},
    {">=", TokenType::kComparisonBinaryOperator},
    {"==", TokenType::kComparisonBinaryOperator},
    {"!=", TokenType::kComparisonBinaryOperator},
    {"<", TokenType::kComparisonBinaryOperator},
    {">", TokenType::kComparisonBinaryOperator},
    {"+", TokenType::kAdditiveBinaryOperator},
    {"-", TokenType::kAdditiveBinaryOperator},
    {"~", TokenType::kAdditiveBinaryOperator},
    {"**", TokenType::kExponentiationBinaryOperator},
    {"*", TokenType::kMultiplicativeBinaryOperator},
    {"//", TokenType::kMultiplicativeBinaryOperator},
    {"/", TokenType::kMultiplicativeBinaryOperator},
    {"%", TokenType::kMultiplicativeBinaryOperator},
    {"=", TokenType::kEquals},
};

int HexValue(char c) {
  if (IsDigitChar(c)) return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

class Lexer {
 public:
  explicit Lexer(Mapped src) : m_(std::move(src)), s_(m_.text) {}

  std::vector<Token> Run() {
    while (pos_ < s_.size()) Step();
    return std::move(tokens_);
  }

 private:
  size_t Origin(size_t i) const { return i < m_.origin.size() ? m_.origin[i] : End(); }
  size_t End() const { return m_.origin.empty() ? 0 : m_.origin.back() + 1; }
  [[noreturn]] void Fail(const std::string& message, size_t at) const {
    throw SyntaxError(message, Origin(at));
  }
  bool At(std::string_view seq) const { return s_.compare(pos_, seq.size(), seq) == 0; }
  void Push(std::string value, TokenType type, size_t start) {
    tokens_.push_back(Token{std::move(value), type, Origin(start)});
  }
  const Token* Last() const { return tokens_.empty() ? nullptr : &tokens_.back(); }

  void StripTrailingWhitespace() {
    if (!tokens_.empty() && tokens_.back().type == TokenType::kText) {
      std::string& v = tokens_.back().value;
      v.resize(JsTrimEnd(v).size());
      if (v.empty()) tokens_.pop_back();
    }
  }
  void SkipWhitespace() {
    size_t len = 0;
    while (IsSpaceAt(s_, pos_, &len)) pos_ += len;
  }

  void Step() {
    const Token* last = Last();
    if (last == nullptr || last->type == TokenType::kCloseStatement ||
        last->type == TokenType::kCloseExpression || last->type == TokenType::kComment) {
      const size_t start = pos_;
      while (pos_ < s_.size() &&
             !(s_[pos_] == '{' && pos_ + 1 < s_.size() &&
               (s_[pos_ + 1] == '%' || s_[pos_ + 1] == '{' || s_[pos_ + 1] == '#'))) {
        ++pos_;
      }
      if (pos_ > start) {
        Push(std::string(s_.substr(start, pos_ - start)), TokenType::kText, start);
        return;
      }
    }

    if (At("{#")) {
      const size_t start = pos_;
      pos_ += 2;
      const bool strip_before = pos_ < s_.size() && s_[pos_] == '-';
      if (strip_before) ++pos_;
      const size_t close = s_.find("#}", pos_);
      if (close == std::string_view::npos) Fail("missing end of comment tag '#}'", start);
      std::string comment(s_.substr(pos_, close - pos_));
      const bool strip_after = !comment.empty() && comment.back() == '-';
      if (strip_after) comment.pop_back();
      if (strip_before) StripTrailingWhitespace();
      Push(std::move(comment), TokenType::kComment, start);
      pos_ = close + 2;
      if (strip_after) SkipWhitespace();
      return;
    }
    if (At("{%-")) {
      StripTrailingWhitespace();
      Push("{%", TokenType::kOpenStatement, pos_);
      pos_ += 3;
      return;
    }
    if (At("{{-")) {
      StripTrailingWhitespace();
      Push("{{", TokenType::kOpenExpression, pos_);
      curly_depth_ = 0;
      pos_ += 3;
      return;
    }

    SkipWhitespace();
    if (pos_ >= s_.size()) Fail("unexpected end of template inside a tag", pos_);

    if (At("-%}")) {
      Push("%}", TokenType::kCloseStatement, pos_);
      pos_ += 3;
      SkipWhitespace();
      return;
    }
    if (At("-}}")) {
      Push("}}", TokenType::kCloseExpression, pos_);
      pos_ += 3;
      SkipWhitespace();
      return;
    }

    const char c = s_[pos_];
    if (c == '-' || c == '+') {
      const Token* prev = Last();
      if (prev == nullptr || prev->type == TokenType::kText) {
        Fail(std::string("unexpected character '") + c + "'", pos_);
      }
      switch (prev->type) {
        case TokenType::kIdentifier:
        case TokenType::kNumericLiteral:
        case TokenType::kStringLiteral:
        case TokenType::kCloseParen:
        case TokenType::kCloseSquareBracket:
          break;  // a binary operator: the table below
        default: {
          // A unary sign, glued to a following number literal.
          const size_t start = pos_++;
          std::string num = Digits();
          if (!num.empty() && pos_ + 1 < s_.size() && s_[pos_] == '.' && IsDigitChar(s_[pos_ + 1])) {
            ++pos_;
            num += "." + Digits();
          }
          Push(std::string(1, c) + num,
               num.empty() ? TokenType::kUnaryOperator : TokenType::kNumericLiteral, start);
          return;
        }
      }
    }

    for (const TableEntry& entry : kTable) {
      if (entry.seq == "}}" && curly_depth_ > 0) continue;
      if (!At(entry.seq)) continue;
      Push(std::string(entry.seq), entry.type, pos_);
      if (entry.type == TokenType::kOpenExpression) {
        curly_depth_ = 0;
      } else if (entry.type == TokenType::kOpenCurlyBracket) {
        ++curly_depth_;
      } else if (entry.type == TokenType::kCloseCurlyBracket) {
        --curly_depth_;
      }
      pos_ += entry.seq.size();
      return;
    }

    if (c == '\'' || c == '"') {
      StringLiteral(c);
      return;
    }
    if (IsDigitChar(c)) {
      const size_t start = pos_;
      std::string num = Digits();
      const Token* prev = Last();
      if ((prev == nullptr || prev->type != TokenType::kDot) && pos_ + 1 < s_.size() && s_[pos_] == '.' &&
          IsDigitChar(s_[pos_ + 1])) {
        ++pos_;
        num += "." + Digits();
      }
      Push(std::move(num), TokenType::kNumericLiteral, start);
      return;
    }
    if (IsWordChar(c)) {
      const size_t start = pos_;
      while (pos_ < s_.size() && IsWordChar(s_[pos_])) ++pos_;
      Push(std::string(s_.substr(start, pos_ - start)), TokenType::kIdentifier, start);
      return;
    }
    size_t len = 1;
    tokenizer::DecodeUtf8Valid(s_.data() + pos_, &len);
    Fail("unexpected character '" + std::string(s_.substr(pos_, len)) + "'", pos_);
  }

  std::string Digits() {
    const size_t start = pos_;
    while (pos_ < s_.size() && IsDigitChar(s_[pos_])) ++pos_;
    return std::string(s_.substr(start, pos_ - start));
  }

  void StringLiteral(char quote) {
    const size_t start = pos_++;
    std::string out;
    char32_t pending_high = 0;  // a \uD800-\uDBFF escape waiting for its low half
    auto flush_high = [&] {
      if (pending_high != 0) tokenizer::AppendUtf8(tokenizer::kReplacementChar, &out);
      pending_high = 0;
    };
    while (true) {
      if (pos_ >= s_.size()) Fail("unterminated string literal", start);
      const char c = s_[pos_];
      if (c == quote) break;
      if (c != '\\') {
        flush_high();
        out.push_back(c);
        ++pos_;
        continue;
      }
      ++pos_;
      if (pos_ >= s_.size()) Fail("unterminated string literal", start);
      const char e = s_[pos_++];
      if (e == 'x' || e == 'u') {
        const size_t n = e == 'x' ? 2 : 4;
        unsigned unit = 0;
        for (size_t k = 0; k < n; ++k) {
          const int h = pos_ + k < s_.size() ? HexValue(s_[pos_ + k]) : -1;
          if (h < 0) Fail(std::string("invalid hexadecimal escape sequence \\") + e, pos_ - 2);
          unit = unit * 16 + h;
        }
        pos_ += n;
        if (unit >= 0xDC00 && unit <= 0xDFFF && pending_high != 0) {
          tokenizer::AppendUtf8(0x10000 + ((pending_high - 0xD800) << 10) + (unit - 0xDC00), &out);
          pending_high = 0;
        } else {
          flush_high();
          if (unit >= 0xD800 && unit <= 0xDBFF) {
            pending_high = unit;
          } else if (unit >= 0xDC00 && unit <= 0xDFFF) {
            tokenizer::AppendUtf8(tokenizer::kReplacementChar, &out);
          } else {
            tokenizer::AppendUtf8(unit, &out);
          }
        }
        continue;
      }
      flush_high();
      switch (e) {
        case 'n': out.push_back('\n'); break;
        case 't': out.push_back('\t'); break;
        case 'r': out.push_back('\r'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'v': out.push_back('\v'); break;
        case '\'': out.push_back('\''); break;
        case '"': out.push_back('"'); break;
        case '\\': out.push_back('\\'); break;
        default: Fail(std::string("unexpected escaped character '") + e + "'", pos_ - 2);
      }
    }
    flush_high();
    ++pos_;  // the closing quote
    Push(std::move(out), TokenType::kStringLiteral, start);
  }

  Mapped m_;
  std::string_view s_;
  size_t pos_ = 0;
  int curly_depth_ = 0;
  std::vector<Token> tokens_;
};

}  // namespace

const char* TokenTypeName(TokenType type) {
  switch (type) {
    case TokenType::kText: return "Text";
    case TokenType::kNumericLiteral: return "NumericLiteral";
    case TokenType::kStringLiteral: return "StringLiteral";
    case TokenType::kIdentifier: return "Identifier";
    case TokenType::kEquals: return "Equals";
    case TokenType::kOpenParen: return "OpenParen";
    case TokenType::kCloseParen: return "CloseParen";
    case TokenType::kOpenStatement: return "OpenStatement";
    case TokenType::kCloseStatement: return "CloseStatement";
    case TokenType::kOpenExpression: return "OpenExpression";
    case TokenType::kCloseExpression: return "CloseExpression";
    case TokenType::kOpenSquareBracket: return "OpenSquareBracket";
    case TokenType::kCloseSquareBracket: return "CloseSquareBracket";
    case TokenType::kOpenCurlyBracket: return "OpenCurlyBracket";
    case TokenType::kCloseCurlyBracket: return "CloseCurlyBracket";
    case TokenType::kComma: return "Comma";
    case TokenType::kDot: return "Dot";
    case TokenType::kColon: return "Colon";
    case TokenType::kPipe: return "Pipe";
    case TokenType::kAdditiveBinaryOperator: return "AdditiveBinaryOperator";
    case TokenType::kMultiplicativeBinaryOperator: return "MultiplicativeBinaryOperator";
    case TokenType::kExponentiationBinaryOperator: return "ExponentiationBinaryOperator";
    case TokenType::kComparisonBinaryOperator: return "ComparisonBinaryOperator";
    case TokenType::kUnaryOperator: return "UnaryOperator";
    case TokenType::kComment: return "Comment";
  }
  return "?";
}

std::vector<Token> Tokenize(std::string_view source) { return Lexer(Preprocess(source)).Run(); }

}  // namespace cortiq::chat::jinja
