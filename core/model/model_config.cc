// ModelConfig parsing: nlohmann::json in its non-throwing mode (parse with
// allow_exceptions = false; every access checks the type first), so no
// exception can leave this file.
#include "core/model/model_config.h"

#include <cmath>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/model/checkpoint_io.h"
#include "core/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace cortiq::model {
namespace {

using Json = nlohmann::json;

// Generous upper bound on any one dimension: keeps every product of two of
// them far inside int64 and catches garbage before it sizes an allocation.
constexpr int64_t kMaxDim = int64_t{1} << 24;
// A config.json is a few KB; anything past this is not one.
constexpr size_t kMaxConfigBytes = size_t{16} << 20;

// Typed access to one JSON object, with errors naming the file and the key.
class Reader {
 public:
  Reader(const Json& obj, std::string_view path) : obj_(obj), path_(path.data(), path.size()) {}

  // nullptr when absent or null (HF writes null for "not set").
  const Json* Find(const char* key) const {
    auto it = obj_.find(key);
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  absl::Status Missing(const char* key) const {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": missing required key '", key, "'"));
  }
  absl::Status WrongType(const char* key, const char* expected, const Json& v) const {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": key '", key, "': expected ", expected, ", got ", v.type_name()));
  }
  absl::Status Invalid(const char* key, absl::string_view why) const {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": key '", key, "': ", why));
  }
  absl::Status Unsupported(const char* key, absl::string_view why) const {
    return absl::UnimplementedError(absl::StrCat(path_, ": key '", key, "': ", why));
  }

  absl::Status IntValue(const char* key, const Json& v, int64_t* out) const {
    if (v.is_number_unsigned()) {
      uint64_t u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return Invalid(key, "integer out of range");
      }
      *out = static_cast<int64_t>(u);
      return absl::OkStatus();
    }
    if (v.is_number_integer()) {
      *out = v.get<int64_t>();
      return absl::OkStatus();
    }
    return WrongType(key, "an integer", v);
  }

  absl::Status Int(const char* key, int64_t* out) const {
    const Json* v = Find(key);
    if (v == nullptr) return Missing(key);
    return IntValue(key, *v, out);
  }
  absl::Status OptInt(const char* key, std::optional<int64_t>* out) const {
    const Json* v = Find(key);
    if (v == nullptr) return absl::OkStatus();
    int64_t x = 0;
    CORTIQ_RETURN_IF_ERROR(IntValue(key, *v, &x));
    *out = x;
    return absl::OkStatus();
  }
  absl::Status IntOr(const char* key, int64_t def, int64_t* out) const {
    *out = def;
    const Json* v = Find(key);
    return v == nullptr ? absl::OkStatus() : IntValue(key, *v, out);
  }
  absl::Status NumberOr(const char* key, double def, double* out) const {
    *out = def;
    const Json* v = Find(key);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_number()) return WrongType(key, "a number", *v);
    *out = v->get<double>();
    return absl::OkStatus();
  }
  absl::Status BoolOr(const char* key, bool def, bool* out) const {
    *out = def;
    const Json* v = Find(key);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_boolean()) return WrongType(key, "a boolean", *v);
    *out = v->get<bool>();
    return absl::OkStatus();
  }
  absl::Status StringOr(const char* key, std::string def, std::string* out) const {
    *out = std::move(def);
    const Json* v = Find(key);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_string()) return WrongType(key, "a string", *v);
    *out = v->get<std::string>();
    return absl::OkStatus();
  }

  // A size in [1, limit].
  absl::Status CheckRange(const char* key, int64_t v, int64_t limit) const {
    if (v < 1 || v > limit) {
      return Invalid(key, absl::StrCat("value ", v, " out of range [1, ", limit, "]"));
    }
    return absl::OkStatus();
  }

 private:
  const Json& obj_;
  absl::string_view path_;  // Abseil 20220623's own string_view type: StrCat takes it
};

absl::Status CheckTokenId(const Reader& r, const char* key, int64_t id, int64_t vocab) {
  if (id < 0 || id >= vocab) {
    return r.Invalid(key,
                     absl::StrCat("token id ", id, " outside the vocabulary [0, ", vocab, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

const char* ModelConfig::ArchName(Arch arch) {
  switch (arch) {
    case Arch::kQwen3:
      return "qwen3";
    case Arch::kQwen2:
      return "qwen2";
    case Arch::kLlama:
      return "llama";
  }
  return "unknown";
}

absl::StatusOr<ModelConfig> ModelConfig::FromJson(std::string_view text, std::string_view path) {
  const absl::string_view apath(path.data(), path.size());
  Json root = Json::parse(text.begin(), text.end(), /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(apath, ": malformed JSON"));
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(apath, ": expected a JSON object, got ", root.type_name()));
  }
  Reader r(root, path);
  ModelConfig c;

  // Architecture first: it decides the defaults below.
  std::string model_type;
  {
    const Json* v = r.Find("model_type");
    if (v == nullptr) return r.Missing("model_type");
    if (!v->is_string()) return r.WrongType("model_type", "a string", *v);
    model_type = v->get<std::string>();
  }
  if (model_type == "qwen3") {
    c.arch = Arch::kQwen3;
  } else if (model_type == "qwen2") {
    c.arch = Arch::kQwen2;
  } else if (model_type == "llama") {
    c.arch = Arch::kLlama;
  } else {
    return r.Unsupported("model_type", absl::StrCat("unsupported model_type '", model_type,
                                                    "' (supported: qwen3, qwen2, llama)"));
  }

  CORTIQ_RETURN_IF_ERROR(r.Int("vocab_size", &c.vocab_size));
  CORTIQ_RETURN_IF_ERROR(r.CheckRange("vocab_size", c.vocab_size, kMaxDim));
  CORTIQ_RETURN_IF_ERROR(r.Int("hidden_size", &c.hidden_size));
  CORTIQ_RETURN_IF_ERROR(r.CheckRange("hidden_size", c.hidden_size, kMaxDim));
  CORTIQ_RETURN_IF_ERROR(r.Int("intermediate_size", &c.intermediate_size));
  CORTIQ_RETURN_IF_ERROR(r.CheckRange("intermediate_size", c.intermediate_size, kMaxDim));
  CORTIQ_RETURN_IF_ERROR(r.Int("num_hidden_layers", &c.num_hidden_layers));
  CORTIQ_RETURN_IF_ERROR(r.CheckRange("num_hidden_layers", c.num_hidden_layers, kMaxDim));
  CORTIQ_RETURN_IF_ERROR(r.Int("num_attention_heads", &c.num_attention_heads));
  CORTIQ_RETURN_IF_ERROR(r.CheckRange("num_attention_heads", c.num_attention_heads, kMaxDim));
  CORTIQ_RETURN_IF_ERROR(
      r.IntOr("num_key_value_heads", c.num_attention_heads, &c.num_key_value_heads));
  CORTIQ_RETURN_IF_ERROR(r.CheckRange("num_key_value_heads", c.num_key_value_heads, kMaxDim));
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return r.Invalid(
        "num_key_value_heads",
        absl::StrCat("num_attention_heads (", c.num_attention_heads,
                     ") is not divisible by num_key_value_heads (", c.num_key_value_heads, ")"));
  }

  if (r.Find("head_dim") != nullptr) {
    CORTIQ_RETURN_IF_ERROR(r.Int("head_dim", &c.head_dim));
    CORTIQ_RETURN_IF_ERROR(r.CheckRange("head_dim", c.head_dim, kMaxDim));
  } else {
    if (c.hidden_size % c.num_attention_heads != 0) {
      return r.Invalid("head_dim", absl::StrCat("absent, and hidden_size (", c.hidden_size,
                                                ") is not divisible by num_attention_heads (",
                                                c.num_attention_heads, ")"));
    }
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  if (c.head_dim % 2 != 0) {
    return r.Invalid("head_dim", absl::StrCat("value ", c.head_dim, " must be even (RoPE)"));
  }

  CORTIQ_RETURN_IF_ERROR(r.NumberOr("rope_theta", 10000.0, &c.rope_theta));
  if (!std::isfinite(c.rope_theta) || c.rope_theta <= 0) {
    return r.Invalid("rope_theta", "must be positive and finite");
  }
  CORTIQ_RETURN_IF_ERROR(r.NumberOr("rms_norm_eps", 1e-6, &c.rms_norm_eps));
  if (!std::isfinite(c.rms_norm_eps) || c.rms_norm_eps <= 0) {
    return r.Invalid("rms_norm_eps", "must be positive and finite");
  }
  CORTIQ_RETURN_IF_ERROR(r.IntOr("max_position_embeddings", c.arch == Arch::kLlama ? 2048 : 32768,
                                 &c.max_position_embeddings));
  CORTIQ_RETURN_IF_ERROR(r.CheckRange("max_position_embeddings", c.max_position_embeddings,
                                      std::numeric_limits<int32_t>::max()));
  CORTIQ_RETURN_IF_ERROR(r.BoolOr("tie_word_embeddings", false, &c.tie_word_embeddings));

  bool bias = false;
  CORTIQ_RETURN_IF_ERROR(r.BoolOr("attention_bias", false, &bias));
  switch (c.arch) {
    case Arch::kQwen2:
      c.attention_bias = true;  // Qwen2Attention hard-codes q/k/v bias
      c.o_proj_bias = false;
      c.qk_norm = false;
      break;
    case Arch::kQwen3:
      c.attention_bias = c.o_proj_bias = bias;
      c.qk_norm = true;
      break;
    case Arch::kLlama:
      c.attention_bias = c.o_proj_bias = bias;
      c.qk_norm = false;
      break;
  }

  // Token ids: bos an int (or null); eos an int, a list of ints, or null.
  std::optional<int64_t> bos;
  CORTIQ_RETURN_IF_ERROR(r.OptInt("bos_token_id", &bos));
  if (bos) {
    CORTIQ_RETURN_IF_ERROR(CheckTokenId(r, "bos_token_id", *bos, c.vocab_size));
    c.bos_token_id = static_cast<int32_t>(*bos);
  }
  if (const Json* eos = r.Find("eos_token_id")) {
    auto add = [&](const Json& v) -> absl::Status {
      int64_t id = 0;
      CORTIQ_RETURN_IF_ERROR(r.IntValue("eos_token_id", v, &id));
      CORTIQ_RETURN_IF_ERROR(CheckTokenId(r, "eos_token_id", id, c.vocab_size));
      c.eos_token_ids.push_back(static_cast<int32_t>(id));
      return absl::OkStatus();
    };
    if (eos->is_array()) {
      for (const Json& v : *eos) CORTIQ_RETURN_IF_ERROR(add(v));
    } else if (eos->is_number()) {
      CORTIQ_RETURN_IF_ERROR(add(*eos));
    } else {
      return r.WrongType("eos_token_id", "an integer or a list of integers", *eos);
    }
  }

  // Newer transformers write "dtype"; older ones "torch_dtype".
  CORTIQ_RETURN_IF_ERROR(r.StringOr("torch_dtype", "", &c.torch_dtype));
  if (c.torch_dtype.empty()) CORTIQ_RETURN_IF_ERROR(r.StringOr("dtype", "", &c.torch_dtype));

  CORTIQ_RETURN_IF_ERROR(r.BoolOr("use_sliding_window", false, &c.use_sliding_window));
  if (c.use_sliding_window) {
    return r.Unsupported("use_sliding_window", "sliding-window attention is not supported");
  }
  CORTIQ_RETURN_IF_ERROR(r.OptInt("sliding_window", &c.sliding_window));

  // The O(1) hint: its errors say "config.json o1_attn"; prefixed with the
  // path like every other key's.
  if (absl::StatusOr<kv::O1Overrides> hint = kv::O1HintFromModelConfig(root); hint.ok()) {
    c.o1_hint = *std::move(hint);
  } else {
    return absl::Status(hint.status().code(), absl::StrCat(apath, ": ", hint.status().message()));
  }

  // Refuse what the engine would silently get wrong.
  if (const Json* v = r.Find("rope_scaling")) {
    return r.Unsupported(
        "rope_scaling", absl::StrCat("RoPE scaling is not supported (got ",
                                     v->dump(-1, ' ', false, Json::error_handler_t::replace), ")"));
  }
  {
    std::string act;
    CORTIQ_RETURN_IF_ERROR(r.StringOr("hidden_act", "silu", &act));
    if (act != "silu") {
      return r.Unsupported("hidden_act",
                           absl::StrCat("activation '", act, "' is not supported (only silu)"));
    }
    bool mlp_bias = false;
    CORTIQ_RETURN_IF_ERROR(r.BoolOr("mlp_bias", false, &mlp_bias));
    if (mlp_bias) return r.Unsupported("mlp_bias", "MLP biases are not supported");
  }
  return c;
}

absl::StatusOr<ModelConfig> ModelConfig::FromFile(const std::string& path) {
  CORTIQ_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(path, kMaxConfigBytes));
  return FromJson(text, path);
}

std::string ModelConfig::ToJson() const {
  static const char* const kArchitectures[] = {"Qwen3ForCausalLM", "Qwen2ForCausalLM",
                                               "LlamaForCausalLM"};
  Json j = Json::object();  // std::map underneath: keys come out sorted
  j["architectures"] = Json::array({kArchitectures[static_cast<int>(arch)]});
  j["model_type"] = ArchName(arch);
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = head_dim;
  j["rope_theta"] = rope_theta;
  j["rms_norm_eps"] = rms_norm_eps;
  j["max_position_embeddings"] = max_position_embeddings;
  j["tie_word_embeddings"] = tie_word_embeddings;
  // qwen2 ignores the key on read; written for the reader's information.
  j["attention_bias"] = arch == Arch::kQwen2 ? true : attention_bias;
  j["hidden_act"] = "silu";
  j["rope_scaling"] = nullptr;
  if (bos_token_id) j["bos_token_id"] = *bos_token_id;
  if (eos_token_ids.size() == 1) {
    j["eos_token_id"] = eos_token_ids[0];
  } else if (!eos_token_ids.empty()) {
    j["eos_token_id"] = eos_token_ids;
  }
  if (!torch_dtype.empty()) j["torch_dtype"] = torch_dtype;
  j["use_sliding_window"] = use_sliding_window;
  j["sliding_window"] = sliding_window ? Json(*sliding_window) : Json(nullptr);
  if (o1_hint != kv::O1Overrides{}) {
    Json h = Json::object();
    if (o1_hint.layers) h["layers"] = *o1_hint.layers;
    if (o1_hint.m) h["m"] = *o1_hint.m;
    if (o1_hint.w) h["w"] = *o1_hint.w;
    if (o1_hint.sink) h["sink"] = *o1_hint.sink;
    j["o1_attn"] = std::move(h);
  }
  // Strings came through our own parser or the caller; replace (never throw
  // on) invalid UTF-8.
  return j.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
}

}  // namespace cortiq::model
