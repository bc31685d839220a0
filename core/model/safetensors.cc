// Safetensors reader/writer. The header is parsed with nlohmann::json in its
// non-throwing mode and every field is type-checked before use; all arithmetic
// on header values is overflow-checked, so no input can crash the reader.
#include "core/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/model/checkpoint_io.h"
#include "core/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace cortiq::model {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; big-endian hosts are not supported");

using Json = nlohmann::json;

// Abseil 20220623 has its own string_view type, which StrCat takes.
absl::string_view Sv(std::string_view s) { return {s.data(), s.size()}; }

// Element sizes of the safetensors dtypes this reader knows, supported or not,
// so that a file holding them still validates. 0: unknown.
size_t KnownDTypeSize(std::string_view name) {
  static constexpr std::pair<std::string_view, size_t> kSizes[] = {
      {"F64", 8},  {"I64", 8},     {"U64", 8},     {"F32", 4},     {"I32", 4}, {"U32", 4},
      {"F16", 2},  {"BF16", 2},    {"I16", 2},     {"U16", 2},     {"I8", 1},  {"U8", 1},
      {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"F8_E8M0", 1},
  };
  for (const auto& [n, s] : kSizes) {
    if (n == name) return s;
  }
  return 0;
}

// A non-negative JSON integer. nlohmann stores non-negative integers as
// unsigned, so a signed one here is negative.
bool GetU64(const Json& v, uint64_t* out) {
  if (!v.is_number_unsigned()) return false;
  *out = v.get<uint64_t>();
  return true;
}

std::string SafeDump(const Json& v) {
  std::string s = v.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

}  // namespace

// ---- TensorView ----

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

math::WeightView TensorView::AsWeightView() const {
  math::WeightView w;
  w.data = data;
  w.dtype = dtype;
  w.rows = shape.empty() ? 1 : static_cast<size_t>(shape[0]);
  size_t cols = 1;
  for (size_t i = 1; i < shape.size(); ++i) cols *= static_cast<size_t>(shape[i]);
  w.cols = cols;
  return w;
}

std::string ShapeString(std::span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

const char* SafetensorsDTypeName(math::DType dtype) {
  switch (dtype) {
    case math::DType::kF32:
      return "F32";
    case math::DType::kBF16:
      return "BF16";
    case math::DType::kF16:
      return "F16";
    case math::DType::kQ8_0:  // not a safetensors dtype
      break;
  }
  return "?";
}

std::optional<math::DType> ParseSafetensorsDType(std::string_view name) {
  if (name == "F32") return math::DType::kF32;
  if (name == "BF16") return math::DType::kBF16;
  if (name == "F16") return math::DType::kF16;
  return std::nullopt;
}

// ---- SafetensorsFile ----

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept
    : path_(std::move(other.path_)),
      map_(std::exchange(other.map_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      data_start_(std::exchange(other.data_start_, 0)),
      tensors_(std::move(other.tensors_)),
      metadata_(std::move(other.metadata_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    Unmap();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    size_ = std::exchange(other.size_, 0);
    data_start_ = std::exchange(other.data_start_, 0);
    tensors_ = std::move(other.tensors_);
    metadata_ = std::move(other.metadata_);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() { Unmap(); }

void SafetensorsFile::Unmap() {
  if (map_ != nullptr) {
    ::munmap(const_cast<uint8_t*>(map_), size_);
    map_ = nullptr;
  }
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  SafetensorsFile f;
  f.path_ = path;
  CORTIQ_ASSIGN_OR_RETURN(OpenedFile file, OpenRegularFile(path));
  const int fd = file.fd;
  f.size_ = file.size;
  if (f.size_ < 8) {
    ::close(fd);
    return absl::DataLossError(absl::StrCat(path, ": file is ", f.size_,
                                            " bytes, shorter than the 8-byte header length "
                                            "(truncated?)"));
  }
  void* m = ::mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd, 0);
  int err = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (m == MAP_FAILED) return absl::ErrnoToStatus(err, absl::StrCat(path, ": cannot mmap"));
  f.map_ = static_cast<const uint8_t*>(m);
  CORTIQ_RETURN_IF_ERROR(f.ParseHeader());
  return f;
}

absl::Status SafetensorsFile::ParseHeader() {
  auto fail = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat(path_, ": ", why));
  };
  auto fail_tensor = [&](absl::string_view name, absl::string_view why) {
    return absl::DataLossError(absl::StrCat(path_, ": tensor '", name, "': ", why));
  };

  uint64_t header_len = 0;
  std::memcpy(&header_len, map_, 8);  // little-endian host (static_assert above)
  if (header_len > kMaxHeaderBytes) {
    return fail(absl::StrCat("header length ", header_len, " exceeds the limit of ",
                             kMaxHeaderBytes, " bytes"));
  }
  if (header_len > size_ - 8) {
    return fail(absl::StrCat("header length ", header_len, " exceeds the ", size_ - 8,
                             " bytes after the length field (truncated?)"));
  }
  data_start_ = 8 + header_len;
  const uint64_t data_size = size_ - data_start_;

  const char* hbegin = reinterpret_cast<const char*>(map_ + 8);
  Json header = Json::parse(hbegin, hbegin + header_len, /*cb=*/nullptr,
                            /*allow_exceptions=*/false);
  if (header.is_discarded()) return fail("malformed header JSON");
  if (!header.is_object()) {
    return fail(absl::StrCat("header JSON is a ", header.type_name(), ", expected an object"));
  }

  struct Span {
    uint64_t begin, end;
    const std::string* name;
  };
  std::vector<Span> spans;
  spans.reserve(header.size());

  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const Json& v = it.value();
    if (name == "__metadata__") {
      if (v.is_null()) continue;
      if (!v.is_object()) return fail("__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) {
          return fail(absl::StrCat("__metadata__ key '", m.key(), "' is not a string"));
        }
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (name.empty()) return fail("a tensor has an empty name");
    if (!v.is_object()) {
      return fail_tensor(name, absl::StrCat("entry is a ", v.type_name(), ", expected an object"));
    }

    TensorInfo info;
    auto dt = v.find("dtype");
    if (dt == v.end() || !dt->is_string()) return fail_tensor(name, "missing or non-string dtype");
    info.dtype_name = dt->get<std::string>();
    info.dtype = ParseSafetensorsDType(info.dtype_name);

    auto sh = v.find("shape");
    if (sh == v.end() || !sh->is_array()) return fail_tensor(name, "missing or non-array shape");
    uint64_t numel = 1;
    bool overflow = false;
    for (const Json& d : *sh) {
      uint64_t x = 0;
      if (!GetU64(d, &x) || x > static_cast<uint64_t>(INT64_MAX)) {
        return fail_tensor(name, absl::StrCat("bad shape ", SafeDump(*sh),
                                              " (dims must be non-negative integers)"));
      }
      info.shape.push_back(static_cast<int64_t>(x));
      overflow |= __builtin_mul_overflow(numel, x, &numel);
    }

    auto off = v.find("data_offsets");
    if (off == v.end() || !off->is_array() || off->size() != 2 || !GetU64((*off)[0], &info.begin) ||
        !GetU64((*off)[1], &info.end)) {
      return fail_tensor(
          name, absl::StrCat("bad data_offsets ", off == v.end() ? "(missing)" : SafeDump(*off),
                             " (expected [begin, end], non-negative integers)"));
    }
    if (info.begin > info.end) {
      return fail_tensor(name, absl::StrCat("data_offsets [", info.begin, ", ", info.end,
                                            ") has begin after end"));
    }
    if (info.end > data_size) {
      return fail_tensor(name, absl::StrCat("data_offsets [", info.begin, ", ", info.end,
                                            ") out of range: the data section has ", data_size,
                                            " bytes (truncated?)"));
    }
    if (size_t esize = KnownDTypeSize(info.dtype_name); esize != 0) {
      uint64_t nbytes = 0;
      if (overflow || __builtin_mul_overflow(numel, esize, &nbytes) ||
          nbytes != info.end - info.begin) {
        return fail_tensor(
            name, absl::StrCat("shape ", ShapeString(info.shape), " x ", info.dtype_name, " (",
                               esize, " bytes) does not match data_offsets [", info.begin, ", ",
                               info.end, ") (", info.end - info.begin, " bytes)"));
      }
    }
    auto [pos, inserted] = tensors_.emplace(name, std::move(info));
    (void)inserted;  // JSON object keys are unique after parsing
    spans.push_back({pos->second.begin, pos->second.end, &pos->first});
  }

  // Overlaps: sort by begin; every non-empty span must start at or after the
  // furthest end seen so far.
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.begin != b.begin ? a.begin < b.begin : *a.name < *b.name;
  });
  const Span* furthest = nullptr;
  for (const Span& s : spans) {
    if (s.begin == s.end) continue;
    if (furthest != nullptr && s.begin < furthest->end) {
      return fail_tensor(
          *s.name, absl::StrCat("data_offsets [", s.begin, ", ", s.end, ") overlap tensor '",
                                *furthest->name, "' [", furthest->begin, ", ", furthest->end, ")"));
    }
    if (furthest == nullptr || s.end > furthest->end) furthest = &s;
  }
  return absl::OkStatus();
}

const SafetensorsFile::TensorInfo* SafetensorsFile::Info(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

absl::StatusOr<TensorView> SafetensorsFile::Get(std::string_view name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(absl::StrCat(path_, ": tensor '", Sv(name), "' not found"));
  }
  const TensorInfo& info = it->second;
  if (!info.dtype) {
    return absl::UnimplementedError(absl::StrCat(path_, ": tensor '", Sv(name),
                                                 "': unsupported dtype ", info.dtype_name,
                                                 " (supported: F32, BF16, F16)"));
  }
  // The kernels read elements by their type (as the GGUF loader says): data
  // off that boundary (a header whose length is not padded to 8, as writers
  // since safetensors 0.3 pad it) is refused rather than read misaligned.
  const uint64_t at = data_start_ + info.begin;
  if (const size_t esize = KnownDTypeSize(info.dtype_name); esize > 1 && at % esize != 0) {
    return absl::DataLossError(absl::StrCat(
        path_, ": tensor '", Sv(name), "': data at byte ", at, " of the file is not ", esize,
        "-byte aligned for ", info.dtype_name, " (header of ", data_start_ - 8, " bytes)"));
  }
  TensorView v;
  v.name = it->first;
  v.dtype = *info.dtype;
  v.shape = info.shape;
  v.data = map_ + at;
  v.nbytes = static_cast<size_t>(info.end - info.begin);
  return v;
}

std::span<const uint8_t> SafetensorsFile::RawData(std::string_view name) const {
  const TensorInfo* info = Info(name);
  if (info == nullptr) return {};
  return {map_ + data_start_ + info->begin, static_cast<size_t>(info->end - info->begin)};
}

std::vector<std::string> SafetensorsFile::TensorNames() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, info] : tensors_) names.push_back(name);
  return names;
}

// ---- SafetensorsWriter ----

absl::Status SafetensorsWriter::Add(std::string name, math::DType dtype, std::vector<int64_t> shape,
                                    std::string_view bytes) {
  if (name.empty() || name == "__metadata__") {
    return absl::InvalidArgumentError(absl::StrCat("tensor name '", name, "' is not allowed"));
  }
  uint64_t numel = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", name, "': bad shape ", ShapeString(shape)));
    }
  }
  uint64_t want = 0;
  if (__builtin_mul_overflow(numel, math::DTypeSize(dtype), &want) || want != bytes.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", name, "': shape ", ShapeString(shape), " x ", SafetensorsDTypeName(dtype),
        " does not match ", bytes.size(), " bytes of data"));
  }
  for (const Pending& p : tensors_) {
    if (p.name == name) {
      return absl::AlreadyExistsError(absl::StrCat("tensor '", name, "' added twice"));
    }
  }
  tensors_.push_back({std::move(name), dtype, std::move(shape), std::string(bytes)});
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::AddF32(std::string name, math::DType dtype,
                                       std::vector<int64_t> shape, std::span<const float> values) {
  std::string bytes(values.size() * math::DTypeSize(dtype), '\0');
  if (!values.empty()) math::ConvertFromF32(values.data(), dtype, values.size(), bytes.data());
  return Add(std::move(name), dtype, std::move(shape), bytes);
}

void SafetensorsWriter::SetMetadata(std::string key, std::string value) {
  metadata_[std::move(key)] = std::move(value);
}

std::string SafetensorsWriter::Serialize() const {
  std::vector<const Pending*> order;
  order.reserve(tensors_.size());
  for (const Pending& p : tensors_) order.push_back(&p);
  std::sort(order.begin(), order.end(), [](const Pending* a, const Pending* b) {
    size_t sa = math::DTypeSize(a->dtype), sb = math::DTypeSize(b->dtype);
    return sa != sb ? sa > sb : a->name < b->name;
  });

  Json header = Json::object();
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  uint64_t offset = 0;
  for (const Pending* p : order) {
    header[p->name] = {{"dtype", SafetensorsDTypeName(p->dtype)},
                       {"shape", p->shape},
                       {"data_offsets", {offset, offset + p->bytes.size()}}};
    offset += p->bytes.size();
  }
  std::string json = header.dump(-1, ' ', false, Json::error_handler_t::replace);
  json.resize((json.size() + 7) / 8 * 8, ' ');  // align the data section to 8

  std::string out;
  out.reserve(8 + json.size() + offset);
  uint64_t n = json.size();
  out.append(reinterpret_cast<const char*>(&n), 8);
  out += json;
  for (const Pending* p : order) out += p->bytes;
  return out;
}

absl::Status SafetensorsWriter::Write(const std::string& path) const {
  return WriteFileAtomically(path, Serialize());
}

}  // namespace cortiq::model
