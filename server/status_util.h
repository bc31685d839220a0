// The one place where internal errors (absl::Status) become gRPC statuses,
// and the names of gRPC codes for logs and metric labels.
//
// absl::StatusCode and grpc::StatusCode share their numbering (both follow
// google.rpc.Code), so the mapping keeps the code and the message. A code
// outside the known range (a bug) becomes INTERNAL.
#pragma once

#include <string_view>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace cortiq::server {

grpc::Status ToGrpcStatus(const absl::Status& status);
// "OK", "CANCELLED", ..., "UNAUTHENTICATED"; "UNKNOWN_CODE" otherwise.
std::string_view GrpcCodeName(int code);

}  // namespace cortiq::server
