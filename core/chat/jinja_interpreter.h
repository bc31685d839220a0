// Evaluator of the Jinja renderer: runs a parsed Program (jinja_parser.h)
// over variables, as @huggingface/jinja's runtime.ts does: the same scoping
// (a for loop opens a scope, `if` does not, macros see their caller's scope),
// the same filters, tests, methods and operator rules, the same output.
//
// Bounded: every limit in RenderLimits ends the render with a RenderError
// naming the limit. Time is bounded by max_steps (one per node evaluated) and
// max_loop_iterations, memory by max_work_bytes (every string, array and
// block output built is charged by size) and max_output_bytes, the stack by
// the tree's depth (parser), max_call_depth and max_value_depth.
//
// Thread-safety: an Interpreter is one render on one thread; Programs are
// immutable and may be shared by concurrent renders.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "core/chat/jinja_parser.h"
#include "core/chat/jinja_value.h"

namespace cortiq::chat::jinja {

struct RenderLimits {
  size_t max_output_bytes = size_t{16} << 20;  // the rendered text and any string built
  uint64_t max_loop_iterations = 1'000'000;    // for-loop items and range() lengths, summed
  uint64_t max_steps = 20'000'000;             // nodes evaluated
  uint64_t max_work_bytes = uint64_t{256} << 20;  // bytes of strings and arrays built, summed
  int max_call_depth = 32;                     // nested macro / caller() calls
  int max_value_depth = 64;                    // nesting of arrays and objects
};

// A scope: variables plus the enclosing scope.
class Environment {
 public:
  explicit Environment(EnvPtr parent) : parent_(std::move(parent)) {}
  void Set(const std::string& name, Value value) { vars_[name] = std::move(value); }
  bool Has(const std::string& name) const { return vars_.count(name) > 0; }
  // Undefined when no scope up the chain declares `name`.
  Value Lookup(const std::string& name) const;

 private:
  EnvPtr parent_;
  std::unordered_map<std::string, Value> vars_;
};

class Interpreter {
 public:
  // now: what strftime_now() formats (UTC).
  Interpreter(const RenderLimits& limits, absl::Time now) : limits_(limits), now_(now) {}

  // The root scope with the globals (true, false, none, range, namespace,
  // raise_exception, strftime_now, ...). Variables the caller adds must not
  // shadow them (ChatTemplate checks).
  EnvPtr MakeGlobals();
  // Renders `program` in `globals`. Throws RenderError.
  std::string Run(const Program& program, const EnvPtr& globals);

  // Building blocks for builtins (jinja_interpreter.cc).
  Value Evaluate(const Node* node, const EnvPtr& env);
  std::string EvaluateBlock(const NodeList& body, const EnvPtr& env);
  Value MakeString(std::string s);
  Value MakeArray(std::vector<Value> items, Kind kind = Kind::kArray);
  Value MakeObject(ObjectMap map, Kind kind = Kind::kObject);
  void ChargeLoop(uint64_t n);
  // Refuses a namespace (at any depth) as a namespace's member: see .cc.
  void CheckNamespaceMember(const Value& v);
  void Charge(uint64_t bytes);
  absl::Time now() const { return now_; }

  // Calls of macros and caller() nest at most max_call_depth deep.
  struct CallGuard {
    explicit CallGuard(Interpreter* i);
    ~CallGuard() { --interp->call_depth_; }
    Interpreter* interp;
  };

 private:
  Value EvaluateInner(const Node* node, const EnvPtr& env);
  Value EvaluateBinary(const Node* node, const EnvPtr& env);
  Value EvaluateUnary(const Node* node, const EnvPtr& env);
  Value EvaluateMember(const Node* node, const EnvPtr& env);
  Value EvaluateSlice(const Value& object, const Node* slice, const EnvPtr& env);
  Value EvaluateCall(const Node* node, const EnvPtr& env);
  Value EvaluateTest(const Node* node, const EnvPtr& env);
  void EvaluateArguments(const NodeList& args, const EnvPtr& env, std::vector<Value>* positional,
                         ObjectMap* keywords);
  Value ApplyFilter(const Value& operand, const Node* filter, const EnvPtr& env);
  Value ApplyFilterCall(const Value& operand, const Node* filter, const EnvPtr& env);
  std::string EvaluateFor(const Node* node, const EnvPtr& env);
  Value EvaluateSet(const Node* node, const EnvPtr& env);
  Value DefineMacro(const Node* node, const EnvPtr& env);
  Value EvaluateCallStatement(const Node* node, const EnvPtr& env);
  void BindMacroArguments(const std::string& display_name, const NodeList& parameters,
                          bool takes_kwargs, bool takes_varargs, std::vector<Value> args,
                          const EnvPtr& scope);

  RenderLimits limits_;
  absl::Time now_;
  uint64_t steps_ = 0;
  uint64_t loop_iterations_ = 0;
  uint64_t work_bytes_ = 0;
  int call_depth_ = 0;
};

// Looks up a property of a value the way member access does when the object
// has no such key: string methods, `length`, object methods (get, items, ...).
// Undefined when there is none.
Value BuiltinMember(Interpreter& interp, const Value& object, const std::string& name);

}  // namespace cortiq::chat::jinja
