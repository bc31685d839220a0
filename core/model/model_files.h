// What a --model path names besides the weights (Checkpoint): the tokenizer,
// the bytes that identify it, and a chat template carried inside the model.
//
//   a directory (Hugging Face layout): tokenizer.json; its bytes are the
//     identity; the chat template lives in tokenizer_config.json, which
//     chat::ChatTemplate reads (core/chat), so `chat_template` stays empty.
//   a regular file (GGUF): the tokenizer.ggml.* keys (ReadGgufVocab ->
//     Tokenizer::FromGgufVocab); the identity is a canonical serialization of
//     those keys; tokenizer.chat_template with the text of the bos/eos tokens.
//
// Every session on a node and every node it migrates to must agree on the
// identity (session::ModelWireFingerprint mixes it in), so two files that
// tokenize alike under different bytes are still told apart only by bytes.
// Errors: NOT_FOUND naming the path when there is no model there or no
// tokenizer in it; the tokenizer's own errors (gguf_vocab.h, tokenizer.h)
// otherwise. Thread-compatible free functions; the cost is the tokenizer's
// (tens of ms for a 151k vocabulary) plus, for GGUF, parsing the header.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "core/math/kernels.h"
#include "core/tokenizer/tokenizer.h"

namespace cortiq::model {

// Whether `path` is a single model file (GGUF) rather than a directory.
bool IsModelFile(const std::string& path);

// OK when `path` names a model directory (with config.json) or a regular
// file; NOT_FOUND saying what --model takes otherwise.
absl::Status CheckModelPath(const std::string& path);

// The name a model is served under: the directory's name, or the file's
// name without ".gguf".
std::string ModelName(const std::string& path);

struct ModelTokenizer {
  tokenizer::Tokenizer tokenizer;
  std::string identity;  // bytes that identify the tokenizer (see above)
  // GGUF only: tokenizer.chat_template (empty: none) and the text of its
  // bos / eos tokens (empty when the file names none).
  std::string chat_template;
  std::string bos_token, eos_token;
};

absl::StatusOr<ModelTokenizer> LoadModelTokenizer(const std::string& path);

// Writes the model directory `dir` as one GGUF file at `path` (atomically):
// its weights with matrices stored as `dtype` (F32, F16, BF16 or Q8_0;
// WriteGgufModel) and its tokenizer as convert_hf_to_gguf.py would
// (GgufVocabFromTokenizerJson over tokenizer.json, tokenizer_config.json
// when present, config.json), so llama.cpp and LoadModelTokenizer both read
// it. Holds the whole file image in memory while writing.
absl::Status ExportGgufModel(const std::string& dir, const std::string& path, math::DType dtype);

}  // namespace cortiq::model
