// Models in GGUF files: the mapping between llama.cpp's names and keys and
// the Hugging Face layout the Transformer binds (used by Checkpoint::Open on a
// .gguf path), and the export of a Checkpoint to GGUF.
//
// Config (ModelConfigFromGguf): general.architecture in {qwen3, qwen2, llama};
// with A = that name,
//   A.block_count                      -> num_hidden_layers         (required)
//   A.context_length                   -> max_position_embeddings   (required)
//   A.embedding_length                 -> hidden_size               (required)
//   A.feed_forward_length              -> intermediate_size         (required)
//   A.attention.head_count             -> num_attention_heads       (required)
//   A.attention.head_count_kv          -> num_key_value_heads       (default: head_count)
//   A.attention.key_length             -> head_dim (default hidden / heads;
//                                         value_length, if present, must equal it)
//   A.rope.dimension_count             must equal head_dim (partial RoPE is refused)
//   A.rope.freq_base                   -> rope_theta                (default 10000)
//   A.attention.layer_norm_rms_epsilon -> rms_norm_eps              (required)
//   A.rope.scaling.type other than "none", or a rope_freqs.weight tensor -> refused
//   vocab_size: the length of tokenizer.ggml.tokens when present, else the rows
//     of token_embd.weight; both present and different -> refused
//   tokenizer.ggml.bos_token_id / eos_token_id -> bos_token_id / eos_token_ids
//   tie_word_embeddings: no output.weight; attention_bias: qwen2 always, else
//     blk.0.attn_q.bias present (o_proj's bias goes with it, as in HF)
// and the result passes ModelConfig's own validation (FromJson).
//
// Tensor names: token_embd <-> model.embed_tokens, output_norm <-> model.norm,
// output <-> lm_head, and per layer N blk.N.X <-> model.layers.N.Y for
//   attn_norm   input_layernorm          ffn_norm  post_attention_layernorm
//   attn_q/k/v  self_attn.q/k/v_proj     attn_output  self_attn.o_proj
//   attn_q_norm self_attn.q_norm         attn_k_norm  self_attn.k_norm
//   ffn_gate/up/down  mlp.gate_proj/up_proj/down_proj
// each with its ".weight" (and ".bias" where there is one).
//
// llama's RoPE: convert_hf_to_gguf.py permutes the rows of q_proj and k_proj
// (weights and biases) of llama models so that ggml's interleaved RoPE
// (pairs 2i, 2i+1) computes HF's rotate-half one (pairs i, i + hd/2): within
// each head of hd rows, GGUF row 2i + s holds HF row s·hd/2 + i (s in {0,1}).
// LlamaGgufRow gives that index; the Checkpoint undoes it at load and the
// export applies it.
//
// Errors (absl::Status), every message starting with the file's path:
//   unknown architecture, rope scaling -> UNIMPLEMENTED; a required key absent
//   -> NOT_FOUND; a key of the wrong type, a value out of range, a vocabulary /
//   embedding mismatch -> INVALID_ARGUMENT.
// Thread-compatible free functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/math/kernels.h"
#include "core/model/gguf.h"
#include "core/model/model_config.h"
#include "core/tokenizer/gguf_vocab.h"

namespace cortiq::model {

class Checkpoint;

// The ModelConfig of a GGUF model (see above).
absl::StatusOr<ModelConfig> ModelConfigFromGguf(const GgufFile& file);

// "blk.3.attn_q.weight" -> "model.layers.3.self_attn.q_proj.weight"; nullopt
// for a name outside the table.
std::optional<std::string> HfTensorName(std::string_view gguf_name);
// The reverse; nullopt for a name outside the table.
std::optional<std::string> GgufTensorName(std::string_view hf_name);
// Whether `hf_name` is a q_proj / k_proj weight or bias (permuted for llama).
bool IsRopePermutedTensor(std::string_view hf_name);
// The GGUF row holding HF row `row` of a llama q/k projection with heads of
// `head_dim` rows (see above).
inline size_t LlamaGgufRow(size_t row, size_t head_dim) {
  const size_t h = row / head_dim, r = row % head_dim, half = head_dim / 2;
  return h * head_dim + (r % half) * 2 + r / half;
}

class GgufWriter;

// Adds the keys above for `config` to `w` (general.architecture first, then
// the A.* keys, then tokenizer.ggml.bos/eos_token_id when set): what
// ModelConfigFromGguf reads back into an equal config, torch_dtype and
// o1_hint aside (GGUF has no such keys).
absl::Status AddGgufModelKeys(const ModelConfig& config, GgufWriter& w);

// The tokenizer keys of `file` (tokenizer.ggml.*, tokenizer.chat_template;
// field by field as core/tokenizer/gguf_vocab.h lists them) as a GgufVocab,
// for Tokenizer::FromGgufVocab. NOT_FOUND when the file has no
// tokenizer.ggml.tokens; a key of the wrong type -> INVALID_ARGUMENT naming
// it. An id above INT32_MAX reads as -1 (refused by FromGgufVocab); a
// token_type outside int32 likewise.
absl::StatusOr<tokenizer::GgufVocab> ReadGgufVocab(const GgufFile& file);

// Adds `vocab`'s keys to `w` (the inverse: ReadGgufVocab gives it back).
absl::Status AddGgufVocabKeys(const tokenizer::GgufVocab& vocab, GgufWriter& w);

struct GgufExportOptions {
  // Storage of the matrices (rank-2 tensors): F32, F16, BF16 or Q8_0. Q8_0
  // needs rows of a multiple of 32 values; a matrix without them is stored
  // F32 (as llama.cpp falls back). Vectors (norms, biases) are always F32.
  math::DType dtype = math::DType::kF32;
  // The tokenizer to embed (AddGgufVocabKeys; its ids replace the config's
  // bos/eos keys), or nullptr: none, as llama.cpp cannot then load the file.
  const tokenizer::GgufVocab* vocab = nullptr;
};

// Writes `ckpt` as a GGUF model at `path` (atomically), with the keys above,
// llama's q/k rows permuted as convert_hf_to_gguf.py does, general.name
// "cortiq-export", and options.vocab's keys when given (else bos/eos only).
// Errors name the tensor.
// Cost: converts every tensor to f32 and then to the storage type in memory
// (holds the whole file image until written).
absl::Status WriteGgufModel(const Checkpoint& ckpt, const std::string& path,
                            const GgufExportOptions& options);

}  // namespace cortiq::model
