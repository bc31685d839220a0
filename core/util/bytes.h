// Little-endian byte buffers for wire formats: ByteWriter appends fixed-width
// integers and raw bytes; ByteReader reads them back with bounds checks (a
// short buffer is an error, never an out-of-range read). x86-64 and every
// target we build for are little-endian; the static_assert keeps it so.
//
// Example:
//   ByteWriter w;  w.U32(7);  w.Bytes(payload);
//   ByteReader r(w.str());  uint32_t v;  if (!r.U32(&v)) return DataLoss(...);
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace cortiq::util {

static_assert(std::endian::native == std::endian::little, "wire formats assume little-endian");

class ByteWriter {
 public:
  ByteWriter() = default;
  // Writes into `reuse` (emptied; its capacity kept): a caller recycling
  // buffers saves the page faults of a fresh allocation.
  explicit ByteWriter(std::string reuse) : out_(std::move(reuse)) { out_.clear(); }
  void U8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void U32(uint32_t v) { Raw(&v, 4); }
  void U64(uint64_t v) { Raw(&v, 8); }
  void I32(int32_t v) { Raw(&v, 4); }
  void Bytes(std::string_view b) { out_.append(b); }
  void Raw(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }
  // Overwrites 4 bytes at `offset` (a length or checksum written afterwards).
  void PatchU32(size_t offset, uint32_t v) { std::memcpy(out_.data() + offset, &v, 4); }
  void PatchU64(size_t offset, uint64_t v) { std::memcpy(out_.data() + offset, &v, 8); }
  void Reserve(size_t n) { out_.reserve(n); }
  size_t size() const { return out_.size(); }
  const std::string& str() const { return out_; }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

class ByteReader {
 public:
  explicit ByteReader(std::string_view in) : in_(in) {}
  bool U8(uint8_t* v) { return Raw(v, 1); }
  bool U32(uint32_t* v) { return Raw(v, 4); }
  bool U64(uint64_t* v) { return Raw(v, 8); }
  bool I32(int32_t* v) { return Raw(v, 4); }
  // The next n bytes as a view (no copy).
  bool Bytes(size_t n, std::string_view* out) {
    if (n > in_.size() - pos_) return false;
    *out = in_.substr(pos_, n);
    pos_ += n;
    return true;
  }
  // n == 0 is a no-op (p may then be null, e.g. an empty vector's data()).
  bool Raw(void* p, size_t n) {
    if (n > in_.size() - pos_) return false;
    if (n > 0) std::memcpy(p, in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  size_t pos() const { return pos_; }
  size_t remaining() const { return in_.size() - pos_; }
  bool done() const { return pos_ == in_.size(); }

 private:
  std::string_view in_;
  size_t pos_ = 0;
};

}  // namespace cortiq::util
