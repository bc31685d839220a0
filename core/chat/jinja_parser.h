// Parser of the Jinja renderer: tokens (jinja_lexer.h) to a syntax tree, a
// port of @huggingface/jinja's parser.ts (same precedence, same quirks), plus
// the checks that make a template using something the renderer lacks fail
// here, at load time, naming the feature: unknown tags, filters, tests,
// functions and methods, tojson's sort_keys, and trees deeper than
// kMaxNestingDepth (the renderer recurses over the tree, so its depth bounds
// the stack).
//
// Errors: throws SyntaxError (lexer.h) with the source offset; Template::Parse
// turns it into INVALID_ARGUMENT "chat_template:LINE:COL: message".
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "core/chat/jinja_lexer.h"

namespace cortiq::chat::jinja {

// Deepest syntax tree accepted (statement nesting plus expression nesting).
inline constexpr int kMaxNestingDepth = 96;

enum class NodeType : uint8_t {
  // statements
  kText,  // literal text between tags (evaluates like a string literal)
  kComment,
  kIf,              // a=test, list=body, list2=alternate
  kFor,             // a=loop variable, b=iterable, list=body, list2=else block
  kSet,             // a=target, b=value (or null: list=body)
  kMacro,           // name, list=parameters, list2=body
  kCallStatement,   // a=call (kCall), list=caller parameters, list2=body
  kFilterStatement, // a=filter (kIdentifier or kCall), list=body
  kBreak,
  kContinue,
  // expressions
  kIntegerLiteral,  // number
  kFloatLiteral,    // number
  kStringLiteral,   // name = the value
  kArrayLiteral,    // list
  kTupleLiteral,    // list
  kObjectLiteral,   // list=keys, list2=values
  kIdentifier,      // name
  kMember,          // a=object, b=property, flag=computed ([...])
  kCall,            // a=callee, list=arguments
  kBinary,          // name=operator, a, b
  kUnary,           // name=operator, a
  kFilter,          // a=operand, b=filter (kIdentifier or kCall)
  kTest,            // a=operand, name=test, flag=negated
  kSelect,          // a=value, b=condition (`a if b` without else)
  kTernary,         // a=condition, b=if true, c=if false
  kSlice,           // a=start, b=stop, c=step (each may be null)
  kKeywordArgument, // name=key, a=value
  kSpread,          // a (*expr)
  kKeywordSpread,   // a (**expr)
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using NodeList = std::vector<NodePtr>;

struct Node {
  NodeType type;
  size_t offset = 0;  // source offset of the token that began it
  std::string name;
  double number = 0;
  bool flag = false;
  int depth = 1;  // height of the subtree rooted here
  NodePtr a, b, c;
  NodeList list, list2;
};

// The parsed template: its top-level statements.
struct Program {
  NodeList body;
};

// Parses tokens into a Program. Throws SyntaxError.
Program Parse(std::vector<Token> tokens);

}  // namespace cortiq::chat::jinja
