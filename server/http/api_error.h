// The HTTP front's errors in the OpenAI shape, and the one mapping from an
// internal status (absl::Status, the vocabulary of the plan, the store and
// the engine) to an HTTP status and that shape.
//
//   {"error": {"message": "...", "type": "invalid_request_error",
//              "param": "max_tokens", "code": null}}
//
// `param` is the request field the message names: internal messages start
// with the field ("max_tokens: 0 is outside [1, 4096]"), and a front end may
// rename internal names to its own (prompt_tokens → prompt) with ParamRenames.
//
// Mapping (ErrorFromStatus): INVALID_ARGUMENT, OUT_OF_RANGE,
// FAILED_PRECONDITION, UNIMPLEMENTED → 400 invalid_request_error;
// UNAUTHENTICATED → 401; PERMISSION_DENIED → 403; NOT_FOUND → 404; ABORTED
// (session busy) → 409; RESOURCE_EXHAUSTED (admission, budget, cap) → 429;
// UNAVAILABLE (draining) → 503; DEADLINE_EXCEEDED → 504; anything else → 500.
//
// All functions are pure and thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace cortiq::server::http {

struct ApiError {
  int status = 400;  // HTTP status
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // "" → null
  std::string code;   // "" → null
};

// Internal field names → the endpoint's names, applied to `param` (the
// part before the first '[' or '.', e.g. "prompt_tokens[3]" → "prompt").
using ParamRenames = std::vector<std::pair<std::string_view, std::string_view>>;

// The field a message names: its prefix up to ": " when that prefix is a
// field path ([A-Za-z0-9_.[\]-]+), else "".
std::string ParamOfMessage(std::string_view message);

// See the banner. `status` must not be OK.
ApiError ErrorFromStatus(const absl::Status& status, const ParamRenames& renames = {});

// The answer to a status httplib set itself (a malformed request, 414 for a
// long URI): message "HTTP <status>", type server_error from 500 up (the
// server failed, not the request), invalid_request_error below.
ApiError ErrorOfHttpStatus(int status);

// 400 invalid_request_error naming `param`: "<param>: <what>".
ApiError InvalidField(std::string_view param, std::string_view what);

// The body: {"error":{"message","type","param","code"}} (bytes that are not
// UTF-8 replaced by U+FFFD).
std::string ErrorJson(const ApiError& e);

// The gRPC code name an HTTP status stands for in the request log
// ("OK", "INVALID_ARGUMENT", ...): one vocabulary for both front ends' lines.
std::string_view CodeNameOfHttpStatus(int status);

}  // namespace cortiq::server::http
