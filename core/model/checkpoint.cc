// Checkpoint: config.json + one or more memory-mapped safetensors files.
#include "core/model/checkpoint.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/model/checkpoint_io.h"
#include "core/model/gguf_model.h"
#include "core/util/status_macros.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace cortiq::model {
namespace {

using Json = nlohmann::json;

// An index names every tensor of the model: a few MB at most.
constexpr size_t kMaxIndexBytes = size_t{64} << 20;
// Bytes hashed per window of tensor data in the fingerprint.
constexpr size_t kFingerprintWindow = 4096;

// Abseil 20220623 has its own string_view type, which StrCat takes.
absl::string_view Sv(std::string_view s) { return {s.data(), s.size()}; }

std::string JoinPath(const std::string& dir, std::string_view file) {
  if (dir.empty()) return std::string(file);
  if (dir.back() == '/') return absl::StrCat(dir, Sv(file));
  return absl::StrCat(dir, "/", Sv(file));
}

bool IsRegularFile(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// A shard name must stay inside the model directory.
bool IsSafeRelativePath(std::string_view p) {
  if (p.empty() || p.front() == '/') return false;
  for (absl::string_view part : absl::StrSplit(Sv(p), '/')) {
    if (part.empty() || part == "." || part == "..") return false;
  }
  return true;
}

// FNV-1a, 64-bit (http://www.isthe.com/chongo/tech/comp/fnv/).
class Fnv1a64 {
 public:
  void Update(const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    for (size_t i = 0; i < n; ++i) {
      h_ ^= p[i];
      h_ *= 0x100000001b3ULL;
    }
  }
  void Update(std::string_view s) { Update(s.data(), s.size()); }
  uint64_t value() const { return h_; }

 private:
  uint64_t h_ = 0xcbf29ce484222325ULL;
};

}  // namespace

absl::StatusOr<Checkpoint> Checkpoint::Open(const std::string& dir) {
  Checkpoint ck;
  ck.dir_ = dir;
  if (IsRegularFile(dir)) {
    CORTIQ_RETURN_IF_ERROR(ck.OpenGguf(dir));
    ck.fingerprint_ = ck.ComputeFingerprint();
    return ck;
  }
  CORTIQ_ASSIGN_OR_RETURN(ck.config_, ModelConfig::FromFile(JoinPath(dir, kConfigFile)));

  const std::string single = JoinPath(dir, kWeightsFile);
  const std::string index = JoinPath(dir, kIndexFile);
  if (IsRegularFile(single)) {
    CORTIQ_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::Open(single));
    for (std::string& name : f.TensorNames()) ck.where_.emplace(std::move(name), 0);
    ck.files_.push_back(std::make_unique<SafetensorsFile>(std::move(f)));
  } else if (IsRegularFile(index)) {
    CORTIQ_RETURN_IF_ERROR(ck.OpenSharded(index));
  } else {
    return absl::NotFoundError(
        absl::StrCat(dir, ": neither ", kWeightsFile, " nor ", kIndexFile, " found"));
  }
  ck.fingerprint_ = ck.ComputeFingerprint();
  return ck;
}

absl::Status Checkpoint::OpenSharded(const std::string& index_path) {
  index_path_ = index_path;
  CORTIQ_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(index_path, kMaxIndexBytes));
  auto fail = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat(index_path, ": ", why));
  };
  Json root = Json::parse(text, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return fail("malformed JSON");
  if (!root.is_object()) return fail("expected a JSON object");
  auto wm = root.find("weight_map");
  if (wm == root.end()) return fail("missing key 'weight_map'");
  if (!wm->is_object()) return fail("key 'weight_map' is not an object");

  // Distinct shards, sorted by name, each opened once.
  std::map<std::string, size_t> shard_index;
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    if (!it->is_string()) {
      return fail(absl::StrCat("weight_map: tensor '", it.key(), "': shard is not a string"));
    }
    const std::string shard = it->get<std::string>();
    if (!IsSafeRelativePath(shard)) {
      return fail(absl::StrCat("weight_map: tensor '", it.key(), "': shard name '", shard,
                               "' is not a relative path inside the model directory"));
    }
    shard_index.emplace(shard, 0);
  }
  for (auto& [shard, idx] : shard_index) {
    auto f = SafetensorsFile::Open(JoinPath(dir_, shard));
    if (!f.ok()) {
      return absl::Status(f.status().code(), absl::StrCat(index_path, ": shard '", shard,
                                                          "': ", f.status().message()));
    }
    idx = files_.size();
    files_.push_back(std::make_unique<SafetensorsFile>(std::move(f).value()));
  }
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    size_t idx = shard_index.at(it->get<std::string>());
    if (!files_[idx]->Has(it.key())) {
      return fail(absl::StrCat("tensor '", it.key(), "' is mapped to shard ", files_[idx]->path(),
                               ", which does not contain it"));
    }
    where_.emplace(it.key(), idx);
  }
  return absl::OkStatus();
}

std::string Checkpoint::SearchedFiles() const {
  if (index_path_.empty()) return files_.empty() ? dir_ : files_[0]->path();
  return absl::StrCat(index_path_, " (weight_map)");
}

std::string Checkpoint::Label(std::string_view name) const {
  if (gguf_ != nullptr) {
    auto it = gguf_tensors_.find(name);
    std::optional<std::string> g = it != gguf_tensors_.end()
                                       ? std::optional<std::string>(it->second.gguf_name)
                                       : GgufTensorName(name);
    if (g) return absl::StrCat(dir_, ": tensor '", *g, "' (", Sv(name), ")");
    return absl::StrCat(dir_, ": tensor '", Sv(name), "'");
  }
  auto it = where_.find(name);
  return absl::StrCat(it != where_.end() ? files_[it->second]->path() : SearchedFiles(),
                      ": tensor '", Sv(name), "'");
}

absl::StatusOr<TensorView> Checkpoint::Lookup(std::string_view name) const {
  if (gguf_ != nullptr) {
    auto it = gguf_tensors_.find(name);
    if (it == gguf_tensors_.end()) return absl::NotFoundError(Label(name) + " not found");
    return it->second.view;
  }
  auto it = where_.find(name);
  if (it == where_.end()) {
    return absl::NotFoundError(
        absl::StrCat(SearchedFiles(), ": tensor '", Sv(name), "' not found"));
  }
  return files_[it->second]->Get(name);
}

absl::StatusOr<TensorView> Checkpoint::GetAnyShape(std::string_view name) const {
  return Lookup(name);
}

absl::StatusOr<TensorView> Checkpoint::Get(std::string_view name,
                                           std::span<const int64_t> expected_shape) const {
  CORTIQ_ASSIGN_OR_RETURN(TensorView v, Lookup(name));
  if (!std::equal(v.shape.begin(), v.shape.end(), expected_shape.begin(), expected_shape.end())) {
    return absl::InvalidArgumentError(absl::StrCat(Label(name), ": shape ", ShapeString(v.shape),
                                                   " expected ", ShapeString(expected_shape)));
  }
  return v;
}

bool Checkpoint::OwnsData(const void* p) const {
  const auto* q = static_cast<const uint8_t*>(p);
  return std::any_of(owned_.begin(), owned_.end(), [q](const OwnedBuffer& b) {
    return q >= b.data.get() && q < b.data.get() + b.bytes;
  });
}

std::vector<std::string> Checkpoint::TensorNames() const {
  std::vector<std::string> names;
  if (gguf_ != nullptr) {
    for (const auto& [name, t] : gguf_tensors_) names.push_back(name);
    return names;
  }
  names.reserve(where_.size());
  for (const auto& [name, idx] : where_) names.push_back(name);
  return names;
}

std::vector<std::string> Checkpoint::FilePaths() const {
  std::vector<std::string> paths;
  if (gguf_ != nullptr) paths.push_back(gguf_->path());
  for (const auto& f : files_) paths.push_back(f->path());
  return paths;
}

uint64_t Checkpoint::ComputeFingerprint() const {
  Fnv1a64 h;
  h.Update("cortiq-checkpoint-fingerprint-v1\n");
  h.Update(config_.ToJson());
  h.Update("\n");
  auto tensor = [&h](std::string_view name, std::string_view dtype, std::span<const int64_t> shape,
                     std::span<const uint8_t> data) {
    h.Update(name);
    h.Update("\n");
    h.Update(dtype);
    h.Update("\n");
    h.Update(absl::StrJoin(shape, ","));
    h.Update("\n");
    const size_t w = std::min(kFingerprintWindow, data.size());
    for (size_t start : {size_t{0}, (data.size() - w) / 2, data.size() - w}) {
      h.Update(data.data() + start, w);
    }
  };
  for (const auto& [name, t] : gguf_tensors_) {  // sorted by name
    tensor(name, GgmlTypeName(GgmlTypeOf(t.view.dtype)), t.view.shape,
           {static_cast<const uint8_t*>(t.view.data), t.view.nbytes});
  }
  for (const auto& [name, idx] : where_) {  // sorted by name
    const SafetensorsFile& f = *files_[idx];
    const SafetensorsFile::TensorInfo* info = f.Info(name);
    tensor(name, info->dtype_name, info->shape, f.RawData(name));
  }
  return h.value();
}

// ---- GGUF ----

absl::Status Checkpoint::OpenGguf(const std::string& path) {
  CORTIQ_ASSIGN_OR_RETURN(GgufFile f, GgufFile::Open(path));
  gguf_ = std::make_unique<GgufFile>(std::move(f));
  CORTIQ_ASSIGN_OR_RETURN(config_, ModelConfigFromGguf(*gguf_));
  size_t converted = 0, converted_bytes = 0;
  std::set<std::string> converted_types;
  for (const GgufFile::TensorInfo& t : gguf_->tensors()) {
    const std::optional<std::string> hf = HfTensorName(t.name);
    if (!hf) continue;
    size_t bytes = 0;
    CORTIQ_ASSIGN_OR_RETURN(GgufTensor g, LoadGgufTensor(t, *hf, &bytes));
    if (!InPlaceDType(t.type)) {
      ++converted;
      converted_bytes += bytes;
      converted_types.insert(GgmlTypeName(t.type));
    }
    gguf_tensors_.emplace(*hf, std::move(g));
  }
  if (converted > 0) {
    load_note_ = absl::StrCat(path, ": converted ", converted, " tensors (",
                              absl::StrJoin(converted_types, ", "), ") to Q8_0 at load: ",
                              absl::StrFormat("%.1f", double(converted_bytes) / (1 << 20)), " MiB");
    spdlog::info("{}", load_note_);
  }
  return absl::OkStatus();
}

// The view of one mapped tensor: in place when the engine reads its type and
// no permutation applies, else built into an owned buffer (rows dequantized
// and re-quantized to Q8_0, vectors to F32; llama q/k rows put back in HF
// order). `*converted_bytes` = the owned bytes.
absl::StatusOr<Checkpoint::GgufTensor> Checkpoint::LoadGgufTensor(const GgufFile::TensorInfo& t,
                                                                  const std::string& hf_name,
                                                                  size_t* converted_bytes) {
  GgufTensor out;
  out.gguf_name = t.name;
  const bool permute = config_.arch == ModelConfig::Arch::kLlama && IsRopePermutedTensor(hf_name);
  const std::optional<math::DType> in_place = InPlaceDType(t.type);
  const bool vector = t.ne.size() == 1;
  if (in_place && !permute && !(vector && *in_place == math::DType::kQ8_0)) {
    CORTIQ_ASSIGN_OR_RETURN(out.view, gguf_->Get(t.name));
    // The kernels read elements (Q8_0: its f16 scales) by their type: a file
    // whose general.alignment puts a tensor off that boundary is refused.
    const size_t align = *in_place == math::DType::kF32 ? 4 : 2;
    if (reinterpret_cast<uintptr_t>(out.view.data) % align != 0) {
      return absl::DataLossError(
          absl::StrCat(Label(hf_name), ": data at byte ", gguf_->data_start() + t.offset,
                       " of the file is not ", align, "-byte aligned for ", GgmlTypeName(t.type),
                       " (general.alignment ", gguf_->alignment(), ")"));
    }
    out.view.name = hf_name;
    return out;
  }
  if (!GgufDequantizable(t.type)) return gguf_->Get(t.name).status();  // names type + list

  // Rows of cols values; a vector's rows are its elements (cols = 1).
  const size_t numel = static_cast<size_t>(t.nbytes / GgmlTypeInfo(t.type)->type_size *
                                           GgmlTypeInfo(t.type)->block_size);
  const size_t src_cols = static_cast<size_t>(t.ne[0]);
  const size_t cols = vector ? 1 : src_cols;
  const size_t rows = numel / cols;
  const size_t hd = static_cast<size_t>(config_.head_dim);
  if (permute && rows % hd != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(Label(hf_name), ": ", rows, " rows are not whole heads of ", hd));
  }
  // Vectors (norms, biases) become F32: callers read them elementwise.
  const math::DType dtype = vector ? math::DType::kF32 : in_place.value_or(math::DType::kQ8_0);
  const size_t dst_row = math::RowBytes(dtype, cols);
  auto buf = std::make_unique<uint8_t[]>(rows * dst_row);
  const uint8_t* src = gguf_->RawData(t.name).data();
  if (vector) {  // dequantize all, then move elements
    std::vector<float> all(numel);
    DequantizeGgufRows(t.type, src, numel, all.data());
    auto* dst = reinterpret_cast<float*>(buf.get());
    for (size_t r = 0; r < rows; ++r) dst[r] = all[permute ? LlamaGgufRow(r, hd) : r];
  } else {
    const size_t src_row = t.nbytes / rows;
    std::vector<float> tmp(in_place ? 0 : cols);
    for (size_t r = 0; r < rows; ++r) {
      const uint8_t* s = src + (permute ? LlamaGgufRow(r, hd) : r) * src_row;
      uint8_t* d = buf.get() + r * dst_row;
      if (in_place) {
        std::memcpy(d, s, dst_row);
      } else {
        DequantizeGgufRows(t.type, s, cols, tmp.data());
        math::QuantizeQ8_0(tmp.data(), cols, d);
      }
    }
  }
  out.view.name = hf_name;
  out.view.dtype = dtype;
  out.view.shape = t.shape;
  out.view.data = buf.get();
  out.view.nbytes = rows * dst_row;
  *converted_bytes = out.view.nbytes;
  owned_.push_back({std::move(buf), out.view.nbytes});
  return out;
}

}  // namespace cortiq::model
