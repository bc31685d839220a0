// Evaluator: a port of @huggingface/jinja's runtime.ts (Interpreter,
// Environment, setupGlobals, the filters, tests and builtin methods), with
// the limits of RenderLimits. Comments name the reference's behaviour where
// it differs from Python Jinja, because that is what must be matched.
#include "core/chat/jinja_interpreter.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <set>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "core/tokenizer/unicode.h"

namespace cortiq::chat::jinja {
namespace {

struct BreakSignal {};
struct ContinueSignal {};

[[noreturn]] void Fail(const std::string& message) { throw RenderError(message); }

std::string Str(size_t n) { return std::to_string(n); }

bool IsNumericLike(const Value& v) { return v.IsNumber() || v.kind == Kind::kBool; }
double NumericValue(const Value& v) {
  return v.kind == Kind::kBool ? (v.boolean ? 1 : 0) : v.number;
}

// The JavaScript value a wrapped JS function (range, strftime_now,
// raise_exception) receives for an argument.
const Value* Arg(const std::vector<Value>& args, size_t i) {
  return i < args.size() ? &args[i] : nullptr;
}

// compareRuntimeValues: sort / dictsort order.
int CompareValues(const Value& a, const Value& b, bool case_sensitive) {
  if (a.kind == Kind::kNull && b.kind == Kind::kNull) return 0;
  if (a.kind == Kind::kNull || b.kind == Kind::kNull) {
    Fail(absl::StrCat("Cannot compare ", TypeName(a.kind), " with ", TypeName(b.kind)));
  }
  if (a.kind == Kind::kUndefined && b.kind == Kind::kUndefined) return 0;
  if (a.kind == Kind::kUndefined || b.kind == Kind::kUndefined) {
    Fail(absl::StrCat("Cannot compare ", TypeName(a.kind), " with ", TypeName(b.kind)));
  }
  if (IsNumericLike(a) && IsNumericLike(b)) {
    const double x = NumericValue(a), y = NumericValue(b);
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.kind != b.kind) {
    Fail(absl::StrCat("Cannot compare different types: ", TypeName(a.kind), " and ",
                      TypeName(b.kind)));
  }
  if (a.kind == Kind::kString) {
    if (case_sensitive) return CompareUtf16(a.s(), b.s());
    return CompareUtf16(JsToLower(a.s()), JsToLower(b.s()));
  }
  Fail(absl::StrCat("Cannot compare type: ", TypeName(a.kind)));
}

// getAttributeValue: "a.b.0" paths through objects and arrays.
Value AttributePath(const Value& item, const std::string& path) {
  Value value = item;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (value.IsAttributeContainer()) {
      const Value* v = value.object->map.Find(part);
      value = v != nullptr ? *v : Value::Undefined();
    } else if (value.IsArray()) {
      double index = 0;
      if (JsParseInt(part, &index) && index >= 0 &&
          index < static_cast<double>(value.items().size())) {
        value = value.items()[static_cast<size_t>(index)];
      } else {
        return Value::Undefined();
      }
    } else {
      return Value::Undefined();
    }
    if (dot == std::string::npos) return value;
    start = dot + 1;
  }
}

// utils.slice over n items: the indices Python's seq[start:stop:step] picks.
std::vector<size_t> SliceIndices(size_t n, const Value& start_v, const Value& stop_v,
                                 const Value& step_v) {
  const double len = static_cast<double>(n);
  const double step = step_v.kind == Kind::kUndefined ? 1 : step_v.number;
  const double direction = step > 0 ? 1 : step < 0 ? -1 : 0;
  double start, stop;
  if (direction >= 0) {
    start = start_v.kind == Kind::kUndefined ? 0 : start_v.number;
    start = start < 0 ? std::max(len + start, 0.0) : std::min(start, len);
    stop = stop_v.kind == Kind::kUndefined ? len : stop_v.number;
    stop = stop < 0 ? std::max(len + stop, 0.0) : std::min(stop, len);
  } else {
    start = start_v.kind == Kind::kUndefined ? len - 1 : start_v.number;
    start = start < 0 ? std::max(len + start, -1.0) : std::min(start, len - 1);
    stop = stop_v.kind == Kind::kUndefined ? -1 : stop_v.number;
    stop = stop < -1 ? std::max(len + stop, -1.0) : std::min(stop, len - 1);
  }
  std::vector<size_t> out;
  if (direction == 0) return out;
  for (double i = start; direction * i < direction * stop; i += step) {
    if (i >= 0 && i < len) out.push_back(static_cast<size_t>(i));
  }
  return out;
}

// utils.replace: Python's str.replace(old, new, count) with a Unicode-aware
// empty pattern (matches between code points).
std::string Replace(const std::string& s, const std::string& old_value,
                    const std::string& new_value, double count) {
  if (count == 0) return s;
  double remaining = (std::isnan(count) || count < 0) ? INFINITY : count;
  std::string out;
  if (old_value.empty()) {
    const std::vector<std::string> cps = CodePoints(s);
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (remaining > 0) {
        out += new_value;
        --remaining;
      }
      if (i < cps.size()) out += cps[i];
    }
    return out;
  }
  size_t pos = 0;
  while (remaining > 0) {
    const size_t hit = s.find(old_value, pos);
    if (hit == std::string::npos) break;
    out.append(s, pos, hit - pos);
    out += new_value;
    pos = hit + old_value.size();
    --remaining;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

// titleCase: /\b\w/g upper-cased (ASCII word characters).
std::string TitleCase(std::string_view s) {
  std::string out(s);
  auto is_word = [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  };
  for (size_t i = 0; i < out.size(); ++i) {
    if (is_word(out[i]) && (i == 0 || !is_word(out[i - 1])) && out[i] >= 'a' && out[i] <= 'z') {
      out[i] = static_cast<char>(out[i] - 32);
    }
  }
  return out;
}

// The indent filter: `pad` before each line, except the first (unless
// `first`) and empty lines (unless `blank`).
std::string Indent(std::string_view s, const std::string& pad, bool first, bool blank) {
  std::string out;
  size_t start = 0;
  bool is_first = true;
  while (true) {
    const size_t nl = s.find('\n', start);
    const std::string_view line =
        s.substr(start, nl == std::string_view::npos ? std::string_view::npos : nl - start);
    if (!is_first) out.push_back('\n');
    if (!((!first && is_first) || (!blank && line.empty()))) out += pad;
    out += line;
    is_first = false;
    if (nl == std::string_view::npos) break;
    start = nl + 1;
  }
  return out;
}

std::string Capitalize(std::string_view s) {
  if (s.empty()) return "";
  size_t len = 1;
  tokenizer::DecodeUtf8Valid(s.data(), &len);
  return JsToUpper(s.substr(0, len)) + std::string(s.substr(len));
}

// The builtin tests (Environment.TESTS). b: the test's argument, if any.
bool RunTest(const std::string& name, const Value& a, const Value* b) {
  if (name == "boolean") return a.kind == Kind::kBool;
  if (name == "callable") return a.kind == Kind::kFunction;
  if (name == "odd" || name == "even") {
    if (a.kind != Kind::kInt) Fail(absl::StrCat("cannot ", name, " on ", TypeName(a.kind)));
    const double r = std::fmod(a.number, 2);
    return name == "odd" ? r != 0 : r == 0;
  }
  if (name == "false") return a.kind == Kind::kBool && !a.boolean;
  if (name == "true") return a.kind == Kind::kBool && a.boolean;
  if (name == "none") return a.kind == Kind::kNull;
  if (name == "string") return a.kind == Kind::kString;
  if (name == "number") return a.IsNumber();
  if (name == "integer") return a.kind == Kind::kInt;
  if (name == "iterable") return a.kind == Kind::kArray || a.kind == Kind::kString;
  if (name == "mapping") return a.IsObject();
  if (name == "sequence") return a.IsArray() || a.IsObject() || a.kind == Kind::kString;
  if (name == "lower") return a.kind == Kind::kString && a.s() == JsToLower(a.s());
  if (name == "upper") return a.kind == Kind::kString && a.s() == JsToUpper(a.s());
  if (name == "defined") return a.kind != Kind::kUndefined;
  if (name == "undefined") return a.kind == Kind::kUndefined;
  if (name == "equalto" || name == "eq") {
    if (b == nullptr) Fail("Cannot read properties of undefined (reading 'value')");
    return StrictEquals(a, *b);
  }
  Fail("Unknown test: " + name);
}

// Python's round(x, ndigits) on doubles: half to even (Jinja's
// round(method="common") calls it); floor / ceil for the other methods.
double RoundNumber(double x, int precision, const std::string& method) {
  const double scale = std::pow(10.0, precision);
  const double y = x * scale;
  double r;
  if (method == "floor") {
    r = std::floor(y);
  } else if (method == "ceil") {
    r = std::ceil(y);
  } else {
    r = std::nearbyint(y);  // default rounding mode: to nearest, ties to even
  }
  return r / scale;
}

std::string StrftimeNow(absl::Time now, const std::string& format) {
  static const char* const kMonths[] = {"January",   "February", "March",    "April",
                                        "May",       "June",     "July",     "August",
                                        "September", "October",  "November", "December"};
  const absl::CivilSecond t = absl::ToCivilSecond(now, absl::UTCTimeZone());
  auto pad2 = [](int n) { return n < 10 ? "0" + std::to_string(n) : std::to_string(n); };
  std::string out;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%' || i + 1 >= format.size()) {
      out.push_back(format[i]);
      continue;
    }
    const char c = format[i + 1];
    const std::string month = kMonths[t.month() - 1];
    switch (c) {
      case 'Y':
        out += std::to_string(t.year());
        break;
      case 'm':
        out += pad2(t.month());
        break;
      case 'd':
        out += pad2(t.day());
        break;
      case 'b':
        out += month.substr(0, 3);
        break;
      case 'B':
        out += month;
        break;
      case 'H':
        out += pad2(t.hour());
        break;
      case 'M':
        out += pad2(t.minute());
        break;
      case '%':
        out += "%";
        break;
      default:
        out.push_back('%');
        out.push_back(c);
    }
    ++i;
  }
  return out;
}

// True when the subtree reads the variable `name` (macro kwargs / varargs).
bool Reads(const Node* node, const std::string& name) {
  if (node == nullptr) return false;
  if (node->type == NodeType::kIdentifier && node->name == name) return true;
  if (node->type == NodeType::kMember && !node->flag) return Reads(node->a.get(), name);
  if ((node->type == NodeType::kFilter) && node->b->type == NodeType::kIdentifier) {
    return Reads(node->a.get(), name);
  }
  for (const Node* child : {node->a.get(), node->b.get(), node->c.get()}) {
    if (Reads(child, name)) return true;
  }
  for (const NodeList* l : {&node->list, &node->list2}) {
    for (const NodePtr& child : *l) {
      if (Reads(child.get(), name)) return true;
    }
  }
  return false;
}
bool Reads(const NodeList& body, const std::string& name) {
  for (const NodePtr& n : body) {
    if (Reads(n.get(), name)) return true;
  }
  return false;
}

Value NamespaceBuiltin() {
  return Value::Function([](Interpreter& interp, std::vector<Value>& args, const EnvPtr&) {
    std::vector<Value> positional = args;
    const Value* kwargs = nullptr;
    Value kw_holder;
    if (!positional.empty() && positional.back().kind == Kind::kKwargs) {
      kw_holder = positional.back();
      kwargs = &kw_holder;
      positional.pop_back();
    }
    if (positional.size() > 1) {
      Fail("namespace expected at most 1 argument, got " + Str(positional.size()));
    }
    ObjectMap entries;
    if (positional.size() == 1) {
      const Value& source = positional[0];
      if (source.IsObject()) {
        for (const auto& [k, v] : source.object->map.entries()) entries.Set(k, v);
      } else if (source.IsArray()) {
        for (const Value& pair : source.items()) {
          std::vector<Value> kv;
          if (pair.IsArray()) {
            kv = pair.items();
          } else if (pair.kind == Kind::kString) {
            for (std::string& cp : CodePoints(pair.s())) kv.push_back(Value::String(std::move(cp)));
          }
          if (kv.size() != 2)
            Fail("namespace expected an object or an iterable of [key, value] pairs");
          if (kv[0].kind != Kind::kString) Fail("namespace keys must be strings");
          entries.Set(kv[0].s(), kv[1]);
        }
      } else {
        Fail(absl::StrCat("'", TypeName(source.kind), "' object is not iterable"));
      }
    }
    if (kwargs != nullptr) {
      for (const auto& [k, v] : kwargs->object->map.entries()) entries.Set(k, v);
    }
    for (const auto& [k, v] : entries.entries()) interp.CheckNamespaceMember(v);
    return interp.MakeObject(std::move(entries), Kind::kNamespace);
  });
}

}  // namespace

// ---- Environment ------------------------------------------------------------

Value Environment::Lookup(const std::string& name) const {
  for (const Environment* e = this; e != nullptr; e = e->parent_.get()) {
    auto it = e->vars_.find(name);
    if (it != e->vars_.end()) return it->second;
    // Every reference Environment starts with its own `namespace`.
    if (name == "namespace") return NamespaceBuiltin();
  }
  return Value::Undefined();
}

// ---- Interpreter: bookkeeping -------------------------------------------------

Interpreter::CallGuard::CallGuard(Interpreter* i) : interp(i) {
  if (++interp->call_depth_ > interp->limits_.max_call_depth) {
    --interp->call_depth_;
    Fail("macro calls nested deeper than the limit of " +
         std::to_string(interp->limits_.max_call_depth));
  }
}

void Interpreter::CheckNamespaceMember(const Value& v) {
  if (++steps_ > limits_.max_steps) {
    Fail("rendering took more than the limit of " + std::to_string(limits_.max_steps) + " steps");
  }
  if (v.kind == Kind::kNamespace) {
    // Namespaces are the only values that change after they are built; one
    // inside another could grow (or loop) past the depth the containers
    // recorded. No chat template nests them.
    Fail("a namespace cannot hold another namespace");
  }
  if (v.IsArray()) {
    for (const Value& item : v.items()) CheckNamespaceMember(item);
  } else if (v.IsObject()) {
    for (const auto& [k, item] : v.object->map.entries()) CheckNamespaceMember(item);
  }
}

void Interpreter::Charge(uint64_t bytes) {
  work_bytes_ += bytes;
  if (work_bytes_ > limits_.max_work_bytes) {
    Fail("rendering built more than the limit of " + std::to_string(limits_.max_work_bytes) +
         " bytes of strings and arrays");
  }
}

void Interpreter::ChargeLoop(uint64_t n) {
  loop_iterations_ += n;
  if (loop_iterations_ > limits_.max_loop_iterations) {
    Fail("more loop iterations than the limit of " + std::to_string(limits_.max_loop_iterations));
  }
}

Value Interpreter::MakeString(std::string s) {
  if (s.size() > limits_.max_output_bytes) {
    Fail("a string of " + Str(s.size()) + " bytes exceeds the output limit of " +
         Str(limits_.max_output_bytes) + " bytes");
  }
  Charge(s.size());
  return Value::String(std::move(s));
}

Value Interpreter::MakeArray(std::vector<Value> items, Kind kind) {
  Charge(items.size() * sizeof(Value));
  Value v = Value::Array(std::move(items), kind);
  if (v.Depth() > limits_.max_value_depth) {
    Fail("a value nested deeper than the limit of " + std::to_string(limits_.max_value_depth));
  }
  return v;
}

Value Interpreter::MakeObject(ObjectMap map, Kind kind) {
  Charge(map.size() * (sizeof(Value) + 32));
  Value v = Value::Object(std::move(map), kind);
  if (v.Depth() > limits_.max_value_depth) {
    Fail("a value nested deeper than the limit of " + std::to_string(limits_.max_value_depth));
  }
  return v;
}

EnvPtr Interpreter::MakeGlobals() {
  auto env = std::make_shared<Environment>(nullptr);
  env->Set("false", Value::Bool(false));
  env->Set("true", Value::Bool(true));
  env->Set("none", Value::Null());
  env->Set("False", Value::Bool(false));
  env->Set("True", Value::Bool(true));
  env->Set("None", Value::Null());
  env->Set("namespace", NamespaceBuiltin());
  env->Set("raise_exception",
           Value::Function([](Interpreter&, std::vector<Value>& args, const EnvPtr&) -> Value {
             // throw new Error(arg): the message is String(arg), "" for undefined.
             const Value* a = Arg(args, 0);
             RenderError e(a == nullptr || a->kind == Kind::kUndefined ? "" : ToJsString(*a));
             e.raised = true;
             throw e;
           }));
  env->Set("range",
           Value::Function([](Interpreter& interp, std::vector<Value>& args, const EnvPtr&) {
             for (const Value& a : args) {
               if (!a.IsNumber()) Fail("range() arguments must be numbers");
             }
             if (args.empty()) Fail("range() needs at least one argument");
             double start = args[0].number, stop = 0, step = 1;
             if (args.size() >= 2) {
               stop = args[1].number;
             } else {
               stop = start;
               start = 0;
             }
             if (args.size() >= 3) step = args[2].number;
             if (step == 0) Fail("range() step must not be zero");
             if (std::isnan(start) || std::isnan(stop) || std::isnan(step))
               return interp.MakeArray({});
             const double count = std::max(0.0, std::ceil((stop - start) / step));
             interp.ChargeLoop(static_cast<uint64_t>(std::min(count, 1e18)));
             // The charged count of elements, each start + k * step: adding
             // the step in a loop stalls past 2^53 (1e16 + 1 == 1e16), and
             // the loop then never ended.
             std::vector<Value> out;
             const auto n = static_cast<uint64_t>(count);
             out.reserve(n);
             for (uint64_t k = 0; k < n; ++k) {
               const double i = start + static_cast<double>(k) * step;
               out.push_back(std::trunc(i) == i ? Value::Int(i) : Value::Float(i));
             }
             return interp.MakeArray(std::move(out));
           }));
  env->Set("strftime_now",
           Value::Function([](Interpreter& interp, std::vector<Value>& args, const EnvPtr&) {
             const Value* f = Arg(args, 0);
             if (f == nullptr || f->kind != Kind::kString)
               Fail("strftime_now() needs a format string");
             return interp.MakeString(StrftimeNow(interp.now(), f->s()));
           }));
  return env;
}

std::string Interpreter::Run(const Program& program, const EnvPtr& globals) {
  try {
    std::string out = EvaluateBlock(program.body, globals);
    if (out.size() > limits_.max_output_bytes) {
      Fail("rendered output exceeds the limit of " + Str(limits_.max_output_bytes) + " bytes");
    }
    return out;
  } catch (const BreakSignal&) {
    Fail("'break' outside a loop");
  } catch (const ContinueSignal&) {
    Fail("'continue' outside a loop");
  }
}

std::string Interpreter::EvaluateBlock(const NodeList& body, const EnvPtr& env) {
  std::string result;
  for (const NodePtr& statement : body) {
    if (statement->type == NodeType::kText) {
      Charge(statement->name.size());
      result += statement->name;
    } else {
      const Value v = Evaluate(statement.get(), env);
      if (v.kind == Kind::kNull || v.kind == Kind::kUndefined) continue;
      if (v.kind == Kind::kString) {
        Charge(v.s().size());
        result += v.s();
      } else {
        const std::string s = ToOutputString(v);
        Charge(s.size());
        result += s;
      }
    }
    if (result.size() > limits_.max_output_bytes) {
      Fail("rendered output exceeds the limit of " + Str(limits_.max_output_bytes) + " bytes");
    }
  }
  return result;
}

Value Interpreter::Evaluate(const Node* node, const EnvPtr& env) {
  if (node == nullptr) return Value::Undefined();
  if (++steps_ > limits_.max_steps) {
    Fail("rendering took more than the limit of " + std::to_string(limits_.max_steps) + " steps");
  }
  try {
    return EvaluateInner(node, env);
  } catch (RenderError& e) {
    if (e.offset == static_cast<size_t>(-1)) e.offset = node->offset;
    throw;
  }
}

Value Interpreter::EvaluateInner(const Node* node, const EnvPtr& env) {
  switch (node->type) {
    case NodeType::kText:
    case NodeType::kStringLiteral:
      return MakeString(node->name);
    case NodeType::kComment:
      return Value::Null();
    case NodeType::kIntegerLiteral:
      return Value::Int(node->number);
    case NodeType::kFloatLiteral:
      return Value::Float(node->number);
    case NodeType::kArrayLiteral:
    case NodeType::kTupleLiteral: {
      std::vector<Value> items;
      for (const NodePtr& item : node->list) items.push_back(Evaluate(item.get(), env));
      return MakeArray(std::move(items),
                       node->type == NodeType::kArrayLiteral ? Kind::kArray : Kind::kTuple);
    }
    case NodeType::kObjectLiteral: {
      ObjectMap map;
      for (size_t i = 0; i < node->list.size(); ++i) {
        const Value key = Evaluate(node->list[i].get(), env);
        if (key.kind != Kind::kString)
          Fail(absl::StrCat("Object keys must be strings: got ", TypeName(key.kind)));
        map.Set(key.s(), Evaluate(node->list2[i].get(), env));
      }
      return MakeObject(std::move(map));
    }
    case NodeType::kIdentifier:
      return env->Lookup(node->name);
    case NodeType::kCall:
      return EvaluateCall(node, env);
    case NodeType::kMember:
      return EvaluateMember(node, env);
    case NodeType::kUnary:
      return EvaluateUnary(node, env);
    case NodeType::kBinary:
      return EvaluateBinary(node, env);
    case NodeType::kFilter: {
      const Value operand = Evaluate(node->a.get(), env);
      return ApplyFilter(operand, node->b.get(), env);
    }
    case NodeType::kFilterStatement: {
      const Value rendered = MakeString(EvaluateBlock(node->list, env));
      return ApplyFilter(rendered, node->a.get(), env);
    }
    case NodeType::kTest:
      return EvaluateTest(node, env);
    case NodeType::kSelect: {
      if (!Truthy(Evaluate(node->b.get(), env))) return Value::Undefined();
      return Evaluate(node->a.get(), env);
    }
    case NodeType::kTernary:
      return Truthy(Evaluate(node->a.get(), env)) ? Evaluate(node->b.get(), env)
                                                  : Evaluate(node->c.get(), env);
    case NodeType::kSet:
      return EvaluateSet(node, env);
    case NodeType::kIf: {
      const bool test = Truthy(Evaluate(node->a.get(), env));
      return MakeString(EvaluateBlock(test ? node->list : node->list2, env));
    }
    case NodeType::kFor:
      return MakeString(EvaluateFor(node, env));
    case NodeType::kMacro:
      return DefineMacro(node, env);
    case NodeType::kCallStatement:
      return EvaluateCallStatement(node, env);
    case NodeType::kBreak:
      throw BreakSignal();
    case NodeType::kContinue:
      throw ContinueSignal();
    default:
      Fail("Unknown node type");
  }
}

// ---- expressions ----------------------------------------------------------------

Value Interpreter::EvaluateBinary(const Node* node, const EnvPtr& env) {
  const std::string& op = node->name;
  const Value left = Evaluate(node->a.get(), env);
  if (op == "and") return Truthy(left) ? Evaluate(node->b.get(), env) : left;
  if (op == "or") return Truthy(left) ? left : Evaluate(node->b.get(), env);
  const Value right = Evaluate(node->b.get(), env);
  if (op == "==") return Value::Bool(LooseEquals(left, right));
  if (op == "!=") return Value::Bool(!LooseEquals(left, right));

  const bool membership = op == "in" || op == "not in";
  if (left.kind == Kind::kUndefined || right.kind == Kind::kUndefined) {
    if (right.kind == Kind::kUndefined && membership) return Value::Bool(op == "not in");
    Fail("Cannot perform operation " + op + " on undefined values");
  }
  if (left.kind == Kind::kNull || right.kind == Kind::kNull)
    Fail("Cannot perform operation on null values");
  if (op == "~") return MakeString(ToJsString(left) + ToJsString(right));
  if (op == "**" && IsNumericLike(left) && IsNumericLike(right)) {
    const double a = NumericValue(left), b = NumericValue(right);
    if (a == 0 && b < 0) Fail("0.0 cannot be raised to a negative power");
    const double result = std::pow(a, b);
    if (!std::isfinite(result)) Fail("Exponentiation result is not a finite real number");
    const bool is_float = left.kind == Kind::kFloat || right.kind == Kind::kFloat || b < 0;
    return is_float ? Value::Float(result) : Value::Int(result);
  }
  if (left.IsNumber() && right.IsNumber()) {
    const double a = left.number, b = right.number;
    const bool is_float = left.kind == Kind::kFloat || right.kind == Kind::kFloat;
    auto num = [&](double r) { return is_float ? Value::Float(r) : Value::Int(r); };
    if (op == "+") return num(a + b);
    if (op == "-") return num(a - b);
    if (op == "*") return num(a * b);
    if (op == "/") return Value::Float(a / b);
    if (op == "//") return num(std::floor(a / b));
    if (op == "%") return num(std::fmod(a, b));
    if (op == "<") return Value::Bool(a < b);
    if (op == ">") return Value::Bool(a > b);
    if (op == ">=") return Value::Bool(a >= b);
    if (op == "<=") return Value::Bool(a <= b);
  } else if (left.IsArray() && right.IsArray()) {
    if (op == "+") {
      std::vector<Value> items = left.items();
      items.insert(items.end(), right.items().begin(), right.items().end());
      return MakeArray(std::move(items));
    }
  } else if (right.IsArray()) {
    if (membership) {
      const bool member = std::any_of(right.items().begin(), right.items().end(),
                                      [&](const Value& x) { return StrictEquals(x, left); });
      return Value::Bool(op == "in" ? member : !member);
    }
  }
  if ((left.kind == Kind::kString || right.kind == Kind::kString) && op == "+") {
    return MakeString(ToJsString(left) + ToJsString(right));
  }
  if (left.kind == Kind::kString && right.kind == Kind::kString && membership) {
    const bool found = right.s().find(left.s()) != std::string::npos;
    return Value::Bool(op == "in" ? found : !found);
  }
  if (left.kind == Kind::kString && right.IsObject() && membership) {
    const bool found = right.object->map.Find(left.s()) != nullptr;
    return Value::Bool(op == "in" ? found : !found);
  }
  Fail(absl::StrCat("Unknown operator \"", op, "\" between ", TypeName(left.kind), " and ",
                    TypeName(right.kind)));
}

Value Interpreter::EvaluateUnary(const Node* node, const EnvPtr& env) {
  const Value arg = Evaluate(node->a.get(), env);
  if (node->name == "not") return Value::Bool(!Truthy(arg));
  const double sign = node->name == "-" ? -1 : 1;
  if (IsNumericLike(arg)) {
    const double r = sign * NumericValue(arg);
    return arg.kind == Kind::kFloat ? Value::Float(r) : Value::Int(r);
  }
  Fail(absl::StrCat("Unknown operator \"", node->name, "\" for ", TypeName(arg.kind)));
}

Value Interpreter::EvaluateTest(const Node* node, const EnvPtr& env) {
  const Value operand = Evaluate(node->a.get(), env);
  const bool result = RunTest(node->name, operand, nullptr);
  return Value::Bool(node->flag ? !result : result);
}

void Interpreter::EvaluateArguments(const NodeList& args, const EnvPtr& env,
                                    std::vector<Value>* positional, ObjectMap* keywords) {
  for (const NodePtr& arg : args) {
    if (arg->type == NodeType::kSpread) {
      const Value v = Evaluate(arg->a.get(), env);
      if (!v.IsArray()) Fail(absl::StrCat("Cannot unpack non-iterable type: ", TypeName(v.kind)));
      positional->insert(positional->end(), v.items().begin(), v.items().end());
    } else if (arg->type != NodeType::kKeywordArgument && arg->type != NodeType::kKeywordSpread) {
      positional->push_back(Evaluate(arg.get(), env));
    }
  }
  for (const NodePtr& arg : args) {
    auto add = [&](const std::string& key, Value value) {
      if (keywords->Find(key) != nullptr)
        Fail("Got multiple values for keyword argument '" + key + "'");
      keywords->Set(key, std::move(value));
    };
    if (arg->type == NodeType::kKeywordArgument) {
      add(arg->name, Evaluate(arg->a.get(), env));
    } else if (arg->type == NodeType::kKeywordSpread) {
      const Value v = Evaluate(arg->a.get(), env);
      if (!v.IsObject())
        Fail(absl::StrCat("Argument after ** must be a mapping, not ", TypeName(v.kind)));
      for (const auto& [k, item] : v.object->map.entries()) add(k, item);
    }
  }
}

Value Interpreter::EvaluateCall(const Node* node, const EnvPtr& env) {
  std::vector<Value> args;
  ObjectMap kwargs;
  EvaluateArguments(node->list, env, &args, &kwargs);
  if (kwargs.size() > 0) args.push_back(MakeObject(std::move(kwargs), Kind::kKwargs));
  const Value fn = Evaluate(node->a.get(), env);
  if (fn.kind != Kind::kFunction) {
    Fail(absl::StrCat("Cannot call something that is not a function: got ", TypeName(fn.kind)));
  }
  return (*fn.function)(*this, args, env);
}

Value Interpreter::EvaluateSlice(const Value& object, const Node* slice, const EnvPtr& env) {
  if (!(object.IsArray() || object.kind == Kind::kString))
    Fail("Slice object must be an array or string");
  const Value start = Evaluate(slice->a.get(), env);
  const Value stop = Evaluate(slice->b.get(), env);
  const Value step = Evaluate(slice->c.get(), env);
  for (const Value* v : {&start, &stop, &step}) {
    if (!(v->kind == Kind::kInt || v->kind == Kind::kUndefined))
      Fail("Slice indices must be integers or undefined");
  }
  if (object.IsArray()) {
    std::vector<Value> out;
    for (size_t i : SliceIndices(object.items().size(), start, stop, step))
      out.push_back(object.items()[i]);
    return MakeArray(std::move(out));
  }
  const std::vector<std::string> cps = CodePoints(object.s());
  std::string out;
  for (size_t i : SliceIndices(cps.size(), start, stop, step)) out += cps[i];
  return MakeString(std::move(out));
}

Value Interpreter::EvaluateMember(const Node* node, const EnvPtr& env) {
  const Value object = Evaluate(node->a.get(), env);
  Value property;
  if (node->flag) {
    if (node->b->type == NodeType::kSlice) return EvaluateSlice(object, node->b.get(), env);
    property = Evaluate(node->b.get(), env);
  } else if (node->b->type == NodeType::kIntegerLiteral) {
    property = Value::Int(node->b->number);
  } else {
    property = Value::String(node->b->name);
  }

  if (object.IsAttributeContainer()) {
    if (property.kind != Kind::kString) {
      Fail(absl::StrCat("Cannot access property with non-string: got ", TypeName(property.kind)));
    }
    if (const Value* v = object.object->map.Find(property.s())) return *v;
    if (object.IsObject()) return BuiltinMember(*this, object, property.s());
    return Value::Undefined();
  }
  if (object.IsArray() || object.kind == Kind::kString) {
    if (property.kind == Kind::kInt) {
      if (object.kind == Kind::kString) {
        std::string unit;
        return Utf16At(object.s(), property.number, &unit) ? MakeString(std::move(unit))
                                                           : Value::Undefined();
      }
      const double n = static_cast<double>(object.items().size());
      double k = std::trunc(property.number);
      if (k < 0) k += n;
      if (k < 0 || k >= n) return Value::Undefined();
      return object.items()[static_cast<size_t>(k)];
    }
    if (property.kind == Kind::kString) return BuiltinMember(*this, object, property.s());
    Fail(absl::StrCat("Cannot access property with non-string/non-number: got ",
                      TypeName(property.kind)));
  }
  if (property.kind != Kind::kString) {
    Fail(absl::StrCat("Cannot access property with non-string: got ", TypeName(property.kind)));
  }
  return Value::Undefined();
}

// ---- builtin members (StringValue / ArrayValue / ObjectValue builtins) ------

namespace {

Value StringMethod(const Value& self, const std::string& name) {
  const std::string s = self.s();
  auto fn = [](auto body) { return Value::Function(body); };
  if (name == "upper")
    return fn([s](Interpreter& i, std::vector<Value>&, const EnvPtr&) {
      return i.MakeString(JsToUpper(s));
    });
  if (name == "lower")
    return fn([s](Interpreter& i, std::vector<Value>&, const EnvPtr&) {
      return i.MakeString(JsToLower(s));
    });
  // strip / lstrip / rstrip ignore their argument in the reference (JavaScript
  // trim()): `x.strip('\n')` strips all whitespace, unlike Python.
  if (name == "strip") {
    return fn([s](Interpreter& i, std::vector<Value>&, const EnvPtr&) {
      return i.MakeString(std::string(JsTrim(s)));
    });
  }
  if (name == "lstrip") {
    return fn([s](Interpreter& i, std::vector<Value>&, const EnvPtr&) {
      return i.MakeString(std::string(JsTrimStart(s)));
    });
  }
  if (name == "rstrip") {
    return fn([s](Interpreter& i, std::vector<Value>&, const EnvPtr&) {
      return i.MakeString(std::string(JsTrimEnd(s)));
    });
  }
  if (name == "title")
    return fn([s](Interpreter& i, std::vector<Value>&, const EnvPtr&) {
      return i.MakeString(TitleCase(s));
    });
  if (name == "capitalize") {
    return fn([s](Interpreter& i, std::vector<Value>&, const EnvPtr&) {
      return i.MakeString(Capitalize(s));
    });
  }
  if (name == "length") return Value::Int(static_cast<double>(Utf16Length(s)));
  if (name == "startswith" || name == "endswith") {
    const bool starts = name == "startswith";
    return fn([s, starts, name](Interpreter&, std::vector<Value>& args, const EnvPtr&) {
      if (args.empty()) Fail(name + "() requires at least one argument");
      auto test = [&](const std::string& p) {
        return p.size() <= s.size() && (starts ? s.compare(0, p.size(), p) == 0
                                               : s.compare(s.size() - p.size(), p.size(), p) == 0);
      };
      const Value& pattern = args[0];
      if (pattern.kind == Kind::kString) return Value::Bool(test(pattern.s()));
      if (pattern.IsArray()) {
        for (const Value& item : pattern.items()) {
          if (item.kind != Kind::kString) Fail(name + "() tuple elements must be strings");
          if (test(item.s())) return Value::Bool(true);
        }
        return Value::Bool(false);
      }
      Fail(name + "() argument must be a string or tuple of strings");
    });
  }
  if (name == "split") {
    return fn([s](Interpreter& interp, std::vector<Value>& args, const EnvPtr&) {
      const Value sep = args.size() > 0 ? args[0] : Value::Null();
      if (!(sep.kind == Kind::kString || sep.kind == Kind::kNull))
        Fail("sep argument must be a string or null");
      const Value maxsplit = args.size() > 1 ? args[1] : Value::Int(-1);
      if (maxsplit.kind != Kind::kInt) Fail("maxsplit argument must be a number");
      const double max = maxsplit.number;
      std::vector<std::string> parts;
      if (sep.kind == Kind::kNull) {
        const std::string_view text = JsTrimStart(s);
        size_t i = 0;
        while (i < text.size()) {
          // One \S+ run.
          size_t start = i, len = 0;
          while (start < text.size()) {
            tokenizer::DecodeUtf8Valid(text.data() + start, &len);
            size_t l2 = 0;
            if (!IsJsSpace(tokenizer::DecodeUtf8Valid(text.data() + start, &l2))) break;
            start += len;
          }
          if (start >= text.size()) break;
          size_t end = start;
          while (end < text.size()) {
            size_t l2 = 0;
            if (IsJsSpace(tokenizer::DecodeUtf8Valid(text.data() + end, &l2))) break;
            end += l2;
          }
          if (max != -1 && static_cast<double>(parts.size()) >= max) {
            parts.emplace_back(text.substr(start));
            break;
          }
          parts.emplace_back(text.substr(start, end - start));
          i = end;
        }
      } else {
        const std::string& d = sep.s();
        if (d.empty()) Fail("empty separator");
        size_t pos = 0;
        while (true) {
          const size_t hit = s.find(d, pos);
          if (hit == std::string::npos) break;
          parts.push_back(s.substr(pos, hit - pos));
          pos = hit + d.size();
        }
        parts.push_back(s.substr(pos));
        if (max != -1 && static_cast<double>(parts.size()) > max) {
          const size_t keep = max < 0 ? 0 : static_cast<size_t>(max);
          std::string rest;
          for (size_t k = keep; k < parts.size(); ++k) {
            if (k > keep) rest += d;
            rest += parts[k];
          }
          parts.resize(keep);
          parts.push_back(std::move(rest));
        }
      }
      std::vector<Value> out;
      for (std::string& p : parts) out.push_back(interp.MakeString(std::move(p)));
      return interp.MakeArray(std::move(out));
    });
  }
  if (name == "replace") {
    return fn([s](Interpreter& interp, std::vector<Value>& args, const EnvPtr&) {
      if (args.size() < 2) Fail("replace() requires at least two arguments");
      if (args[0].kind != Kind::kString || args[1].kind != Kind::kString)
        Fail("replace() arguments must be strings");
      Value count = Value::Null();
      if (args.size() > 2) {
        if (args[2].kind == Kind::kKwargs) {
          const Value* c = args[2].object->map.Find("count");
          count = c != nullptr ? *c : Value::Null();
        } else {
          count = args[2];
        }
      }
      if (!(count.kind == Kind::kInt || count.kind == Kind::kNull)) {
        Fail("replace() count argument must be a number or null");
      }
      const std::string& old_value = args[0].s();
      const std::string& new_value = args[1].s();
      // Bound the result before building it.
      const double hits = old_value.empty() ? static_cast<double>(Utf16Length(s) + 1)
                                            : static_cast<double>(s.size() / old_value.size());
      interp.Charge(
          static_cast<uint64_t>(std::min(hits * static_cast<double>(new_value.size()), 1e18)));
      return interp.MakeString(
          Replace(s, old_value, new_value, count.kind == Kind::kNull ? NAN : count.number));
    });
  }
  return Value::Undefined();
}

std::vector<Value> Items(Interpreter& interp, const Value& obj) {
  std::vector<Value> out;
  for (const auto& [k, v] : obj.object->map.entries())
    out.push_back(interp.MakeArray({Value::String(k), v}));
  return out;
}

Value ObjectMethod(const Value& self, const std::string& name) {
  if (name == "get") {
    return Value::Function([self](Interpreter&, std::vector<Value>& args, const EnvPtr&) {
      if (args.empty()) Fail("Cannot read properties of undefined (reading 'type')");
      if (args[0].kind != Kind::kString)
        Fail(absl::StrCat("Object key must be a string: got ", TypeName(args[0].kind)));
      if (const Value* v = self.object->map.Find(args[0].s())) return *v;
      return args.size() > 1 ? args[1] : Value::Null();
    });
  }
  if (name == "items") {
    return Value::Function([self](Interpreter& i, std::vector<Value>&, const EnvPtr&) {
      return i.MakeArray(Items(i, self));
    });
  }
  if (name == "keys") {
    return Value::Function([self](Interpreter& i, std::vector<Value>&, const EnvPtr&) {
      std::vector<Value> out;
      for (const auto& [k, v] : self.object->map.entries()) out.push_back(Value::String(k));
      return i.MakeArray(std::move(out));
    });
  }
  if (name == "values") {
    return Value::Function([self](Interpreter& i, std::vector<Value>&, const EnvPtr&) {
      std::vector<Value> out;
      for (const auto& [k, v] : self.object->map.entries()) out.push_back(v);
      return i.MakeArray(std::move(out));
    });
  }
  if (name == "dictsort") {
    return Value::Function([self](Interpreter& i, std::vector<Value>& args, const EnvPtr&) {
      const ObjectMap* kwargs = nullptr;
      std::vector<Value> positional;
      for (const Value& a : args) {
        if (a.kind == Kind::kKwargs) {
          kwargs = &a.object->map;
        } else {
          positional.push_back(a);
        }
      }
      auto option = [&](size_t index, const char* key, Value fallback) {
        if (index < positional.size()) return positional[index];
        if (kwargs != nullptr) {
          if (const Value* v = kwargs->Find(key)) return *v;
        }
        return fallback;
      };
      const Value case_sensitive = option(0, "case_sensitive", Value::Bool(false));
      if (case_sensitive.kind != Kind::kBool) Fail("case_sensitive must be a boolean");
      const Value by = option(1, "by", Value::String("key"));
      if (by.kind != Kind::kString) Fail("by must be a string");
      if (by.s() != "key" && by.s() != "value") Fail("by must be either 'key' or 'value'");
      const Value reverse = option(2, "reverse", Value::Bool(false));
      if (reverse.kind != Kind::kBool) Fail("reverse must be a boolean");
      std::vector<Value> items = Items(i, self);
      const size_t index = by.s() == "key" ? 0 : 1;
      std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
        const int r = CompareValues(a.items()[index], b.items()[index], case_sensitive.boolean);
        return (reverse.boolean ? -r : r) < 0;
      });
      return i.MakeArray(std::move(items));
    });
  }
  return Value::Undefined();
}

}  // namespace

Value BuiltinMember(Interpreter&, const Value& object, const std::string& name) {
  if (object.kind == Kind::kString) return StringMethod(object, name);
  if (object.IsArray()) {
    return name == "length" ? Value::Int(static_cast<double>(object.items().size()))
                            : Value::Undefined();
  }
  if (object.IsObject()) return ObjectMethod(object, name);
  return Value::Undefined();
}

// ---- filters ------------------------------------------------------------------

Value Interpreter::ApplyFilter(const Value& operand, const Node* filter, const EnvPtr& env) {
  if (filter->type == NodeType::kCall) return ApplyFilterCall(operand, filter, env);
  const std::string& name = filter->name;
  if (name == "safe") return operand;
  if (name == "tojson") {
    std::string out;
    JsonOptions options;
    options.max_bytes = limits_.max_output_bytes;
    AppendJson(operand, options, 0, /*undefined_to_null=*/true, &out);
    return MakeString(std::move(out));
  }
  if (operand.IsArray()) {
    const std::vector<Value>& items = operand.items();
    if (name == "list") return operand;
    if (name == "first") return items.empty() ? Value::Undefined() : items.front();
    if (name == "last") return items.empty() ? Value::Undefined() : items.back();
    if (name == "length") return Value::Int(static_cast<double>(items.size()));
    if (name == "reverse") return MakeArray(std::vector<Value>(items.rbegin(), items.rend()));
    if (name == "sort") {
      std::vector<Value> sorted = items;
      std::stable_sort(sorted.begin(), sorted.end(), [](const Value& a, const Value& b) {
        return CompareValues(a, b, false) < 0;
      });
      return MakeArray(std::move(sorted));
    }
    if (name == "join") {
      std::string out;
      for (const Value& v : items) out += ToJoinString(v);
      return MakeString(std::move(out));
    }
    if (name == "string") return MakeString(ToOutputString(operand));
    if (name == "unique") {
      std::vector<Value> out;
      for (const Value& v : items) {
        const bool seen = std::any_of(out.begin(), out.end(), [&](const Value& o) {
          return StrictEquals(o, v) ||
                 (v.IsNumber() && o.IsNumber() && std::isnan(v.number) && std::isnan(o.number));
        });
        if (!seen) out.push_back(v);
      }
      return MakeArray(std::move(out));
    }
    Fail("Unknown ArrayValue filter: " + name);
  }
  if (operand.kind == Kind::kString) {
    const std::string& s = operand.s();
    if (name == "length") return Value::Int(static_cast<double>(Utf16Length(s)));
    if (name == "upper") return MakeString(JsToUpper(s));
    if (name == "lower") return MakeString(JsToLower(s));
    if (name == "title") return MakeString(TitleCase(s));
    if (name == "capitalize") return MakeString(Capitalize(s));
    if (name == "trim") return MakeString(std::string(JsTrim(s)));
    if (name == "indent") return MakeString(Indent(s, "    ", false, false));
    if (name == "join" || name == "string") return operand;
    if (name == "int") {
      double v = 0;
      return Value::Int(JsParseInt(s, &v) ? v : 0);
    }
    if (name == "float") {
      double v = 0;
      return Value::Float(JsParseFloat(s, &v) ? v : 0);
    }
    Fail("Unknown StringValue filter: " + name);
  }
  if (operand.IsNumber()) {
    if (name == "abs") {
      return operand.kind == Kind::kInt ? Value::Int(std::fabs(operand.number))
                                        : Value::Float(std::fabs(operand.number));
    }
    if (name == "int") return Value::Int(std::floor(operand.number));
    if (name == "float") return Value::Float(operand.number);
    if (name == "string") return MakeString(ToOutputString(operand));
    if (name == "round") return Value::Float(RoundNumber(operand.number, 0, "common"));
    Fail("Unknown NumericValue filter: " + name);
  }
  if (operand.IsObject()) {
    if (name == "items") return MakeArray(Items(*this, operand));
    if (name == "length") return Value::Int(static_cast<double>(operand.object->map.size()));
    const Value builtin = ObjectMethod(operand, name);
    if (builtin.kind == Kind::kFunction) {
      std::vector<Value> none;
      return (*builtin.function)(*this, none, env);
    }
    Fail("Unknown ObjectValue filter: " + name);
  }
  if (operand.kind == Kind::kBool) {
    if (name == "bool") return operand;
    if (name == "int") return Value::Int(operand.boolean ? 1 : 0);
    if (name == "float") return Value::Float(operand.boolean ? 1 : 0);
    if (name == "string") return MakeString(operand.boolean ? "true" : "false");
    Fail("Unknown BooleanValue filter: " + name);
  }
  Fail(absl::StrCat("Cannot apply filter \"", name, "\" to type: ", TypeName(operand.kind)));
}

Value Interpreter::ApplyFilterCall(const Value& operand, const Node* filter, const EnvPtr& env) {
  const std::string& name = filter->a->name;
  std::vector<Value> args;
  ObjectMap kwargs;
  auto evaluate_args = [&] { EvaluateArguments(filter->list, env, &args, &kwargs); };
  auto option = [&](size_t index, const char* key) -> const Value* {
    if (index < args.size()) return &args[index];
    return kwargs.Find(key);
  };

  if (name == "tojson") {
    evaluate_args();
    JsonOptions options;
    if (const Value* indent = kwargs.Find("indent")) {
      if (indent->kind == Kind::kInt) {
        if (indent->number > 1024 || indent->number < 0) Fail("tojson indent must be in [0, 1024]");
        options.indent = static_cast<int>(indent->number);
      } else if (indent->kind != Kind::kNull) {
        Fail("If set, indent must be a number");
      }
    }
    if (const Value* ascii = kwargs.Find("ensure_ascii")) {
      if (ascii->kind != Kind::kBool) Fail("If set, ensure_ascii must be a boolean");
      options.ensure_ascii = ascii->boolean;
    }
    if (const Value* seps = kwargs.Find("separators")) {
      if (seps->IsArray()) {
        if (seps->items().size() != 2 || seps->items()[0].kind != Kind::kString ||
            seps->items()[1].kind != Kind::kString) {
          Fail("separators must be a tuple of two strings");
        }
        options.has_separators = true;
        options.item_separator = seps->items()[0].s();
        options.key_separator = seps->items()[1].s();
      } else if (seps->kind != Kind::kNull) {
        Fail("If set, separators must be a tuple of two strings");
      }
    }
    std::string out;
    options.max_bytes = limits_.max_output_bytes;
    AppendJson(operand, options, 0, /*undefined_to_null=*/true, &out);
    return MakeString(std::move(out));
  }
  if (name == "join") {
    std::vector<std::string> parts;
    if (operand.kind == Kind::kString) {
      parts = CodePoints(operand.s());
    } else if (operand.IsArray()) {
      for (const Value& v : operand.items()) parts.push_back(ToJoinString(v));
    } else {
      Fail(absl::StrCat("Cannot apply filter \"join\" to type: ", TypeName(operand.kind)));
    }
    evaluate_args();
    const Value* sep = option(0, "separator");
    if (sep != nullptr && sep->kind != Kind::kString) Fail("separator must be a string");
    const std::string separator = sep != nullptr ? sep->s() : "";
    Charge(parts.size() * separator.size());
    std::string out;
    for (size_t i = 0; i < parts.size(); ++i) {
      if (i > 0) out += separator;
      out += parts[i];
    }
    return MakeString(std::move(out));
  }
  if (name == "int" || name == "float") {
    evaluate_args();
    const bool is_int = name == "int";
    const Value* d = option(0, "default");
    const Value fallback = d != nullptr ? *d : (is_int ? Value::Int(0) : Value::Float(0));
    if (operand.kind == Kind::kString) {
      double v = 0;
      const bool ok = is_int ? JsParseInt(operand.s(), &v) : JsParseFloat(operand.s(), &v);
      if (!ok) return fallback;
      return is_int ? Value::Int(v) : Value::Float(v);
    }
    if (operand.IsNumber()) return operand;
    if (operand.kind == Kind::kBool) {
      return is_int ? Value::Int(operand.boolean ? 1 : 0) : Value::Float(operand.boolean ? 1 : 0);
    }
    Fail(absl::StrCat("Cannot apply filter \"", name, "\" to type: ", TypeName(operand.kind)));
  }
  if (name == "default") {
    evaluate_args();
    const Value fallback = args.size() > 0 ? args[0] : Value::String("");
    const Value* flag = args.size() > 1 ? &args[1] : kwargs.Find("boolean");
    if (flag != nullptr && flag->kind != Kind::kBool)
      Fail("`default` filter flag must be a boolean");
    const bool boolean = flag != nullptr && flag->boolean;
    if (operand.kind == Kind::kUndefined || (boolean && !Truthy(operand))) return fallback;
    return operand;
  }
  if (name == "round" && operand.IsNumber()) {
    evaluate_args();
    const Value* precision = option(0, "precision");
    const Value* method = option(1, "method");
    if (precision != nullptr && precision->kind != Kind::kInt)
      Fail("round precision must be an integer");
    if (method != nullptr &&
        (method->kind != Kind::kString ||
         (method->s() != "common" && method->s() != "floor" && method->s() != "ceil"))) {
      Fail("round method must be 'common', 'floor' or 'ceil'");
    }
    const int p =
        precision != nullptr ? static_cast<int>(std::clamp(precision->number, -300.0, 300.0)) : 0;
    return Value::Float(RoundNumber(operand.number, p, method != nullptr ? method->s() : "common"));
  }

  if (operand.IsArray()) {
    const std::vector<Value>& items = operand.items();
    if (name == "sort") {
      evaluate_args();
      const Value* reverse = option(0, "reverse");
      const Value* case_sensitive = option(1, "case_sensitive");
      const Value* attribute = option(2, "attribute");
      if (reverse != nullptr && reverse->kind != Kind::kBool) Fail("reverse must be a boolean");
      if (case_sensitive != nullptr && case_sensitive->kind != Kind::kBool)
        Fail("case_sensitive must be a boolean");
      if (attribute != nullptr &&
          !(attribute->kind == Kind::kString || attribute->kind == Kind::kInt ||
            attribute->kind == Kind::kNull)) {
        Fail("attribute must be a string, integer, or null");
      }
      const bool rev = reverse != nullptr && reverse->boolean;
      const bool cs = case_sensitive != nullptr && case_sensitive->boolean;
      auto key = [&](const Value& item) {
        if (attribute == nullptr || attribute->kind == Kind::kNull) return item;
        return AttributePath(item, attribute->kind == Kind::kInt
                                       ? JsNumberToString(attribute->number)
                                       : attribute->s());
      };
      std::vector<Value> sorted = items;
      std::stable_sort(sorted.begin(), sorted.end(), [&](const Value& a, const Value& b) {
        const int r = CompareValues(key(a), key(b), cs);
        return (rev ? -r : r) < 0;
      });
      return MakeArray(std::move(sorted));
    }
    if (name == "selectattr" || name == "rejectattr") {
      const bool select = name == "selectattr";
      for (const Value& item : items) {
        if (!item.IsAttributeContainer())
          Fail("`" + name + "` can only be applied to array of objects");
      }
      // The parser checked that the arguments are string literals.
      const std::string& attr = filter->list[0]->name;
      const std::string test = filter->list.size() > 1 ? filter->list[1]->name : "";
      std::optional<Value> test_arg;
      if (filter->list.size() > 2) test_arg = Value::String(filter->list[2]->name);
      std::vector<Value> out;
      for (const Value& item : items) {
        const Value* a = item.object->map.Find(attr);
        bool result = false;
        if (a != nullptr)
          result = test.empty() ? Truthy(*a) : RunTest(test, *a, test_arg ? &*test_arg : nullptr);
        if (select ? result : !result) out.push_back(item);
      }
      return MakeArray(std::move(out));
    }
    if (name == "map") {
      evaluate_args();
      const Value* attr = kwargs.Find("attribute");
      if (attr == nullptr)
        Fail("`map` expressions without `attribute` set are not currently supported.");
      if (attr->kind != Kind::kString) Fail("attribute must be a string");
      const Value* fallback = kwargs.Find("default");
      std::vector<Value> out;
      for (const Value& item : items) {
        if (!item.IsAttributeContainer()) Fail("items in map must be an object");
        Value v = AttributePath(item, attr->s());
        if (v.kind == Kind::kUndefined && fallback != nullptr) v = *fallback;
        out.push_back(std::move(v));
      }
      return MakeArray(std::move(out));
    }
    Fail("Unknown ArrayValue filter: " + name);
  }
  if (operand.kind == Kind::kString) {
    const std::string& s = operand.s();
    if (name == "indent") {
      evaluate_args();
      const Value* width = option(0, "width");
      if (width != nullptr && width->kind != Kind::kInt) Fail("width must be a number");
      const Value* first = option(1, "first");
      const Value* blank = option(2, "blank");
      const double w = width != nullptr ? width->number : 4;
      if (w < 0 || w > 1024) Fail("indent width must be in [0, 1024]");
      const std::string pad(static_cast<size_t>(w), ' ');
      const bool indent_first = first != nullptr && Truthy(*first);
      const bool indent_blank = blank != nullptr && Truthy(*blank);
      Charge(static_cast<uint64_t>(std::count(s.begin(), s.end(), '\n') + 1) * pad.size());
      return MakeString(Indent(s, pad, indent_first, indent_blank));
    }
    if (name == "replace") {
      const Value fn = StringMethod(operand, "replace");
      evaluate_args();
      args.push_back(MakeObject(std::move(kwargs), Kind::kKwargs));
      return (*fn.function)(*this, args, env);
    }
    Fail("Unknown StringValue filter: " + name);
  }
  if (operand.IsObject()) {
    const Value builtin = ObjectMethod(operand, name);
    if (builtin.kind == Kind::kFunction) {
      evaluate_args();
      if (kwargs.size() > 0) args.push_back(MakeObject(std::move(kwargs), Kind::kKwargs));
      return (*builtin.function)(*this, args, env);
    }
    Fail("Unknown ObjectValue filter: " + name);
  }
  Fail(absl::StrCat("Cannot apply filter \"", name, "\" to type: ", TypeName(operand.kind)));
}

// ---- statements -----------------------------------------------------------------

Value Interpreter::EvaluateSet(const Node* node, const EnvPtr& env) {
  const Value rhs =
      node->b ? Evaluate(node->b.get(), env) : MakeString(EvaluateBlock(node->list, env));
  const Node* target = node->a.get();
  if (target->type == NodeType::kIdentifier) {
    env->Set(target->name, rhs);
  } else if (target->type == NodeType::kTupleLiteral) {
    if (!rhs.IsArray())
      Fail(absl::StrCat("Cannot unpack non-iterable type in set: ", TypeName(rhs.kind)));
    if (rhs.items().size() != target->list.size()) {
      Fail(std::string("Too ") + (target->list.size() > rhs.items().size() ? "few" : "many") +
           " items to unpack in set");
    }
    for (size_t i = 0; i < target->list.size(); ++i) {
      if (target->list[i]->type != NodeType::kIdentifier)
        Fail("Cannot unpack to non-identifier in set");
      env->Set(target->list[i]->name, rhs.items()[i]);
    }
  } else if (target->type == NodeType::kMember) {
    const Value object = Evaluate(target->a.get(), env);
    if (object.kind != Kind::kNamespace) Fail("cannot assign attribute on non-namespace object");
    if (target->b->type != NodeType::kIdentifier)
      Fail("Cannot assign to member with non-identifier property");
    CheckNamespaceMember(rhs);
    object.object->map.Set(target->b->name, rhs);
    object.object->depth = std::max(object.object->depth, rhs.Depth() + 1);
    if (object.object->depth > limits_.max_value_depth) {
      Fail("a value nested deeper than the limit of " + std::to_string(limits_.max_value_depth));
    }
  } else {
    Fail("Invalid LHS inside assignment expression");
  }
  return Value::Null();
}

std::string Interpreter::EvaluateFor(const Node* node, const EnvPtr& env) {
  auto scope = std::make_shared<Environment>(env);
  const Node* test = nullptr;
  Value iterable;
  if (node->b->type == NodeType::kSelect) {
    iterable = Evaluate(node->b->a.get(), scope);
    test = node->b->b.get();
  } else {
    iterable = Evaluate(node->b.get(), scope);
  }
  if (!(iterable.IsArray() || iterable.IsObject())) {
    Fail(absl::StrCat("Expected iterable or object type in for loop: got ",
                      TypeName(iterable.kind)));
  }
  std::vector<Value> all;
  if (iterable.IsObject()) {
    for (const auto& [k, v] : iterable.object->map.entries()) all.push_back(Value::String(k));
  } else {
    all = iterable.items();
  }
  ChargeLoop(all.size());

  const Node* loopvar = node->a.get();
  auto bind = [&](const EnvPtr& target, const Value& current) {
    if (loopvar->type == NodeType::kIdentifier) {
      target->Set(loopvar->name, current);
      return;
    }
    for (size_t j = 0; j < loopvar->list.size(); ++j) {
      if (loopvar->list[j]->type != NodeType::kIdentifier)
        Fail("Cannot unpack non-identifier type");
      target->Set(loopvar->list[j]->name, current.items()[j]);
    }
  };
  std::vector<Value> items;
  for (const Value& current : all) {
    if (loopvar->type == NodeType::kTupleLiteral) {
      if (current.kind != Kind::kArray)
        Fail(absl::StrCat("Cannot unpack non-iterable type: ", TypeName(current.kind)));
      if (loopvar->list.size() != current.items().size()) {
        Fail(std::string("Too ") +
             (loopvar->list.size() > current.items().size() ? "few" : "many") + " items to unpack");
      }
    }
    if (test != nullptr) {
      auto loop_scope = std::make_shared<Environment>(scope);
      bind(loop_scope, current);
      if (!Truthy(Evaluate(test, loop_scope))) continue;
    }
    items.push_back(current);
  }

  std::string result;
  bool no_iteration = true;
  const size_t n = items.size();
  for (size_t i = 0; i < n; ++i) {
    ObjectMap loop;
    loop.Set("index", Value::Int(static_cast<double>(i + 1)));
    loop.Set("index0", Value::Int(static_cast<double>(i)));
    loop.Set("revindex", Value::Int(static_cast<double>(n - i)));
    loop.Set("revindex0", Value::Int(static_cast<double>(n - i - 1)));
    loop.Set("first", Value::Bool(i == 0));
    loop.Set("last", Value::Bool(i == n - 1));
    loop.Set("length", Value::Int(static_cast<double>(n)));
    loop.Set("previtem", i > 0 ? items[i - 1] : Value::Undefined());
    loop.Set("nextitem", i + 1 < n ? items[i + 1] : Value::Undefined());
    scope->Set("loop", MakeObject(std::move(loop)));
    bind(scope, items[i]);
    try {
      const std::string block = EvaluateBlock(node->list, scope);
      Charge(block.size());
      result += block;
      if (result.size() > limits_.max_output_bytes) {
        Fail("rendered output exceeds the limit of " + Str(limits_.max_output_bytes) + " bytes");
      }
    } catch (const ContinueSignal&) {
      continue;
    } catch (const BreakSignal&) {
      break;
    }
    no_iteration = false;
  }
  if (no_iteration) result += EvaluateBlock(node->list2, scope);
  return result;
}

void Interpreter::BindMacroArguments(const std::string& display_name, const NodeList& parameters,
                                     bool takes_kwargs, bool takes_varargs, std::vector<Value> args,
                                     const EnvPtr& scope) {
  ObjectMap keywords;
  if (!args.empty() && args.back().kind == Kind::kKwargs) {
    keywords = args.back().object->map;
    args.pop_back();
  }
  std::vector<std::pair<std::string, const Node*>> pending_defaults;
  std::set<std::string> consumed;
  for (size_t i = 0; i < parameters.size(); ++i) {
    const Node* p = parameters[i].get();
    const std::string& name = p->name;
    const Node* default_value = p->type == NodeType::kKeywordArgument ? p->a.get() : nullptr;
    std::optional<Value> value;
    if (i < args.size()) value = args[i];
    if (!value && keywords.Find(name) != nullptr && consumed.count(name) == 0) {
      value = *keywords.Find(name);
      consumed.insert(name);
    }
    if (!value && default_value != nullptr) pending_defaults.emplace_back(name, default_value);
    scope->Set(name, value ? *value : Value::Undefined());
  }
  ObjectMap remaining;
  for (const auto& [k, v] : keywords.entries()) {
    if (consumed.count(k) == 0) remaining.Set(k, v);
  }
  if (takes_kwargs) {
    scope->Set("kwargs", MakeObject(std::move(remaining)));
  } else if (remaining.size() > 0) {
    Fail("macro " + display_name + " takes no keyword argument '" + remaining.entries()[0].first +
         "'");
  }
  if (takes_varargs) {
    std::vector<Value> rest;
    if (args.size() > parameters.size()) rest.assign(args.begin() + parameters.size(), args.end());
    scope->Set("varargs", MakeArray(std::move(rest)));
  } else if (args.size() > parameters.size()) {
    Fail("macro " + display_name + " takes not more than " + Str(parameters.size()) +
         " argument(s)");
  }
  for (const auto& [name, expr] : pending_defaults) scope->Set(name, Evaluate(expr, scope));
}

Value Interpreter::DefineMacro(const Node* node, const EnvPtr& env) {
  const bool takes_kwargs = Reads(node->list2, "kwargs");
  const bool takes_varargs = Reads(node->list2, "varargs");
  env->Set(node->name,
           Value::Function([node, takes_kwargs, takes_varargs](
                               Interpreter& interp, std::vector<Value>& args, const EnvPtr& scope) {
             CallGuard guard(&interp);
             auto macro_scope = std::make_shared<Environment>(scope);
             interp.BindMacroArguments("'" + node->name + "'", node->list, takes_kwargs,
                                       takes_varargs, args, macro_scope);
             return interp.MakeString(interp.EvaluateBlock(node->list2, macro_scope));
           }));
  return Value::Null();
}

Value Interpreter::EvaluateCallStatement(const Node* node, const EnvPtr& env) {
  const bool takes_kwargs = Reads(node->list2, "kwargs");
  const bool takes_varargs = Reads(node->list2, "varargs");
  // A weak reference: a caller stored somewhere longer-lived (a namespace)
  // must not keep its scope alive in a cycle.
  std::weak_ptr<Environment> weak_env = env;
  const Value caller =
      Value::Function([node, weak_env, takes_kwargs, takes_varargs](
                          Interpreter& interp, std::vector<Value>& args, const EnvPtr&) {
        CallGuard guard(&interp);
        EnvPtr env = weak_env.lock();
        if (env == nullptr) Fail("caller() used outside its call block");
        auto block_env = std::make_shared<Environment>(env);
        interp.BindMacroArguments("None", node->list, takes_kwargs, takes_varargs, args, block_env);
        return interp.MakeString(interp.EvaluateBlock(node->list2, block_env));
      });
  const Node* call = node->a.get();
  std::vector<Value> args;
  ObjectMap kwargs;
  EvaluateArguments(call->list, env, &args, &kwargs);
  args.push_back(MakeObject(std::move(kwargs), Kind::kKwargs));
  const Value fn = Evaluate(call->a.get(), env);
  if (fn.kind != Kind::kFunction) {
    Fail(absl::StrCat("Cannot call something that is not a function: got ", TypeName(fn.kind)));
  }
  auto call_env = std::make_shared<Environment>(env);
  call_env->Set("caller", caller);
  return (*fn.function)(*this, args, call_env);
}

}  // namespace cortiq::chat::jinja
