// Script checkpoints: a model whose greedy continuation is a given text.
//
// A test fixture for the front ends: no shipped model writes `<tool_call>`
// or `<think>`, so without it no test reads tool calls or reasoning out of a
// real generation. WriteScriptCheckpoint writes a one-layer Qwen3
// checkpoint that, after a prompt ending in `after`, greedily writes `text`
// and then its end token (`<|im_end|>`, else `<|endoftext|>`).
//
// Construction (exact, not trained): o_proj and down_proj are zero, so the
// residual stream never changes and the last hidden state is the last
// token's embedding. The script's tokens have one-hot embeddings (mutually
// orthogonal) and lm_head's row for s(t) is the one-hot of t, so after token
// t the logit of s(t) is ~sqrt(hidden) and every other logit is exactly 0:
// greedy decoding walks the successor table t -> s(t) from the prompt's last
// token. Everything else (q/k/v, gate/up, norms, the other tokens'
// embeddings) is random, so the forward pass still runs real math; a prompt
// ending in any script token continues from there (Qwen3's
// enable_thinking=false prompt, ending "</think>\n\n", lands on the "\n\n"
// before "<tool_call>" when the text has one).
//
// A table gives a token one successor, so the text is cut into pieces that
// never repeat: tags ("<tool_call>", "</think>") whole, then runs of word
// characters (ASCII letters, digits, '_', bytes >= 0x80), of '\n', and of
// anything else; a piece equal to an earlier one (or to the prompt's last
// token) is joined to the next (the last piece, to the one before) until
// none repeats. A piece the base tokenizer spells as one token keeps that
// id; every other piece becomes a non-special added token, as Qwen3's
// "<tool_call>" and "<think>" are. The written tokenizer must encode the text
// back to the pieces (Encode(after + text) == Encode(after) + the pieces'
// ids): added tokens match leftmost-longest, so a joined piece can swallow
// the text at an earlier piece; that piece is then joined to the next one
// and the cut tried again. All chain ids must be distinct. Last, the written
// model is run: greedy decoding from Encode(after) writes exactly the
// pieces, then the end token.
//
// Cost: milliseconds (the model is ~1 MB for a short text). Deterministic:
// the same options write the same bytes.
//
// Example:
//   ScriptCheckpointOptions o;
//   o.text = "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";
//   o.tokenizer_dir = "models/cortiq-byte-4m";
//   CORTIQ_ASSIGN_OR_RETURN(ScriptPlan plan, WriteScriptCheckpoint("/tmp/script", o));
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/math/kernels.h"

namespace cortiq::model {

// Longest text a script checkpoint takes (its hidden size grows with the
// number of pieces).
inline constexpr size_t kMaxScriptBytes = 1024;

struct ScriptCheckpointOptions {
  std::string text;  // what the model writes: UTF-8, 1..kMaxScriptBytes
  std::string after =
      "<|im_start|>assistant\n";  // what prompts end with (ChatML's generation prompt)
  // Directory whose tokenizer.json is extended (and whose
  // tokenizer_config.json, the chat template, is copied when present).
  // Empty: the byte-level tokenizer of random checkpoints.
  std::string tokenizer_dir;
  math::DType dtype = math::DType::kF32;  // kF32, kBF16 or kF16
  uint64_t seed = 1;
};

// What was written.
struct ScriptPlan {
  std::vector<std::string> pieces;  // the text, one piece per generated token
  // The successor chain: [Encode(after).back(), the pieces' ids..., end id].
  std::vector<int32_t> ids;
  size_t added_tokens = 0;  // pieces new to the vocabulary
};

// The text's first cut (see the banner; WriteScriptCheckpoint may join more
// pieces for its tokenizer): tags whole, then runs of one character class;
// a piece equal to `first` or to an earlier piece is joined to its
// neighbour. InvalidArgument naming "text" when the whole text is one piece
// equal to `first`. O(pieces^2 log pieces).
absl::StatusOr<std::vector<std::string>> CutScript(std::string_view text, std::string_view first);

// Writes config.json, model.safetensors, tokenizer.json (and
// tokenizer_config.json) into `dir`, then checks them (see the banner).
// Errors: InvalidArgument naming "text" or "after" (empty, too long, no cut
// that encodes back, a special token inside the text), NotFound for a missing
// tokenizer_dir/tokenizer.json, Internal when the written model does not
// reproduce the script (a bug here).
absl::StatusOr<ScriptPlan> WriteScriptCheckpoint(const std::string& dir,
                                                 const ScriptCheckpointOptions& options);

}  // namespace cortiq::model
