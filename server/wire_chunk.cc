#include "server/wire_chunk.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/proto_buffer_writer.h"

namespace cortiq::server {

namespace {

// WireChunk's data field (bytes data = 1) as protobuf frames it: the tag
// of a length-delimited field numbered as the generated code says.
constexpr uint32_t kChunkDataTag = google::protobuf::internal::WireFormatLite::MakeTag(
    v1::WireChunk::kDataFieldNumber,
    google::protobuf::internal::WireFormatLite::WIRETYPE_LENGTH_DELIMITED);
static_assert(kChunkBytes <= INT32_MAX, "a chunk's length is a protobuf length (< 2^31)");
// The most bytes before a chunk's data: the tag (a varint32, <= 5 bytes) and
// the length (a varint, read as up to 10 bytes).
constexpr size_t kChunkHeadMax = 5 + 10;

}  // namespace

session::SessionWireOptions WireOptionsFrom(uint32_t version, v1::WireDtype dtype) {
  session::SessionWireOptions o;
  o.version = version == 0 ? session::kSessionWireMaxVersion : version;
  o.f16 = dtype == v1::WIRE_DTYPE_F16;
  return o;
}

absl::Status CheckWireRequest(uint32_t version, v1::WireDtype dtype) {
  if (version != 0 &&
      (version < session::kSessionWireMinVersion || version > session::kSessionWireMaxVersion)) {
    return absl::InvalidArgumentError(absl::StrCat("version: ", version,
                                                   " is not one this server writes (",
                                                   session::kSessionWireMinVersion, "..",
                                                   session::kSessionWireMaxVersion, "; 0 = the highest)"));
  }
  if (dtype != v1::WIRE_DTYPE_UNSPECIFIED && dtype != v1::WIRE_DTYPE_F32 &&
      dtype != v1::WIRE_DTYPE_F16) {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype: unknown value ", static_cast<int>(dtype), " (F32 = 1 | F16 = 2)"));
  }
  return absl::OkStatus();
}

grpc::ByteBuffer ChunkMessage(grpc::Slice data) {
  using google::protobuf::io::CodedOutputStream;
  uint8_t head[kChunkHeadMax];
  uint8_t* end = CodedOutputStream::WriteTagToArray(kChunkDataTag, head);
  end = CodedOutputStream::WriteVarint32ToArray(static_cast<uint32_t>(data.size()), end);
  grpc::Slice slices[2] = {grpc::Slice(head, static_cast<size_t>(end - head)), std::move(data)};
  return grpc::ByteBuffer(slices, 2);
}

bool ChunkView::Parse(grpc::ByteBuffer& message) {
  slices_.clear();
  pieces_.clear();
  size_ = 0;
  if (!message.Dump(&slices_).ok()) return false;
  const size_t total = message.Length();
  if (total == 0) return true;
  uint8_t head[kChunkHeadMax];
  size_t h = 0;
  for (const grpc::Slice& sl : slices_) {
    for (size_t i = 0; i < sl.size() && h < sizeof(head); ++i) head[h++] = sl.begin()[i];
  }
  google::protobuf::io::CodedInputStream in(head, static_cast<int>(h));
  uint64_t len = 0;
  if (in.ReadTag() == kChunkDataTag && in.ReadVarint64(&len) &&
      len == total - static_cast<size_t>(in.CurrentPosition())) {
    size_ = len;
    size_t skip = static_cast<size_t>(in.CurrentPosition());
    for (const grpc::Slice& sl : slices_) {
      std::string_view v(reinterpret_cast<const char*>(sl.begin()), sl.size());
      const size_t drop = std::min(skip, v.size());
      v.remove_prefix(drop);
      skip -= drop;
      if (!v.empty()) pieces_.push_back(v);
    }
    return true;
  }
  if (!grpc::SerializationTraits<v1::WireChunk>::Deserialize(&message, &parsed_).ok()) {
    return false;
  }
  size_ = parsed_.data().size();
  pieces_.push_back(parsed_.data());
  return true;
}

}  // namespace cortiq::server
