// GGUF vocabulary <-> tokenizer.json / Tokenizer. See gguf_vocab.h; each
// mapping rule names the llama.cpp code it follows.

#include "core/tokenizer/gguf_vocab.h"

#include <algorithm>
#include <array>
#include <unordered_map>
#include <utility>

#include "core/tokenizer/field_errors.h"
#include "core/tokenizer/json_object.h"
#include "core/tokenizer/tokenizer_spec.h"
#include "core/tokenizer/unicode.h"
#include "core/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace cortiq::tokenizer {
namespace {

using internal::Cat;
using Errors = internal::FieldErrors;
using Json = nlohmann::json;

constexpr std::string_view kModelKey = "tokenizer.ggml.model";
constexpr std::string_view kPreKey = "tokenizer.ggml.pre";
constexpr std::string_view kTokensKey = "tokenizer.ggml.tokens";
constexpr std::string_view kTypesKey = "tokenizer.ggml.token_type";
constexpr std::string_view kMergesKey = "tokenizer.ggml.merges";

// A tokenizer.ggml.pre value: the pre-tokenizer regex and what the HF
// tokenizer of that family does besides (llama-vocab.cpp sets ignore_merges
// for LLAMA3; Qwen's tokenizer.json has the NFC normalizer).
struct PreTokenizerFamily {
  std::string_view name;
  PreTokenizerPattern pattern;
  bool nfc;
  bool ignore_merges;
};

// The first entry of each pattern is the name GgufVocabFromTokenizerJson
// writes (convert_hf_to_gguf.py's names for Qwen2/3, Llama 3 and GPT-2).
constexpr std::array<PreTokenizerFamily, 6> kFamilies = {{
    {"qwen2", PreTokenizerPattern::kQwen2, true, false},
    {"deepseek-r1-qwen", PreTokenizerPattern::kQwen2, true, false},
    {"llama-bpe", PreTokenizerPattern::kLlama3, false, true},
    {"llama3", PreTokenizerPattern::kLlama3, false, true},
    {"llama-v3", PreTokenizerPattern::kLlama3, false, true},
    {"gpt-2", PreTokenizerPattern::kGpt2, false, false},
}};

std::string SupportedPreNames() {
  std::string names;
  for (const PreTokenizerFamily& family : kFamilies) {
    names += names.empty() ? "\"" : ", \"";
    names += family.name;
    names += "\"";
  }
  return names;
}

std::string_view PatternName(PreTokenizerPattern pattern) {
  switch (pattern) {
    case PreTokenizerPattern::kQwen2:
      return "Qwen2";
    case PreTokenizerPattern::kLlama3:
      return "Llama-3";
    case PreTokenizerPattern::kGpt2:
      break;
  }
  return "GPT-2";
}

// convert_hf_to_gguf.py's does_token_look_special: added tokens HF calls
// non-special that are written as control tokens all the same. Prefix and
// suffix are tested independently, as Python's startswith / endswith do (so
// "<|>" counts).
bool LooksSpecial(std::string_view token) {
  auto wrapped = [&](std::string_view open, std::string_view close) {
    return token.starts_with(open) && token.ends_with(close);
  };
  return token == "<pad>" || token == "<mask>" || token == "<2mass>" || token == "[@BOS@]" ||
         wrapped("<|", "|>") || wrapped("<\uFF5C", "\uFF5C>") || wrapped("<unused", ">");
}

// Replaces every occurrence of from in s by to.
std::string ReplaceAll(std::string s, std::string_view from, std::string_view to) {
  for (size_t pos = s.find(from); pos != std::string::npos; pos = s.find(from, pos + to.size())) {
    s.replace(pos, from.size(), to);
  }
  return s;
}

// A tokenizer_config.json special-token entry: "text" or {"content": "text"}.
std::optional<std::string> SpecialTokenContent(const Json& config, const std::string& key) {
  auto it = config.find(key);
  if (it == config.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto content = it->find("content");
    if (content != it->end() && content->is_string()) return content->get<std::string>();
  }
  return std::nullopt;
}

std::optional<int32_t>* SpecialIdField(GgufVocab* vocab, std::string_view type) {
  if (type == "bos") return &vocab->bos;
  if (type == "eos") return &vocab->eos;
  if (type == "unk") return &vocab->unk;
  return &vocab->pad;
}

// The special ids, add_{bos,eos}_token and the chat template, as gguf-py's
// SpecialVocab reads them: tokenizer_config.json's <type>_token matched
// against added_tokens by content (the first match), then config.json's
// <type>_token_id for types still unset, ids below n_tokens only.
absl::Status SetSpecialTokens(const Json& tokenizer_config, const Json& config,
                              const std::vector<AddedToken>& added, int64_t n_tokens,
                              GgufVocab* vocab) {
  constexpr std::array<std::string_view, 4> kTypes = {"bos", "eos", "unk", "pad"};
  for (std::string_view type : kTypes) {
    const std::optional<std::string> content =
        SpecialTokenContent(tokenizer_config, Cat(type, "_token"));
    if (!content) continue;
    auto it = std::find_if(added.begin(), added.end(),
                           [&](const AddedToken& t) { return t.content == *content; });
    if (it != added.end() && it->id < n_tokens) *SpecialIdField(vocab, type) = it->id;
  }
  for (std::string_view type : kTypes) {
    std::optional<int32_t>* field = SpecialIdField(vocab, type);
    auto it = config.find(Cat(type, "_token_id"));
    if (field->has_value() || it == config.end() || !it->is_number_integer()) continue;
    const int64_t id = it->get<int64_t>();
    if (id < 0) {
      return Errors("config.json").Field(Cat(type, "_token_id"), Cat("negative id ", id));
    }
    if (id < n_tokens) *field = static_cast<int32_t>(id);
  }
  const Errors config_errors("tokenizer_config.json");
  for (auto [key, field] :
       {std::pair{"add_bos_token", &vocab->add_bos}, std::pair{"add_eos_token", &vocab->add_eos}}) {
    auto it = tokenizer_config.find(key);
    if (it != tokenizer_config.end() && it->is_boolean()) *field = it->get<bool>();
  }
  auto tmpl = tokenizer_config.find("chat_template");
  if (tmpl != tokenizer_config.end() && !tmpl->is_null()) {
    if (!tmpl->is_string()) {
      return config_errors.Field("chat_template",
                                 "only a string is supported (not a list of named templates)");
    }
    vocab->chat_template = tmpl->get<std::string>();
  }
  return absl::OkStatus();
}

absl::StatusOr<Json> OptionalJsonObject(std::string_view text, std::string_view source) {
  if (text.empty()) return Json::object();
  return internal::ParseJsonObject(text, Errors(source));
}

// config.json's vocab_size when given (the embedding rows), else max id + 1.
absl::StatusOr<int64_t> TokenCount(const Json& config, const TokenizerSpec& spec) {
  int64_t count = 0;
  for (const auto& [token, id] : spec.vocab) count = std::max<int64_t>(count, int64_t{id} + 1);
  for (const AddedToken& t : spec.added) count = std::max<int64_t>(count, int64_t{t.id} + 1);
  auto it = config.find("vocab_size");
  if (it == config.end() || it->is_null()) return count;
  const Errors errors("config.json");
  if (!it->is_number_integer()) return errors.Field("vocab_size", "expected an integer");
  const int64_t vocab_size = it->get<int64_t>();
  if (vocab_size < count || vocab_size > kMaxGgufTokens) {
    return errors.Field("vocab_size", Cat(vocab_size, " is outside [", count,
                                          " (the tokenizer's ids), ", kMaxGgufTokens, "]"));
  }
  return vocab_size;
}

const PreTokenizerFamily* FindFamily(std::string_view pre) {
  for (const PreTokenizerFamily& family : kFamilies) {
    if (family.name == pre) return &family;
  }
  return nullptr;
}

// Adds vocab.tokens[i] of type to spec. Returns the error for a type a
// byte-level BPE cannot hold.
absl::Status AddToken(const Errors& errors, const std::string& token, int32_t id, int32_t type,
                      TokenizerSpec* spec) {
  switch (static_cast<GgufTokenType>(type)) {
    case GgufTokenType::kNormal:
      spec->vocab.emplace_back(token, id);
      return absl::OkStatus();
    case GgufTokenType::kControl:
    case GgufTokenType::kUnknown:
      spec->added.push_back({token, id, /*special=*/true, false, false});
      return absl::OkStatus();
    case GgufTokenType::kUserDefined:
      spec->added.push_back({token, id, /*special=*/false, false, false});
      return absl::OkStatus();
    case GgufTokenType::kUnused:
      return absl::OkStatus();  // an id with no text (padding)
    case GgufTokenType::kByte:
      return errors.Field(Cat(kTypesKey, "[", id, "]"),
                          "byte tokens (6) are SentencePiece byte fallback, not byte-level BPE");
    case GgufTokenType::kUndefined:
      break;
  }
  return errors.Field(Cat(kTypesKey, "[", id, "]"),
                      Cat("unsupported token type ", type, " (1 normal, 2 unknown, 3 control, ",
                          "4 user-defined, 5 unused)"));
}

}  // namespace

absl::StatusOr<GgufVocab> GgufVocabFromTokenizerJson(std::string_view tokenizer_json,
                                                     std::string_view tokenizer_config_json,
                                                     std::string_view config_json) {
  CORTIQ_ASSIGN_OR_RETURN(TokenizerSpec spec, ParseTokenizerJson(tokenizer_json, "tokenizer.json"));
  CORTIQ_ASSIGN_OR_RETURN(Json tokenizer_config,
                          OptionalJsonObject(tokenizer_config_json, "tokenizer_config.json"));
  CORTIQ_ASSIGN_OR_RETURN(Json config, OptionalJsonObject(config_json, "config.json"));
  const Errors errors("tokenizer.json");

  GgufVocab vocab;
  vocab.model = "gpt2";
  const auto family = std::find_if(kFamilies.begin(), kFamilies.end(), [&](const auto& f) {
    return f.pattern == spec.pattern && f.nfc == spec.nfc && f.ignore_merges == spec.ignore_merges;
  });
  if (family == kFamilies.end()) {
    return errors.Field(
        "pre_tokenizer",
        Cat("the ", PatternName(spec.pattern), " regex with ",
            spec.nfc ? "the NFC normalizer" : "no normalizer", " and model.ignore_merges ",
            spec.ignore_merges ? "true" : "false",
            " has no GGUF tokenizer.ggml.pre (qwen2: Qwen2 regex + NFC; llama-bpe: Llama-3 "
            "regex + ignore_merges; gpt-2: GPT-2 regex)"));
  }
  vocab.pre = family->name;

  CORTIQ_ASSIGN_OR_RETURN(const int64_t n_tokens, TokenCount(config, spec));
  vocab.tokens.assign(n_tokens, std::string());
  vocab.token_types.assign(n_tokens, static_cast<int32_t>(GgufTokenType::kUnused));
  for (const auto& [token, id] : spec.vocab) {
    vocab.tokens[id] = token;
    vocab.token_types[id] = static_cast<int32_t>(GgufTokenType::kNormal);
  }
  // get_vocab_base: an added token is control when HF calls it special or it
  // looks special, else user-defined with SentencePiece's U+2581 as a space.
  for (size_t i = 0; i < spec.added.size(); ++i) {
    const AddedToken& t = spec.added[i];
    if (t.lstrip || t.rstrip) {
      return errors.Field(Cat("added_tokens[", i, "]"),
                          "lstrip / rstrip have no GGUF equivalent (llama.cpp sets them by "
                          "model name only)");
    }
    const bool control = t.special || LooksSpecial(t.content);
    vocab.tokens[t.id] = control ? t.content : ReplaceAll(t.content, "\u2581", " ");
    vocab.token_types[t.id] =
        static_cast<int32_t>(control ? GgufTokenType::kControl : GgufTokenType::kUserDefined);
  }
  for (int64_t id = 0; id < n_tokens; ++id) {
    if (vocab.tokens[id].empty()) vocab.tokens[id] = Cat("[PAD", id, "]");
  }

  vocab.merges.reserve(spec.merges.size());
  for (size_t i = 0; i < spec.merges.size(); ++i) {
    const auto& [left, right] = spec.merges[i];
    if (left.find(' ') != std::string::npos || right.find(' ') != std::string::npos) {
      return errors.Field(Cat("model.merges[", i, "]"),
                          "a token with a space cannot be written as a GGUF \"left right\" merge");
    }
    vocab.merges.push_back(Cat(left, " ", right));
  }
  CORTIQ_RETURN_IF_ERROR(SetSpecialTokens(tokenizer_config, config, spec.added, n_tokens, &vocab));
  return vocab;
}

absl::StatusOr<Tokenizer> Tokenizer::FromGgufVocab(const GgufVocab& vocab,
                                                   std::string_view source_name) {
  const Errors errors(source_name);
  if (vocab.model != "gpt2") {
    return errors.Field(kModelKey, Cat("unsupported tokenizer model \"", vocab.model,
                                       "\" (only \"gpt2\", byte-level BPE)"));
  }
  const PreTokenizerFamily* family = FindFamily(vocab.pre);
  if (family == nullptr) {
    return errors.Field(
        kPreKey,
        Cat("unsupported pre-tokenizer \"", vocab.pre, "\" (supported: ", SupportedPreNames(),
            "; absent or \"default\" means llama.cpp's four-regex default split, "
            "which no supported tokenizer uses)"));
  }
  const int64_t n_tokens = static_cast<int64_t>(vocab.tokens.size());
  if (n_tokens == 0 || n_tokens > kMaxGgufTokens) {
    return errors.Field(kTokensKey, Cat(n_tokens, " tokens, outside [1, ", kMaxGgufTokens, "]"));
  }
  if (!vocab.token_types.empty() && vocab.token_types.size() != vocab.tokens.size()) {
    return errors.Field(kTypesKey, Cat(vocab.token_types.size(), " entries for ", n_tokens,
                                       " tokens in ", kTokensKey));
  }
  if (static_cast<int64_t>(vocab.merges.size()) > kMaxGgufMerges) {
    return errors.Field(
        kMergesKey, Cat(vocab.merges.size(), " merges, more than the limit of ", kMaxGgufMerges));
  }
  int64_t bytes = 0;
  for (const std::string& s : vocab.tokens) bytes += static_cast<int64_t>(s.size());
  for (const std::string& s : vocab.merges) bytes += static_cast<int64_t>(s.size());
  if (bytes > kMaxGgufVocabBytes) {
    return errors.Field(kTokensKey, Cat("tokens and merges hold ", bytes,
                                        " bytes, more than the limit of ", kMaxGgufVocabBytes));
  }
  for (auto [key, id] : {std::pair{"tokenizer.ggml.bos_token_id", vocab.bos},
                         std::pair{"tokenizer.ggml.eos_token_id", vocab.eos},
                         std::pair{"tokenizer.ggml.padding_token_id", vocab.pad},
                         std::pair{"tokenizer.ggml.unknown_token_id", vocab.unk}}) {
    if (id && (*id < 0 || *id >= n_tokens)) {
      return errors.Field(key, Cat("id ", *id, " out of range [0, ", n_tokens, ")"));
    }
  }

  TokenizerSpec spec;
  spec.nfc = family->nfc;
  spec.pattern = family->pattern;
  spec.ignore_merges = family->ignore_merges;
  spec.vocab_field = Cat(kTokensKey, " (normal tokens)");
  spec.merges_field = std::string(kMergesKey);
  spec.min_vocab_size = static_cast<int32_t>(n_tokens);
  // Every token must be unique: llama.cpp's token_to_id would silently keep
  // the last of two (and then asserts on the count).
  std::unordered_map<std::string_view, int32_t> first_id;
  first_id.reserve(vocab.tokens.size());
  for (int32_t id = 0; id < n_tokens; ++id) {
    const std::string& token = vocab.tokens[id];
    if (token.empty() || !IsValidUtf8(token)) {
      return errors.Field(Cat(kTokensKey, "[", id, "]"), "empty or not valid UTF-8");
    }
    auto [it, inserted] = first_id.emplace(token, id);
    if (!inserted) {
      return errors.Field(Cat(kTokensKey, "[", id, "]"),
                          Cat("\"", token, "\" duplicates ", kTokensKey, "[", it->second, "]"));
    }
    const int32_t type = vocab.token_types.empty() ? static_cast<int32_t>(GgufTokenType::kNormal)
                                                   : vocab.token_types[id];
    CORTIQ_RETURN_IF_ERROR(AddToken(errors, token, id, type, &spec));
  }
  spec.merges.reserve(vocab.merges.size());
  for (size_t i = 0; i < vocab.merges.size(); ++i) {
    const std::string& merge = vocab.merges[i];
    const size_t space = merge.find(' ');
    if (space == 0 || space == std::string::npos || space + 1 == merge.size() ||
        merge.find(' ', space + 1) != std::string::npos) {
      return errors.Field(Cat(kMergesKey, "[", i, "]"),
                          Cat("expected \"left right\", got \"", merge, "\""));
    }
    spec.merges.emplace_back(merge.substr(0, space), merge.substr(space + 1));
  }
  return Tokenizer::FromSpec(std::move(spec), source_name);
}

}  // namespace cortiq::tokenizer
