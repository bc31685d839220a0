// JinjaTemplate: parse + render entry points, errors to Status (jinja.h).
#include "core/chat/jinja.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "core/chat/jinja_lexer.h"
#include "core/chat/jinja_parser.h"
#include "core/tokenizer/unicode.h"
#include "core/util/strings.h"

namespace cortiq::chat {
namespace {

using jinja::Kind;
using jinja::Value;

constexpr char kRaisedPayload[] = "type.cortiq.dev/chat.raise_exception";

// 1-based line and column (in code points) of a byte offset.
std::string Position(std::string_view source, size_t offset) {
  offset = std::min(offset, source.size());
  size_t line = 1, column = 1;
  for (size_t i = 0; i < offset; ++i) {
    if (source[i] == '\n') {
      ++line;
      column = 1;
    } else if ((static_cast<unsigned char>(source[i]) & 0xC0) != 0x80) {
      ++column;
    }
  }
  return absl::StrCat(line, ":", column);
}

// JavaScript's property order: array-index keys ascending, then the rest in
// insertion order (what Object.entries gives after JSON.parse).
bool IsArrayIndex(const std::string& key, uint64_t* index) {
  if (key.empty() || key.size() > 10 || (key.size() > 1 && key[0] == '0')) return false;
  uint64_t v = 0;
  for (char c : key) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  if (v >= 4294967295ull) return false;
  *index = v;
  return true;
}

Value FromJson(jinja::Interpreter& interp, const nlohmann::ordered_json& j, int depth, int max_depth) {
  if (depth > max_depth) {
    throw jinja::RenderError("input value nested deeper than the limit of " + std::to_string(max_depth));
  }
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::Null();
    case nlohmann::ordered_json::value_t::boolean: return Value::Bool(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::Int(static_cast<double>(j.get<int64_t>()));
    case nlohmann::ordered_json::value_t::number_unsigned:
      return Value::Int(static_cast<double>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float: {
      const double d = j.get<double>();
      return std::isfinite(d) && std::trunc(d) == d ? Value::Int(d) : Value::Float(d);
    }
    case nlohmann::ordered_json::value_t::string: {
      const std::string& s = j.get_ref<const std::string&>();
      return interp.MakeString(tokenizer::IsValidUtf8(s) ? s : tokenizer::SanitizeUtf8(s));
    }
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& item : j) items.push_back(FromJson(interp, item, depth + 1, max_depth));
      return interp.MakeArray(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      std::vector<std::pair<uint64_t, const std::string*>> indexed;
      for (auto it = j.begin(); it != j.end(); ++it) {
        uint64_t index = 0;
        if (IsArrayIndex(it.key(), &index)) indexed.emplace_back(index, &it.key());
      }
      std::sort(indexed.begin(), indexed.end());
      jinja::ObjectMap map;
      for (const auto& [index, key] : indexed) map.Set(*key, FromJson(interp, j.at(*key), depth + 1, max_depth));
      for (auto it = j.begin(); it != j.end(); ++it) {
        uint64_t index = 0;
        if (IsArrayIndex(it.key(), &index)) continue;
        const std::string key = tokenizer::IsValidUtf8(it.key()) ? it.key() : tokenizer::SanitizeUtf8(it.key());
        map.Set(key, FromJson(interp, it.value(), depth + 1, max_depth));
      }
      return interp.MakeObject(std::move(map));
    }
    default: throw jinja::RenderError("unsupported JSON value (binary)");
  }
}

const std::set<std::string_view> kGlobalNames = {"true", "false", "none", "True", "False", "None",
                                                 "range", "namespace", "raise_exception", "strftime_now"};

}  // namespace

bool IsJinjaGlobalName(std::string_view name) { return kGlobalNames.count(name) > 0; }

absl::StatusOr<JinjaTemplate> JinjaTemplate::Parse(std::string_view source, std::string name) {
  if (source.size() > kMaxTemplateBytes) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": template of ", source.size(),
                                                   " bytes exceeds the limit of ", kMaxTemplateBytes, " bytes"));
  }
  if (!tokenizer::IsValidUtf8(source)) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": template is not valid UTF-8"));
  }
  try {
    auto program = std::make_shared<jinja::Program>(jinja::Parse(jinja::Tokenize(source)));
    return JinjaTemplate(std::move(program), std::make_shared<const std::string>(source), std::move(name));
  } catch (const jinja::SyntaxError& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ":", Position(source, e.offset()), ": ", util::Sv(e.what())));
  }
}

absl::StatusOr<std::string> JinjaTemplate::Render(const nlohmann::ordered_json& vars,
                                                  const JinjaRenderOptions& options) const {
  if (!vars.is_object()) return absl::InvalidArgumentError(absl::StrCat(name_, ": variables must be a JSON object"));
  jinja::Interpreter interp(options.limits, options.now.value_or(absl::Now()));
  try {
    jinja::EnvPtr globals = interp.MakeGlobals();
    for (auto it = vars.begin(); it != vars.end(); ++it) {
      if (IsJinjaGlobalName(it.key())) {
        return absl::InvalidArgumentError(
            absl::StrCat(name_, ": variable '", util::Sv(it.key()), "' would shadow a builtin"));
      }
      globals->Set(it.key(), FromJson(interp, it.value(), 1, options.limits.max_value_depth));
    }
    return interp.Run(*program_, globals);
  } catch (const jinja::RenderError& e) {
    if (e.raised) {
      absl::Status status = absl::InvalidArgumentError(util::Sv(e.what()));
      status.SetPayload(kRaisedPayload, absl::Cord("1"));
      return status;
    }
    if (e.offset == static_cast<size_t>(-1)) {
      return absl::InvalidArgumentError(absl::StrCat(name_, ": ", util::Sv(e.what())));
    }
    return absl::InvalidArgumentError(
        absl::StrCat(name_, ":", Position(*source_, e.offset), ": ", util::Sv(e.what())));
  }
}

bool JinjaTemplate::IsRaisedError(const absl::Status& status) {
  return status.GetPayload(kRaisedPayload).has_value();
}

}  // namespace cortiq::chat
