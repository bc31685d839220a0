// ModelConfig: the geometry and hyper-parameters of a decoder-only transformer,
// read from a Hugging Face `config.json`.
//
// Supported `model_type`s and how they differ (everything else is shared):
//   qwen3  q/k RMSNorm per head (qk_norm), explicit head_dim, biases per
//          `attention_bias` (q, k, v and o together, as HF does).
//   qwen2  q/k/v biases always (the key is ignored, as HF ignores it), no
//          o_proj bias, no qk-norm.
//   llama  biases per `attention_bias` (q, k, v and o together), no qk-norm.
// Features the engine does not implement are refused by name, never silently
// ignored: `rope_scaling` other than null, `use_sliding_window: true`,
// `mlp_bias: true`, `hidden_act` other than "silu".
// The optional O(1)-attention hint `o1_attn` (kv::O1HintFromModelConfig) is
// parsed here, once, into o1_hint; its m and w are checked against the
// kernel's minimums where the sources are resolved (kv::ResolveO1Config).
//
// Errors (absl::Status), each message naming the file and the key:
//   malformed JSON, missing required key, wrong type, invalid value
//   (non-positive size, heads not divisible by kv heads, odd head_dim, ...)
//       -> INVALID_ARGUMENT
//   unsupported feature (see above) or model_type -> UNIMPLEMENTED
//   config file unreadable -> NOT_FOUND / the errno's code
// Never throws.
//
// A plain value type: copyable, thread-compatible.
//
// Example:
//   CORTIQ_ASSIGN_OR_RETURN(ModelConfig cfg, ModelConfig::FromFile(dir + "/config.json"));
//   int64_t q_rows = cfg.num_attention_heads * cfg.head_dim;
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/kv/o1_config.h"

namespace cortiq::model {

struct ModelConfig {
  enum class Arch { kQwen3, kQwen2, kLlama };

  Arch arch = Arch::kQwen3;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // default: num_attention_heads
  int64_t head_dim = 0;             // default: hidden_size / num_attention_heads
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-6;
  int64_t max_position_embeddings = 0;  // default 32768 (qwen), 2048 (llama)
  bool tie_word_embeddings = false;     // lm_head shares embed_tokens
  bool attention_bias = false;          // q_proj, k_proj, v_proj carry a bias
  bool o_proj_bias = false;             // o_proj carries a bias
  bool qk_norm = false;                 // q_norm / k_norm per head (qwen3)
  std::optional<int32_t> bos_token_id;
  std::vector<int32_t> eos_token_ids;     // HF's eos_token_id: an int or a list
  std::string torch_dtype;                // as written ("bfloat16", ...); may be empty
  bool use_sliding_window = false;        // always false once parsed (true is refused)
  std::optional<int64_t> sliding_window;  // carried for round trips; unused
  kv::O1Overrides o1_hint;                // "o1_attn": the model's O(1) suggestion; rect never set

  // Parses and validates `json`. `path` only labels error messages.
  static absl::StatusOr<ModelConfig> FromJson(std::string_view json, std::string_view path);
  // Reads `path` and calls FromJson.
  static absl::StatusOr<ModelConfig> FromFile(const std::string& path);

  // HF-compatible config.json text (2-space indent, keys sorted, so it is also
  // canonical: equal configs give equal text). FromJson(ToJson()) == *this.
  std::string ToJson() const;

  // "qwen3" / "qwen2" / "llama".
  static const char* ArchName(Arch arch);

  // Convenience: the rows of q_proj / k_proj (= v_proj).
  int64_t q_dim() const { return num_attention_heads * head_dim; }
  int64_t kv_dim() const { return num_key_value_heads * head_dim; }

  bool operator==(const ModelConfig&) const = default;
};

}  // namespace cortiq::model
