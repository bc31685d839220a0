// GGUF reader. Every read goes through Cursor, which checks the bytes left
// first; every count is capped by the bytes left before it drives a loop or an
// allocation; all arithmetic on header values is overflow-checked. So no
// input can make the parser read out of bounds, allocate more than the file's
// size in names, or loop past the end of the file.
#include "core/model/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "core/model/checkpoint_io.h"
#include "core/util/status_macros.h"

namespace cortiq::model {
namespace {

static_assert(std::endian::native == std::endian::little,
              "GGUF is read in place as little-endian; big-endian hosts are not supported");

// Abseil 20220623 has its own string_view type, which StrCat takes.
absl::string_view Sv(std::string_view s) { return {s.data(), s.size()}; }

// Id -> traits; {nullptr, 0, 0}: unknown (removed from ggml, or never used).
// Sizes from gguf-py/gguf/constants.py GGML_QUANT_SIZES (QK_K = 256).
constexpr GgmlTypeTraits kTypes[] = {
    {"F32", 1, 4},         // 0
    {"F16", 1, 2},         // 1
    {"Q4_0", 32, 18},      // 2
    {"Q4_1", 32, 20},      // 3
    {nullptr, 0, 0},       // 4 (Q4_2, removed)
    {nullptr, 0, 0},       // 5 (Q4_3, removed)
    {"Q5_0", 32, 22},      // 6
    {"Q5_1", 32, 24},      // 7
    {"Q8_0", 32, 34},      // 8
    {"Q8_1", 32, 36},      // 9
    {"Q2_K", 256, 84},     // 10
    {"Q3_K", 256, 110},    // 11
    {"Q4_K", 256, 144},    // 12
    {"Q5_K", 256, 176},    // 13
    {"Q6_K", 256, 210},    // 14
    {"Q8_K", 256, 292},    // 15
    {"IQ2_XXS", 256, 66},  // 16
    {"IQ2_XS", 256, 74},   // 17
    {"IQ3_XXS", 256, 98},  // 18
    {"IQ1_S", 256, 50},    // 19
    {"IQ4_NL", 32, 18},    // 20
    {"IQ3_S", 256, 110},   // 21
    {"IQ2_S", 256, 82},    // 22
    {"IQ4_XS", 256, 136},  // 23
    {"I8", 1, 1},          // 24
    {"I16", 1, 2},         // 25
    {"I32", 1, 4},         // 26
    {"I64", 1, 8},         // 27
    {"F64", 1, 8},         // 28
    {"IQ1_M", 256, 56},    // 29
    {"BF16", 1, 2},        // 30
    {nullptr, 0, 0},       // 31 (Q4_0_4_4, removed)
    {nullptr, 0, 0},       // 32 (Q4_0_4_8, removed)
    {nullptr, 0, 0},       // 33 (Q4_0_8_8, removed)
    {"TQ1_0", 256, 54},    // 34
    {"TQ2_0", 256, 66},    // 35
    {nullptr, 0, 0},       // 36 (IQ4_NL_4_4, removed)
    {nullptr, 0, 0},       // 37 (IQ4_NL_4_8, removed)
    {nullptr, 0, 0},       // 38 (IQ4_NL_8_8, removed)
    {"MXFP4", 32, 17},     // 39
    {"NVFP4", 64, 36},     // 40
    {"Q1_0", 128, 18},     // 41
    {"Q2_0", 64, 18},      // 42
};

bool KnownValueType(uint32_t t) { return t <= static_cast<uint32_t>(GgufValueType::kF64); }

bool IsIntType(GgufValueType t) {
  switch (t) {
    case GgufValueType::kU8:
    case GgufValueType::kI8:
    case GgufValueType::kU16:
    case GgufValueType::kI16:
    case GgufValueType::kU32:
    case GgufValueType::kI32:
    case GgufValueType::kU64:
    case GgufValueType::kI64:
      return true;
    default:
      return false;
  }
}

template <typename T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Bounds-checked little-endian reads over [0, size).
class Cursor {
 public:
  Cursor(const uint8_t* p, uint64_t size) : p_(p), size_(size) {}
  uint64_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }
  bool Skip(uint64_t n) {
    if (n > left()) return false;
    pos_ += n;
    return true;
  }
  template <typename T>
  bool Read(T* out) {
    if (sizeof(T) > left()) return false;
    *out = Load<T>(p_ + pos_);
    pos_ += sizeof(T);
    return true;
  }
  // A GGUF string: u64 length, bytes. `max` bounds the length too.
  bool String(std::string* out, uint64_t max = std::numeric_limits<uint64_t>::max()) {
    uint64_t n = 0;
    if (!Read(&n) || n > left() || n > max) return false;
    out->assign(reinterpret_cast<const char*>(p_ + pos_), static_cast<size_t>(n));
    pos_ += n;
    return true;
  }

 private:
  const uint8_t* p_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

}  // namespace

// ---- types ----

const char* GgufValueTypeName(GgufValueType t) {
  static const char* const kNames[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                       "bool", "string", "array", "u64", "i64", "f64"};
  const auto i = static_cast<uint32_t>(t);
  return i < std::size(kNames) ? kNames[i] : "unknown";
}

uint64_t GgufScalarSize(GgufValueType t) {
  switch (t) {
    case GgufValueType::kU8:
    case GgufValueType::kI8:
    case GgufValueType::kBool:
      return 1;
    case GgufValueType::kU16:
    case GgufValueType::kI16:
      return 2;
    case GgufValueType::kU32:
    case GgufValueType::kI32:
    case GgufValueType::kF32:
      return 4;
    case GgufValueType::kU64:
    case GgufValueType::kI64:
    case GgufValueType::kF64:
      return 8;
    case GgufValueType::kString:
    case GgufValueType::kArray:
      break;
  }
  return 0;
}

const GgmlTypeTraits* GgmlTypeInfo(uint32_t type) {
  if (type >= std::size(kTypes) || kTypes[type].name == nullptr) return nullptr;
  return &kTypes[type];
}

std::string GgmlTypeName(uint32_t type) {
  const GgmlTypeTraits* t = GgmlTypeInfo(type);
  return t != nullptr ? std::string(t->name) : absl::StrCat("type ", type);
}

uint32_t GgmlTypeOf(math::DType dtype) {
  switch (dtype) {
    case math::DType::kF32:
      return ggml_type::kF32;
    case math::DType::kF16:
      return ggml_type::kF16;
    case math::DType::kBF16:
      return ggml_type::kBF16;
    case math::DType::kQ8_0:
      return ggml_type::kQ8_0;
  }
  return ggml_type::kF32;
}

std::optional<math::DType> InPlaceDType(uint32_t type) {
  switch (type) {
    case ggml_type::kF32:
      return math::DType::kF32;
    case ggml_type::kF16:
      return math::DType::kF16;
    case ggml_type::kBF16:
      return math::DType::kBF16;
    case ggml_type::kQ8_0:
      return math::DType::kQ8_0;
    default:
      return std::nullopt;
  }
}

bool GgufDequantizable(uint32_t type) {
  return InPlaceDType(type).has_value() || type == ggml_type::kQ4_0 || type == ggml_type::kQ4_K ||
         type == ggml_type::kQ6_K;
}

const char* GgufSupportedTypeList() { return "F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K"; }

// ---- GgufFile ----

GgufFile::GgufFile(GgufFile&& other) noexcept
    : path_(std::move(other.path_)),
      map_(std::exchange(other.map_, nullptr)),
      owned_(std::move(other.owned_)),
      size_(std::exchange(other.size_, 0)),
      version_(other.version_),
      alignment_(other.alignment_),
      data_start_(other.data_start_),
      kvs_(std::move(other.kvs_)),
      key_order_(std::move(other.key_order_)),
      tensors_(std::move(other.tensors_)),
      index_(std::move(other.index_)) {}

GgufFile& GgufFile::operator=(GgufFile&& other) noexcept {
  if (this != &other) {
    Unmap();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    owned_ = std::move(other.owned_);
    size_ = std::exchange(other.size_, 0);
    version_ = other.version_;
    alignment_ = other.alignment_;
    data_start_ = other.data_start_;
    kvs_ = std::move(other.kvs_);
    key_order_ = std::move(other.key_order_);
    tensors_ = std::move(other.tensors_);
    index_ = std::move(other.index_);
  }
  return *this;
}

GgufFile::~GgufFile() { Unmap(); }

void GgufFile::Unmap() {
  if (map_ != nullptr && owned_ == nullptr && size_ > 0) {
    ::munmap(const_cast<uint8_t*>(map_), size_);
  }
  map_ = nullptr;
  owned_.reset();
}

absl::StatusOr<GgufFile> GgufFile::Open(const std::string& path) {
  GgufFile f;
  f.path_ = path;
  CORTIQ_ASSIGN_OR_RETURN(OpenedFile file, OpenRegularFile(path));
  f.size_ = file.size;
  if (f.size_ == 0) {
    ::close(file.fd);
    return absl::DataLossError(absl::StrCat(path, ": file is empty, not a GGUF file"));
  }
  void* m = ::mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, file.fd, 0);
  const int err = errno;
  ::close(file.fd);  // the mapping keeps the file alive
  if (m == MAP_FAILED) return absl::ErrnoToStatus(err, absl::StrCat(path, ": cannot mmap"));
  f.map_ = static_cast<const uint8_t*>(m);
  CORTIQ_RETURN_IF_ERROR(f.Parse());
  return f;
}

absl::StatusOr<GgufFile> GgufFile::FromBuffer(std::string_view bytes, std::string label) {
  GgufFile f;
  f.path_ = std::move(label);
  f.size_ = bytes.size();
  // The copy starts on a 64-byte boundary, as a mapping starts on a page.
  f.owned_ = std::make_unique<uint8_t[]>(bytes.size() + 64);
  uint8_t* base = f.owned_.get() + (64 - reinterpret_cast<uintptr_t>(f.owned_.get()) % 64) % 64;
  if (!bytes.empty()) std::memcpy(base, bytes.data(), bytes.size());
  f.map_ = base;
  CORTIQ_RETURN_IF_ERROR(f.Parse());
  return f;
}

absl::Status GgufFile::Parse() {
  auto fail = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat(path_, ": ", why));
  };
  Cursor c(map_, size_);
  auto truncated = [&](absl::string_view what) {
    return fail(absl::StrCat("truncated at byte ", c.pos(), " of ", size_, " reading ", what));
  };

  char magic[4] = {};
  if (size_ < 4)
    return fail(absl::StrCat("file is ", size_, " bytes, shorter than the GGUF magic"));
  std::memcpy(magic, map_, 4);
  c.Skip(4);
  if (std::memcmp(magic, "GGUF", 4) != 0) {
    return fail(absl::StrCat("not a GGUF file: magic bytes ", absl::CHexEscape(Sv({magic, 4})),
                             ", expected \"GGUF\""));
  }
  if (!c.Read(&version_)) return truncated("the version");
  if (version_ != 2 && version_ != 3) {
    return fail(absl::StrCat("GGUF version ", version_, " is not supported (2 or 3)"));
  }
  uint64_t n_tensors = 0, n_kv = 0;
  if (!c.Read(&n_tensors)) return truncated("the tensor count");
  if (!c.Read(&n_kv)) return truncated("the metadata count");

  // Smallest encodings: a key/value is a u64 length, 1 byte of key, a u32
  // type and 1 byte of value; a tensor info a u64 length, 1 byte of name, a
  // u32 n_dims, one u64 dim, a u32 type and a u64 offset.
  constexpr uint64_t kMinKvBytes = 8 + 1 + 4 + 1, kMinTensorBytes = 8 + 1 + 4 + 8 + 4 + 8;
  if (n_kv > c.left() / kMinKvBytes) {
    return fail(absl::StrCat("metadata count ", n_kv, " cannot fit in the ", c.left(),
                             " bytes left (truncated or corrupt)"));
  }
  if (n_tensors > c.left() / kMinTensorBytes) {
    return fail(absl::StrCat("tensor count ", n_tensors, " cannot fit in the ", c.left(),
                             " bytes left (truncated or corrupt)"));
  }

  // ---- key/value pairs
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key;
    if (!c.String(&key)) return truncated(absl::StrCat("the key of metadata entry ", i));
    if (key.empty()) return fail(absl::StrCat("metadata entry ", i, " has an empty key"));
    auto bad = [&](absl::string_view why) {
      return fail(absl::StrCat("metadata key '", key, "': ", why));
    };
    uint32_t type = 0;
    if (!c.Read(&type)) return truncated(absl::StrCat("the type of metadata key '", key, "'"));
    if (!KnownValueType(type)) return bad(absl::StrCat("unknown value type ", type));
    Kv kv;
    kv.type = static_cast<GgufValueType>(type);
    kv.offset = c.pos();
    auto skip_value = [&](GgufValueType t) -> bool {
      if (t == GgufValueType::kString) {
        uint64_t n = 0;
        return c.Read(&n) && c.Skip(n);
      }
      return c.Skip(GgufScalarSize(t));
    };
    if (kv.type == GgufValueType::kArray) {
      uint32_t elem = 0;
      if (!c.Read(&elem) || !c.Read(&kv.count)) {
        return truncated(absl::StrCat("the array header of metadata key '", key, "'"));
      }
      if (!KnownValueType(elem)) return bad(absl::StrCat("unknown array element type ", elem));
      kv.elem = static_cast<GgufValueType>(elem);
      if (kv.elem == GgufValueType::kArray) return bad("arrays of arrays are not supported");
      if (kv.elem == GgufValueType::kString) {
        if (kv.count > c.left() / 8) {
          return bad(absl::StrCat("array of ", kv.count, " strings cannot fit in the ", c.left(),
                                  " bytes left"));
        }
        for (uint64_t j = 0; j < kv.count; ++j) {
          if (!skip_value(GgufValueType::kString)) {
            return truncated(absl::StrCat("string ", j, " of metadata key '", key, "'"));
          }
        }
      } else {
        const uint64_t es = GgufScalarSize(kv.elem);
        if (kv.count > c.left() / es) {
          return bad(absl::StrCat("array of ", kv.count, " x ", GgufValueTypeName(kv.elem),
                                  " cannot fit in the ", c.left(), " bytes left"));
        }
        c.Skip(kv.count * es);
      }
    } else if (!skip_value(kv.type)) {
      return truncated(absl::StrCat("the value of metadata key '", key, "'"));
    }
    if (kv.type == GgufValueType::kBool && map_[kv.offset] > 1) {
      return bad(absl::StrCat("bool value ", int{map_[kv.offset]}, " is neither 0 nor 1"));
    }
    if (!kvs_.emplace(key, kv).second) return bad("appears twice");
    key_order_.push_back(std::move(key));
  }

  // ---- alignment
  if (const auto it = kvs_.find("general.alignment"); it != kvs_.end()) {
    if (it->second.type != GgufValueType::kU32) {
      return fail(absl::StrCat("metadata key 'general.alignment' has type ",
                               GgufValueTypeName(it->second.type), ", expected u32"));
    }
    alignment_ = Load<uint32_t>(map_ + it->second.offset);
    if (alignment_ == 0 || (alignment_ & (alignment_ - 1)) != 0) {
      return fail(absl::StrCat("general.alignment ", alignment_, " is not a power of two"));
    }
  }

  // ---- tensor infos
  tensors_.reserve(static_cast<size_t>(n_tensors));  // capped by the file size above
  for (uint64_t i = 0; i < n_tensors; ++i) {
    TensorInfo t;
    {
      uint64_t n = 0;
      Cursor peek = c;
      if (!peek.Read(&n)) return truncated(absl::StrCat("the name of tensor ", i));
      if (n > kMaxTensorNameBytes) {
        return fail(absl::StrCat("tensor ", i, ": name of ", n, " bytes exceeds the limit of ",
                                 kMaxTensorNameBytes));
      }
      if (n == 0) return fail(absl::StrCat("tensor ", i, " has an empty name"));
      if (!c.String(&t.name)) return truncated(absl::StrCat("the name of tensor ", i));
    }
    auto bad = [&](absl::string_view why) {
      return fail(absl::StrCat("tensor '", t.name, "': ", why));
    };
    uint32_t n_dims = 0;
    if (!c.Read(&n_dims)) return truncated(absl::StrCat("n_dims of tensor '", t.name, "'"));
    if (n_dims < 1 || n_dims > kMaxDims) {
      return bad(absl::StrCat("n_dims ", n_dims, " outside [1, ", kMaxDims, "]"));
    }
    uint64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t ne = 0;
      if (!c.Read(&ne)) return truncated(absl::StrCat("the dims of tensor '", t.name, "'"));
      if (ne == 0 || ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return bad(absl::StrCat("dim ", d, " is ", ne, " (must be in [1, 2^63))"));
      }
      if (__builtin_mul_overflow(numel, ne, &numel) ||
          numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return bad("element count overflows");
      }
      t.ne.push_back(static_cast<int64_t>(ne));
    }
    t.shape.assign(t.ne.rbegin(), t.ne.rend());
    if (!c.Read(&t.type)) return truncated(absl::StrCat("the type of tensor '", t.name, "'"));
    const GgmlTypeTraits* traits = GgmlTypeInfo(t.type);
    if (traits == nullptr) return bad(absl::StrCat("unknown ggml type ", t.type));
    if (static_cast<uint64_t>(t.ne[0]) % traits->block_size != 0) {
      return bad(absl::StrCat("row of ", t.ne[0], " values is not a whole number of ", traits->name,
                              " blocks of ", traits->block_size));
    }
    if (__builtin_mul_overflow(numel / traits->block_size, uint64_t{traits->type_size},
                               &t.nbytes)) {
      return bad("byte count overflows");
    }
    if (!c.Read(&t.offset)) return truncated(absl::StrCat("the offset of tensor '", t.name, "'"));
    if (t.offset % alignment_ != 0) {
      return bad(absl::StrCat("data offset ", t.offset, " is not a multiple of the alignment ",
                              alignment_));
    }
    if (index_.find(t.name) != index_.end()) return bad("appears twice");
    index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }

  // ---- data section: starts at the next multiple of the alignment
  const uint64_t pad = (alignment_ - c.pos() % alignment_) % alignment_;
  data_start_ = c.pos() + pad;
  if (n_tensors > 0 && data_start_ > size_) {
    return fail(absl::StrCat("data section would start at byte ", data_start_, ", past the end (",
                             size_, " bytes; truncated?)"));
  }
  const uint64_t data_size = data_start_ <= size_ ? size_ - data_start_ : 0;
  std::vector<const TensorInfo*> order;
  order.reserve(tensors_.size());
  for (const TensorInfo& t : tensors_) {
    if (t.offset > data_size || t.nbytes > data_size - t.offset) {
      return fail(absl::StrCat("tensor '", t.name, "': data [", t.offset, ", +", t.nbytes,
                               ") is outside the data section of ", data_size,
                               " bytes (truncated?)"));
    }
    order.push_back(&t);
  }
  std::sort(order.begin(), order.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->offset != b->offset ? a->offset < b->offset : a->name < b->name;
  });
  for (size_t i = 1; i < order.size(); ++i) {
    const TensorInfo& prev = *order[i - 1];
    if (order[i]->offset < prev.offset + prev.nbytes) {
      return fail(absl::StrCat("tensor '", order[i]->name, "': data at offset ", order[i]->offset,
                               " overlaps tensor '", prev.name, "' [", prev.offset, ", ",
                               prev.offset + prev.nbytes, ")"));
    }
  }
  return absl::OkStatus();
}

// ---- metadata accessors ----

std::optional<GgufValueType> GgufFile::TypeOf(std::string_view key) const {
  auto it = kvs_.find(key);
  if (it == kvs_.end()) return std::nullopt;
  return it->second.type;
}

absl::StatusOr<const GgufFile::Kv*> GgufFile::Find(std::string_view key) const {
  auto it = kvs_.find(key);
  if (it == kvs_.end()) {
    return absl::NotFoundError(absl::StrCat(path_, ": metadata key '", Sv(key), "' not found"));
  }
  return &it->second;
}

absl::Status GgufFile::WrongType(std::string_view key, const Kv& kv, const char* expected) const {
  std::string got = GgufValueTypeName(kv.type);
  if (kv.type == GgufValueType::kArray) got = absl::StrCat("array of ", GgufValueTypeName(kv.elem));
  return absl::InvalidArgumentError(absl::StrCat(path_, ": metadata key '", Sv(key), "' has type ",
                                                 got, ", expected ", expected));
}

absl::StatusOr<std::string> GgufFile::GetString(std::string_view key) const {
  CORTIQ_ASSIGN_OR_RETURN(const Kv* kv, Find(key));
  if (kv->type != GgufValueType::kString) return WrongType(key, *kv, "string");
  Cursor c(map_, size_);
  c.Skip(kv->offset);
  std::string s;
  c.String(&s);  // validated by Parse
  return s;
}

#define CORTIQ_GGUF_SCALAR_GETTER(Name, T, Type, type_name)                     \
  absl::StatusOr<T> GgufFile::Name(std::string_view key) const {                \
    CORTIQ_ASSIGN_OR_RETURN(const Kv* kv, Find(key));                           \
    if (kv->type != GgufValueType::Type) return WrongType(key, *kv, type_name); \
    return Load<T>(map_ + kv->offset);                                          \
  }
CORTIQ_GGUF_SCALAR_GETTER(GetU32, uint32_t, kU32, "u32")
CORTIQ_GGUF_SCALAR_GETTER(GetI32, int32_t, kI32, "i32")
CORTIQ_GGUF_SCALAR_GETTER(GetU64, uint64_t, kU64, "u64")
CORTIQ_GGUF_SCALAR_GETTER(GetF32, float, kF32, "f32")
#undef CORTIQ_GGUF_SCALAR_GETTER

absl::StatusOr<bool> GgufFile::GetBool(std::string_view key) const {
  CORTIQ_ASSIGN_OR_RETURN(const Kv* kv, Find(key));
  if (kv->type != GgufValueType::kBool) return WrongType(key, *kv, "bool");
  return map_[kv->offset] != 0;
}

absl::StatusOr<int64_t> GgufFile::IntAt(std::string_view key, GgufValueType t, uint64_t off) const {
  const uint8_t* p = map_ + off;
  switch (t) {
    case GgufValueType::kU8:
      return int64_t{Load<uint8_t>(p)};
    case GgufValueType::kI8:
      return int64_t{Load<int8_t>(p)};
    case GgufValueType::kU16:
      return int64_t{Load<uint16_t>(p)};
    case GgufValueType::kI16:
      return int64_t{Load<int16_t>(p)};
    case GgufValueType::kU32:
      return int64_t{Load<uint32_t>(p)};
    case GgufValueType::kI32:
      return int64_t{Load<int32_t>(p)};
    case GgufValueType::kI64:
      return Load<int64_t>(p);
    case GgufValueType::kU64: {
      const uint64_t v = Load<uint64_t>(p);
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return absl::InvalidArgumentError(
            absl::StrCat(path_, ": metadata key '", Sv(key), "': value ", v, " is out of range"));
      }
      return static_cast<int64_t>(v);
    }
    default:
      break;
  }
  return absl::InternalError("not an integer type");  // callers check IsIntType first
}

absl::StatusOr<int64_t> GgufFile::GetInt(std::string_view key) const {
  CORTIQ_ASSIGN_OR_RETURN(const Kv* kv, Find(key));
  if (!IsIntType(kv->type)) return WrongType(key, *kv, "an integer");
  return IntAt(key, kv->type, kv->offset);
}

absl::StatusOr<double> GgufFile::GetFloat(std::string_view key) const {
  CORTIQ_ASSIGN_OR_RETURN(const Kv* kv, Find(key));
  if (kv->type == GgufValueType::kF32) return double{Load<float>(map_ + kv->offset)};
  if (kv->type == GgufValueType::kF64) return Load<double>(map_ + kv->offset);
  return WrongType(key, *kv, "f32 or f64");
}

absl::StatusOr<uint64_t> GgufFile::ArrayLength(std::string_view key) const {
  CORTIQ_ASSIGN_OR_RETURN(const Kv* kv, Find(key));
  if (kv->type != GgufValueType::kArray) return WrongType(key, *kv, "an array");
  return kv->count;
}

absl::StatusOr<GgufValueType> GgufFile::ArrayElementType(std::string_view key) const {
  CORTIQ_ASSIGN_OR_RETURN(const Kv* kv, Find(key));
  if (kv->type != GgufValueType::kArray) return WrongType(key, *kv, "an array");
  return kv->elem;
}

// Arrays: the value starts with u32 element type and u64 count (12 bytes).
absl::StatusOr<std::vector<std::string>> GgufFile::GetStringArray(std::string_view key) const {
  CORTIQ_ASSIGN_OR_RETURN(const Kv* kv, Find(key));
  if (kv->type != GgufValueType::kArray || kv->elem != GgufValueType::kString) {
    return WrongType(key, *kv, "array of string");
  }
  std::vector<std::string> out(static_cast<size_t>(kv->count));  // capped by the file size
  Cursor c(map_, size_);
  c.Skip(kv->offset + 12);
  for (std::string& s : out) c.String(&s);
  return out;
}

absl::StatusOr<std::vector<int64_t>> GgufFile::GetIntArray(std::string_view key) const {
  CORTIQ_ASSIGN_OR_RETURN(const Kv* kv, Find(key));
  if (kv->type != GgufValueType::kArray || !IsIntType(kv->elem)) {
    return WrongType(key, *kv, "array of integers");
  }
  std::vector<int64_t> out(static_cast<size_t>(kv->count));
  const uint64_t es = GgufScalarSize(kv->elem);
  for (uint64_t i = 0; i < kv->count; ++i) {
    CORTIQ_ASSIGN_OR_RETURN(out[i], IntAt(key, kv->elem, kv->offset + 12 + i * es));
  }
  return out;
}

absl::StatusOr<std::vector<float>> GgufFile::GetFloatArray(std::string_view key) const {
  CORTIQ_ASSIGN_OR_RETURN(const Kv* kv, Find(key));
  if (kv->type != GgufValueType::kArray ||
      (kv->elem != GgufValueType::kF32 && kv->elem != GgufValueType::kF64)) {
    return WrongType(key, *kv, "array of f32 or f64");
  }
  std::vector<float> out(static_cast<size_t>(kv->count));
  const uint8_t* p = map_ + kv->offset + 12;
  for (uint64_t i = 0; i < kv->count; ++i) {
    out[i] = kv->elem == GgufValueType::kF32 ? Load<float>(p + 4 * i)
                                             : static_cast<float>(Load<double>(p + 8 * i));
  }
  return out;
}

// ---- tensors ----

const GgufFile::TensorInfo* GgufFile::Info(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

absl::StatusOr<TensorView> GgufFile::Get(std::string_view name) const {
  const TensorInfo* t = Info(name);
  if (t == nullptr) {
    return absl::NotFoundError(absl::StrCat(path_, ": tensor '", Sv(name), "' not found"));
  }
  const std::optional<math::DType> dtype = InPlaceDType(t->type);
  if (!dtype) {
    if (GgufDequantizable(t->type)) {
      return absl::UnimplementedError(
          absl::StrCat(path_, ": tensor '", t->name, "' has type ", GgmlTypeName(t->type),
                       ", which is not read in place (F32, F16, BF16, Q8_0): dequantize it "
                       "(DequantizeGgufRows)"));
    }
    return absl::UnimplementedError(
        absl::StrCat(path_, ": tensor '", t->name, "' has type ", GgmlTypeName(t->type),
                     ", which is not supported (supported: ", GgufSupportedTypeList(), ")"));
  }
  TensorView v;
  v.name = t->name;
  v.dtype = *dtype;
  v.shape = t->shape;
  v.data = map_ + data_start_ + t->offset;
  v.nbytes = static_cast<size_t>(t->nbytes);
  return v;
}

std::span<const uint8_t> GgufFile::RawData(std::string_view name) const {
  const TensorInfo* t = Info(name);
  if (t == nullptr) return {};
  return {map_ + data_start_ + t->offset, static_cast<size_t>(t->nbytes)};
}

// ---- dequantization (ggml-quants.c) ----

namespace {

float F16At(const uint8_t* p) { return math::F16ToF32(Load<uint16_t>(p)); }

// block_q4_0: f16 d, u8 qs[16]; value j = (lo nibble of qs[j] - 8)·d,
// value j + 16 = (hi nibble - 8)·d.
void DequantizeQ4_0(const uint8_t* b, size_t blocks, float* y) {
  for (size_t i = 0; i < blocks; ++i, b += 18, y += 32) {
    const float d = F16At(b);
    for (int j = 0; j < 16; ++j) {
      y[j] = static_cast<float>((b[2 + j] & 0x0F) - 8) * d;
      y[j + 16] = static_cast<float>((b[2 + j] >> 4) - 8) * d;
    }
  }
}

// 6-bit scale and min j of a K-quant super-block (get_scale_min_k4).
void ScaleMinK4(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
  }
}

// block_q4_K: f16 d, f16 dmin, u8 scales[12], u8 qs[128] (256 values).
void DequantizeQ4_K(const uint8_t* b, size_t blocks, float* y) {
  for (size_t i = 0; i < blocks; ++i, b += 144) {
    const float d = F16At(b), min = F16At(b + 2);
    const uint8_t* scales = b + 4;
    const uint8_t* q = b + 16;
    int is = 0;
    for (int j = 0; j < 256; j += 64) {
      uint8_t sc = 0, m = 0;
      ScaleMinK4(is + 0, scales, &sc, &m);
      const float d1 = d * sc, m1 = min * m;
      ScaleMinK4(is + 1, scales, &sc, &m);
      const float d2 = d * sc, m2 = min * m;
      for (int l = 0; l < 32; ++l) {
        const float p = d1 * static_cast<float>(q[l] & 0xF);
        *y++ = p - m1;
      }
      for (int l = 0; l < 32; ++l) {
        const float p = d2 * static_cast<float>(q[l] >> 4);
        *y++ = p - m2;
      }
      q += 32;
      is += 2;
    }
  }
}

// block_q6_K: u8 ql[128], u8 qh[64], i8 scales[16], f16 d (256 values).
void DequantizeQ6_K(const uint8_t* b, size_t blocks, float* y) {
  for (size_t i = 0; i < blocks; ++i, b += 210) {
    const float d = F16At(b + 208);
    const uint8_t* ql = b;
    const uint8_t* qh = b + 128;
    const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
    for (int n = 0; n < 256; n += 128) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l + 0] = d * static_cast<float>(sc[is + 0]) * static_cast<float>(q1);
        y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
        y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
        y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
      }
      y += 128;
      ql += 64;
      qh += 32;
      sc += 8;
    }
  }
}

}  // namespace

bool DequantizeGgufRows(uint32_t type, const void* src, size_t n, float* out) {
  const auto* b = static_cast<const uint8_t*>(src);
  if (std::optional<math::DType> dt = InPlaceDType(type)) {
    math::ConvertToF32(src, *dt, n, out);
    return true;
  }
  switch (type) {
    case ggml_type::kQ4_0:
      DequantizeQ4_0(b, n / 32, out);
      return true;
    case ggml_type::kQ4_K:
      DequantizeQ4_K(b, n / 256, out);
      return true;
    case ggml_type::kQ6_K:
      DequantizeQ6_K(b, n / 256, out);
      return true;
    default:
      return false;
  }
}

}  // namespace cortiq::model
