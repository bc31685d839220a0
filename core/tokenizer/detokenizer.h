// Streaming detokenizer: turns ids, one at a time, into text that never ends
// inside a UTF-8 character. Bytes of an incomplete character are held back
// until the next ids complete it (or prove it invalid).
//
// Guarantee: the concatenation of Push(id_1) ... Push(id_n) and Flush() equals
// Tokenizer::Decode({id_1 ... id_n}), and every returned string is valid UTF-8.
// Ill-formed sequences become U+FFFD exactly as in Decode.
//
// Migration: pending_bytes() (0..3 bytes, a proper prefix of a UTF-8
// character) is the whole stream state; RestorePending() on a detokenizer
// built from the same tokenizer.json resumes the stream on another server.
//
// Thread-safety: one stream per object, not thread-safe (thread-compatible).
// It shares the tokenizer's immutable tables, so the Tokenizer it was built
// from may be moved or destroyed. Push allocates nothing beyond the returned
// string (PushTo: nothing beyond growing *out).
//
// Example:
//   IncrementalDetokenizer detok(tokenizer);
//   for (int32_t id : generated) SendToClient(detok.Push(id));
//   SendToClient(detok.Flush());
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "core/tokenizer/tokenizer.h"

namespace cortiq::tokenizer {

class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer);

  // Text completed by id (possibly empty). Unknown ids contribute nothing.
  std::string Push(int32_t id);
  // Same, appended to *out.
  void PushTo(int32_t id, std::string* out);
  // Ends the stream: U+FFFD if a character was left incomplete, else "".
  // The detokenizer is then empty and can start a new stream.
  std::string Flush();

  // Bytes held back (a proper prefix of a UTF-8 character, at most 3 bytes).
  std::string_view pending_bytes() const { return std::string_view(pending_, pending_length_); }
  // Replaces the held-back bytes with an exported pending_bytes() value.
  // InvalidArgument (state unchanged) unless bytes is empty or a proper prefix
  // of a well-formed UTF-8 character.
  absl::Status RestorePending(std::string_view bytes);
  // Drops held-back bytes.
  void Reset() { pending_length_ = 0; }

 private:
  Tokenizer tokenizer_;  // shares the immutable tables
  char pending_[4] = {};
  uint8_t pending_length_ = 0;
};

}  // namespace cortiq::tokenizer
