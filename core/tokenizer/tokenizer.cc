// tokenizer.json loading, Encode and Decode. See tokenizer.h.

#include "core/tokenizer/tokenizer.h"

#include <algorithm>
#include <array>
#include <fstream>
#include <limits>
#include <sstream>
#include <unordered_map>
#include <utility>

#include "core/tokenizer/bpe_model.h"
#include "core/tokenizer/byte_level.h"
#include "core/tokenizer/field_errors.h"
#include "core/tokenizer/json_object.h"
#include "core/tokenizer/pre_tokenizer.h"
#include "core/tokenizer/tokenizer_spec.h"
#include "core/tokenizer/unicode.h"
#include "core/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace cortiq::tokenizer {
namespace internal {

// Everything a Tokenizer needs, immutable after Load.
struct TokenizerData {
  bool nfc = false;
  PreTokenizerPattern pattern = PreTokenizerPattern::kQwen2;
  std::unique_ptr<BpeModel> bpe;

  // Per id (size vocab_size): token string and decoded bytes, as slices of
  // the pools; kind 0 = unused id, 1 = vocab, 2 = added, 3 = added special.
  std::vector<uint32_t> string_offsets;  // (vocab_size + 1)
  std::string string_pool;
  std::vector<uint32_t> bytes_offsets;  // (vocab_size + 1)
  std::string bytes_pool;
  std::vector<uint8_t> kinds;  // (vocab_size)

  std::unordered_map<std::string, int32_t> token_to_id;

  // Added tokens, and for each first byte the indices of those starting with
  // it, longest first (leftmost-longest matching).
  std::vector<AddedToken> added;
  std::array<std::vector<uint16_t>, 256> added_by_first_byte;

  std::optional<int32_t> endoftext_id, im_start_id, im_end_id;
};

}  // namespace internal

namespace {

using internal::Cat;
using internal::TokenizerData;
using Errors = internal::FieldErrors;
using Json = nlohmann::json;

constexpr int32_t kMaxId = (1 << 24) - 1;  // bounds the per-id tables
constexpr int kMaxJsonDepth = 64;
constexpr uint8_t kKindVocab = 1, kKindAdded = 2, kKindSpecial = 3;

// Rejects nesting deeper than kMaxJsonDepth before nlohmann sees the text, so
// hostile input cannot exhaust the stack.
bool NestingWithinLimit(std::string_view text) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) return false;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return true;
}

const Json* Member(const Json& object, const char* key) {
  if (!object.is_object()) return nullptr;
  auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

bool IsNullOrAbsent(const Json* value) { return value == nullptr || value->is_null(); }

// Reads an optional boolean member; absent/null gives fallback.
absl::StatusOr<bool> OptionalBool(const Errors& errors, const Json& object, const char* key,
                                  std::string_view path, bool fallback) {
  const Json* value = Member(object, key);
  if (IsNullOrAbsent(value)) return fallback;
  if (!value->is_boolean()) return errors.Field(Cat(path, ".", key), "expected a boolean");
  return value->get<bool>();
}

absl::StatusOr<std::string> RequiredString(const Errors& errors, const Json& object,
                                           const char* key, std::string_view path) {
  const Json* value = Member(object, key);
  if (value == nullptr) return errors.Field(Cat(path, ".", key), "missing");
  if (!value->is_string()) return errors.Field(Cat(path, ".", key), "expected a string");
  return value->get<std::string>();
}

absl::StatusOr<int32_t> TokenIdValue(const Errors& errors, const Json& value,
                                     std::string_view path) {
  if (!value.is_number_integer()) return errors.Field(path, "expected an integer id");
  const int64_t id =
      value.is_number_unsigned()
          ? static_cast<int64_t>(std::min<uint64_t>(value.get<uint64_t>(), uint64_t{1} << 40))
          : value.get<int64_t>();
  if (id < 0 || id > kMaxId) {
    return errors.Field(path, Cat("id ", id, " out of range [0, ", kMaxId, "]"));
  }
  return static_cast<int32_t>(id);
}

absl::Status ParseNormalizer(const Errors& errors, const Json* normalizer, TokenizerSpec* spec) {
  if (IsNullOrAbsent(normalizer)) return absl::OkStatus();
  CORTIQ_ASSIGN_OR_RETURN(std::string type,
                          RequiredString(errors, *normalizer, "type", "normalizer"));
  if (type == "NFC") {
    spec->nfc = true;
    return absl::OkStatus();
  }
  if (type == "Sequence") {
    const Json* list = Member(*normalizer, "normalizers");
    if (list == nullptr || !list->is_array()) {
      return errors.Field("normalizer.normalizers", "expected an array");
    }
    for (size_t i = 0; i < list->size(); ++i) {
      const std::string path = Cat("normalizer.normalizers[", i, "]");
      CORTIQ_ASSIGN_OR_RETURN(std::string t, RequiredString(errors, (*list)[i], "type", path));
      if (t != "NFC") {
        return errors.Field(Cat(path, ".type"),
                            Cat("unsupported normalizer \"", t, "\" (only NFC)"));
      }
      spec->nfc = true;
    }
    return absl::OkStatus();
  }
  return errors.Field("normalizer.type",
                      Cat("unsupported normalizer \"", type, "\" (only NFC or null)"));
}

// ByteLevel pre-tokenizer / decoder / post-processor options we can honour.
absl::Status CheckByteLevel(const Errors& errors, const Json& config, std::string_view path,
                            bool want_use_regex, bool check_use_regex) {
  CORTIQ_ASSIGN_OR_RETURN(bool add_prefix_space,
                          OptionalBool(errors, config, "add_prefix_space", path, false));
  if (add_prefix_space) {
    return errors.Field(Cat(path, ".add_prefix_space"), "true is not supported");
  }
  if (check_use_regex) {
    CORTIQ_ASSIGN_OR_RETURN(bool use_regex, OptionalBool(errors, config, "use_regex", path, true));
    if (use_regex != want_use_regex) {
      return errors.Field(Cat(path, ".use_regex"),
                          want_use_regex ? "must be true for a lone ByteLevel pre-tokenizer"
                                         : "must be false after a Split pre-tokenizer");
    }
  }
  return absl::OkStatus();
}

absl::Status ParseSplit(const Errors& errors, const Json& split, std::string_view path,
                        TokenizerSpec* spec) {
  const Json* pattern = Member(split, "pattern");
  if (pattern == nullptr || !pattern->is_object()) {
    return errors.Field(Cat(path, ".pattern"), "expected an object");
  }
  const Json* regex = Member(*pattern, "Regex");
  if (regex == nullptr || !regex->is_string()) {
    return errors.Field(Cat(path, ".pattern"), "only {\"Regex\": ...} is supported");
  }
  const std::string source = regex->get<std::string>();
  bool known = false;
  for (PreTokenizerPattern p :
       {PreTokenizerPattern::kQwen2, PreTokenizerPattern::kLlama3, PreTokenizerPattern::kGpt2}) {
    if (source == PreTokenizerRegex(p)) {
      spec->pattern = p;
      known = true;
    }
  }
  if (!known) {
    return errors.Field(Cat(path, ".pattern.Regex"),
                        Cat("unsupported regex \"", source,
                            "\" (only the Qwen2, Llama-3 and GPT-2 patterns are implemented)"));
  }
  CORTIQ_ASSIGN_OR_RETURN(std::string behavior, RequiredString(errors, split, "behavior", path));
  if (behavior != "Isolated") {
    return errors.Field(Cat(path, ".behavior"),
                        Cat("unsupported behavior \"", behavior, "\" (only Isolated)"));
  }
  CORTIQ_ASSIGN_OR_RETURN(bool invert, OptionalBool(errors, split, "invert", path, false));
  if (invert) return errors.Field(Cat(path, ".invert"), "true is not supported");
  return absl::OkStatus();
}

absl::Status ParsePreTokenizer(const Errors& errors, const Json* pre, TokenizerSpec* spec) {
  if (IsNullOrAbsent(pre)) {
    return errors.Field("pre_tokenizer", "missing (a byte-level BPE needs ByteLevel)");
  }
  CORTIQ_ASSIGN_OR_RETURN(std::string type, RequiredString(errors, *pre, "type", "pre_tokenizer"));
  if (type == "ByteLevel") {
    spec->pattern = PreTokenizerPattern::kGpt2;
    return CheckByteLevel(errors, *pre, "pre_tokenizer", /*want_use_regex=*/true,
                          /*check_use_regex=*/true);
  }
  if (type != "Sequence") {
    return errors.Field("pre_tokenizer.type", Cat("unsupported pre-tokenizer \"", type, "\""));
  }
  const Json* list = Member(*pre, "pretokenizers");
  if (list == nullptr || !list->is_array()) {
    return errors.Field("pre_tokenizer.pretokenizers", "expected an array");
  }
  if (list->size() != 2) {
    return errors.Field("pre_tokenizer.pretokenizers",
                        "expected exactly [Split, ByteLevel(use_regex=false)]");
  }
  CORTIQ_ASSIGN_OR_RETURN(std::string first, RequiredString(errors, (*list)[0], "type",
                                                            "pre_tokenizer.pretokenizers[0]"));
  CORTIQ_ASSIGN_OR_RETURN(std::string second, RequiredString(errors, (*list)[1], "type",
                                                             "pre_tokenizer.pretokenizers[1]"));
  if (first != "Split") {
    return errors.Field("pre_tokenizer.pretokenizers[0].type",
                        Cat("expected Split, got \"", first, "\""));
  }
  if (second != "ByteLevel") {
    return errors.Field("pre_tokenizer.pretokenizers[1].type",
                        Cat("expected ByteLevel, got \"", second, "\""));
  }
  CORTIQ_RETURN_IF_ERROR(ParseSplit(errors, (*list)[0], "pre_tokenizer.pretokenizers[0]", spec));
  return CheckByteLevel(errors, (*list)[1], "pre_tokenizer.pretokenizers[1]",
                        /*want_use_regex=*/false, /*check_use_regex=*/true);
}

absl::Status ParseDecoderAndPostProcessor(const Errors& errors, const Json& root) {
  const Json* decoder = Member(root, "decoder");
  if (IsNullOrAbsent(decoder)) return errors.Field("decoder", "missing (expected ByteLevel)");
  CORTIQ_ASSIGN_OR_RETURN(std::string type, RequiredString(errors, *decoder, "type", "decoder"));
  if (type != "ByteLevel") {
    return errors.Field("decoder.type", Cat("unsupported decoder \"", type, "\" (only ByteLevel)"));
  }
  const Json* post = Member(root, "post_processor");
  if (!IsNullOrAbsent(post)) {
    CORTIQ_ASSIGN_OR_RETURN(std::string post_type,
                            RequiredString(errors, *post, "type", "post_processor"));
    if (post_type != "ByteLevel") {
      return errors.Field("post_processor.type", Cat("unsupported post-processor \"", post_type,
                                                     "\" (only ByteLevel or null)"));
    }
  }
  for (const char* key : {"truncation", "padding"}) {
    if (!IsNullOrAbsent(Member(root, key))) return errors.Field(key, "must be null");
  }
  return absl::OkStatus();
}

absl::Status ParseMerges(const Errors& errors, const Json& list, TokenizerSpec* model) {
  model->merges.reserve(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    const Json& merge = list[i];
    if (merge.is_string()) {
      const std::string& s = merge.get_ref<const std::string&>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        return errors.Field(Cat("model.merges[", i, "]"),
                            Cat("expected \"left right\", got \"", s, "\""));
      }
      model->merges.emplace_back(s.substr(0, space), s.substr(space + 1));
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      model->merges.emplace_back(merge[0].get<std::string>(), merge[1].get<std::string>());
    } else {
      return errors.Field(Cat("model.merges[", i, "]"),
                          "expected a \"left right\" string or a [left, right] pair");
    }
  }
  return absl::OkStatus();
}

absl::Status ParseModel(const Errors& errors, const Json& root, TokenizerSpec* parsed) {
  const Json* model = Member(root, "model");
  if (model == nullptr || !model->is_object()) return errors.Field("model", "expected an object");
  CORTIQ_ASSIGN_OR_RETURN(std::string type, RequiredString(errors, *model, "type", "model"));
  if (type != "BPE") {
    return errors.Field("model.type", Cat("unsupported model \"", type, "\" (only BPE)"));
  }
  const Json* dropout = Member(*model, "dropout");
  if (!IsNullOrAbsent(dropout) && !(dropout->is_number() && dropout->get<double>() == 0.0)) {
    return errors.Field("model.dropout", "BPE dropout is not supported");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const Json* value = Member(*model, key);
    if (!IsNullOrAbsent(value) &&
        !(value->is_string() && value->get_ref<const std::string&>().empty())) {
      return errors.Field(Cat("model.", key), "must be empty or null");
    }
  }
  CORTIQ_ASSIGN_OR_RETURN(bool byte_fallback,
                          OptionalBool(errors, *model, "byte_fallback", "model", false));
  if (byte_fallback) return errors.Field("model.byte_fallback", "true is not supported");
  CORTIQ_ASSIGN_OR_RETURN(parsed->ignore_merges,
                          OptionalBool(errors, *model, "ignore_merges", "model", false));

  const Json* vocab = Member(*model, "vocab");
  if (vocab == nullptr || !vocab->is_object()) {
    return errors.Field("model.vocab", "expected an object of token -> id");
  }
  parsed->vocab.reserve(vocab->size());
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    CORTIQ_ASSIGN_OR_RETURN(
        int32_t id, TokenIdValue(errors, it.value(), Cat("model.vocab[\"", it.key(), "\"]")));
    parsed->vocab.emplace_back(it.key(), id);
  }
  const Json* merges = Member(*model, "merges");
  if (merges == nullptr || !merges->is_array()) {
    return errors.Field("model.merges", "expected an array");
  }
  CORTIQ_RETURN_IF_ERROR(ParseMerges(errors, *merges, parsed));

  const Json* unk = Member(*model, "unk_token");
  if (!IsNullOrAbsent(unk)) {
    if (!unk->is_string()) return errors.Field("model.unk_token", "expected a string or null");
    // A byte-level vocabulary covers every byte, so unk is never produced;
    // it must still name a real token.
    const std::string& unk_token = unk->get_ref<const std::string&>();
    if (std::none_of(parsed->vocab.begin(), parsed->vocab.end(),
                     [&](const auto& entry) { return entry.first == unk_token; })) {
      return errors.Field("model.unk_token", "not in model.vocab");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<AddedToken>> ParseAddedTokens(const Errors& errors, const Json& root) {
  std::vector<AddedToken> added;
  const Json* list = Member(root, "added_tokens");
  if (IsNullOrAbsent(list)) return added;
  if (!list->is_array()) return errors.Field("added_tokens", "expected an array");
  if (list->size() > std::numeric_limits<uint16_t>::max()) {
    return errors.Field("added_tokens", "too many added tokens");
  }
  for (size_t i = 0; i < list->size(); ++i) {
    const Json& entry = (*list)[i];
    const std::string path = Cat("added_tokens[", i, "]");
    if (!entry.is_object()) return errors.Field(path, "expected an object");
    AddedToken token;
    CORTIQ_ASSIGN_OR_RETURN(token.content, RequiredString(errors, entry, "content", path));
    if (token.content.empty()) return errors.Field(Cat(path, ".content"), "empty");
    if (!IsValidUtf8(token.content)) {
      return errors.Field(Cat(path, ".content"), "not valid UTF-8");
    }
    const Json* id = Member(entry, "id");
    if (id == nullptr) return errors.Field(Cat(path, ".id"), "missing");
    CORTIQ_ASSIGN_OR_RETURN(token.id, TokenIdValue(errors, *id, Cat(path, ".id")));
    CORTIQ_ASSIGN_OR_RETURN(token.special, OptionalBool(errors, entry, "special", path, false));
    CORTIQ_ASSIGN_OR_RETURN(token.lstrip, OptionalBool(errors, entry, "lstrip", path, false));
    CORTIQ_ASSIGN_OR_RETURN(token.rstrip, OptionalBool(errors, entry, "rstrip", path, false));
    CORTIQ_ASSIGN_OR_RETURN(bool single_word,
                            OptionalBool(errors, entry, "single_word", path, false));
    if (single_word) {
      return errors.Field(Cat(path, ".single_word"), "true is not supported");
    }
    added.push_back(std::move(token));
  }
  return added;
}

// Builds the per-id tables, the merge table and the added-token index.
absl::Status BuildData(const Errors& errors, TokenizerSpec model, TokenizerData* data) {
  data->nfc = model.nfc;
  data->pattern = model.pattern;
  if (model.added.size() > std::numeric_limits<uint16_t>::max()) {
    return errors.General(Cat(model.added.size(), " added tokens, more than the limit of ",
                              std::numeric_limits<uint16_t>::max()));
  }
  for (const auto& [token, id] : model.vocab) {
    if (id < 0 || id > kMaxId) {
      return errors.Field(model.vocab_field,
                          Cat("id ", id, " of \"", token, "\" out of range [0, ", kMaxId, "]"));
    }
  }
  for (const AddedToken& t : model.added) {
    if (t.id < 0 || t.id > kMaxId || t.content.empty()) {
      return errors.General(Cat("added token \"", t.content, "\" (id ", t.id,
                                ") is empty or its id is out of range [0, ", kMaxId, "]"));
    }
  }
  std::unordered_map<std::string, int32_t> vocab_ids;
  vocab_ids.reserve(model.vocab.size());
  for (const auto& [token, id] : model.vocab) vocab_ids[token] = id;

  // ByteLevel alphabet.
  std::array<int32_t, 256> byte_ids{};
  for (int b = 0; b < 256; ++b) {
    auto it = vocab_ids.find(std::string(ByteLevelUtf8Of(static_cast<uint8_t>(b))));
    if (it == vocab_ids.end()) {
      return errors.Field(model.vocab_field,
                          Cat("lacks the ByteLevel token \"",
                              ByteLevelUtf8Of(static_cast<uint8_t>(b)), "\" of byte ", b));
    }
    byte_ids[b] = it->second;
  }

  // Merges -> (left id, right id) -> (rank, merged id).
  std::vector<std::pair<uint64_t, MergeTable::Merge>> merge_entries;
  merge_entries.reserve(model.merges.size());
  for (size_t i = 0; i < model.merges.size(); ++i) {
    const auto& [left, right] = model.merges[i];
    auto l = vocab_ids.find(left);
    auto r = vocab_ids.find(right);
    auto m = vocab_ids.find(left + right);
    if (l == vocab_ids.end() || r == vocab_ids.end() || m == vocab_ids.end()) {
      const std::string missing = l == vocab_ids.end()   ? left
                                  : r == vocab_ids.end() ? right
                                                         : left + right;
      return errors.Field(Cat(model.merges_field, "[", i, "]"),
                          Cat("token \"", missing, "\" is not in ", model.vocab_field));
    }
    merge_entries.push_back(
        {MergeTable::Key(l->second, r->second), {static_cast<int32_t>(i), m->second}});
  }
  MergeTable merges;
  merges.Build(merge_entries);

  // Per-id strings and bytes.
  int32_t max_id = -1;
  for (const auto& [token, id] : model.vocab) max_id = std::max(max_id, id);
  for (const AddedToken& t : model.added) max_id = std::max(max_id, t.id);
  if (model.min_vocab_size < 0 || model.min_vocab_size > kMaxId + 1) {
    return errors.General(
        Cat("vocabulary size ", model.min_vocab_size, " out of range [0, ", kMaxId + 1, "]"));
  }
  max_id = std::max(max_id, model.min_vocab_size - 1);
  const size_t size = static_cast<size_t>(max_id) + 1;  // max_id <= kMaxId
  std::vector<std::string_view> strings(size);
  std::vector<std::string> bytes(size);
  data->kinds.assign(size, 0);
  for (const auto& [token, id] : model.vocab) {
    if (data->kinds[id] != 0) {
      return errors.Field(model.vocab_field,
                          Cat("id ", id, " is used by \"", strings[id], "\" and \"", token, "\""));
    }
    data->kinds[id] = kKindVocab;
    strings[id] = token;
    bytes[id] = ByteLevelDecode(token);
  }
  for (const AddedToken& t : model.added) {
    data->kinds[t.id] = t.special ? kKindSpecial : kKindAdded;
    strings[t.id] = t.content;
    bytes[t.id] = t.content;
  }
  data->string_offsets.assign(size + 1, 0);
  data->bytes_offsets.assign(size + 1, 0);
  for (size_t id = 0; id < size; ++id) {
    data->string_pool.append(strings[id]);
    data->bytes_pool.append(bytes[id]);
    data->string_offsets[id + 1] = static_cast<uint32_t>(data->string_pool.size());
    data->bytes_offsets[id + 1] = static_cast<uint32_t>(data->bytes_pool.size());
  }

  // Token -> id (added tokens override vocab entries, as in the reference).
  std::unordered_map<std::string, int32_t> whole_word_ids;
  if (model.ignore_merges) whole_word_ids = vocab_ids;
  data->token_to_id = std::move(vocab_ids);
  for (const AddedToken& t : model.added) data->token_to_id[t.content] = t.id;

  // Added-token index: a later entry with the same content replaces an
  // earlier one.
  std::unordered_map<std::string, size_t> seen;
  for (AddedToken& t : model.added) {
    auto [it, inserted] = seen.emplace(t.content, data->added.size());
    if (inserted) {
      data->added.push_back(std::move(t));
    } else {
      data->added[it->second] = std::move(t);
    }
  }
  for (size_t i = 0; i < data->added.size(); ++i) {
    const auto first = static_cast<uint8_t>(data->added[i].content[0]);
    data->added_by_first_byte[first].push_back(static_cast<uint16_t>(i));
  }
  for (auto& bucket : data->added_by_first_byte) {
    std::stable_sort(bucket.begin(), bucket.end(), [&](uint16_t a, uint16_t b) {
      return data->added[a].content.size() > data->added[b].content.size();
    });
  }

  auto find = [&](const char* token) -> std::optional<int32_t> {
    auto it = data->token_to_id.find(token);
    if (it == data->token_to_id.end()) return std::nullopt;
    return it->second;
  };
  data->endoftext_id = find("<|endoftext|>");
  data->im_start_id = find("<|im_start|>");
  data->im_end_id = find("<|im_end|>");

  data->bpe = std::make_unique<BpeModel>(byte_ids, std::move(merges), std::move(whole_word_ids));
  return absl::OkStatus();
}

}  // namespace

namespace internal {

absl::StatusOr<nlohmann::json> ParseJsonObject(std::string_view text, const FieldErrors& errors) {
  if (!NestingWithinLimit(text)) {
    return errors.General(Cat("JSON nested deeper than ", kMaxJsonDepth, " levels"));
  }
  Json root;
  try {
    root = Json::parse(text.begin(), text.end());
  } catch (const Json::exception& e) {
    return errors.General(Cat("malformed JSON: ", e.what()));
  }
  if (!root.is_object()) return errors.General("expected a JSON object at the top level");
  return root;
}

}  // namespace internal

absl::StatusOr<TokenizerSpec> ParseTokenizerJson(std::string_view text, std::string_view source) {
  const Errors errors(source);
  CORTIQ_ASSIGN_OR_RETURN(Json root, internal::ParseJsonObject(text, errors));
  // Every access below checks types first; the catch is a backstop so that a
  // missed check on hostile input is an error, never a crash.
  try {
    TokenizerSpec spec;
    CORTIQ_RETURN_IF_ERROR(ParseModel(errors, root, &spec));
    CORTIQ_RETURN_IF_ERROR(ParseNormalizer(errors, Member(root, "normalizer"), &spec));
    CORTIQ_RETURN_IF_ERROR(ParsePreTokenizer(errors, Member(root, "pre_tokenizer"), &spec));
    CORTIQ_RETURN_IF_ERROR(ParseDecoderAndPostProcessor(errors, root));
    CORTIQ_ASSIGN_OR_RETURN(spec.added, ParseAddedTokens(errors, root));
    return spec;  // the DOM is freed here, before a caller builds the tables
  } catch (const Json::exception& e) {
    return errors.General(Cat("unexpected JSON content: ", e.what()));
  }
}

namespace {

inline std::string_view Slice(const std::string& pool, const std::vector<uint32_t>& offsets,
                              int32_t id) {
  if (id < 0 || static_cast<size_t>(id) + 1 >= offsets.size()) return {};
  return std::string_view(pool.data() + offsets[id], offsets[id + 1] - offsets[id]);
}

// A piece of the input: text (added < 0) or data.added[added].
struct Section {
  std::string_view text;
  int32_t added;
};

// Splits text around added tokens: at each position the longest eligible
// added token starting there wins (the reference's trie scan).
void SplitAddedTokens(const TokenizerData& data, std::string_view text, bool parse_special,
                      std::vector<Section>* sections) {
  size_t start = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const auto& bucket = data.added_by_first_byte[static_cast<uint8_t>(text[i])];
    if (bucket.empty()) continue;
    for (uint16_t index : bucket) {
      const AddedToken& token = data.added[index];
      if (token.special && !parse_special) continue;
      if (text.compare(i, token.content.size(), token.content) != 0) continue;
      if (i > start) sections->push_back({text.substr(start, i - start), -1});
      sections->push_back({text.substr(i, token.content.size()), static_cast<int32_t>(index)});
      i += token.content.size() - 1;
      start = i + 1;
      break;
    }
  }
  if (start < text.size()) sections->push_back({text.substr(start), -1});
}

// ECMAScript String.prototype.trimStart / trimEnd (\s characters).
std::string_view TrimSpaceStart(std::string_view s) {
  while (!s.empty()) {
    size_t len = 0;
    if (!IsSpace(DecodeUtf8Valid(s.data(), &len))) break;
    s.remove_prefix(len);
  }
  return s;
}

std::string_view TrimSpaceEnd(std::string_view s) {
  while (!s.empty()) {
    size_t start = s.size() - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    size_t len = 0;
    if (!IsSpace(DecodeUtf8Valid(s.data() + start, &len))) break;
    s.remove_suffix(s.size() - start);
  }
  return s;
}

}  // namespace

Tokenizer::Tokenizer(std::shared_ptr<const internal::TokenizerData> data)
    : data_(std::move(data)) {}

Tokenizer::~Tokenizer() = default;

absl::StatusOr<Tokenizer> Tokenizer::FromFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(Cat(path, ": cannot open tokenizer file"));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return absl::DataLossError(Cat(path, ": read error"));
  return FromJson(buffer.str(), path);
}

absl::StatusOr<Tokenizer> Tokenizer::FromJson(std::string_view json, std::string_view source_name) {
  CORTIQ_ASSIGN_OR_RETURN(TokenizerSpec spec, ParseTokenizerJson(json, source_name));
  return FromSpec(std::move(spec), source_name);
}

absl::StatusOr<Tokenizer> Tokenizer::FromSpec(TokenizerSpec spec, std::string_view source_name) {
  auto data = std::make_shared<TokenizerData>();
  CORTIQ_RETURN_IF_ERROR(BuildData(Errors(source_name), std::move(spec), data.get()));
  return Tokenizer(std::shared_ptr<const TokenizerData>(std::move(data)));
}

std::vector<int32_t> Tokenizer::Encode(std::string_view utf8, bool parse_special) const {
  std::vector<int32_t> ids;
  ids.reserve(utf8.size() / 3 + 4);
  EncodeTo(utf8, parse_special, &ids);
  return ids;
}

void Tokenizer::EncodeTo(std::string_view utf8, bool parse_special,
                         std::vector<int32_t>* ids) const {
  const TokenizerData& data = *data_;
  std::string repaired;
  if (!IsValidUtf8(utf8)) {
    repaired = SanitizeUtf8(utf8);
    utf8 = repaired;
  }
  std::vector<Section> sections;
  SplitAddedTokens(data, utf8, parse_special, &sections);
  // lstrip / rstrip of added tokens trim whitespace off their text neighbours.
  for (size_t i = 0; i < sections.size(); ++i) {
    if (sections[i].added < 0) continue;
    const AddedToken& token = data.added[sections[i].added];
    if (token.lstrip && i > 0 && sections[i - 1].added < 0) {
      sections[i - 1].text = TrimSpaceEnd(sections[i - 1].text);
    }
    if (token.rstrip && i + 1 < sections.size() && sections[i + 1].added < 0) {
      sections[i + 1].text = TrimSpaceStart(sections[i + 1].text);
    }
  }
  std::string normalized;
  for (const Section& section : sections) {
    if (section.added >= 0) {
      ids->push_back(data.added[section.added].id);
      continue;
    }
    std::string_view text = section.text;
    if (data.nfc && !IsNfcQuick(text)) {
      normalized = ToNfc(text);
      text = normalized;
    }
    ForEachPreToken(data.pattern, text,
                    [&](std::string_view piece) { data.bpe->EncodeWord(piece, ids); });
  }
}

std::string Tokenizer::Decode(std::span<const int32_t> ids) const {
  std::string bytes;
  for (int32_t id : ids) bytes.append(TokenBytes(id));
  if (IsValidUtf8(bytes)) return bytes;
  return SanitizeUtf8(bytes);
}

size_t Tokenizer::vocab_size() const { return data_->kinds.size(); }

std::optional<int32_t> Tokenizer::TokenId(std::string_view token) const {
  auto it = data_->token_to_id.find(std::string(token));
  if (it == data_->token_to_id.end()) return std::nullopt;
  return it->second;
}

std::string_view Tokenizer::TokenString(int32_t id) const {
  return Slice(data_->string_pool, data_->string_offsets, id);
}

std::string_view Tokenizer::TokenBytes(int32_t id) const {
  return Slice(data_->bytes_pool, data_->bytes_offsets, id);
}

bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < data_->kinds.size() &&
         data_->kinds[id] == kKindSpecial;
}

bool Tokenizer::IsAddedToken(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < data_->kinds.size() && data_->kinds[id] >= kKindAdded;
}

std::optional<int32_t> Tokenizer::endoftext_id() const { return data_->endoftext_id; }
std::optional<int32_t> Tokenizer::im_start_id() const { return data_->im_start_id; }
std::optional<int32_t> Tokenizer::im_end_id() const { return data_->im_end_id; }

std::string MakeByteLevelTokenizerJson(const std::vector<std::string>& special_tokens) {
  using OrderedJson = nlohmann::ordered_json;
  OrderedJson vocab = OrderedJson::object();
  for (int b = 0; b < 256; ++b) {
    vocab[std::string(ByteLevelUtf8Of(static_cast<uint8_t>(b)))] = b;
  }
  OrderedJson added = OrderedJson::array();
  int32_t id = 256;
  for (const std::string& content : special_tokens) {
    added.push_back({{"id", id++},
                     {"content", content},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  const OrderedJson byte_level = {{"type", "ByteLevel"},
                                  {"add_prefix_space", false},
                                  {"trim_offsets", false},
                                  {"use_regex", false}};
  OrderedJson split = {{"type", "Split"},
                       {"pattern", OrderedJson::object()},
                       {"behavior", "Isolated"},
                       {"invert", false}};
  split["pattern"]["Regex"] = std::string(PreTokenizerRegex(PreTokenizerPattern::kQwen2));
  OrderedJson pre_tokenizer = OrderedJson::object();
  pre_tokenizer["type"] = "Sequence";
  pre_tokenizer["pretokenizers"] = OrderedJson::array({split, byte_level});
  OrderedJson model = {{"type", "BPE"},
                       {"dropout", nullptr},
                       {"unk_token", nullptr},
                       {"continuing_subword_prefix", ""},
                       {"end_of_word_suffix", ""},
                       {"fuse_unk", false},
                       {"byte_fallback", false},
                       {"ignore_merges", false}};
  model["vocab"] = std::move(vocab);
  model["merges"] = OrderedJson::array();
  OrderedJson root = OrderedJson::object();
  root["version"] = "1.0";
  root["truncation"] = nullptr;
  root["padding"] = nullptr;
  root["added_tokens"] = std::move(added);
  root["normalizer"] = {{"type", "NFC"}};
  root["pre_tokenizer"] = std::move(pre_tokenizer);
  root["post_processor"] = byte_level;
  root["decoder"] = byte_level;
  root["model"] = std::move(model);
  return root.dump(2);
}

}  // namespace cortiq::tokenizer
