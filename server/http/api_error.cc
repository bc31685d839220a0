#include "server/http/api_error.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/util/strings.h"
#include "nlohmann/json.hpp"

namespace cortiq::server::http {

std::string ParamOfMessage(std::string_view message) {
  const size_t colon = message.find(": ");
  if (colon == std::string_view::npos || colon == 0) return "";
  const std::string_view head = message.substr(0, colon);
  const bool path = std::all_of(head.begin(), head.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '.' || c == '[' || c == ']' || c == '-';
  });
  return path ? std::string(head) : "";
}

namespace {

std::string Rename(std::string param, const ParamRenames& renames) {
  const size_t cut = param.find_first_of(".[");
  const std::string_view root = std::string_view(param).substr(0, cut);
  for (const auto& [from, to] : renames) {
    if (root == from) return absl::StrCat(util::Sv(to), param.substr(root.size()));
  }
  return param;
}

}  // namespace

ApiError ErrorFromStatus(const absl::Status& status, const ParamRenames& renames) {
  ApiError e;
  e.message = std::string(status.message());
  e.param = Rename(ParamOfMessage(e.message), renames);
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
      e.status = 400;
      break;
    case absl::StatusCode::kUnimplemented:
      e.status = 400;
      e.code = "unsupported";
      break;
    case absl::StatusCode::kUnauthenticated:
      e.status = 401;
      e.type = "authentication_error";
      e.code = "invalid_api_key";
      break;
    case absl::StatusCode::kPermissionDenied:
      e.status = 403;
      e.type = "permission_error";
      break;
    case absl::StatusCode::kNotFound:
      e.status = 404;
      e.type = "not_found_error";
      break;
    case absl::StatusCode::kAborted:
      e.status = 409;
      e.type = "conflict_error";
      e.code = "session_busy";
      break;
    case absl::StatusCode::kResourceExhausted:
      e.status = 429;
      e.type = "rate_limit_error";
      e.code = "resource_exhausted";
      break;
    case absl::StatusCode::kUnavailable:
      e.status = 503;
      e.type = "service_unavailable";
      break;
    case absl::StatusCode::kDeadlineExceeded:
      e.status = 504;
      e.type = "timeout_error";
      break;
    default:
      e.status = 500;
      e.type = "server_error";
      e.param.clear();
      break;
  }
  return e;
}

ApiError ErrorOfHttpStatus(int status) {
  ApiError e;
  e.status = status;
  e.message = absl::StrCat("HTTP ", status);
  if (status >= 500) e.type = "server_error";
  return e;
}

ApiError InvalidField(std::string_view param, std::string_view what) {
  ApiError e;
  e.param = std::string(param);
  e.message = absl::StrCat(util::Sv(param), ": ", util::Sv(what));
  return e;
}

std::string ErrorJson(const ApiError& e) {
  nlohmann::ordered_json err;
  err["message"] = e.message;
  err["type"] = e.type;
  err["param"] = e.param.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(e.param);
  err["code"] = e.code.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(e.code);
  nlohmann::ordered_json body;
  body["error"] = std::move(err);
  return body.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

std::string_view CodeNameOfHttpStatus(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "INVALID_ARGUMENT";
    case 401:
      return "UNAUTHENTICATED";
    case 403:
      return "PERMISSION_DENIED";
    case 404:
      return "NOT_FOUND";
    case 405:
      return "UNIMPLEMENTED";
    case 409:
      return "ABORTED";
    case 411:
    case 413:
    case 415:
      return "INVALID_ARGUMENT";
    case 429:
      return "RESOURCE_EXHAUSTED";
    case 499:
      return "CANCELLED";
    case 503:
      return "UNAVAILABLE";
    case 504:
      return "DEADLINE_EXCEEDED";
    default:
      return status < 400 ? "OK" : "INTERNAL";
  }
}

}  // namespace cortiq::server::http
