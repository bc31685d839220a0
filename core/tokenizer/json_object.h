// JSON text -> a top-level object, for the tokenizer's loaders
// (tokenizer.json, tokenizer_config.json, config.json). Nesting deeper than
// 64 levels is refused before nlohmann parses (hostile input cannot exhaust
// the stack); malformed JSON or a non-object top level is an
// InvalidArgument naming errors' source. Never throws.
//
// Contract: pure function, thread-safe; cost linear in the text, plus the
// DOM (several times the text's size).
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "core/tokenizer/field_errors.h"
#include "nlohmann/json.hpp"

namespace cortiq::tokenizer::internal {

absl::StatusOr<nlohmann::json> ParseJsonObject(std::string_view text, const FieldErrors& errors);

}  // namespace cortiq::tokenizer::internal
