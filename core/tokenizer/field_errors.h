// Error text for the tokenizer loaders (tokenizer.json, GGUF vocabularies):
// "<source>: <field>: <message>" as absl::InvalidArgumentError, and Cat(), a
// string concatenation of text and integers (absl::StrCat is avoided: this
// Abseil build's string_view is not std::string_view).
//
// Contract: header-only, no state beyond the source name; thread-compatible.
//
// Example:
//   const internal::FieldErrors errors("model.gguf");
//   return errors.Field(internal::Cat("tokenizer.ggml.merges[", i, "]"), "unknown token");
#pragma once

#include <concepts>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace cortiq::tokenizer::internal {

inline void AppendPiece(std::string* out, std::string_view piece) { out->append(piece); }
template <std::integral T>
inline void AppendPiece(std::string* out, T value) {
  out->append(std::to_string(value));
}
template <typename... Args>
std::string Cat(const Args&... args) {
  std::string out;
  (AppendPiece(&out, args), ...);
  return out;
}

class FieldErrors {
 public:
  explicit FieldErrors(std::string_view source) : source_(source) {}
  absl::Status Field(std::string_view field, std::string_view message) const {
    return absl::InvalidArgumentError(Cat(source_, ": ", field, ": ", message));
  }
  absl::Status General(std::string_view message) const {
    return absl::InvalidArgumentError(Cat(source_, ": ", message));
  }

 private:
  std::string source_;
};

}  // namespace cortiq::tokenizer::internal
