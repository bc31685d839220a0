#include "server/status_util.h"

#include <array>
#include <string>

namespace cortiq::server {

namespace {
constexpr std::array<std::string_view, 17> kCodeNames = {
    "OK",        "CANCELLED",          "UNKNOWN",           "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED", "NOT_FOUND",  "ALREADY_EXISTS",    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
    "UNIMPLEMENTED", "INTERNAL",       "UNAVAILABLE",       "DATA_LOSS",
    "UNAUTHENTICATED"};
}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  const int code = static_cast<int>(status.code());
  if (code <= 0 || code >= static_cast<int>(kCodeNames.size())) {
    return grpc::Status(grpc::StatusCode::INTERNAL, std::string(status.message()));
  }
  return grpc::Status(static_cast<grpc::StatusCode>(code), std::string(status.message()));
}

std::string_view GrpcCodeName(int code) {
  if (code < 0 || code >= static_cast<int>(kCodeNames.size())) return "UNKNOWN_CODE";
  return kCodeNames[static_cast<size_t>(code)];
}

}  // namespace cortiq::server
