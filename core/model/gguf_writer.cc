// GgufWriter (see the header): values are encoded as they are added; the
// tensor infos and the data section are laid out in Serialize.
#include "core/model/gguf_writer.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/model/checkpoint_io.h"
#include "core/util/status_macros.h"

namespace cortiq::model {
namespace {

template <typename T>
void Put(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}

void PutString(std::string& out, std::string_view s) {
  Put<uint64_t>(out, s.size());
  out.append(s.data(), s.size());
}

template <typename T>
std::string Scalar(T v) {
  std::string s;
  Put(s, v);
  return s;
}

// numel of a PyTorch-order shape of 1..4 dims, each >= 1.
absl::StatusOr<uint64_t> Numel(const std::string& name, const std::vector<int64_t>& shape) {
  if (shape.empty() || shape.size() > GgufFile::kMaxDims) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': shape ",
                                                   ShapeString(shape), " must have 1 to ",
                                                   GgufFile::kMaxDims, " dims"));
  }
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 1 || __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", name, "': bad shape ", ShapeString(shape)));
    }
  }
  return n;
}

}  // namespace

GgufWriter::GgufWriter(uint32_t alignment) : alignment_(alignment) {
  if (alignment_ == 0 || (alignment_ & (alignment_ - 1)) != 0)
    alignment_ = GgufFile::kDefaultAlignment;
  if (alignment_ != GgufFile::kDefaultAlignment) (void)AddU32("general.alignment", alignment_);
}

absl::Status GgufWriter::AddKv(std::string key, GgufValueType type, std::string_view value) {
  if (key.empty()) return absl::InvalidArgumentError("metadata key is empty");
  if (!keys_.insert(key).second) {
    return absl::AlreadyExistsError(absl::StrCat("metadata key '", key, "' added twice"));
  }
  PutString(kv_bytes_, key);
  Put<uint32_t>(kv_bytes_, static_cast<uint32_t>(type));
  kv_bytes_.append(value.data(), value.size());
  ++num_kv_;
  return absl::OkStatus();
}

absl::Status GgufWriter::AddU8(std::string key, uint8_t v) {
  return AddKv(std::move(key), GgufValueType::kU8, Scalar(v));
}
absl::Status GgufWriter::AddI8(std::string key, int8_t v) {
  return AddKv(std::move(key), GgufValueType::kI8, Scalar(v));
}
absl::Status GgufWriter::AddU16(std::string key, uint16_t v) {
  return AddKv(std::move(key), GgufValueType::kU16, Scalar(v));
}
absl::Status GgufWriter::AddI16(std::string key, int16_t v) {
  return AddKv(std::move(key), GgufValueType::kI16, Scalar(v));
}
absl::Status GgufWriter::AddU32(std::string key, uint32_t v) {
  return AddKv(std::move(key), GgufValueType::kU32, Scalar(v));
}
absl::Status GgufWriter::AddI32(std::string key, int32_t v) {
  return AddKv(std::move(key), GgufValueType::kI32, Scalar(v));
}
absl::Status GgufWriter::AddU64(std::string key, uint64_t v) {
  return AddKv(std::move(key), GgufValueType::kU64, Scalar(v));
}
absl::Status GgufWriter::AddI64(std::string key, int64_t v) {
  return AddKv(std::move(key), GgufValueType::kI64, Scalar(v));
}
absl::Status GgufWriter::AddF32(std::string key, float v) {
  return AddKv(std::move(key), GgufValueType::kF32, Scalar(v));
}
absl::Status GgufWriter::AddF64(std::string key, double v) {
  return AddKv(std::move(key), GgufValueType::kF64, Scalar(v));
}
absl::Status GgufWriter::AddBool(std::string key, bool v) {
  return AddKv(std::move(key), GgufValueType::kBool, Scalar<uint8_t>(v ? 1 : 0));
}
absl::Status GgufWriter::AddString(std::string key, std::string_view v) {
  std::string s;
  PutString(s, v);
  return AddKv(std::move(key), GgufValueType::kString, s);
}

absl::Status GgufWriter::AddStringArray(std::string key, std::span<const std::string> v) {
  std::string s;
  Put<uint32_t>(s, static_cast<uint32_t>(GgufValueType::kString));
  Put<uint64_t>(s, v.size());
  for (const std::string& e : v) PutString(s, e);
  return AddKv(std::move(key), GgufValueType::kArray, s);
}

absl::Status GgufWriter::AddI32Array(std::string key, std::span<const int32_t> v) {
  return AddArray(std::move(key), GgufValueType::kI32, v.size(),
                  {reinterpret_cast<const char*>(v.data()), v.size_bytes()});
}

absl::Status GgufWriter::AddF32Array(std::string key, std::span<const float> v) {
  return AddArray(std::move(key), GgufValueType::kF32, v.size(),
                  {reinterpret_cast<const char*>(v.data()), v.size_bytes()});
}

absl::Status GgufWriter::AddArray(std::string key, GgufValueType elem, uint64_t count,
                                  std::string_view elements) {
  const uint64_t es = GgufScalarSize(elem);
  if (es == 0) {
    return absl::InvalidArgumentError(absl::StrCat("metadata key '", key, "': arrays of ",
                                                   GgufValueTypeName(elem),
                                                   " go through AddStringArray or not at all"));
  }
  if (count > elements.size() / es || count * es != elements.size()) {
    return absl::InvalidArgumentError(absl::StrCat("metadata key '", key, "': ", count, " x ",
                                                   GgufValueTypeName(elem), " does not match ",
                                                   elements.size(), " bytes"));
  }
  std::string s;
  Put<uint32_t>(s, static_cast<uint32_t>(elem));
  Put<uint64_t>(s, count);
  s.append(elements.data(), elements.size());
  return AddKv(std::move(key), GgufValueType::kArray, s);
}

absl::Status GgufWriter::AddTensor(std::string name, math::DType dtype, std::vector<int64_t> shape,
                                   std::span<const float> values) {
  CORTIQ_ASSIGN_OR_RETURN(const uint64_t n, Numel(name, shape));
  if (values.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': ", values.size(),
                                                   " values for shape ", ShapeString(shape)));
  }
  const size_t cols = static_cast<size_t>(shape.back());
  if (dtype == math::DType::kQ8_0 && cols % math::kQ8Block != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': Q8_0 needs rows of a ",
                                                   "multiple of 32 values, shape ",
                                                   ShapeString(shape)));
  }
  std::string bytes(n / cols * math::RowBytes(dtype, cols), '\0');
  math::ConvertFromF32(values.data(), dtype, values.size(), bytes.data());
  return AddRawTensor(std::move(name), GgmlTypeOf(dtype), std::move(shape), bytes);
}

absl::Status GgufWriter::AddRawTensor(std::string name, uint32_t ggml_type,
                                      std::vector<int64_t> shape, std::string_view bytes) {
  if (name.empty() || name.size() > GgufFile::kMaxTensorNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("tensor name of ", name.size(), " bytes (1 to ",
                                                   GgufFile::kMaxTensorNameBytes, ")"));
  }
  const GgmlTypeTraits* t = GgmlTypeInfo(ggml_type);
  if (t == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", name, "': unknown ggml type ", ggml_type));
  }
  CORTIQ_ASSIGN_OR_RETURN(const uint64_t n, Numel(name, shape));
  if (static_cast<uint64_t>(shape.back()) % t->block_size != 0 ||
      n / t->block_size * t->type_size != bytes.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", name, "': shape ", ShapeString(shape), " in ", t->name,
                     " (blocks of ", t->block_size, " values in ", t->type_size,
                     " bytes) does not match ", bytes.size(), " bytes"));
  }
  for (const Pending& p : tensors_) {
    if (p.name == name) {
      return absl::AlreadyExistsError(absl::StrCat("tensor '", name, "' added twice"));
    }
  }
  tensors_.push_back({std::move(name), ggml_type, std::move(shape), std::string(bytes)});
  return absl::OkStatus();
}

std::string GgufWriter::Serialize() const {
  auto pad_to = [&](std::string& out, uint64_t base) {
    while ((out.size() - base) % alignment_ != 0) out.push_back('\0');
  };
  std::string out = "GGUF";
  Put<uint32_t>(out, 3);
  Put<uint64_t>(out, tensors_.size());
  Put<uint64_t>(out, num_kv_);
  out += kv_bytes_;
  uint64_t offset = 0;
  for (const Pending& p : tensors_) {
    PutString(out, p.name);
    Put<uint32_t>(out, static_cast<uint32_t>(p.shape.size()));
    for (auto it = p.shape.rbegin(); it != p.shape.rend(); ++it) Put<uint64_t>(out, *it);
    Put<uint32_t>(out, p.type);
    Put<uint64_t>(out, offset);
    offset += (p.bytes.size() + alignment_ - 1) / alignment_ * alignment_;
  }
  pad_to(out, 0);
  const uint64_t data_start = out.size();
  for (const Pending& p : tensors_) {
    out += p.bytes;
    pad_to(out, data_start);
  }
  return out;
}

absl::Status GgufWriter::Write(const std::string& path) const {
  return WriteFileAtomically(path, Serialize());
}

}  // namespace cortiq::model
