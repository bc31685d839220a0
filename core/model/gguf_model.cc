// GGUF model mapping (see the header). The config is assembled as config.json
// text and validated by ModelConfig::FromJson, so a GGUF model passes exactly
// the checks an HF directory does.
#include "core/model/gguf_model.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/model/checkpoint.h"
#include "core/model/gguf_writer.h"
#include "core/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace cortiq::model {
namespace {

using Json = nlohmann::json;

absl::string_view Sv(std::string_view s) { return {s.data(), s.size()}; }

// Generous bound on one dimension (as model_config.cc's).
constexpr int64_t kMaxDim = int64_t{1} << 24;

struct NamePair {
  std::string_view gguf, hf;
};
// Under blk.N. / model.layers.N.
constexpr NamePair kLayerNames[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_q.bias", "self_attn.q_proj.bias"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_k.bias", "self_attn.k_proj.bias"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_v.bias", "self_attn.v_proj.bias"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"attn_output.bias", "self_attn.o_proj.bias"},
    {"attn_q_norm.weight", "self_attn.q_norm.weight"},
    {"attn_k_norm.weight", "self_attn.k_norm.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
};
constexpr NamePair kGlobalNames[] = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
};

// "<prefix><digits>.<rest>" -> (digits, rest).
bool SplitLayer(std::string_view name, std::string_view prefix, std::string_view* layer,
                std::string_view* rest) {
  if (name.substr(0, prefix.size()) != prefix) return false;
  name.remove_prefix(prefix.size());
  const size_t dot = name.find('.');
  if (dot == 0 || dot == std::string_view::npos) return false;
  *layer = name.substr(0, dot);
  for (char ch : *layer) {
    if (ch < '0' || ch > '9') return false;
  }
  if (layer->size() > 1 && layer->front() == '0') return false;  // one spelling per layer
  *rest = name.substr(dot + 1);
  return true;
}

std::optional<std::string> MapName(std::string_view name, bool to_hf) {
  for (const NamePair& p : kGlobalNames) {
    if (name == (to_hf ? p.gguf : p.hf)) return std::string(to_hf ? p.hf : p.gguf);
  }
  std::string_view layer, rest;
  if (!SplitLayer(name, to_hf ? "blk." : "model.layers.", &layer, &rest)) return std::nullopt;
  for (const NamePair& p : kLayerNames) {
    if (rest == (to_hf ? p.gguf : p.hf)) {
      return absl::StrCat(to_hf ? "model.layers." : "blk.", Sv(layer), ".",
                          Sv(to_hf ? p.hf : p.gguf));
    }
  }
  return std::nullopt;
}

// Reads the GGUF keys of one architecture, with errors naming the key.
class KeyReader {
 public:
  KeyReader(const GgufFile& f, std::string arch) : f_(f), arch_(std::move(arch)) {}
  std::string Key(std::string_view suffix) const { return absl::StrCat(arch_, ".", Sv(suffix)); }

  // A dimension in [1, limit].
  absl::StatusOr<int64_t> Dim(std::string_view suffix, int64_t limit = kMaxDim) const {
    const std::string key = Key(suffix);
    CORTIQ_ASSIGN_OR_RETURN(int64_t v, f_.GetInt(key));
    if (v < 1 || v > limit) {
      return absl::InvalidArgumentError(absl::StrCat(
          f_.path(), ": metadata key '", key, "': value ", v, " out of range [1, ", limit, "]"));
    }
    return v;
  }
  absl::StatusOr<std::optional<int64_t>> OptDim(std::string_view suffix,
                                                int64_t limit = kMaxDim) const {
    if (!f_.Has(Key(suffix))) return std::optional<int64_t>();
    CORTIQ_ASSIGN_OR_RETURN(int64_t v, Dim(suffix, limit));
    return std::optional<int64_t>(v);
  }
  absl::StatusOr<std::optional<double>> OptFloat(std::string_view suffix) const {
    if (!f_.Has(Key(suffix))) return std::optional<double>();
    CORTIQ_ASSIGN_OR_RETURN(double v, Float(suffix));
    return std::optional<double>(v);
  }
  // An f32 value as the shortest decimal that reads back as the same f32
  // (1e-6f -> 1e-6, as config.json writes it), so that a converted model's
  // config equals its HF twin's; an f64 value as is.
  absl::StatusOr<double> Float(std::string_view suffix) const {
    const std::string key = Key(suffix);
    CORTIQ_ASSIGN_OR_RETURN(double v, f_.GetFloat(key));
    // A NaN or infinity would reach config.json as null, which reads as
    // "absent": the model would run on the default, never on what it says.
    if (!std::isfinite(v)) return Invalid(suffix, absl::StrCat("value ", v, " is not finite"));
    if (f_.TypeOf(key) != GgufValueType::kF32) return v;
    for (int digits = 1; digits <= 9; ++digits) {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%.*g", digits, v);
      const double d = std::strtod(buf, nullptr);
      if (static_cast<float>(d) == static_cast<float>(v)) return d;
    }
    return v;
  }
  absl::Status Invalid(std::string_view suffix, absl::string_view why) const {
    return absl::InvalidArgumentError(
        absl::StrCat(f_.path(), ": metadata key '", Key(suffix), "': ", why));
  }

 private:
  const GgufFile& f_;
  std::string arch_;
};

}  // namespace

std::optional<std::string> HfTensorName(std::string_view gguf_name) {
  return MapName(gguf_name, /*to_hf=*/true);
}

std::optional<std::string> GgufTensorName(std::string_view hf_name) {
  return MapName(hf_name, /*to_hf=*/false);
}

bool IsRopePermutedTensor(std::string_view hf_name) {
  std::string_view layer, rest;
  if (!SplitLayer(hf_name, "model.layers.", &layer, &rest)) return false;
  return rest == "self_attn.q_proj.weight" || rest == "self_attn.q_proj.bias" ||
         rest == "self_attn.k_proj.weight" || rest == "self_attn.k_proj.bias";
}

absl::StatusOr<ModelConfig> ModelConfigFromGguf(const GgufFile& f) {
  const absl::string_view path = Sv(f.path());
  CORTIQ_ASSIGN_OR_RETURN(const std::string arch, f.GetString("general.architecture"));
  if (arch != "qwen3" && arch != "qwen2" && arch != "llama") {
    return absl::UnimplementedError(absl::StrCat(path, ": general.architecture '", arch,
                                                 "' is not supported (supported: qwen3, qwen2, "
                                                 "llama)"));
  }
  const KeyReader r(f, arch);
  Json j = Json::object();
  j["model_type"] = arch;
  CORTIQ_ASSIGN_OR_RETURN(const int64_t layers, r.Dim("block_count"));
  CORTIQ_ASSIGN_OR_RETURN(const int64_t context,
                          r.Dim("context_length", std::numeric_limits<int32_t>::max()));
  CORTIQ_ASSIGN_OR_RETURN(const int64_t hidden, r.Dim("embedding_length"));
  CORTIQ_ASSIGN_OR_RETURN(const int64_t inter, r.Dim("feed_forward_length"));
  CORTIQ_ASSIGN_OR_RETURN(const int64_t heads, r.Dim("attention.head_count"));
  CORTIQ_ASSIGN_OR_RETURN(const std::optional<int64_t> kv_heads,
                          r.OptDim("attention.head_count_kv"));
  CORTIQ_ASSIGN_OR_RETURN(const std::optional<int64_t> key_len, r.OptDim("attention.key_length"));
  CORTIQ_ASSIGN_OR_RETURN(const std::optional<int64_t> val_len, r.OptDim("attention.value_length"));
  CORTIQ_ASSIGN_OR_RETURN(const std::optional<int64_t> rope_dims, r.OptDim("rope.dimension_count"));
  CORTIQ_ASSIGN_OR_RETURN(const std::optional<double> theta, r.OptFloat("rope.freq_base"));
  CORTIQ_ASSIGN_OR_RETURN(const double eps, r.Float("attention.layer_norm_rms_epsilon"));

  int64_t head_dim = 0;
  if (key_len) {
    head_dim = *key_len;
  } else {
    if (hidden % heads != 0) {
      return r.Invalid("attention.key_length",
                       absl::StrCat("absent, and embedding_length (", hidden,
                                    ") is not divisible by attention.head_count (", heads, ")"));
    }
    head_dim = hidden / heads;
  }
  if (val_len && *val_len != head_dim) {
    return r.Invalid("attention.value_length",
                     absl::StrCat("value ", *val_len, " differs from the key length ", head_dim,
                                  " (not supported)"));
  }
  if (rope_dims && *rope_dims != head_dim) {
    return absl::UnimplementedError(absl::StrCat(
        path, ": metadata key '", r.Key("rope.dimension_count"), "': RoPE over ", *rope_dims,
        " of ", head_dim, " dims per head (partial rotary) is not supported"));
  }
  // RoPE scaling as llama.cpp reads it: the type defaults to "linear" and the
  // factor is rope.scaling.factor, else the older rope.scale_linear (0 or 1:
  // none). Any scaling that changes the positions is refused, a linear
  // factor without a type key included.
  {
    std::string type = "linear";
    const std::string type_key = r.Key("rope.scaling.type");
    if (f.Has(type_key)) {
      CORTIQ_ASSIGN_OR_RETURN(type, f.GetString(type_key));
    }
    std::optional<double> factor;
    std::string factor_key;
    for (const char* suffix : {"rope.scaling.factor", "rope.scale_linear"}) {
      factor_key = r.Key(suffix);
      CORTIQ_ASSIGN_OR_RETURN(factor, r.OptFloat(suffix));
      if (factor) break;
    }
    const bool scales = factor && *factor != 0.0 && *factor != 1.0;
    if (type != "none" && type != "linear") {
      return absl::UnimplementedError(absl::StrCat(
          path, ": metadata key '", type_key, "': RoPE scaling '", type, "' is not supported"));
    }
    if (type == "linear" && scales) {
      return absl::UnimplementedError(absl::StrCat(path, ": metadata key '", factor_key,
                                                   "': linear RoPE scaling by ", *factor,
                                                   " is not supported"));
    }
  }
  if (f.HasTensor("rope_freqs.weight")) {
    return absl::UnimplementedError(
        absl::StrCat(path,
                     ": tensor 'rope_freqs.weight' (RoPE frequency factors, llama3 scaling) is not "
                     "supported"));
  }

  // Vocabulary: the tokenizer's list and the embedding must agree.
  const GgufFile::TensorInfo* embd = f.Info("token_embd.weight");
  if (embd == nullptr) {
    return absl::NotFoundError(absl::StrCat(path, ": tensor 'token_embd.weight' not found"));
  }
  if (embd->shape.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": tensor 'token_embd.weight': shape ",
                                                   ShapeString(embd->shape), " expected [vocab, ",
                                                   hidden, "]"));
  }
  int64_t vocab = embd->shape[0];
  if (f.Has("tokenizer.ggml.tokens")) {
    CORTIQ_ASSIGN_OR_RETURN(const uint64_t n, f.ArrayLength("tokenizer.ggml.tokens"));
    if (n != static_cast<uint64_t>(vocab)) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": the vocabulary has ", n,
                                                     " tokens (tokenizer.ggml.tokens) but tensor "
                                                     "'token_embd.weight' has ",
                                                     vocab, " rows"));
    }
  }
  if (vocab > kMaxDim) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": vocabulary of ", vocab, " tokens exceeds ", kMaxDim));
  }

  j["vocab_size"] = vocab;
  j["hidden_size"] = hidden;
  j["intermediate_size"] = inter;
  j["num_hidden_layers"] = layers;
  j["num_attention_heads"] = heads;
  j["num_key_value_heads"] = kv_heads.value_or(heads);
  j["head_dim"] = head_dim;
  j["rope_theta"] = theta.value_or(10000.0);
  j["rms_norm_eps"] = eps;
  j["max_position_embeddings"] = context;
  j["tie_word_embeddings"] = !f.HasTensor("output.weight");
  j["attention_bias"] = arch == "qwen2" || f.HasTensor("blk.0.attn_q.bias");
  for (const char* key : {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"}) {
    if (!f.Has(key)) continue;
    CORTIQ_ASSIGN_OR_RETURN(const int64_t id, f.GetInt(key));
    j[std::strstr(key, "bos") != nullptr ? "bos_token_id" : "eos_token_id"] = id;
  }
  return ModelConfig::FromJson(j.dump(), f.path());
}

// ---- export ----

absl::Status AddGgufModelKeys(const ModelConfig& c, GgufWriter& w) {
  const std::string arch = ModelConfig::ArchName(c.arch);
  auto key = [&](std::string_view s) { return absl::StrCat(arch, ".", Sv(s)); };
  auto u32 = [](int64_t v) { return static_cast<uint32_t>(v); };
  CORTIQ_RETURN_IF_ERROR(w.AddString("general.architecture", arch));
  CORTIQ_RETURN_IF_ERROR(w.AddString("general.name", "cortiq-export"));
  CORTIQ_RETURN_IF_ERROR(w.AddU32(key("block_count"), u32(c.num_hidden_layers)));
  CORTIQ_RETURN_IF_ERROR(w.AddU32(key("context_length"), u32(c.max_position_embeddings)));
  CORTIQ_RETURN_IF_ERROR(w.AddU32(key("embedding_length"), u32(c.hidden_size)));
  CORTIQ_RETURN_IF_ERROR(w.AddU32(key("feed_forward_length"), u32(c.intermediate_size)));
  CORTIQ_RETURN_IF_ERROR(w.AddU32(key("attention.head_count"), u32(c.num_attention_heads)));
  CORTIQ_RETURN_IF_ERROR(w.AddU32(key("attention.head_count_kv"), u32(c.num_key_value_heads)));
  CORTIQ_RETURN_IF_ERROR(w.AddU32(key("attention.key_length"), u32(c.head_dim)));
  CORTIQ_RETURN_IF_ERROR(w.AddU32(key("attention.value_length"), u32(c.head_dim)));
  CORTIQ_RETURN_IF_ERROR(w.AddU32(key("rope.dimension_count"), u32(c.head_dim)));
  CORTIQ_RETURN_IF_ERROR(w.AddF32(key("rope.freq_base"), static_cast<float>(c.rope_theta)));
  CORTIQ_RETURN_IF_ERROR(
      w.AddF32(key("attention.layer_norm_rms_epsilon"), static_cast<float>(c.rms_norm_eps)));
  if (c.bos_token_id) {
    CORTIQ_RETURN_IF_ERROR(w.AddU32("tokenizer.ggml.bos_token_id", u32(*c.bos_token_id)));
  }
  if (!c.eos_token_ids.empty()) {
    CORTIQ_RETURN_IF_ERROR(w.AddU32("tokenizer.ggml.eos_token_id", u32(c.eos_token_ids[0])));
  }
  return absl::OkStatus();
}

absl::StatusOr<tokenizer::GgufVocab> ReadGgufVocab(const GgufFile& f) {
  constexpr const char* kTokens = "tokenizer.ggml.tokens";
  if (!f.Has(kTokens)) {
    return absl::NotFoundError(
        absl::StrCat(f.path(), ": no tokenizer (tokenizer.ggml.tokens absent)"));
  }
  tokenizer::GgufVocab v;
  CORTIQ_ASSIGN_OR_RETURN(v.model, f.GetString("tokenizer.ggml.model"));
  if (f.Has("tokenizer.ggml.pre")) {
    CORTIQ_ASSIGN_OR_RETURN(v.pre, f.GetString("tokenizer.ggml.pre"));
  }
  CORTIQ_ASSIGN_OR_RETURN(v.tokens, f.GetStringArray(kTokens));
  const auto narrow = [](int64_t x) {
    return x >= std::numeric_limits<int32_t>::min() && x <= std::numeric_limits<int32_t>::max()
               ? static_cast<int32_t>(x)
               : -1;
  };
  if (f.Has("tokenizer.ggml.token_type")) {
    // One type per token, checked before the array is widened to int64
    // (8 bytes of memory per byte of file otherwise).
    CORTIQ_ASSIGN_OR_RETURN(const uint64_t n_types, f.ArrayLength("tokenizer.ggml.token_type"));
    if (n_types != v.tokens.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(f.path(), ": metadata key 'tokenizer.ggml.token_type': ", n_types,
                       " types for ", v.tokens.size(), " tokens (tokenizer.ggml.tokens)"));
    }
    CORTIQ_ASSIGN_OR_RETURN(const std::vector<int64_t> types,
                            f.GetIntArray("tokenizer.ggml.token_type"));
    v.token_types.reserve(types.size());
    for (const int64_t t : types) v.token_types.push_back(narrow(t));
  }
  if (f.Has("tokenizer.ggml.merges")) {
    CORTIQ_ASSIGN_OR_RETURN(v.merges, f.GetStringArray("tokenizer.ggml.merges"));
  }
  for (const auto& [key, field] : {std::pair{"tokenizer.ggml.bos_token_id", &v.bos},
                                   {"tokenizer.ggml.eos_token_id", &v.eos},
                                   {"tokenizer.ggml.padding_token_id", &v.pad},
                                   {"tokenizer.ggml.unknown_token_id", &v.unk}}) {
    if (!f.Has(key)) continue;
    CORTIQ_ASSIGN_OR_RETURN(const int64_t id, f.GetInt(key));
    *field = narrow(id);
  }
  for (const auto& [key, field] : {std::pair{"tokenizer.ggml.add_bos_token", &v.add_bos},
                                   {"tokenizer.ggml.add_eos_token", &v.add_eos}}) {
    if (!f.Has(key)) continue;
    CORTIQ_ASSIGN_OR_RETURN(*field, f.GetBool(key));
  }
  if (f.Has("tokenizer.chat_template")) {
    CORTIQ_ASSIGN_OR_RETURN(v.chat_template, f.GetString("tokenizer.chat_template"));
  }
  return v;
}

absl::Status AddGgufVocabKeys(const tokenizer::GgufVocab& v, GgufWriter& w) {
  CORTIQ_RETURN_IF_ERROR(w.AddString("tokenizer.ggml.model", v.model));
  if (!v.pre.empty()) CORTIQ_RETURN_IF_ERROR(w.AddString("tokenizer.ggml.pre", v.pre));
  CORTIQ_RETURN_IF_ERROR(w.AddStringArray("tokenizer.ggml.tokens", v.tokens));
  if (!v.token_types.empty()) {
    CORTIQ_RETURN_IF_ERROR(w.AddI32Array("tokenizer.ggml.token_type", v.token_types));
  }
  // llama.cpp requires the key for a gpt2 model even with no merges.
  CORTIQ_RETURN_IF_ERROR(w.AddStringArray("tokenizer.ggml.merges", v.merges));
  for (const auto& [key, field] : {std::pair{"tokenizer.ggml.bos_token_id", &v.bos},
                                   {"tokenizer.ggml.eos_token_id", &v.eos},
                                   {"tokenizer.ggml.padding_token_id", &v.pad},
                                   {"tokenizer.ggml.unknown_token_id", &v.unk}}) {
    if (!field->has_value()) continue;
    if (**field < 0) {
      return absl::InvalidArgumentError(absl::StrCat(key, ": negative id ", **field));
    }
    CORTIQ_RETURN_IF_ERROR(w.AddU32(key, static_cast<uint32_t>(**field)));
  }
  for (const auto& [key, field] : {std::pair{"tokenizer.ggml.add_bos_token", &v.add_bos},
                                   {"tokenizer.ggml.add_eos_token", &v.add_eos}}) {
    if (field->has_value()) CORTIQ_RETURN_IF_ERROR(w.AddBool(key, **field));
  }
  if (!v.chat_template.empty()) {
    CORTIQ_RETURN_IF_ERROR(w.AddString("tokenizer.chat_template", v.chat_template));
  }
  return absl::OkStatus();
}

absl::Status WriteGgufModel(const Checkpoint& ckpt, const std::string& path,
                            const GgufExportOptions& options) {
  const ModelConfig& c = ckpt.config();
  GgufWriter w;
  if (options.vocab != nullptr) {
    ModelConfig keys = c;  // the vocabulary's own ids go in its keys
    keys.bos_token_id.reset();
    keys.eos_token_ids.clear();
    CORTIQ_RETURN_IF_ERROR(AddGgufModelKeys(keys, w));
    CORTIQ_RETURN_IF_ERROR(AddGgufVocabKeys(*options.vocab, w));
  } else {
    CORTIQ_RETURN_IF_ERROR(AddGgufModelKeys(c, w));
  }
  std::vector<float> values, permuted;
  for (const std::string& hf : ckpt.TensorNames()) {
    const std::optional<std::string> name = GgufTensorName(hf);
    if (!name) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor '", hf, "' has no GGUF name (core/model/gguf_model.h)"));
    }
    CORTIQ_ASSIGN_OR_RETURN(const TensorView t, ckpt.GetAnyShape(hf));
    values.resize(static_cast<size_t>(t.numel()));
    math::ConvertToF32(t.data, t.dtype, values.size(), values.data());
    if (c.arch == ModelConfig::Arch::kLlama && IsRopePermutedTensor(hf)) {
      // The permutation moves whole rows within each head: the loader's
      // check (LoadGgufTensor), before any row is written.
      const size_t hd = static_cast<size_t>(c.head_dim);
      if (t.shape.empty() || t.shape.size() > 2 || t.shape[0] <= 0 ||
          static_cast<size_t>(t.shape[0]) % hd != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": tensor '", hf, "': shape ", ShapeString(t.shape),
                         " is not whole heads of head_dim ", hd, " rows"));
      }
      const size_t rows = static_cast<size_t>(t.shape[0]);
      const size_t cols = values.size() / rows;
      permuted.resize(values.size());
      for (size_t r = 0; r < rows; ++r) {
        std::memcpy(&permuted[LlamaGgufRow(r, hd) * cols], &values[r * cols], cols * sizeof(float));
      }
      values.swap(permuted);
    }
    math::DType dtype = t.shape.size() == 2 ? options.dtype : math::DType::kF32;
    if (dtype == math::DType::kQ8_0 && t.shape.back() % int64_t{math::kQ8Block} != 0) {
      dtype = math::DType::kF32;
    }
    CORTIQ_RETURN_IF_ERROR(w.AddTensor(*name, dtype, t.shape, values));
  }
  return w.Write(path);
}

}  // namespace cortiq::model
