// A byte-level BPE vocabulary as llama.cpp stores it in GGUF metadata, both
// ways: from a Hugging Face tokenizer.json (+ tokenizer_config.json, and
// optionally config.json), as llama.cpp's convert_hf_to_gguf.py writes it
// (_set_vocab_gpt2 / get_vocab_base, gguf-py SpecialVocab), and to a
// Tokenizer that encodes exactly as the tokenizer.json it came from.
//
// GGUF keys (a GGUF reader / writer maps GgufVocab's fields 1:1; this
// header holds no GGUF-file type, so either side can change alone):
//   tokenizer.ggml.model           string    model         ("gpt2": byte-level BPE)
//   tokenizer.ggml.pre             string    pre           ("qwen2", "llama-bpe", "gpt-2")
//   tokenizer.ggml.tokens          [string]  tokens        (id order; ByteLevel form for
//                                                           normal tokens, raw text else)
//   tokenizer.ggml.token_type      [i32]     token_types   (GgufTokenType values)
//   tokenizer.ggml.merges          [string]  merges        ("left right", rank order)
//   tokenizer.ggml.bos_token_id    u32       bos           (each id key only when set)
//   tokenizer.ggml.eos_token_id    u32       eos
//   tokenizer.ggml.padding_token_id u32      pad
//   tokenizer.ggml.unknown_token_id u32      unk
//   tokenizer.ggml.add_bos_token   bool      add_bos       (only when set: an absent key
//   tokenizer.ggml.add_eos_token   bool      add_eos        means llama.cpp's default)
//   tokenizer.chat_template        string    chat_template (only when non-empty)
//
// What a GGUF vocabulary means here (as llama.cpp's llama-vocab.cpp reads
// it, except where noted):
//   - pre "qwen2" (alias "deepseek-r1-qwen"): the Qwen2 regex, and NFC on
//     text outside added tokens, as Qwen's tokenizer.json does (llama.cpp
//     skips NFC: on non-NFC input its ids differ from HF's; ours do not);
//     "llama-bpe" ("llama3", "llama-v3"): the Llama-3 regex with
//     ignore_merges; "gpt-2": GPT-2's regex. "default" or absent is refused:
//     llama.cpp then splits with four regexes in a row, which no HF
//     tokenizer.json we support does.
//   - token types: normal (1) tokens form the BPE vocabulary; control (3)
//     and unknown (2) tokens are added tokens matched only with
//     parse_special; user-defined (4) ones are always matched; unused (5)
//     ids encode to nothing and decode to nothing; byte (6) and undefined
//     (0) are refused (SentencePiece only). Added tokens are found
//     leftmost-longest, as HF does (llama.cpp takes the longest token first
//     over the whole text; the two differ only when added tokens overlap).
//     GGUF has no lstrip / rstrip / single_word: none are applied.
//   - convert_hf_to_gguf.py marks an added token that HF calls non-special
//     as control when it looks special ("<|...|>", "<pad>", "<mask>", ...):
//     for Qwen3 that is <|fim_*|>, <|repo_name|>, <|file_sep|>. From GGUF
//     these are matched only with parse_special (HF matches them always).
//
// Contract: pure functions, thread-safe. Errors are InvalidArgument
// "<source>: <field>: <message>" naming the tokenizer.json / GGUF key.
// Costs: linear in the vocabulary and merges (Qwen3: 151k tokens, 151k
// merges, ~10 MB of strings, tens of ms).
//
// Example:
//   CORTIQ_ASSIGN_OR_RETURN(GgufVocab vocab,
//       GgufVocabFromTokenizerJson(tokenizer_json, tokenizer_config_json, config_json));
//   ... write vocab's fields as the GGUF keys above; later, read them back ...
//   CORTIQ_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::FromGgufVocab(vocab, "model.gguf"));
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/tokenizer/tokenizer.h"

namespace cortiq::tokenizer {

// tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
enum class GgufTokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

struct GgufVocab {
  std::string model;                 // tokenizer.ggml.model
  std::string pre;                   // tokenizer.ggml.pre
  std::vector<std::string> tokens;   // tokenizer.ggml.tokens, (n_tokens)
  std::vector<int32_t> token_types;  // tokenizer.ggml.token_type, (n_tokens); empty: all normal
  std::vector<std::string> merges;   // tokenizer.ggml.merges, rank order
  // tokenizer.ggml.*_token_id (u32 in the file: a reader narrows a value
  // above INT32_MAX to an id FromGgufVocab refuses, e.g. -1).
  std::optional<int32_t> bos, eos, pad, unk;
  std::optional<bool> add_bos, add_eos;  // tokenizer.ggml.add_{bos,eos}_token
  std::string chat_template;             // tokenizer.chat_template; empty: absent
};

// Limits on a GGUF vocabulary (hostile files): ids fit the tokenizer's
// tables, and the strings its pools.
inline constexpr int64_t kMaxGgufTokens = int64_t{1} << 24;
inline constexpr int64_t kMaxGgufMerges = int64_t{1} << 24;
inline constexpr int64_t kMaxGgufVocabBytes = int64_t{1} << 30;  // tokens + merges

// What convert_hf_to_gguf.py writes for this tokenizer. tokenizer_config_json
// gives the special tokens ({bos,eos,pad,unk}_token, matched against
// added_tokens by content), add_{bos,eos}_token and chat_template; it may be
// empty. config_json (may be empty) gives vocab_size -- ids from the
// tokenizer's size up to it become "[PAD<id>]" unused tokens, so the count
// matches the embedding rows -- and {bos,eos,pad,unk}_token_id where the
// tokenizer config names none. Refused (no GGUF equivalent): a pre-tokenizer
// whose regex / NFC / ignore_merges combination is not one of the three
// above, lstrip / rstrip added tokens, merges containing a space, a
// chat_template that is not a string.
absl::StatusOr<GgufVocab> GgufVocabFromTokenizerJson(std::string_view tokenizer_json,
                                                     std::string_view tokenizer_config_json,
                                                     std::string_view config_json = {});

// Tokenizer::FromGgufVocab(vocab, source_name) (tokenizer.h) builds the
// tokenizer a GGUF vocabulary describes (see above); source_name (e.g. the
// GGUF path) prefixes errors. It checks everything a hostile file could get
// wrong: model and pre, token / type counts, empty, invalid-UTF-8 or
// duplicate tokens, size limits, merges naming unknown tokens, special ids
// out of range.

}  // namespace cortiq::tokenizer
