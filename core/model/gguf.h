// GGUF: read (memory-mapped, validated) llama.cpp's model file format.
//
// Layout (little-endian; ggml/src/gguf.cpp, gguf-py/gguf/gguf_writer.py):
//   "GGUF"  u32 version (2 or 3)  u64 n_tensors  u64 n_kv
//   n_kv x      { string key, u32 value type, value }
//   n_tensors x { string name, u32 n_dims, u64 ne[n_dims], u32 ggml type, u64 offset }
//   padding to general.alignment (u32, default 32, a power of two)
//   data section: each tensor at data_start + offset (offset a multiple of the alignment)
// A string is u64 length + bytes (no terminator); an array is u32 element
// type + u64 count + elements. ne[0] is the innermost (fastest) dimension:
// a [rows][cols] matrix has ne = {cols, rows}.
//
// GgufFile::Open maps the file read-only (tensor data is paged in on first
// touch) and validates everything before returning: the magic, the version,
// every count and length bounded by the bytes left (a hostile header never
// sizes an allocation), every value type known, no duplicate key or tensor
// name, general.alignment a power-of-two u32, tensor names <= 64 KiB, n_dims
// in 1..4, every dim > 0, element and byte counts without overflow, the type
// a known ggml type whose block divides ne[0], offsets aligned, inside the
// data section and not overlapping. After that no accessor can read out of
// bounds.
//
// Tensors come back as TensorViews (core/model/safetensors.h) in PyTorch order
// (ne reversed: shape = {rows, cols}) pointing into the mapping: F32, F16,
// BF16 and Q8_0 (math::DType::kQ8_0: ggml's block_q8_0, read in place). Q4_0,
// Q4_K and Q6_K are readable through DequantizeGgufRows (gguf_quants below);
// the Checkpoint converts them to Q8_0 at load. Other known types (IQ2_XXS,
// Q5_K, ...) let the file open; using such a tensor is UNIMPLEMENTED.
//
// Errors (absl::Status), every message starting with the file's path (or the
// label given to FromBuffer) and naming the key or tensor where there is one:
//   file cannot be opened / mapped           -> the errno's code (NOT_FOUND, ...)
//   malformed header (truncated, bad magic or version, counts or lengths past
//   the end, unknown value or tensor type, bad alignment, dims, offsets out of
//   range / misaligned / overlapping, duplicates) -> DATA_LOSS
//   metadata key absent -> NOT_FOUND; of another type -> INVALID_ARGUMENT
//     ("<path>: metadata key 'x' has type string, expected u32")
//   tensor absent -> NOT_FOUND; of a type not read in place -> UNIMPLEMENTED
// Never throws, never crashes on any input bytes.
//
// Cost: Open reads the header only (O(header bytes), one allocation per key
// and tensor name); accessors are O(log n) map lookups, array accessors copy.
// Thread-safety: after Open, all methods are const and thread-safe. Views stay
// valid while the GgufFile lives (moves included: the mapping moves). Move-only.
//
// Example:
//   CORTIQ_ASSIGN_OR_RETURN(GgufFile f, GgufFile::Open("/models/qwen3-0.6b-q8_0.gguf"));
//   CORTIQ_ASSIGN_OR_RETURN(std::string arch, f.GetString("general.architecture"));
//   CORTIQ_ASSIGN_OR_RETURN(TensorView w, f.Get("blk.0.attn_q.weight"));  // {rows, cols}
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/math/kernels.h"
#include "core/model/safetensors.h"

namespace cortiq::model {

// Metadata value types (gguf_type).
enum class GgufValueType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};
// "u32", "string", "array", ...; "unknown" outside the enum.
const char* GgufValueTypeName(GgufValueType t);
// Bytes of a fixed-size value type (1, 2, 4 or 8); 0 for string, array and
// values outside the enum.
uint64_t GgufScalarSize(GgufValueType t);

// ggml tensor types this reader knows (ggml.h `enum ggml_type`; the ids are
// the file's). Ids not listed (4, 5, 31-33, 36-38: removed from ggml) and ids
// past the end are unknown: the file does not open.
namespace ggml_type {
inline constexpr uint32_t kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8,
                          kQ8_1 = 9, kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14,
                          kQ8_K = 15, kIQ2_XXS = 16, kBF16 = 30;
}  // namespace ggml_type

struct GgmlTypeTraits {
  const char* name;     // "Q4_K"
  uint32_t block_size;  // values per block (1 for plain element types)
  uint32_t type_size;   // bytes per block
};
// nullptr for an unknown id.
const GgmlTypeTraits* GgmlTypeInfo(uint32_t type);
// "Q4_K", or "type <id>" for an unknown id.
std::string GgmlTypeName(uint32_t type);
// The ggml type of an engine dtype (F32, F16, BF16, Q8_0), and the reverse
// (nullopt for a type the engine does not read in place).
uint32_t GgmlTypeOf(math::DType dtype);
std::optional<math::DType> InPlaceDType(uint32_t ggml_type);
// Types DequantizeGgufRows reads: the in-place ones and Q4_0, Q4_K, Q6_K.
bool GgufDequantizable(uint32_t ggml_type);
// "F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K" (for error messages).
const char* GgufSupportedTypeList();

// out[0..n) = the values of n consecutive elements of `type` at `src` (n a
// multiple of the type's block size, src at a block boundary), exactly as
// ggml dequantizes them (ggml-quants.c dequantize_row_*; the f32 arithmetic
// in the same order, no fused multiply-add). Types: GgufDequantizable.
// Returns false (writing nothing) for any other type.
bool DequantizeGgufRows(uint32_t type, const void* src, size_t n, float* out);

class GgufFile {
 public:
  static constexpr uint32_t kDefaultAlignment = 32;
  static constexpr uint64_t kMaxTensorNameBytes = 64 * 1024;
  static constexpr uint32_t kMaxDims = 4;

  struct TensorInfo {
    std::string name;
    uint32_t type = 0;           // ggml type id (known: GgmlTypeInfo != nullptr)
    std::vector<int64_t> ne;     // as in the file, ne[0] innermost
    std::vector<int64_t> shape;  // PyTorch order: ne reversed
    uint64_t offset = 0;         // into the data section
    uint64_t nbytes = 0;
  };

  // Maps and validates `path`.
  static absl::StatusOr<GgufFile> Open(const std::string& path);
  // Validates a copy of `bytes` (fuzzing, tests), made on a 64-byte
  // boundary; `label` stands for the path in messages.
  static absl::StatusOr<GgufFile> FromBuffer(std::string_view bytes, std::string label);

  GgufFile(GgufFile&& other) noexcept;
  GgufFile& operator=(GgufFile&& other) noexcept;
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;
  ~GgufFile();  // unmaps

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t file_size() const { return size_; }
  uint64_t data_start() const { return data_start_; }

  // ---- metadata ----
  bool Has(std::string_view key) const { return kvs_.find(key) != kvs_.end(); }
  // nullopt when absent.
  std::optional<GgufValueType> TypeOf(std::string_view key) const;
  // Keys in file order.
  const std::vector<std::string>& keys() const { return key_order_; }

  // Exactly typed scalars: NOT_FOUND when absent, INVALID_ARGUMENT when the
  // key holds another type (the message names both).
  absl::StatusOr<std::string> GetString(std::string_view key) const;
  absl::StatusOr<uint32_t> GetU32(std::string_view key) const;
  absl::StatusOr<int32_t> GetI32(std::string_view key) const;
  absl::StatusOr<uint64_t> GetU64(std::string_view key) const;
  absl::StatusOr<float> GetF32(std::string_view key) const;
  absl::StatusOr<bool> GetBool(std::string_view key) const;
  // Any integer type (u8 .. i64) as int64 (a u64 above INT64_MAX is
  // INVALID_ARGUMENT); any float type (f32, f64) as double. Writers differ in
  // the widths they pick for the same key: the model mapping reads these.
  absl::StatusOr<int64_t> GetInt(std::string_view key) const;
  absl::StatusOr<double> GetFloat(std::string_view key) const;
  // Arrays: the element type must match (strings; any integer type; f32/f64).
  absl::StatusOr<std::vector<std::string>> GetStringArray(std::string_view key) const;
  absl::StatusOr<std::vector<int64_t>> GetIntArray(std::string_view key) const;
  absl::StatusOr<std::vector<float>> GetFloatArray(std::string_view key) const;
  // Element count and type of an array (INVALID_ARGUMENT for a non-array).
  absl::StatusOr<uint64_t> ArrayLength(std::string_view key) const;
  absl::StatusOr<GgufValueType> ArrayElementType(std::string_view key) const;

  // ---- tensors ----
  bool HasTensor(std::string_view name) const { return index_.find(name) != index_.end(); }
  // nullptr when absent.
  const TensorInfo* Info(std::string_view name) const;
  // In file order.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // F32 / F16 / BF16 / Q8_0 in place. NOT_FOUND when absent; UNIMPLEMENTED
  // otherwise ("<path>: tensor 'blk.0.attn_q.weight' has type IQ2_XXS, which
  // is not supported (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K)";
  // Q4_0 / Q4_K / Q6_K: "... which is not read in place: dequantize it").
  absl::StatusOr<TensorView> Get(std::string_view name) const;
  // The tensor's bytes whatever its type (empty when absent).
  std::span<const uint8_t> RawData(std::string_view name) const;

 private:
  struct Kv {
    GgufValueType type = GgufValueType::kU8;
    GgufValueType elem = GgufValueType::kU8;  // arrays
    uint64_t count = 0;                       // arrays: elements
    uint64_t offset = 0;                      // of the value (after the type field)
  };

  GgufFile() = default;
  absl::Status Parse();
  void Unmap();
  absl::StatusOr<const Kv*> Find(std::string_view key) const;
  absl::Status WrongType(std::string_view key, const Kv& kv, const char* expected) const;
  absl::StatusOr<int64_t> IntAt(std::string_view key, GgufValueType t, uint64_t off) const;

  std::string path_;
  const uint8_t* map_ = nullptr;      // the whole file, PROT_READ (or owned_)
  std::unique_ptr<uint8_t[]> owned_;  // FromBuffer's copy
  uint64_t size_ = 0;
  uint32_t version_ = 0;
  uint32_t alignment_ = kDefaultAlignment;
  uint64_t data_start_ = 0;
  std::map<std::string, Kv, std::less<>> kvs_;
  std::vector<std::string> key_order_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> tensors_ index
};

}  // namespace cortiq::model
