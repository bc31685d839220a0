// Checkpoint: a Hugging Face model directory, opened and validated.
//
//   <dir>/config.json                      -> ModelConfig
//   <dir>/model.safetensors                -> one memory-mapped file, or else
//   <dir>/model.safetensors.index.json     -> {"weight_map": {tensor: shard file}}
//                                             and every shard it names (each
//                                             opened, mapped and validated once)
// model.safetensors wins when both are present (as in transformers).
//
// Open() validates the config, every file header (see safetensors.h) and the
// index: each tensor the index names must be in its shard, and a shard name
// must be a plain file name inside <dir>. Tensors a shard holds but the index
// does not name are not visible (the index is authoritative, as in HF).
//
// Errors (absl::Status), each naming the file and the tensor or key:
//   no weights file, shard missing              -> NOT_FOUND
//   malformed index / shard / tensor not in its shard -> DATA_LOSS
//   Get: tensor absent -> NOT_FOUND (names the file(s) searched);
//        wrong shape -> INVALID_ARGUMENT ("<file>: tensor '<name>': shape [..]
//        expected [..]"); unsupported dtype -> UNIMPLEMENTED
//   config.json errors as in model_config.h.
//
// Thread-safety: after Open, all methods are const and thread-safe. TensorViews
// point into the mappings and stay valid while the Checkpoint lives (moves
// included). Move-only.
//
// Example:
//   CORTIQ_ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::Open("/models/qwen3-0.6b"));
//   const ModelConfig& c = ckpt.config();
//   CORTIQ_ASSIGN_OR_RETURN(TensorView emb,
//       ckpt.Get("model.embed_tokens.weight", {c.vocab_size, c.hidden_size}));
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/model/model_config.h"
#include "core/model/safetensors.h"

namespace cortiq::model {

class Checkpoint {
 public:
  static constexpr const char* kConfigFile = "config.json";
  static constexpr const char* kWeightsFile = "model.safetensors";
  static constexpr const char* kIndexFile = "model.safetensors.index.json";

  static absl::StatusOr<Checkpoint> Open(const std::string& dir);

  Checkpoint(Checkpoint&&) noexcept = default;
  Checkpoint& operator=(Checkpoint&&) noexcept = default;
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;

  const ModelConfig& config() const { return config_; }
  const std::string& dir() const { return dir_; }

  bool Has(std::string_view name) const { return where_.find(name) != where_.end(); }

  // The tensor, checked against `expected_shape` (exact rank and dims).
  absl::StatusOr<TensorView> Get(std::string_view name,
                                 std::span<const int64_t> expected_shape) const;
  absl::StatusOr<TensorView> Get(std::string_view name,
                                 std::initializer_list<int64_t> expected_shape) const {
    return Get(name, std::span<const int64_t>(expected_shape.begin(), expected_shape.size()));
  }
  // The tensor whatever its shape (callers check it themselves).
  absl::StatusOr<TensorView> GetAnyShape(std::string_view name) const;

  // Every tensor name visible through this checkpoint, sorted.
  std::vector<std::string> TensorNames() const;
  // The files mapped (one, or each shard once), in index order.
  std::vector<std::string> FilePaths() const;

  // A 64-bit identity of the model, computed once at Open: FNV-1a 64 over
  //   "cortiq-checkpoint-fingerprint-v1\n" + config().ToJson() + "\n"
  //   and then, for each visible tensor in sorted name order,
  //   name "\n" dtype-string "\n" shape (decimal dims joined by ",") "\n"
  //   followed by up to 4096 bytes sampled from the start, the middle and the
  //   end of the tensor's data (12 KiB at most per tensor).
  // Sampling the data (three pages per tensor, no full read) tells apart two
  // fine-tunes of the same architecture without reading gigabytes at start-up;
  // it is an identity check, not an integrity check. Independent of sharding
  // and of the order of tensors in the files. The tokenizer is not included:
  // the session layer mixes it in.
  uint64_t Fingerprint() const { return fingerprint_; }

 private:
  Checkpoint() = default;
  absl::Status OpenSharded(const std::string& index_path);
  absl::StatusOr<TensorView> Lookup(std::string_view name) const;
  uint64_t ComputeFingerprint() const;
  std::string SearchedFiles() const;

  std::string dir_;
  ModelConfig config_;
  // unique_ptr: Info pointers and the name keys in where_ stay put on moves.
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t, std::less<>> where_;  // tensor -> index into files_
  std::string index_path_;                            // empty when not sharded
  uint64_t fingerprint_ = 0;
};

}  // namespace cortiq::model
