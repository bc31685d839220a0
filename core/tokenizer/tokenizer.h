// Byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json (or a
// GGUF file's embedded vocabulary, gguf_vocab.h), as
// Qwen2 / Qwen2.5 / Qwen3 use it: added tokens matched first (leftmost, then
// longest), NFC normalizer, the Qwen Split pre-tokenizer regex (or GPT-2's
// ByteLevel regex), ByteLevel byte->char mapping, BPE merges by rank;
// ByteLevel decoding. Ids agree with the JS reference encoder
// (@lenml/tokenizers, a transformers.js fork) on tests/tokenizer/data.
//
// Supported tokenizer.json (anything else is an InvalidArgument naming the
// field): model.type "BPE" with vocab and merges ("a b" strings or [a, b]
// pairs), no dropout, no continuing_subword_prefix / end_of_word_suffix, no
// byte_fallback, optional ignore_merges; normalizer null, NFC or a Sequence of
// NFC; pre_tokenizer Sequence[Split(Regex, Isolated, invert=false),
// ByteLevel(add_prefix_space=false, use_regex=false)] with the Qwen2, Llama-3
// or GPT-2 regex, or ByteLevel(add_prefix_space=false, use_regex=true); decoder
// ByteLevel; post_processor null or ByteLevel; truncation and padding null;
// added_tokens with special / lstrip / rstrip (single_word must be false; the
// `normalized` flag is ignored, as the JS reference does).
//
// Invalid UTF-8 passed to Encode is repaired first: each maximal ill-formed
// subpart becomes U+FFFD (what JavaScript's TextDecoder would hand the
// reference). Decode output is always valid UTF-8, repaired the same way.
//
// Thread-safety: after construction all methods are const and thread-safe.
// Copies are cheap and share the immutable tables (a shared_ptr); moves leave
// the source empty (only destruction and assignment are valid on it).
//
// Example:
//   CORTIQ_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::FromFile(path));
//   std::vector<int32_t> ids = tok.Encode("<|im_start|>user\nHi<|im_end|>");
//   std::string text = tok.Decode(ids);
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/tokenizer/tokenizer_spec.h"

namespace cortiq::tokenizer {

namespace internal {
struct TokenizerData;
}  // namespace internal

struct GgufVocab;  // gguf_vocab.h

class Tokenizer {
 public:
  // Reads and parses a tokenizer.json. Errors name the file and the field.
  static absl::StatusOr<Tokenizer> FromFile(const std::string& path);
  // Parses tokenizer.json text; source_name (e.g. the path) prefixes errors.
  // Malformed or hostile JSON yields an error, never a crash.
  static absl::StatusOr<Tokenizer> FromJson(std::string_view json, std::string_view source_name);
  // The tokenizer a GGUF file's embedded vocabulary describes (the
  // tokenizer.ggml.* keys, gathered into a GgufVocab; defined and documented
  // in gguf_vocab.h/.cc). Encodes exactly as the tokenizer.json it was
  // converted from. Errors are InvalidArgument naming source_name (e.g. the
  // GGUF path) and the GGUF key. Cost: linear in the tokens and merges.
  static absl::StatusOr<Tokenizer> FromGgufVocab(const GgufVocab& vocab,
                                                 std::string_view source_name);
  // Builds the tables from a parsed description (tokenizer_spec.h; what
  // FromJson and FromGgufVocab both go through).
  // Errors name source_name and the spec's field names. Cost: linear in the
  // vocabulary and merges; allocates the per-id tables.
  static absl::StatusOr<Tokenizer> FromSpec(TokenizerSpec spec, std::string_view source_name);

  Tokenizer(const Tokenizer&) = default;
  Tokenizer& operator=(const Tokenizer&) = default;
  Tokenizer(Tokenizer&&) noexcept = default;
  Tokenizer& operator=(Tokenizer&&) noexcept = default;
  ~Tokenizer();

  // Token ids of utf8. parse_special=true: special added tokens written in the
  // text (e.g. "<|im_end|>") become their ids; false: they are encoded as
  // plain text. Non-special added tokens (e.g. "<think>") are matched either
  // way, as in HF tokenizers. No BOS/EOS is added. Cost: linear in the input.
  std::vector<int32_t> Encode(std::string_view utf8, bool parse_special = true) const;
  // Same, appending to *ids.
  void EncodeTo(std::string_view utf8, bool parse_special, std::vector<int32_t>* ids) const;

  // Text of ids: ByteLevel tokens become their bytes, added tokens their
  // content; ids outside the vocabulary are skipped. Invalid UTF-8 (a
  // sequence cut between ids) becomes U+FFFD.
  std::string Decode(std::span<const int32_t> ids) const;

  // Max id + 1 over the vocabulary and the added tokens (at least the
  // spec's min_vocab_size: a GGUF vocabulary's token count).
  size_t vocab_size() const;
  // Id of a token string (ByteLevel form for vocab tokens, e.g. "Ġthe"; plain
  // content for added tokens). Added tokens win over vocab entries.
  std::optional<int32_t> TokenId(std::string_view token) const;
  // Token string of id (as in tokenizer.json); empty for an unknown id.
  std::string_view TokenString(int32_t id) const;
  // Raw bytes id stands for (ByteLevel-decoded; the content of an added
  // token); empty for an unknown id. May be an incomplete UTF-8 sequence.
  std::string_view TokenBytes(int32_t id) const;
  // True for added tokens flagged "special".
  bool IsSpecial(int32_t id) const;
  // True for every added token (special or not).
  bool IsAddedToken(int32_t id) const;

  // Ids of the ChatML / end-of-text tokens, when the vocabulary has them.
  std::optional<int32_t> endoftext_id() const;
  std::optional<int32_t> im_start_id() const;
  std::optional<int32_t> im_end_id() const;

 private:
  explicit Tokenizer(std::shared_ptr<const internal::TokenizerData> data);

  std::shared_ptr<const internal::TokenizerData> data_;
};

// tokenizer.json of a pure byte-level tokenizer for tiny / random models: ids
// 0..255 are the ByteLevel tokens of bytes 0..255 (id b stands for byte b), no
// merges, then special_tokens at ids 256, 257, ...; NFC normalizer, the Qwen2
// Split pre-tokenizer + ByteLevel, ByteLevel decoder -- the same code path as
// Qwen3's file. Decode(Encode(s)) == NFC(s) for any valid UTF-8 s.
std::string MakeByteLevelTokenizerJson(const std::vector<std::string>& special_tokens = {
                                           "<|endoftext|>", "<|im_start|>", "<|im_end|>"});

}  // namespace cortiq::tokenizer
