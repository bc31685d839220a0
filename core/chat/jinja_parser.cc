// Parser: a port of @huggingface/jinja's parser.ts plus load-time feature
// checks (see jinja_parser.h).
#include "core/chat/jinja_parser.h"

#include <algorithm>
#include <set>
#include <string_view>
#include <utility>

namespace cortiq::chat::jinja {
namespace {

// What the renderer implements (jinja_interpreter.cc); anything else is
// refused at parse time.
const std::set<std::string_view> kFilters = {
    "abs",   "bool",  "capitalize", "default", "dictsort", "first",   "float", "get",
    "indent", "int",  "items",      "join",    "keys",     "last",    "length", "list",
    "lower", "map",   "rejectattr", "replace", "reverse",  "round",   "safe",   "selectattr",
    "sort",  "string", "title",     "tojson",  "trim",     "unique",  "upper",  "values"};
const std::set<std::string_view> kTests = {
    "boolean", "callable", "odd",      "even",     "false",   "true",  "none",
    "string",  "number",   "integer",  "iterable", "mapping", "sequence", "lower",
    "upper",   "defined",  "undefined", "equalto", "eq"};
const std::set<std::string_view> kGlobalFunctions = {"raise_exception", "range", "strftime_now",
                                                     "namespace"};
const std::set<std::string_view> kMethods = {
    // strings
    "upper", "lower", "strip", "title", "capitalize", "rstrip", "lstrip", "startswith", "endswith",
    "split", "replace",
    // objects
    "get", "items", "keys", "values", "dictsort"};

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  Program Run() {
    Program program;
    while (current_ < tokens_.size()) program.body.push_back(ParseAny());
    CheckCalls(program);
    return program;
  }

 private:
  // ---- token access ----
  size_t EndOffset() const { return tokens_.empty() ? 0 : tokens_.back().offset; }
  [[noreturn]] void Fail(const std::string& message, size_t offset) const {
    throw SyntaxError(message, offset);
  }
  [[noreturn]] void FailHere(const std::string& message) const {
    Fail(message, current_ < tokens_.size() ? tokens_[current_].offset : EndOffset());
  }
  const Token& Peek() const {
    if (current_ >= tokens_.size()) FailHere("unexpected end of template");
    return tokens_[current_];
  }
  const Token& Take() {
    const Token& t = Peek();
    ++current_;
    return t;
  }
  const Token& Expect(TokenType type, const char* what) {
    if (current_ >= tokens_.size()) FailHere(std::string("unexpected end of template, expected ") + what);
    const Token& t = tokens_[current_];
    if (t.type != type) {
      Fail(std::string("expected ") + what + ", got " + Describe(t), t.offset);
    }
    ++current_;
    return t;
  }
  static std::string Describe(const Token& t) {
    if (t.type == TokenType::kText) return "text";
    return "'" + t.value + "'";
  }
  bool Is(TokenType type) const { return current_ < tokens_.size() && tokens_[current_].type == type; }
  bool Is(TokenType t1, TokenType t2) const {
    return current_ + 1 < tokens_.size() && tokens_[current_].type == t1 && tokens_[current_ + 1].type == t2;
  }
  bool IsIdentifier(std::string_view name, size_t ahead = 0) const {
    return current_ + ahead < tokens_.size() && tokens_[current_ + ahead].type == TokenType::kIdentifier &&
           tokens_[current_ + ahead].value == name;
  }
  bool IsStatement(std::initializer_list<std::string_view> names) const {
    if (!(current_ + 1 < tokens_.size() && tokens_[current_].type == TokenType::kOpenStatement &&
          tokens_[current_ + 1].type == TokenType::kIdentifier)) {
      return false;
    }
    return std::find(names.begin(), names.end(), tokens_[current_ + 1].value) != names.end();
  }
  void ExpectIdentifier(std::string_view name) {
    if (!IsIdentifier(name)) FailHere("expected '" + std::string(name) + "'");
    ++current_;
  }
  // Parses statements until one of `names` opens; names the unclosed tag at
  // the end of the template.
  void ParseUntil(std::initializer_list<std::string_view> names, NodeList* out, const char* opened,
                  size_t opened_at) {
    while (!IsStatement(names)) {
      if (current_ >= tokens_.size()) {
        Fail(std::string("unclosed '") + opened + "' tag: no matching end tag", opened_at);
      }
      out->push_back(ParseAny());
    }
  }
  void ExpectEnd(std::string_view end_tag) {
    Expect(TokenType::kOpenStatement, "'{%'");
    ExpectIdentifier(end_tag);
    Expect(TokenType::kCloseStatement, "'%}'");
  }

  // ---- nodes ----
  static NodePtr Make(NodeType type, size_t offset) {
    auto n = std::make_unique<Node>();
    n->type = type;
    n->offset = offset;
    return n;
  }
  // Computes the subtree height and enforces the nesting limit.
  NodePtr Seal(NodePtr n) const {
    int d = 0;
    for (const NodePtr* child : {&n->a, &n->b, &n->c}) {
      if (*child) d = std::max(d, (*child)->depth);
    }
    for (const NodeList* l : {&n->list, &n->list2}) {
      for (const NodePtr& child : *l) d = std::max(d, child->depth);
    }
    n->depth = d + 1;
    if (n->depth > kMaxNestingDepth) {
      Fail("template nested too deeply (limit " + std::to_string(kMaxNestingDepth) + ")", n->offset);
    }
    return n;
  }
  NodePtr Binary(const Token& op, std::string name, NodePtr left, NodePtr right) const {
    auto n = Make(NodeType::kBinary, op.offset);
    n->name = std::move(name);
    n->a = std::move(left);
    n->b = std::move(right);
    return Seal(std::move(n));
  }

  // ---- statements ----
  NodePtr ParseAny() {
    const Token& t = Peek();
    switch (t.type) {
      case TokenType::kComment: {
        auto n = Make(NodeType::kComment, t.offset);
        ++current_;
        return n;
      }
      case TokenType::kText: {
        auto n = Make(NodeType::kText, t.offset);
        n->name = t.value;
        ++current_;
        return n;
      }
      case TokenType::kOpenStatement: return ParseStatement();
      case TokenType::kOpenExpression: {
        ++current_;
        NodePtr e = ParseExpression();
        Expect(TokenType::kCloseExpression, "'}}'");
        return e;
      }
      default: Fail("unexpected " + Describe(t), t.offset);
    }
  }

  NodePtr ParseStatement() {
    Take();  // {%
    const Token& name_token = Peek();
    if (name_token.type != TokenType::kIdentifier) {
      Fail("expected a tag name after '{%', got " + Describe(name_token), name_token.offset);
    }
    const std::string name = name_token.value;
    const size_t at = name_token.offset;
    ++current_;
    if (name == "set") return ParseSet(at);
    if (name == "if") {
      NodePtr n = ParseIf(at);
      ExpectEnd("endif");
      return n;
    }
    if (name == "for") {
      NodePtr n = ParseFor(at);
      ExpectEnd("endfor");
      return n;
    }
    if (name == "macro") {
      NodePtr n = ParseMacro(at);
      ExpectEnd("endmacro");
      return n;
    }
    if (name == "call") return ParseCallStatement(at);
    if (name == "filter") return ParseFilterStatement(at);
    if (name == "break" || name == "continue") {
      Expect(TokenType::kCloseStatement, "'%}'");
      return Make(name == "break" ? NodeType::kBreak : NodeType::kContinue, at);
    }
    static const std::set<std::string_view> kClosers = {"endif", "endfor", "endmacro", "endcall",
                                                        "endfilter", "endset", "else", "elif"};
    if (kClosers.count(name) > 0) Fail("unexpected tag '" + name + "'", at);
    Fail("unsupported tag '" + name + "'", at);
  }

  NodePtr ParseSet(size_t at) {
    auto n = Make(NodeType::kSet, at);
    n->a = ParseExpressionSequence(false);
    DeclareTarget(*n->a);
    if (Is(TokenType::kEquals)) {
      ++current_;
      n->b = ParseExpressionSequence(false);
    } else {
      Expect(TokenType::kCloseStatement, "'%}' or '='");
      ParseUntil({"endset"}, &n->list, "set", at);
      Expect(TokenType::kOpenStatement, "'{%'");
      ExpectIdentifier("endset");
    }
    Expect(TokenType::kCloseStatement, "'%}'");
    return Seal(std::move(n));
  }

  NodePtr ParseIf(size_t at) {
    auto n = Make(NodeType::kIf, at);
    n->a = ParseExpression();
    Expect(TokenType::kCloseStatement, "'%}'");
    ParseUntil({"elif", "else", "endif"}, &n->list, "if", at);
    if (IsStatement({"elif"})) {
      current_ += 2;
      n->list2.push_back(ParseIf(tokens_[current_ - 1].offset));
    } else if (IsStatement({"else"})) {
      current_ += 2;
      Expect(TokenType::kCloseStatement, "'%}'");
      ParseUntil({"endif"}, &n->list2, "if", at);
    }
    return Seal(std::move(n));
  }

  NodePtr ParseMacro(size_t at) {
    auto n = Make(NodeType::kMacro, at);
    NodePtr name = ParsePrimary();
    if (name->type != NodeType::kIdentifier) Fail("expected a macro name", name->offset);
    n->name = name->name;
    macros_.insert(n->name);
    n->list = ParseArgs(/*parameters=*/true);
    Expect(TokenType::kCloseStatement, "'%}'");
    ParseUntil({"endmacro"}, &n->list2, "macro", at);
    return Seal(std::move(n));
  }

  NodePtr ParseFor(size_t at) {
    auto n = Make(NodeType::kFor, at);
    n->a = ParseExpressionSequence(true);
    if (n->a->type != NodeType::kIdentifier && n->a->type != NodeType::kTupleLiteral) {
      Fail("expected a name or a tuple of names as the loop variable", n->a->offset);
    }
    DeclareTarget(*n->a);
    if (!IsIdentifier("in")) FailHere("expected 'in' after the loop variable");
    ++current_;
    n->b = ParseExpression();
    Expect(TokenType::kCloseStatement, "'%}'");
    ParseUntil({"endfor", "else"}, &n->list, "for", at);
    if (IsStatement({"else"})) {
      current_ += 2;
      Expect(TokenType::kCloseStatement, "'%}'");
      ParseUntil({"endfor"}, &n->list2, "for", at);
    }
    return Seal(std::move(n));
  }

  NodePtr ParseCallStatement(size_t at) {
    auto n = Make(NodeType::kCallStatement, at);
    if (Is(TokenType::kOpenParen)) n->list = ParseArgs(/*parameters=*/true);
    NodePtr callee = ParsePrimary();
    if (callee->type != NodeType::kIdentifier) Fail("expected a macro name after 'call'", callee->offset);
    auto call = Make(NodeType::kCall, callee->offset);
    RecordCall(*callee);
    call->a = std::move(callee);
    call->list = ParseArgs(/*parameters=*/false);
    n->a = Seal(std::move(call));
    Expect(TokenType::kCloseStatement, "'%}'");
    ParseUntil({"endcall"}, &n->list2, "call", at);
    ExpectEnd("endcall");
    return Seal(std::move(n));
  }

  NodePtr ParseFilterStatement(size_t at) {
    auto n = Make(NodeType::kFilterStatement, at);
    NodePtr filter = ParsePrimary();
    if (filter->type != NodeType::kIdentifier) Fail("expected a filter name", filter->offset);
    if (Is(TokenType::kOpenParen)) filter = ParseCall(std::move(filter), /*record=*/false);
    CheckFilter(*filter);
    n->a = std::move(filter);
    Expect(TokenType::kCloseStatement, "'%}'");
    ParseUntil({"endfilter"}, &n->list, "filter", at);
    ExpectEnd("endfilter");
    return Seal(std::move(n));
  }

  // ---- expressions ----
  // Recursion guard for the descents that do not build a node per level.
  struct DepthGuard {
    DepthGuard(const Parser* p, size_t offset) : parser(p) {
      if (++p->recursion_ > kMaxNestingDepth) {
        p->Fail("expression nested too deeply (limit " + std::to_string(kMaxNestingDepth) + ")", offset);
      }
    }
    ~DepthGuard() { --parser->recursion_; }
    const Parser* parser;
  };

  NodePtr ParseExpressionSequence(bool primary) {
    const size_t at = Peek().offset;
    NodeList items;
    items.push_back(primary ? ParsePrimary() : ParseExpression());
    const bool is_tuple = Is(TokenType::kComma);
    while (is_tuple) {
      ++current_;
      items.push_back(primary ? ParsePrimary() : ParseExpression());
      if (!Is(TokenType::kComma)) break;
    }
    if (!is_tuple) return std::move(items[0]);
    auto n = Make(NodeType::kTupleLiteral, at);
    n->list = std::move(items);
    return Seal(std::move(n));
  }

  NodePtr ParseExpression() {
    DepthGuard guard(this, current_ < tokens_.size() ? tokens_[current_].offset : EndOffset());
    return ParseIfExpression();
  }

  NodePtr ParseIfExpression() {
    NodePtr a = ParseLogicalOr();
    if (!IsIdentifier("if")) return a;
    const size_t at = Take().offset;
    NodePtr test = ParseLogicalOr();
    if (IsIdentifier("else")) {
      ++current_;
      DepthGuard guard(this, at);
      auto n = Make(NodeType::kTernary, at);
      n->a = std::move(test);
      n->b = std::move(a);
      n->c = ParseIfExpression();
      return Seal(std::move(n));
    }
    auto n = Make(NodeType::kSelect, at);
    n->a = std::move(a);
    n->b = std::move(test);
    return Seal(std::move(n));
  }

  NodePtr ParseLogicalOr() {
    NodePtr left = ParseLogicalAnd();
    while (IsIdentifier("or")) {
      const Token& op = Take();
      left = Binary(op, "or", std::move(left), ParseLogicalAnd());
    }
    return left;
  }

  NodePtr ParseLogicalAnd() {
    NodePtr left = ParseLogicalNot();
    while (IsIdentifier("and")) {
      const Token& op = Take();
      left = Binary(op, "and", std::move(left), ParseLogicalNot());
    }
    return left;
  }

  NodePtr ParseLogicalNot() {
    NodePtr right;
    while (IsIdentifier("not")) {
      const Token& op = Take();
      DepthGuard guard(this, op.offset);
      auto n = Make(NodeType::kUnary, op.offset);
      n->name = "not";
      n->a = ParseLogicalNot();
      right = Seal(std::move(n));
    }
    return right ? std::move(right) : ParseComparison();
  }

  NodePtr ParseComparison() {
    NodePtr left = ParseAdditive();
    while (true) {
      std::string op_name;
      size_t op_index = current_;
      if (IsIdentifier("not") && IsIdentifier("in", 1)) {
        op_name = "not in";
        current_ += 2;
      } else if (IsIdentifier("in")) {
        op_name = "in";
        ++current_;
      } else if (Is(TokenType::kComparisonBinaryOperator)) {
        op_name = tokens_[current_++].value;
      } else {
        break;
      }
      left = Binary(tokens_[op_index], op_name, std::move(left), ParseAdditive());
    }
    return left;
  }

  NodePtr ParseAdditive() {
    NodePtr left = ParseMultiplicative();
    while (Is(TokenType::kAdditiveBinaryOperator)) {
      const Token& op = Take();
      left = Binary(op, op.value, std::move(left), ParseMultiplicative());
    }
    return left;
  }

  NodePtr ParseMultiplicative() {
    NodePtr left = ParsePower();
    while (Is(TokenType::kMultiplicativeBinaryOperator)) {
      const Token& op = Take();
      left = Binary(op, op.value, std::move(left), ParsePower());
    }
    return left;
  }

  NodePtr ParsePower() {
    NodePtr left = ParseTestExpression();
    while (Is(TokenType::kExponentiationBinaryOperator)) {
      const Token& op = Take();
      left = Binary(op, op.value, std::move(left), ParseTestExpression());
    }
    return left;
  }

  NodePtr ParseTestExpression() {
    NodePtr operand = ParseFilterExpression();
    while (IsIdentifier("is")) {
      const size_t at = Take().offset;
      const bool negate = IsIdentifier("not");
      if (negate) ++current_;
      NodePtr test = ParsePrimary();
      if (test->type != NodeType::kIdentifier) Fail("expected a test name after 'is'", test->offset);
      if (kTests.count(test->name) == 0) Fail("unsupported test '" + test->name + "'", test->offset);
      if (Is(TokenType::kOpenParen) || (current_ < tokens_.size() && (Is(TokenType::kStringLiteral) ||
                                                                    Is(TokenType::kNumericLiteral)))) {
        FailHere("tests with arguments are not supported (test '" + test->name + "')");
      }
      auto n = Make(NodeType::kTest, at);
      n->a = std::move(operand);
      n->name = test->name;
      n->flag = negate;
      operand = Seal(std::move(n));
    }
    return operand;
  }

  NodePtr ParseFilterExpression() {
    NodePtr operand = ParseUnarySign();
    while (Is(TokenType::kPipe)) {
      const size_t at = Take().offset;
      NodePtr filter = ParsePrimary();
      if (filter->type != NodeType::kIdentifier) Fail("expected a filter name after '|'", filter->offset);
      if (Is(TokenType::kOpenParen)) filter = ParseCall(std::move(filter), /*record=*/false);
      CheckFilter(*filter);
      auto n = Make(NodeType::kFilter, at);
      n->a = std::move(operand);
      n->b = std::move(filter);
      operand = Seal(std::move(n));
    }
    return operand;
  }

  NodePtr ParseUnarySign() {
    if (current_ < tokens_.size()) {
      const Token& t = tokens_[current_];
      if ((t.type == TokenType::kUnaryOperator || t.type == TokenType::kAdditiveBinaryOperator) &&
          (t.value == "-" || t.value == "+")) {
        ++current_;
        DepthGuard guard(this, t.offset);
        auto n = Make(NodeType::kUnary, t.offset);
        n->name = t.value;
        n->a = ParseUnarySign();
        return Seal(std::move(n));
      }
    }
    NodePtr member = ParseMember(ParsePrimary());
    if (Is(TokenType::kOpenParen)) return ParseCall(std::move(member));
    return member;
  }

  // record: false for a filter's argument list (`x | indent(2)`: not a call
  // of a function named indent).
  NodePtr ParseCall(NodePtr callee, bool record = true) {
    while (true) {
      if (record) RecordCall(*callee);
      record = true;
      auto n = Make(NodeType::kCall, callee->offset);
      n->a = std::move(callee);
      n->list = ParseArgs(/*parameters=*/false);
      NodePtr expr = ParseMember(Seal(std::move(n)));
      if (!Is(TokenType::kOpenParen)) return expr;
      callee = std::move(expr);
    }
  }

  NodeList ParseArgs(bool parameters) {
    Expect(TokenType::kOpenParen, "'('");
    NodeList args;
    std::set<std::string> names;
    bool saw_keyword = false, saw_spread = false;
    while (!Is(TokenType::kCloseParen)) {
      if (current_ >= tokens_.size()) FailHere("unexpected end of template in an argument list");
      const Token& t = tokens_[current_];
      const bool keyword_spread = t.type == TokenType::kExponentiationBinaryOperator;
      const bool positional_spread = t.type == TokenType::kMultiplicativeBinaryOperator && t.value == "*";
      if (parameters && (keyword_spread || positional_spread)) {
        Fail("argument unpacking is not allowed in parameter declarations", t.offset);
      }
      if (keyword_spread) {
        ++current_;
        auto n = Make(NodeType::kKeywordSpread, t.offset);
        n->a = ParseExpression();
        args.push_back(Seal(std::move(n)));
        if (Is(TokenType::kComma)) ++current_;
        if (!Is(TokenType::kCloseParen)) FailHere("'**' must be applied to the final argument");
        break;
      }
      NodePtr arg;
      if (positional_spread) {
        if (saw_spread) Fail("only one '*' argument unpacking is allowed", t.offset);
        saw_spread = true;
        ++current_;
        auto n = Make(NodeType::kSpread, t.offset);
        n->a = ParseExpression();
        arg = Seal(std::move(n));
      } else {
        arg = ParseExpression();
        if (Is(TokenType::kEquals)) {
          ++current_;
          if (arg->type != NodeType::kIdentifier) {
            Fail(parameters ? "expected a name for a parameter" : "expected a name for a keyword argument",
                 arg->offset);
          }
          auto n = Make(NodeType::kKeywordArgument, arg->offset);
          n->name = arg->name;
          n->a = ParseExpression();
          arg = Seal(std::move(n));
        }
        if (parameters) {
          if (arg->type != NodeType::kIdentifier && arg->type != NodeType::kKeywordArgument) {
            Fail("expected a name for a parameter", arg->offset);
          }
          if (!names.insert(arg->name).second) Fail("duplicate parameter name '" + arg->name + "'", arg->offset);
          declared_.insert(arg->name);
        }
        if (arg->type == NodeType::kKeywordArgument) {
          saw_keyword = true;
        } else if (saw_keyword) {
          Fail(parameters ? "non-default parameter follows a default one"
                          : "positional arguments must come before keyword arguments",
               arg->offset);
        } else if (saw_spread) {
          Fail("positional arguments must not follow '*' unpacking", arg->offset);
        }
      }
      args.push_back(std::move(arg));
      if (Is(TokenType::kComma)) ++current_;
    }
    Expect(TokenType::kCloseParen, "')'");
    return args;
  }

  NodePtr ParseMemberArguments(size_t at) {
    std::vector<NodePtr> slices;
    bool is_slice = false;
    while (!Is(TokenType::kCloseSquareBracket)) {
      if (current_ >= tokens_.size()) FailHere("unexpected end of template, expected ']'");
      if (Is(TokenType::kColon)) {
        slices.push_back(nullptr);
        ++current_;
        is_slice = true;
      } else {
        slices.push_back(ParseExpression());
        if (Is(TokenType::kColon)) {
          ++current_;
          is_slice = true;
        }
      }
    }
    if (slices.empty()) Fail("expected an index or a slice inside '[]'", at);
    if (!is_slice) return std::move(slices[0]);
    if (slices.size() > 3) Fail("a slice takes at most 3 parts", at);
    auto n = Make(NodeType::kSlice, at);
    n->a = std::move(slices[0]);
    if (slices.size() > 1) n->b = std::move(slices[1]);
    if (slices.size() > 2) n->c = std::move(slices[2]);
    return Seal(std::move(n));
  }

  NodePtr ParseMember(NodePtr object) {
    while (Is(TokenType::kDot) || Is(TokenType::kOpenSquareBracket)) {
      const Token& op = Take();
      const bool computed = op.type == TokenType::kOpenSquareBracket;
      NodePtr property;
      if (computed) {
        property = ParseMemberArguments(op.offset);
        Expect(TokenType::kCloseSquareBracket, "']'");
      } else {
        property = ParsePrimary();
        if (property->type != NodeType::kIdentifier && property->type != NodeType::kIntegerLiteral) {
          Fail("expected a name or an integer after '.'", property->offset);
        }
      }
      auto n = Make(NodeType::kMember, op.offset);
      n->a = std::move(object);
      n->b = std::move(property);
      n->flag = computed;
      object = Seal(std::move(n));
    }
    return object;
  }

  NodePtr ParsePrimary() {
    const Token& t = Take();
    switch (t.type) {
      case TokenType::kNumericLiteral: {
        const bool is_float = t.value.find('.') != std::string::npos;
        auto n = Make(is_float ? NodeType::kFloatLiteral : NodeType::kIntegerLiteral, t.offset);
        n->number = std::strtod(t.value.c_str(), nullptr);
        return n;
      }
      case TokenType::kStringLiteral: {
        auto n = Make(NodeType::kStringLiteral, t.offset);
        n->name = t.value;
        while (Is(TokenType::kStringLiteral)) n->name += tokens_[current_++].value;
        return n;
      }
      case TokenType::kIdentifier: {
        auto n = Make(NodeType::kIdentifier, t.offset);
        n->name = t.value;
        return n;
      }
      case TokenType::kOpenParen: {
        DepthGuard guard(this, t.offset);
        NodePtr e = ParseExpressionSequence(false);
        Expect(TokenType::kCloseParen, "')'");
        return e;
      }
      case TokenType::kOpenSquareBracket: {
        DepthGuard guard(this, t.offset);
        auto n = Make(NodeType::kArrayLiteral, t.offset);
        while (!Is(TokenType::kCloseSquareBracket)) {
          if (current_ >= tokens_.size()) FailHere("unexpected end of template, expected ']'");
          n->list.push_back(ParseExpression());
          if (Is(TokenType::kComma)) ++current_;
        }
        ++current_;
        return Seal(std::move(n));
      }
      case TokenType::kOpenCurlyBracket: {
        DepthGuard guard(this, t.offset);
        auto n = Make(NodeType::kObjectLiteral, t.offset);
        while (!Is(TokenType::kCloseCurlyBracket)) {
          if (current_ >= tokens_.size()) FailHere("unexpected end of template, expected '}'");
          n->list.push_back(ParseExpression());
          Expect(TokenType::kColon, "':' between key and value");
          n->list2.push_back(ParseExpression());
          if (Is(TokenType::kComma)) ++current_;
        }
        ++current_;
        return Seal(std::move(n));
      }
      default: Fail("unexpected " + Describe(t), t.offset);
    }
  }

  // ---- load-time feature checks ----
  void DeclareTarget(const Node& target) {
    if (target.type == NodeType::kIdentifier) declared_.insert(target.name);
    if (target.type == NodeType::kTupleLiteral) {
      for (const NodePtr& item : target.list) DeclareTarget(*item);
    }
  }

  // Calls are checked once the whole template is read (a macro may be
  // defined after its first use).
  void RecordCall(const Node& callee) {
    if (callee.type == NodeType::kIdentifier) {
      calls_.emplace_back(callee.name, callee.offset, /*method=*/false);
    } else if (callee.type == NodeType::kMember && !callee.flag && callee.b->type == NodeType::kIdentifier) {
      calls_.emplace_back(callee.b->name, callee.b->offset, /*method=*/true);
    }
  }

  void CheckCalls(const Program&) const {
    for (const auto& [name, offset, method] : calls_) {
      if (macros_.count(name) > 0) continue;
      if (method) {
        if (kMethods.count(name) == 0) Fail("unsupported method '" + name + "'", offset);
      } else if (kGlobalFunctions.count(name) == 0 && name != "caller" && declared_.count(name) == 0) {
        Fail("unsupported function '" + name + "'", offset);
      }
    }
  }

  void CheckFilter(const Node& filter) const {
    const Node& id = filter.type == NodeType::kCall ? *filter.a : filter;
    const std::string& name = id.name;
    if (kFilters.count(name) == 0) Fail("unsupported filter '" + name + "'", id.offset);
    if (filter.type != NodeType::kCall) return;
    const NodeList& args = filter.list;
    if (name == "tojson") {
      for (const NodePtr& arg : args) {
        if (arg->type != NodeType::kKeywordArgument) {
          Fail("tojson takes keyword arguments only (indent=, ensure_ascii=, separators=)", arg->offset);
        }
        if (arg->name == "sort_keys") Fail("unsupported tojson argument 'sort_keys'", arg->offset);
      }
    } else if (name == "selectattr" || name == "rejectattr") {
      for (const NodePtr& arg : args) {
        if (arg->type != NodeType::kStringLiteral) {
          Fail("arguments of '" + name + "' must be string literals", arg->offset);
        }
      }
      if (args.empty()) Fail("'" + name + "' needs an attribute name", id.offset);
      if (args.size() >= 2 && kTests.count(args[1]->name) == 0) {
        Fail("unsupported test '" + args[1]->name + "'", args[1]->offset);
      }
    } else if (name == "map") {
      const bool has_attribute = std::any_of(args.begin(), args.end(), [](const NodePtr& a) {
        return a->type == NodeType::kKeywordArgument && a->name == "attribute";
      });
      if (!has_attribute) Fail("'map' is supported with attribute= only", id.offset);
    }
  }

  std::vector<Token> tokens_;
  size_t current_ = 0;
  mutable int recursion_ = 0;
  std::set<std::string> macros_;
  std::set<std::string> declared_;
  std::vector<std::tuple<std::string, size_t, bool>> calls_;
};

}  // namespace

Program Parse(std::vector<Token> tokens) { return Parser(std::move(tokens)).Run(); }

}  // namespace cortiq::chat::jinja
