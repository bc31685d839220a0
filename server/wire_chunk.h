// The session wire stream as gRPC messages: WireChunk framing without
// copies (ChunkMessage out, ChunkView in), the chunk size, and the checks of
// a request's wire version and dtype. Shared by the Export/Import handlers
// (server/wire_calls.cc) and the client side of a migration
// (server/migration.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "core/session/session_wire.h"
#include "cortiq/v1/inference.grpc.pb.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"

namespace cortiq::server {

// The most wire bytes in one WireChunk this server sends.
inline constexpr size_t kChunkBytes = 1 << 20;

// The wire options a request names (version 0 = the highest this build writes).
session::SessionWireOptions WireOptionsFrom(uint32_t version, v1::WireDtype dtype);
// INVALID_ARGUMENT naming the field for a version this build does not write
// or an unknown dtype.
absl::Status CheckWireRequest(uint32_t version, v1::WireDtype dtype);

// A serialised WireChunk around `data` without copying it: the field's tag
// and length (protobuf's varints) in a slice of their own, then the data
// slice as it is.
grpc::ByteBuffer ChunkMessage(grpc::Slice data);

// One received WireChunk {bytes data = 1}, seen without copying it: views of
// its data inside the message's slices when the message is what protobuf
// encoders write for it (the field's tag, its length, its bytes; nothing at
// all for empty data), else protobuf's parse of it.
class ChunkView {
 public:
  // False: the message is not a WireChunk. Views stay valid until the next Parse.
  bool Parse(grpc::ByteBuffer& message);
  size_t size() const { return size_; }
  const std::vector<std::string_view>& pieces() const { return pieces_; }

 private:
  std::vector<grpc::Slice> slices_;  // references, keeping the views valid
  std::vector<std::string_view> pieces_;
  v1::WireChunk parsed_;
  size_t size_ = 0;
};

}  // namespace cortiq::server
