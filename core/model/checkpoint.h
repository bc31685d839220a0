// Checkpoint: a Hugging Face model directory or a GGUF file, opened and
// validated.
//
//   <dir>/config.json                      -> ModelConfig
//   <dir>/model.safetensors                -> one memory-mapped file, or else
//   <dir>/model.safetensors.index.json     -> {"weight_map": {tensor: shard file}}
//                                             and every shard it names (each
//                                             opened, mapped and validated once)
// model.safetensors wins when both are present (as in transformers).
//
// or a path to a regular file: a GGUF model (gguf.h, gguf_model.h), its
// metadata mapped onto a ModelConfig and its tensors onto the HF names above,
// so that callers (the Transformer) see one layout:
//   F32 / F16 / BF16 / Q8_0 tensors are read in place from the mapping;
//   Q4_0 / Q4_K / Q6_K are dequantized once at Open (ggml's definitions) and
//     re-quantized with math::QuantizeQ8_0 (Q8_0 rows; vectors become F32) into
//     buffers the Checkpoint owns, logged as ONE info line (spdlog)
//     ("<path>: converted N tensors (Q4_K, Q6_K) to Q8_0 at load: X MiB", also
//     in load_note()); cost: one pass over those tensors, ~1.9x their bytes;
//   llama's q_proj / k_proj rows, permuted by convert_hf_to_gguf.py for ggml's
//     interleaved RoPE, are put back in HF order (LlamaGgufRow) into owned
//     buffers (a row permutation: Q8_0 rows are whole blocks).
//   Tensors outside the name table (gguf_model.h) are not visible. A tensor
//   the model maps in a type the engine cannot read fails Open (UNIMPLEMENTED,
//   naming the tensor, its type and the supported list).
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
//   config.json errors as in model_config.h; GGUF errors as in gguf.h and
//   gguf_model.h.
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
#include "core/model/gguf.h"
#include "core/model/model_config.h"
#include "core/model/safetensors.h"

namespace cortiq::model {

class Checkpoint {
 public:
  static constexpr const char* kConfigFile = "config.json";
  static constexpr const char* kWeightsFile = "model.safetensors";
  static constexpr const char* kIndexFile = "model.safetensors.index.json";

  // `path`: a model directory, or a GGUF file.
  static absl::StatusOr<Checkpoint> Open(const std::string& path);

  Checkpoint(Checkpoint&&) noexcept = default;
  Checkpoint& operator=(Checkpoint&&) noexcept = default;
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;

  const ModelConfig& config() const { return config_; }
  // The path given to Open (a directory, or the GGUF file).
  const std::string& dir() const { return dir_; }
  bool is_gguf() const { return gguf_ != nullptr; }
  // GGUF only: the conversion line logged at Open; empty when nothing was
  // converted.
  const std::string& load_note() const { return load_note_; }

  bool Has(std::string_view name) const {
    return gguf_ != nullptr ? gguf_tensors_.find(name) != gguf_tensors_.end()
                            : where_.find(name) != where_.end();
  }

  // Whether `p` points into memory this Checkpoint owns (a GGUF tensor
  // converted or un-permuted at Open) rather than into a read-only file
  // mapping. Owned memory is anonymous: MADV_DONTNEED would zero it, so a
  // caller that hands source pages back (math::PackedWeights::Pack) must keep
  // these (its keep_sources).
  bool OwnsData(const void* p) const;

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
  // GGUF: the same formula over the visible (HF-named) tensors as the engine
  // reads them, after any un-permutation and conversion: dtype-string the
  // ggml type name of the view ("F32", "F16", "BF16", "Q8_0"), the view's
  // shape and bytes. A GGUF file and a directory holding the same config and
  // the same bytes have the same fingerprint.
  uint64_t Fingerprint() const { return fingerprint_; }

 private:
  Checkpoint() = default;
  // A GGUF tensor under its HF name: the view the engine reads (into the
  // mapping, or into owned_) and the name in the file.
  struct GgufTensor {
    TensorView view;
    std::string gguf_name;
  };

  absl::Status OpenSharded(const std::string& index_path);
  absl::Status OpenGguf(const std::string& path);
  absl::StatusOr<GgufTensor> LoadGgufTensor(const GgufFile::TensorInfo& t,
                                            const std::string& hf_name, size_t* converted_bytes);
  std::string Label(std::string_view name) const;
  absl::StatusOr<TensorView> Lookup(std::string_view name) const;
  uint64_t ComputeFingerprint() const;
  std::string SearchedFiles() const;

  std::string dir_;
  ModelConfig config_;
  // unique_ptr: Info pointers and the name keys in where_ stay put on moves.
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t, std::less<>> where_;  // tensor -> index into files_
  std::string index_path_;                            // empty when not sharded
  // GGUF (else null / empty). unique_ptr: views into the mapping and into
  // owned_ stay put on moves.
  std::unique_ptr<GgufFile> gguf_;
  std::map<std::string, GgufTensor, std::less<>> gguf_tensors_;  // HF name -> tensor
  struct OwnedBuffer {
    std::unique_ptr<uint8_t[]> data;
    size_t bytes = 0;
  };
  std::vector<OwnedBuffer> owned_;  // converted / permuted data
  std::string load_note_;
  uint64_t fingerprint_ = 0;
};

}  // namespace cortiq::model
