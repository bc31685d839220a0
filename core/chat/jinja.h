// JinjaTemplate: the Jinja2 subset Hugging Face chat templates use, rendering
// byte for byte what @huggingface/jinja (transformers.js) renders — that
// library is the reference, quirks included: trim_blocks and lstrip_blocks on
// (as transformers sets them), `none` prints as "", booleans as "true",
// `x.strip('\n')` strips all whitespace (its strip ignores the argument),
// tojson as Python's json.dumps(ensure_ascii=False).
//
// Supported: {{ }}, {% %}, {# #} with `-` whitespace control; if/elif/else,
// for/else (loop.index, index0, revindex, first, last, length, previtem,
// nextitem; `for x in xs if cond`; break/continue), set (also `set ns.x` and
// block set), macro/call, filter blocks; the filters, tests, methods and
// globals listed in jinja_parser.cc (kFilters, kTests, kMethods,
// kGlobalFunctions). A template using anything else — an unknown tag, filter,
// test, function or method — fails in Parse with INVALID_ARGUMENT
// "<name>:LINE:COL: unsupported ... 'x'", never during Render.
// Documented gaps: toUpperCase/toLowerCase cover Latin, Greek and Cyrillic
// only; tojson(sort_keys=) is refused (the reference sorts with
// localeCompare); a namespace cannot hold another namespace.
//
// Render is bounded (jinja::RenderLimits: output size, loop iterations,
// steps, bytes built, call and value depth): templates and variables are
// operator and client input, so every limit ends in an error, never a crash
// or a hang. Parse bounds the template: kMaxTemplateBytes, and the syntax tree
// depth (jinja::kMaxNestingDepth).
//
// Thread-safety: a parsed template is immutable; Render is const and may run
// concurrently. Copies share the parsed tree.
//
// Example:
//   CORTIQ_ASSIGN_OR_RETURN(JinjaTemplate t, JinjaTemplate::Parse(source));
//   nlohmann::ordered_json vars = {{"messages", messages}, {"add_generation_prompt", true}};
//   CORTIQ_ASSIGN_OR_RETURN(std::string prompt, t.Render(vars, {}));
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/chat/jinja_interpreter.h"
#include "nlohmann/json.hpp"

namespace cortiq::chat {

inline constexpr size_t kMaxTemplateBytes = size_t{1} << 20;

struct JinjaRenderOptions {
  jinja::RenderLimits limits;
  // What strftime_now() formats (UTC); unset: the wall clock.
  std::optional<absl::Time> now;
};

class JinjaTemplate {
 public:
  // source: the template text (valid UTF-8, at most kMaxTemplateBytes).
  // name: how errors name it ("chat_template:3:7: ..."). Errors:
  // INVALID_ARGUMENT for anything the subset cannot parse or lacks.
  static absl::StatusOr<JinjaTemplate> Parse(std::string_view source, std::string name = "chat_template");

  // vars: a JSON object; each member becomes a template variable (JSON
  // numbers with an integral value are integers, as after JSON.parse;
  // objects keep their member order, with array-index-like keys first, as
  // JavaScript's Object.entries orders them). Names must not shadow the
  // globals (true, false, none, True, False, None, range, namespace,
  // raise_exception, strftime_now). Errors, all INVALID_ARGUMENT:
  // raise_exception(msg) -> exactly msg; any other failure or limit ->
  // "<name>:LINE:COL: <what failed>". Cost: linear in the work the template
  // does, within the limits.
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& vars, const JinjaRenderOptions& options) const;

  // True when the error Render returned came from raise_exception.
  static bool IsRaisedError(const absl::Status& status);

 private:
  JinjaTemplate(std::shared_ptr<const jinja::Program> program, std::shared_ptr<const std::string> source,
                std::string name)
      : program_(std::move(program)), source_(std::move(source)), name_(std::move(name)) {}

  std::shared_ptr<const jinja::Program> program_;
  std::shared_ptr<const std::string> source_;  // for line:column of render errors
  std::string name_;
};

// The names JinjaTemplate defines itself (render variables must not use them).
bool IsJinjaGlobalName(std::string_view name);

}  // namespace cortiq::chat
