// Safetensors: read (memory-mapped) and write the Hugging Face tensor file format.
//
// Layout: u64 little-endian N, then N bytes of JSON header
//   {"<name>": {"dtype": "BF16", "shape": [r, c], "data_offsets": [begin, end]},
//    ..., "__metadata__": {"<key>": "<string>"}}
// then the data section; offsets are relative to its start, end exclusive.
//
// SafetensorsFile::Open maps the file read-only (nothing is read eagerly: the
// kernel pages tensors in on first touch) and validates the whole header before
// returning: header length sane (<= 100 MB, inside the file), JSON well formed,
// every entry well formed, shape x element size == end - begin, offsets inside
// the data section, no two tensors overlapping. A tensor whose dtype the engine
// does not compute with (I8, F64, ..., or a dtype this reader does not know)
// does not stop the file from opening; Get() of that tensor fails instead.
//
// Errors (absl::Status), every message starting with the file's path and naming
// the tensor where there is one:
//   file cannot be opened / mapped     -> the errno's code (NOT_FOUND, ...)
//   truncated, malformed header JSON, bad entry, offsets out of range or
//   overlapping, size/shape mismatch   -> DATA_LOSS
//   tensor absent                      -> NOT_FOUND
//   unsupported dtype (at Get)         -> UNIMPLEMENTED
// Never throws, never crashes on any input bytes.
//
// Thread-safety: after Open, all methods are const and thread-safe; the
// returned TensorViews stay valid as long as the SafetensorsFile lives (moving
// the file object keeps them valid: the mapping moves, it is not remapped).
//
// Example:
//   CORTIQ_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::Open(path));
//   CORTIQ_ASSIGN_OR_RETURN(TensorView w, f.Get("lm_head.weight"));
//   math::WeightView wv = w.AsWeightView();
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/math/kernels.h"

namespace cortiq::model {

// One tensor inside a mapped file. Does not own `data`.
struct TensorView {
  std::string name;
  math::DType dtype = math::DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // in the mapping; no alignment guaranteed
  size_t nbytes = 0;

  int64_t numel() const;
  // The nn.Linear view: rows = shape[0], cols = product of the remaining
  // dims (1 for a rank-1 tensor). Intended for rank-2 weights.
  math::WeightView AsWeightView() const;
};

// "[2, 3]" -- used in error messages across the model folder.
std::string ShapeString(std::span<const int64_t> shape);

// The safetensors dtype string of a supported dtype ("F32", "BF16", "F16"),
// and the reverse (nullopt for anything else, including known-but-unsupported).
const char* SafetensorsDTypeName(math::DType dtype);
std::optional<math::DType> ParseSafetensorsDType(std::string_view name);

class SafetensorsFile {
 public:
  // Header-level facts about a tensor, whatever its dtype.
  struct TensorInfo {
    std::string dtype_name;            // as written in the header ("BF16", "I8", ...)
    std::optional<math::DType> dtype;  // nullopt: not supported by the engine
    std::vector<int64_t> shape;
    uint64_t begin = 0;  // offsets into the data section, end exclusive
    uint64_t end = 0;
  };

  // Largest header accepted (the safetensors reference implementation's limit).
  static constexpr uint64_t kMaxHeaderBytes = 100'000'000;

  static absl::StatusOr<SafetensorsFile> Open(const std::string& path);

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();  // unmaps

  const std::string& path() const { return path_; }
  uint64_t file_size() const { return size_; }

  bool Has(std::string_view name) const { return tensors_.find(name) != tensors_.end(); }
  // nullptr when absent.
  const TensorInfo* Info(std::string_view name) const;
  // NOT_FOUND when absent, UNIMPLEMENTED for an unsupported dtype.
  absl::StatusOr<TensorView> Get(std::string_view name) const;
  // The tensor's bytes whatever its dtype (empty when absent).
  std::span<const uint8_t> RawData(std::string_view name) const;
  // Sorted.
  std::vector<std::string> TensorNames() const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  absl::Status ParseHeader();
  void Unmap();

  std::string path_;
  const uint8_t* map_ = nullptr;  // the whole file, PROT_READ
  uint64_t size_ = 0;             // file size in bytes
  uint64_t data_start_ = 0;       // 8 + header length
  std::map<std::string, TensorInfo, std::less<>> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Builds a safetensors file in memory and writes it. Tensors are laid out
// contiguously (as the reference implementation requires: no holes), sorted by
// descending element size then name, after a header padded with spaces to a
// multiple of 8 bytes, so every tensor is aligned to its element size.
// Not thread-safe.
//
// Example:
//   SafetensorsWriter w;
//   CORTIQ_RETURN_IF_ERROR(w.AddF32("norm.weight", math::DType::kBF16, {4}, values));
//   CORTIQ_RETURN_IF_ERROR(w.Write(dir + "/model.safetensors"));
class SafetensorsWriter {
 public:
  // Raw little-endian bytes; bytes.size() must equal numel x element size.
  // INVALID_ARGUMENT on a size mismatch, negative dim or empty name,
  // ALREADY_EXISTS on a duplicate name.
  absl::Status Add(std::string name, math::DType dtype, std::vector<int64_t> shape,
                   std::string_view bytes);
  // f32 values converted to `dtype` (round to nearest even); values.size()
  // must equal numel.
  absl::Status AddF32(std::string name, math::DType dtype, std::vector<int64_t> shape,
                      std::span<const float> values);
  // "__metadata__" entries (string to string).
  void SetMetadata(std::string key, std::string value);

  // The complete file image.
  std::string Serialize() const;
  // Writes `path` atomically (to path + ".tmp", then rename). Errors name the path.
  absl::Status Write(const std::string& path) const;

  size_t num_tensors() const { return tensors_.size(); }

 private:
  struct Pending {
    std::string name;
    math::DType dtype;
    std::vector<int64_t> shape;
    std::string bytes;
  };
  std::vector<Pending> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace cortiq::model
