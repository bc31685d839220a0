// Streaming detokenizer. See detokenizer.h.

#include "core/tokenizer/detokenizer.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/tokenizer/unicode.h"

namespace cortiq::tokenizer {

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer)
    : tokenizer_(tokenizer) {}

std::string IncrementalDetokenizer::Push(int32_t id) {
  std::string out;
  PushTo(id, &out);
  return out;
}

void IncrementalDetokenizer::PushTo(int32_t id, std::string* out) {
  std::string_view bytes = tokenizer_.TokenBytes(id);
  if (bytes.empty()) return;
  if (pending_length_ > 0) {
    // Resolve the held-back character with the first new bytes: it completes,
    // stays incomplete (all new bytes consumed), or turns out ill-formed.
    char buffer[4];
    std::memcpy(buffer, pending_, pending_length_);
    const size_t take = std::min<size_t>(4 - pending_length_, bytes.size());
    std::memcpy(buffer + pending_length_, bytes.data(), take);
    const std::string_view head(buffer, pending_length_ + take);
    const size_t tail = IncompleteUtf8TailLength(head);
    if (tail == head.size()) {  // still incomplete; only possible if take == bytes.size()
      std::memcpy(pending_, buffer, head.size());
      pending_length_ = static_cast<uint8_t>(head.size());
      return;
    }
    // The first character of head is now complete or ill-formed.
    bool well_formed = false;
    const size_t length = NextUtf8Sequence(head, 0, &well_formed);
    if (well_formed) {
      out->append(head.data(), length);
    } else {
      AppendUtf8(kReplacementChar, out);
    }
    // length >= pending_length_: the held-back bytes are a valid prefix.
    bytes.remove_prefix(length - pending_length_);
    pending_length_ = 0;
  }
  const size_t tail = IncompleteUtf8TailLength(bytes);
  AppendSanitizedUtf8(bytes.substr(0, bytes.size() - tail), out);
  std::memcpy(pending_, bytes.data() + bytes.size() - tail, tail);
  pending_length_ = static_cast<uint8_t>(tail);
}

std::string IncrementalDetokenizer::Flush() {
  std::string out;
  if (pending_length_ > 0) AppendUtf8(kReplacementChar, &out);
  pending_length_ = 0;
  return out;
}

absl::Status IncrementalDetokenizer::RestorePending(std::string_view bytes) {
  if (bytes.size() > 3 || IncompleteUtf8TailLength(bytes) != bytes.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("IncrementalDetokenizer::RestorePending: ", bytes.size(),
                     " bytes are not a proper prefix of a UTF-8 character"));
  }
  std::memcpy(pending_, bytes.data(), bytes.size());
  pending_length_ = static_cast<uint8_t>(bytes.size());
  return absl::OkStatus();
}

}  // namespace cortiq::tokenizer
