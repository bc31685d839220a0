#include "core/model/model_files.h"

#include <cstdint>
#include <filesystem>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "core/model/checkpoint.h"
#include "core/model/checkpoint_io.h"
#include "core/model/gguf.h"
#include "core/model/gguf_model.h"
#include "core/tokenizer/gguf_vocab.h"
#include "core/util/status_macros.h"

namespace cortiq::model {
namespace {

void AppendField(std::string& out, std::string_view s) {
  const uint64_t n = s.size();
  out.append(reinterpret_cast<const char*>(&n), sizeof(n));
  out.append(s);
}

void AppendId(std::string& out, std::string_view name, const std::optional<int32_t>& id) {
  AppendField(out, name);
  AppendField(out, id ? std::to_string(*id) : std::string("-"));
}

// Length-prefixed fields in a fixed order: equal strings <=> equal vocabularies.
std::string VocabIdentity(const tokenizer::GgufVocab& v) {
  std::string out = "gguf-vocab-1";
  AppendField(out, v.model);
  AppendField(out, v.pre);
  AppendField(out, std::to_string(v.tokens.size()));
  for (const std::string& t : v.tokens) AppendField(out, t);
  AppendField(out, std::to_string(v.token_types.size()));
  for (const int32_t t : v.token_types) AppendField(out, std::to_string(t));
  AppendField(out, std::to_string(v.merges.size()));
  for (const std::string& m : v.merges) AppendField(out, m);
  AppendId(out, "bos", v.bos);
  AppendId(out, "eos", v.eos);
  AppendId(out, "pad", v.pad);
  AppendId(out, "unk", v.unk);
  AppendField(out, v.add_bos ? (*v.add_bos ? "1" : "0") : "-");
  AppendField(out, v.add_eos ? (*v.add_eos ? "1" : "0") : "-");
  return out;
}

std::string TokenText(const tokenizer::Tokenizer& tok, const std::optional<int32_t>& id) {
  if (!id || *id < 0) return "";
  return std::string(tok.TokenBytes(*id));
}

// tokenizer.json of a 151k vocabulary is ~11 MB; anything past this is not one.
constexpr size_t kMaxTokenizerFileBytes = size_t{256} << 20;

absl::StatusOr<std::string> ReadModelFile(const std::string& path) {
  return ReadSmallFile(path, kMaxTokenizerFileBytes);
}

}  // namespace

bool IsModelFile(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_regular_file(path, ec);
}

absl::Status CheckModelPath(const std::string& path) {
  std::error_code ec;
  if (!path.empty() &&
      (IsModelFile(path) ||
       std::filesystem::is_regular_file(std::filesystem::path(path) / "config.json", ec))) {
    return absl::OkStatus();
  }
  return absl::NotFoundError(absl::StrCat(
      "--model: no model at '", path,
      "' (give a directory with config.json, model.safetensors and tokenizer.json, or a .gguf "
      "file)"));
}

std::string ModelName(const std::string& path) {
  std::filesystem::path p(path);
  if (!p.has_filename()) p = p.parent_path();  // "dir/"
  std::string name = p.filename().string();
  if (IsModelFile(path)) name = std::string(absl::StripSuffix(name, ".gguf"));
  return name;
}

absl::StatusOr<ModelTokenizer> LoadModelTokenizer(const std::string& path) {
  if (!IsModelFile(path)) {
    const std::string file = (std::filesystem::path(path) / "tokenizer.json").string();
    CORTIQ_ASSIGN_OR_RETURN(std::string json, ReadModelFile(file));
    CORTIQ_ASSIGN_OR_RETURN(tokenizer::Tokenizer tok, tokenizer::Tokenizer::FromJson(json, file));
    return ModelTokenizer{.tokenizer = std::move(tok),
                          .identity = std::move(json),
                          .chat_template = {},
                          .bos_token = {},
                          .eos_token = {}};
  }
  CORTIQ_ASSIGN_OR_RETURN(const GgufFile f, GgufFile::Open(path));
  CORTIQ_ASSIGN_OR_RETURN(tokenizer::GgufVocab vocab, ReadGgufVocab(f));
  CORTIQ_ASSIGN_OR_RETURN(tokenizer::Tokenizer tok,
                          tokenizer::Tokenizer::FromGgufVocab(vocab, path));
  std::string bos = TokenText(tok, vocab.bos), eos = TokenText(tok, vocab.eos);
  return ModelTokenizer{.tokenizer = std::move(tok),
                        .identity = VocabIdentity(vocab),
                        .chat_template = std::move(vocab.chat_template),
                        .bos_token = std::move(bos),
                        .eos_token = std::move(eos)};
}

absl::Status ExportGgufModel(const std::string& dir, const std::string& path, math::DType dtype) {
  const std::filesystem::path d(dir);
  CORTIQ_ASSIGN_OR_RETURN(const std::string tokenizer_json,
                          ReadModelFile((d / "tokenizer.json").string()));
  std::string tokenizer_config;
  if (std::error_code ec; std::filesystem::exists(d / "tokenizer_config.json", ec)) {
    CORTIQ_ASSIGN_OR_RETURN(tokenizer_config,
                            ReadModelFile((d / "tokenizer_config.json").string()));
  }
  CORTIQ_ASSIGN_OR_RETURN(const std::string config, ReadModelFile((d / "config.json").string()));
  CORTIQ_ASSIGN_OR_RETURN(
      const tokenizer::GgufVocab vocab,
      tokenizer::GgufVocabFromTokenizerJson(tokenizer_json, tokenizer_config, config));
  CORTIQ_ASSIGN_OR_RETURN(const Checkpoint ckpt, Checkpoint::Open(dir));
  return WriteGgufModel(ckpt, path, {.dtype = dtype, .vocab = &vocab});
}

}  // namespace cortiq::model
