// Runtime values of the Jinja renderer (core/chat/jinja.h) and the JavaScript
// string and number semantics they follow.
//
// The reference renderer is @huggingface/jinja (transformers.js), which runs
// on JavaScript values: numbers are doubles, strings are UTF-16, printing a
// number is Number.prototype.toString, `==` is JavaScript's loose equality.
// Output must match it byte for byte, so these helpers reproduce exactly those
// rules on our UTF-8 strings: lengths and indices count UTF-16 code units,
// whitespace is ECMAScript's \s, numbers print the way V8 prints them.
//
// A Value is a small tagged handle. Arrays, objects and namespaces are shared
// (reference semantics, as in JavaScript): copying a Value copies a pointer.
// Only namespaces are ever mutated after construction (`set ns.x = ...`).
// Every container records its nesting depth so that deep values are refused
// when built (recursion over them — printing, destruction — stays bounded).
//
// Thread-safety: values are confined to the render call that made them.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace cortiq::chat::jinja {

class Interpreter;
class Environment;
struct Value;

// A render-time error (the reference's `throw new Error(...)`). Thrown inside
// the renderer only: Template::Render catches it and returns a Status, so no
// exception crosses the library boundary. Exceptions (not StatusOr on every
// evaluation step) because the evaluator mirrors the reference's ~150 throw
// sites one for one; an early return at each would double the code.
class RenderError : public std::runtime_error {
 public:
  explicit RenderError(const std::string& message) : std::runtime_error(message) {}
  // Source offset of the innermost node being evaluated (set on the way out).
  size_t offset = static_cast<size_t>(-1);
  // True for raise_exception(msg): the message is the template author's.
  bool raised = false;
};

// An ordered string -> Value map (JavaScript Map: insertion order; setting an
// existing key keeps its position).
class ObjectMap {
 public:
  const Value* Find(std::string_view key) const;
  void Set(std::string key, Value value);
  size_t size() const { return entries_.size(); }
  const std::vector<std::pair<std::string, Value>>& entries() const { return entries_; }

 private:
  std::vector<std::pair<std::string, Value>> entries_;
  std::unordered_map<std::string, size_t> index_;
};

// A callable: builtins (range, namespace, string methods), macros and caller().
// args: the positional arguments, then (when the call had any) one kKwargs value.
// scope: the caller's environment (macros scope dynamically, as the reference does).
using EnvPtr = std::shared_ptr<Environment>;
using NativeFunction =
    std::function<Value(Interpreter&, std::vector<Value>& args, const EnvPtr& scope)>;

enum class Kind : uint8_t {
  kUndefined,
  kNull,
  kBool,
  kInt,    // a JavaScript number the reference types IntegerValue
  kFloat,  // a JavaScript number the reference types FloatValue
  kString,
  kArray,
  kTuple,  // an array (TupleValue extends ArrayValue)
  kObject,
  kKwargs,  // keyword arguments: an object (KeywordArgumentsValue extends ObjectValue)
  kNamespace,
  kFunction,
};

struct ArrayData {
  std::vector<Value> items;
  int depth = 1;
};
struct ObjectData {
  ObjectMap map;
  int depth = 1;
};

struct Value {
  Kind kind = Kind::kUndefined;
  bool boolean = false;
  double number = 0;  // kInt and kFloat
  std::shared_ptr<const std::string> str;
  std::shared_ptr<const ArrayData> array;  // kArray, kTuple
  std::shared_ptr<ObjectData> object;      // kObject, kKwargs, kNamespace
  std::shared_ptr<const NativeFunction> function;

  static Value Of(Kind k) {
    Value v;
    v.kind = k;
    return v;
  }
  static Value Undefined() { return Value{}; }
  static Value Null() { return Of(Kind::kNull); }
  static Value Bool(bool b) {
    Value v = Of(Kind::kBool);
    v.boolean = b;
    return v;
  }
  static Value Int(double n) {
    Value v = Of(Kind::kInt);
    v.number = n;
    return v;
  }
  static Value Float(double n) {
    Value v = Of(Kind::kFloat);
    v.number = n;
    return v;
  }
  static Value String(std::string s) {
    Value v = Of(Kind::kString);
    v.str = std::make_shared<const std::string>(std::move(s));
    return v;
  }
  // Containers take their items' depths; callers check the depth limit.
  static Value Array(std::vector<Value> items, Kind kind = Kind::kArray);
  static Value Object(ObjectMap map, Kind kind = Kind::kObject);
  static Value Function(NativeFunction fn) {
    Value v = Of(Kind::kFunction);
    v.function = std::make_shared<const NativeFunction>(std::move(fn));
    return v;
  }

  bool IsNumber() const { return kind == Kind::kInt || kind == Kind::kFloat; }
  bool IsArray() const { return kind == Kind::kArray || kind == Kind::kTuple; }
  bool IsObject() const { return kind == Kind::kObject || kind == Kind::kKwargs; }
  // ObjectValue or NamespaceValue: attribute access by name.
  bool IsAttributeContainer() const { return IsObject() || kind == Kind::kNamespace; }
  const std::string& s() const { return *str; }
  const std::vector<Value>& items() const { return array->items; }
  int Depth() const;
};

// The reference's type names ("StringValue", ...), used in error messages.
const char* TypeName(Kind kind);

// __bool__: Python truthiness as the reference computes it.
bool Truthy(const Value& v);

// ---- JavaScript text semantics over UTF-8 -----------------------------------

// Number.prototype.toString(): "1", "0.1", "1e+21", "NaN", "-Infinity".
std::string JsNumberToString(double n);
// What {{ }} prints for a FloatValue: 3 -> "3.0", -0 -> "-0.0", 0.5 -> "0.5".
std::string JsFloatToString(double n);
// JSON.stringify(string): quotes, escapes " \ and control characters.
void AppendJsonQuoted(std::string_view s, std::string* out);
// ECMAScript \s (String.prototype.trim's set).
bool IsJsSpace(char32_t cp);
std::string_view JsTrimStart(std::string_view s);
std::string_view JsTrimEnd(std::string_view s);
inline std::string_view JsTrim(std::string_view s) { return JsTrimEnd(JsTrimStart(s)); }
// String length in UTF-16 code units.
size_t Utf16Length(std::string_view s);
// The code points of s, each as its own UTF-8 string (Array.from(s)).
std::vector<std::string> CodePoints(std::string_view s);
// s.at(i): the UTF-16 code unit at i (negative counts from the end); a lone
// surrogate half becomes U+FFFD (what the reference's output encoding makes of
// it). False when out of range.
bool Utf16At(std::string_view s, double index, std::string* out);
// JavaScript's `a < b` on strings: UTF-16 code unit order.
int CompareUtf16(std::string_view a, std::string_view b);
// toUpperCase / toLowerCase. Covers ASCII, Latin-1, Latin Extended-A, Greek
// and Cyrillic; other scripts pass through unchanged (documented subset).
std::string JsToUpper(std::string_view s);
std::string JsToLower(std::string_view s);
// parseInt(s, 10) / parseFloat(s); false for NaN.
bool JsParseInt(std::string_view s, double* out);
bool JsParseFloat(std::string_view s, double* out);

// toJSON() of the reference (tojson, string, printing containers). indent <= 0:
// one line with ", " / ": "; indent > 0: pretty, "," / ": ". Throws
// RenderError for functions.
struct JsonOptions {
  int indent = 0;
  bool ensure_ascii = false;
  bool has_separators = false;
  std::string item_separator;
  std::string key_separator;
  // AppendJson throws RenderError once *out passes this many bytes: an
  // indented dump of a client's deep, wide value grows far past the value
  // itself, so the limit is checked as it is built, not after.
  size_t max_bytes = SIZE_MAX;
};
void AppendJson(const Value& v, const JsonOptions& options, int depth, bool undefined_to_null,
                std::string* out);

// RuntimeValue.toString(): what {{ v }} prints (objects and arrays as JSON).
std::string ToOutputString(const Value& v);
// `v.value.toString()`: what `~` and string `+` concatenate (numbers without
// the ".0", arrays joined with ",", objects as "[object Map]").
std::string ToJsString(const Value& v);
// Array.prototype.join's view of one raw element (null / undefined -> "").
std::string ToJoinString(const Value& v);
// JavaScript `a.value == b.value` (loose) and `===` (strict, SameValue for
// primitives, identity for containers).
bool LooseEquals(const Value& a, const Value& b);
bool StrictEquals(const Value& a, const Value& b);

}  // namespace cortiq::chat::jinja
