#include "core/model/random_checkpoint.h"

#include <cmath>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/model/safetensors.h"
#include "core/tokenizer/tokenizer.h"
#include "core/util/status_macros.h"

namespace cortiq::model {
namespace {

// splitmix64: tiny, fully specified, the same on every machine.
struct Rng {
  uint64_t s;
  uint64_t Next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [-1, 1).
  float Sym() { return float(double(Next() >> 11) * 0x1.0p-53 * 2.0 - 1.0); }
};

ModelConfig Base() {
  ModelConfig c;
  c.arch = ModelConfig::Arch::kQwen3;
  c.qk_norm = true;
  c.rope_theta = 10000.0;
  c.rms_norm_eps = 1e-6;
  c.max_position_embeddings = 4096;
  c.tie_word_embeddings = true;
  c.eos_token_ids = {256};
  c.bos_token_id = 256;
  c.torch_dtype = "float32";
  return c;
}

absl::Status WriteText(const std::string& path, std::string_view text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(text.data(), static_cast<std::streamsize>(text.size()));
  f.close();
  if (!f) return absl::InternalError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

}  // namespace

std::vector<std::string> NamedShapes() {
  return {"tiny", "tiny-gqa", "tiny-qwen2", "tiny-llama", "qwen3-0.6b"};
}

absl::StatusOr<ModelConfig> NamedShape(std::string_view name) {
  ModelConfig c = Base();
  if (name == "tiny") {
    c.vocab_size = 259;
    c.hidden_size = 64;
    c.intermediate_size = 192;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 16;
  } else if (name == "tiny-gqa") {
    c.vocab_size = 300;
    c.hidden_size = 48;
    c.intermediate_size = 128;
    c.num_hidden_layers = 3;
    c.num_attention_heads = 8;
    c.num_key_value_heads = 2;
    c.head_dim = 32;
    c.tie_word_embeddings = false;
    c.rope_theta = 1e6;
  } else if (name == "tiny-qwen2") {
    c.arch = ModelConfig::Arch::kQwen2;
    c.qk_norm = false;
    c.attention_bias = true;
    c.vocab_size = 259;
    c.hidden_size = 64;
    c.intermediate_size = 160;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 16;
  } else if (name == "tiny-llama") {
    c.arch = ModelConfig::Arch::kLlama;
    c.qk_norm = false;
    c.vocab_size = 259;
    c.hidden_size = 64;
    c.intermediate_size = 160;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 4;
    c.head_dim = 16;
    c.tie_word_embeddings = false;
    c.max_position_embeddings = 2048;
  } else if (name == "qwen3-0.6b") {
    c.vocab_size = 151936;
    c.hidden_size = 1024;
    c.intermediate_size = 3072;
    c.num_hidden_layers = 28;
    c.num_attention_heads = 16;
    c.num_key_value_heads = 8;
    c.head_dim = 128;
    c.rope_theta = 1e6;
    c.max_position_embeddings = 40960;
    c.torch_dtype = "bfloat16";
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown model shape '", std::string(name),
                     "'; known: ", absl::StrJoin(NamedShapes(), ", ")));
  }
  return c;
}

absl::Status WriteRandomCheckpoint(const ModelConfig& config_in, const std::string& dir,
                                   const RandomCheckpointOptions& options) {
  ModelConfig config = config_in;
  config.torch_dtype = options.dtype == math::DType::kF32    ? "float32"
                       : options.dtype == math::DType::kBF16 ? "bfloat16"
                                                             : "float16";
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat(dir, ": cannot create: ", ec.message()));

  Rng rng{options.seed};
  SafetensorsWriter writer;
  std::vector<float> buf;
  // buf, after options.edit, as tensor `name`.
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    if (options.edit) options.edit(name, buf);
    return writer.AddF32(name, options.dtype, std::move(shape), buf);
  };
  auto matrix = [&](const std::string& name, int64_t rows, int64_t cols) -> absl::Status {
    buf.resize(size_t(rows * cols));
    const float a = std::sqrt(3.0f / float(cols));
    for (float& x : buf) x = a * rng.Sym();
    return add(name, {rows, cols});
  };
  auto vector = [&](const std::string& name, int64_t n, float center, float spread) {
    buf.resize(size_t(n));
    for (float& x : buf) x = center + spread * rng.Sym();
    return add(name, {n});
  };
  const int64_t h = config.hidden_size, q = config.q_dim(), kv = config.kv_dim(),
                inter = config.intermediate_size, hd = config.head_dim;
  // Embeddings with unit-variance entries (a = sqrt(3) ⇒ variance 1).
  buf.resize(size_t(config.vocab_size * h));
  for (float& x : buf) x = std::sqrt(3.0f) * rng.Sym();
  CORTIQ_RETURN_IF_ERROR(add("model.embed_tokens.weight", {config.vocab_size, h}));
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    CORTIQ_RETURN_IF_ERROR(vector(p + "input_layernorm.weight", h, 1.0f, 0.1f));
    CORTIQ_RETURN_IF_ERROR(vector(p + "post_attention_layernorm.weight", h, 1.0f, 0.1f));
    CORTIQ_RETURN_IF_ERROR(matrix(p + "self_attn.q_proj.weight", q, h));
    CORTIQ_RETURN_IF_ERROR(matrix(p + "self_attn.k_proj.weight", kv, h));
    CORTIQ_RETURN_IF_ERROR(matrix(p + "self_attn.v_proj.weight", kv, h));
    CORTIQ_RETURN_IF_ERROR(matrix(p + "self_attn.o_proj.weight", h, q));
    if (config.attention_bias) {
      CORTIQ_RETURN_IF_ERROR(vector(p + "self_attn.q_proj.bias", q, 0.0f, 0.1f));
      CORTIQ_RETURN_IF_ERROR(vector(p + "self_attn.k_proj.bias", kv, 0.0f, 0.1f));
      CORTIQ_RETURN_IF_ERROR(vector(p + "self_attn.v_proj.bias", kv, 0.0f, 0.1f));
    }
    if (config.o_proj_bias) {
      CORTIQ_RETURN_IF_ERROR(vector(p + "self_attn.o_proj.bias", h, 0.0f, 0.1f));
    }
    if (config.qk_norm) {
      CORTIQ_RETURN_IF_ERROR(vector(p + "self_attn.q_norm.weight", hd, 1.0f, 0.1f));
      CORTIQ_RETURN_IF_ERROR(vector(p + "self_attn.k_norm.weight", hd, 1.0f, 0.1f));
    }
    CORTIQ_RETURN_IF_ERROR(matrix(p + "mlp.gate_proj.weight", inter, h));
    CORTIQ_RETURN_IF_ERROR(matrix(p + "mlp.up_proj.weight", inter, h));
    CORTIQ_RETURN_IF_ERROR(matrix(p + "mlp.down_proj.weight", h, inter));
  }
  CORTIQ_RETURN_IF_ERROR(vector("model.norm.weight", h, 1.0f, 0.1f));
  if (!config.tie_word_embeddings) {
    CORTIQ_RETURN_IF_ERROR(matrix("lm_head.weight", config.vocab_size, h));
  }
  writer.SetMetadata("format", "pt");
  writer.SetMetadata("generator", absl::StrCat("cortiq-tool mkmodel seed=", options.seed));
  CORTIQ_RETURN_IF_ERROR(writer.Write(dir + "/model.safetensors"));
  CORTIQ_RETURN_IF_ERROR(WriteText(dir + "/config.json", config.ToJson()));
  CORTIQ_RETURN_IF_ERROR(WriteText(
      dir + "/tokenizer.json",
      options.tokenizer_json.empty()
          ? tokenizer::MakeByteLevelTokenizerJson({"<|endoftext|>", "<|im_start|>", "<|im_end|>"})
          : options.tokenizer_json));
  return absl::OkStatus();
}

}  // namespace cortiq::model
