#include "server/http/assistant_output.h"

#include <algorithm>
#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace cortiq::server::http {

namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";

// The length of the longest suffix of `text` that is a proper prefix of `tag`.
size_t HeldFor(std::string_view text, std::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n) {
    if (text.substr(text.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}

std::string CallId() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return absl::StrFormat("call_%016x%08x", rng(), static_cast<uint32_t>(rng()));
}

}  // namespace

AssistantOutputParser::AssistantOutputParser(Options options)
    : options_(options),
      mode_(options.reasoning && options.start_in_reasoning ? Mode::kReasoning : Mode::kContent),
      skip_newlines_(mode_ == Mode::kReasoning) {}

AssistantDelta AssistantOutputParser::Push(std::string_view text) {
  AssistantDelta out;
  buffer_.append(text);
  Drain(out, /*final=*/false);
  return out;
}

AssistantDelta AssistantOutputParser::Finish() {
  AssistantDelta out;
  Drain(out, /*final=*/true);
  return out;
}

void AssistantOutputParser::Emit(AssistantDelta& out, std::string_view text) {
  if (mode_ == Mode::kReasoning) {
    out.reasoning.append(text);
  } else {
    out.content.append(text);
  }
}

bool AssistantOutputParser::ParseCall(std::string_view body, ToolCall* call) {
  const absl::string_view trimmed =
      absl::StripAsciiWhitespace(absl::string_view(body.data(), body.size()));
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(trimmed.begin(), trimmed.end(), nullptr,
                                                           /*allow_exceptions=*/false);
  if (!j.is_object()) return false;
  auto name = j.find("name");
  if (name == j.end() || !name->is_string()) return false;
  auto args = j.find("arguments");
  std::string arguments = "{}";
  if (args != j.end()) {
    if (args->is_object()) {
      arguments = args->dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    } else if (args->is_string()) {
      arguments = args->get<std::string>();
    } else {
      return false;
    }
  }
  call->id = CallId();
  call->name = name->get<std::string>();
  call->arguments = std::move(arguments);
  return true;
}

void AssistantOutputParser::Drain(AssistantDelta& out, bool final) {
  for (;;) {
    if (skip_newlines_) {
      const size_t keep = buffer_.find_first_not_of('\n');
      if (keep == std::string::npos) {
        buffer_.clear();
        return;  // still skipping: the next text may start with more
      }
      buffer_.erase(0, keep);
      skip_newlines_ = false;
    }
    if (mode_ == Mode::kToolCall) {
      const size_t close = buffer_.find(kCallClose);
      if (close == std::string::npos) {
        if (final) {  // never closed: the model's text, as it was
          out.content.append(kCallOpen).append(buffer_);
          buffer_.clear();
          mode_ = Mode::kContent;
        }
        return;
      }
      ToolCall call;
      if (ParseCall(std::string_view(buffer_).substr(0, close), &call)) {
        out.tool_calls.push_back(std::move(call));
        ++tool_calls_;
      } else {
        out.content.append(kCallOpen).append(buffer_, 0, close).append(kCallClose);
      }
      buffer_.erase(0, close + kCallClose.size());
      mode_ = Mode::kContent;
      continue;
    }
    // Content or reasoning: the tags that end this mode.
    std::vector<std::string_view> tags;
    if (mode_ == Mode::kReasoning) {
      tags.push_back(kThinkClose);
    } else {
      if (options_.reasoning) tags.push_back(kThinkOpen);
      if (options_.tools) tags.push_back(kCallOpen);
    }
    size_t at = std::string::npos;
    std::string_view tag;
    for (std::string_view t : tags) {
      const size_t p = buffer_.find(t);
      if (p < at) {
        at = p;
        tag = t;
      }
    }
    if (at == std::string::npos) {
      size_t held = 0;
      if (!final) {
        for (std::string_view t : tags) held = std::max(held, HeldFor(buffer_, t));
      }
      Emit(out, std::string_view(buffer_).substr(0, buffer_.size() - held));
      buffer_.erase(0, buffer_.size() - held);
      return;
    }
    Emit(out, std::string_view(buffer_).substr(0, at));
    buffer_.erase(0, at + tag.size());
    if (tag == kThinkOpen) {
      mode_ = Mode::kReasoning;
      skip_newlines_ = true;
    } else if (tag == kThinkClose) {
      mode_ = Mode::kContent;
      skip_newlines_ = true;
    } else {
      mode_ = Mode::kToolCall;
    }
  }
}

}  // namespace cortiq::server::http
