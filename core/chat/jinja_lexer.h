// Lexer of the Jinja renderer: the template's text after the preprocessing
// transformers applies (trim_blocks, lstrip_blocks, one trailing newline
// dropped, the `generation` tags removed), cut into tokens exactly as
// @huggingface/jinja's tokenize() does, including its whitespace control
// (`{%-`, `-%}`, `{{-`, `-}}`, `{#-`, `-#}`) and its unary-minus rule.
//
// Every token carries the byte offset in the ORIGINAL source where it starts,
// so that parse errors can name a line:column of the text the operator wrote.
//
// Input: valid UTF-8 (Template::Parse checks). Errors: throws SyntaxError
// (only inside core/chat; the parser's caller turns it into a Status).
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace cortiq::chat::jinja {

// A template error found before rendering, at `offset` bytes into the source.
class SyntaxError : public std::runtime_error {
 public:
  SyntaxError(const std::string& message, size_t offset)
      : std::runtime_error(message), offset_(offset) {}
  size_t offset() const { return offset_; }

 private:
  size_t offset_;
};

enum class TokenType : uint8_t {
  kText,
  kNumericLiteral,
  kStringLiteral,
  kIdentifier,
  kEquals,
  kOpenParen,
  kCloseParen,
  kOpenStatement,
  kCloseStatement,
  kOpenExpression,
  kCloseExpression,
  kOpenSquareBracket,
  kCloseSquareBracket,
  kOpenCurlyBracket,
  kCloseCurlyBracket,
  kComma,
  kDot,
  kColon,
  kPipe,
  kAdditiveBinaryOperator,
  kMultiplicativeBinaryOperator,
  kExponentiationBinaryOperator,
  kComparisonBinaryOperator,
  kUnaryOperator,
  kComment,
};

const char* TokenTypeName(TokenType type);

struct Token {
  std::string value;
  TokenType type;
  size_t offset;  // byte offset of the token's start in the original source
};

// Tokenizes `source` with trim_blocks and lstrip_blocks on (what transformers
// and @huggingface/jinja's Template use). O(n) time and memory.
std::vector<Token> Tokenize(std::string_view source);

}  // namespace cortiq::chat::jinja
