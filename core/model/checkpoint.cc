// Checkpoint: config.json + one or more memory-mapped safetensors files.
#include "core/model/checkpoint.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/model/checkpoint_io.h"
#include "core/util/status_macros.h"
#include "nlohmann/json.hpp"

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

absl::StatusOr<TensorView> Checkpoint::Lookup(std::string_view name) const {
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
    return absl::InvalidArgumentError(
        absl::StrCat(files_[where_.find(name)->second]->path(), ": tensor '", Sv(name), "': shape ",
                     ShapeString(v.shape), " expected ", ShapeString(expected_shape)));
  }
  return v;
}

std::vector<std::string> Checkpoint::TensorNames() const {
  std::vector<std::string> names;
  names.reserve(where_.size());
  for (const auto& [name, idx] : where_) names.push_back(name);
  return names;
}

std::vector<std::string> Checkpoint::FilePaths() const {
  std::vector<std::string> paths;
  for (const auto& f : files_) paths.push_back(f->path());
  return paths;
}

uint64_t Checkpoint::ComputeFingerprint() const {
  Fnv1a64 h;
  h.Update("cortiq-checkpoint-fingerprint-v1\n");
  h.Update(config_.ToJson());
  h.Update("\n");
  for (const auto& [name, idx] : where_) {  // sorted by name
    const SafetensorsFile& f = *files_[idx];
    const SafetensorsFile::TensorInfo* info = f.Info(name);
    h.Update(name);
    h.Update("\n");
    h.Update(info->dtype_name);
    h.Update("\n");
    h.Update(absl::StrJoin(info->shape, ","));
    h.Update("\n");
    std::span<const uint8_t> data = f.RawData(name);
    const size_t w = std::min(kFingerprintWindow, data.size());
    for (size_t start : {size_t{0}, (data.size() - w) / 2, data.size() - w}) {
      h.Update(data.data() + start, w);
    }
  }
  return h.value();
}

}  // namespace cortiq::model
