// GgufWriter: builds a GGUF file (version 3) in memory and writes it, in the
// layout GgufFile reads (core/model/gguf.h) and llama.cpp writes: header,
// metadata in call order, tensor infos in call order, each tensor's data at
// the next multiple of the alignment (padding zeros), offsets packed as
// gguf.cpp requires. Used by tests, the fuzz corpus and the model export
// (WriteGgufModel, core/model/gguf_model.h).
//
// Metadata: every GGUF value type (scalars, strings, arrays of scalars or
// strings). Tensors: f32 values stored as F32 / F16 / BF16 (round to nearest
// even) or Q8_0 (math::QuantizeQ8_0, bit-for-bit llama.cpp's
// quantize_row_q8_0_ref), or raw bytes of any known ggml type.
//
// Errors (absl::Status): empty or duplicate key / tensor name -> INVALID_ARGUMENT
// / ALREADY_EXISTS; a shape that is empty, has more than 4 dims or a dim < 1,
// a last dim not a multiple of the type's block, bytes that do not match the
// shape, an unknown ggml type -> INVALID_ARGUMENT. Write: the errno's code,
// naming the path.
//
// Cost: holds every tensor's bytes until Serialize / Write (the file image is
// built once more there). Not thread-safe.
//
// Example:
//   GgufWriter w;
//   CORTIQ_RETURN_IF_ERROR(w.AddString("general.architecture", "qwen3"));
//   CORTIQ_RETURN_IF_ERROR(w.AddTensor("token_embd.weight", math::DType::kQ8_0, {vocab, hidden},
//   v)); CORTIQ_RETURN_IF_ERROR(w.Write("/tmp/model.gguf"));
#pragma once

#include <cstdint>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "core/math/kernels.h"
#include "core/model/gguf.h"

namespace cortiq::model {

class GgufWriter {
 public:
  // `alignment`: a power of two; other than 32 it is written as
  // general.alignment (u32), the first key.
  explicit GgufWriter(uint32_t alignment = GgufFile::kDefaultAlignment);

  absl::Status AddU8(std::string key, uint8_t v);
  absl::Status AddI8(std::string key, int8_t v);
  absl::Status AddU16(std::string key, uint16_t v);
  absl::Status AddI16(std::string key, int16_t v);
  absl::Status AddU32(std::string key, uint32_t v);
  absl::Status AddI32(std::string key, int32_t v);
  absl::Status AddU64(std::string key, uint64_t v);
  absl::Status AddI64(std::string key, int64_t v);
  absl::Status AddF32(std::string key, float v);
  absl::Status AddF64(std::string key, double v);
  absl::Status AddBool(std::string key, bool v);
  absl::Status AddString(std::string key, std::string_view v);
  absl::Status AddStringArray(std::string key, std::span<const std::string> v);
  absl::Status AddI32Array(std::string key, std::span<const int32_t> v);
  absl::Status AddF32Array(std::string key, std::span<const float> v);
  // Any array of scalars: `elements` holds count little-endian values of
  // `elem` (INVALID_ARGUMENT for string / array elements or a size mismatch).
  absl::Status AddArray(std::string key, GgufValueType elem, uint64_t count,
                        std::string_view elements);

  // `shape` in PyTorch order ({rows, cols}; written as ne = reversed).
  // `values` (numel of them) stored as `dtype`.
  absl::Status AddTensor(std::string name, math::DType dtype, std::vector<int64_t> shape,
                         std::span<const float> values);
  // Bytes of a known ggml type, checked against the shape.
  absl::Status AddRawTensor(std::string name, uint32_t ggml_type, std::vector<int64_t> shape,
                            std::string_view bytes);

  // The complete file image.
  std::string Serialize() const;
  // Writes `path` atomically (path + ".tmp", then rename).
  absl::Status Write(const std::string& path) const;

  size_t num_tensors() const { return tensors_.size(); }
  size_t num_keys() const { return num_kv_; }

 private:
  struct Pending {
    std::string name;
    uint32_t type;
    std::vector<int64_t> shape;
    std::string bytes;
  };
  absl::Status AddKv(std::string key, GgufValueType type, std::string_view value);

  uint32_t alignment_;
  std::string kv_bytes_;  // encoded key/value pairs, in call order
  uint64_t num_kv_ = 0;
  std::set<std::string, std::less<>> keys_;
  std::vector<Pending> tensors_;
};

}  // namespace cortiq::model
