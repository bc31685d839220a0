// Random-weight checkpoints of named shapes, in the exact Hugging Face layout
// (config.json, model.safetensors, a byte-level tokenizer.json on the same
// code path as Qwen3's). Tests write them at test time; `cortiq-tool mkmodel`
// exposes them; the decode benchmark runs on the `qwen3-0.6b` shape.
//
// Deterministic: the same (shape, dtype, seed) writes the same bytes.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/math/kernels.h"
#include "core/model/model_config.h"

namespace cortiq::model {

// Named shapes: "tiny" (qwen3, 2 layers, hidden 64, 4 q / 2 kv heads),
// "tiny-gqa" (qwen3, GQA 4:1, head_dim 32 != hidden/heads, untied lm_head),
// "tiny-qwen2" (q/k/v bias, no qk-norm), "tiny-llama", and "qwen3-0.6b"
// (hidden 1024, 28 layers, 16 q / 8 kv heads, head_dim 128, intermediate
// 3072, vocab 151936, tied, rope_theta 1e6, eps 1e-6).
absl::StatusOr<ModelConfig> NamedShape(std::string_view name);
std::vector<std::string> NamedShapes();

struct RandomCheckpointOptions {
  math::DType dtype = math::DType::kF32;
  uint64_t seed = 1;
  // Called with each tensor's Hugging Face name and its freshly drawn values
  // (f32, row-major, the layout's shape) before they are written; may change
  // them in place (script_checkpoint.h builds an exact model this way). The
  // draws do not depend on it. Null: the random values as drawn.
  std::function<void(std::string_view name, std::span<float> values)> edit;
  // tokenizer.json text; empty: tokenizer::MakeByteLevelTokenizerJson().
  std::string tokenizer_json;
};

// Writes config.json, model.safetensors and tokenizer.json into `dir`
// (created if needed). Weights are uniform with variance 1/fan_in (unit-scale
// activations), norms 1 ± 0.1, biases ± 0.1 (before options.edit).
absl::Status WriteRandomCheckpoint(const ModelConfig& config, const std::string& dir,
                                   const RandomCheckpointOptions& options);

}  // namespace cortiq::model
