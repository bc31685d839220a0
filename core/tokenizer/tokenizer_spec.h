// The format-independent description of a byte-level BPE tokenizer: what
// tokenizer.json is parsed into (ParseTokenizerJson) and what a GGUF
// vocabulary is mapped to (gguf_vocab.h); Tokenizer::FromSpec builds the
// tables from it. Keeping the two sources apart from the build means both
// give the same Tokenizer for the same content, by construction.
//
// Contract: plain data, no invariants until Tokenizer::FromSpec checks them
// (ByteLevel alphabet present, ids unique and in [0, 2^24), every merge
// naming vocab tokens whose concatenation is a vocab token). Memory: the
// strings of the whole vocabulary (~10 MB for Qwen3's 151k tokens).
//
// Example:
//   CORTIQ_ASSIGN_OR_RETURN(TokenizerSpec spec, ParseTokenizerJson(json, path));
//   CORTIQ_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::FromSpec(std::move(spec), path));
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/tokenizer/pre_tokenizer.h"

namespace cortiq::tokenizer {

// A token matched in the text before pre-tokenization (HF "added token").
struct AddedToken {
  std::string content;  // raw UTF-8 text, non-empty
  int32_t id = 0;
  bool special = false;  // matched only when Encode's parse_special is true
  bool lstrip = false;   // swallows whitespace on its left
  bool rstrip = false;   // swallows whitespace on its right
};

struct TokenizerSpec {
  bool nfc = false;  // NFC normalizer on text outside added tokens
  PreTokenizerPattern pattern = PreTokenizerPattern::kQwen2;
  std::vector<std::pair<std::string, int32_t>> vocab;       // (ByteLevel string, id)
  std::vector<std::pair<std::string, std::string>> merges;  // (left, right), rank order
  // A pre-token that is itself a vocab token is emitted as is (Llama 3).
  bool ignore_merges = false;
  std::vector<AddedToken> added;  // later entries with the same content win
  // The tables span at least this many ids (GGUF: the token count, unused
  // padding ids included); ids with no token decode to nothing.
  int32_t min_vocab_size = 0;
  // Source field names used in errors that FromSpec reports.
  std::string vocab_field = "model.vocab";
  std::string merges_field = "model.merges";
};

// Parses tokenizer.json text (see tokenizer.h for what is supported); errors
// are InvalidArgument "<source_name>: <field>: ...". Malformed or hostile JSON
// yields an error, never a crash. Cost: linear in the text; the JSON DOM is
// freed before returning.
absl::StatusOr<TokenizerSpec> ParseTokenizerJson(std::string_view json,
                                                 std::string_view source_name);

}  // namespace cortiq::tokenizer
