// AssistantOutputParser: reads a chat model's raw output back into the
// OpenAI message fields, as it streams — Qwen3's `<think>…</think>` into
// reasoning_content, `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>`
// into tool_calls, the rest into content.
//
// Text is handed on as soon as it cannot be part of a tag: only a suffix
// that may be the start of `<think>`, `</think>`, `<tool_call>` (or, inside a
// call, anything up to `</tool_call>`) is held back. A tool call is handed
// on whole, once its closing tag arrives (OpenAI streams its arguments in
// pieces; one piece is a valid stream). A call whose body is not a JSON
// object with a string "name" and an object or string "arguments" is left
// as content, tags included, and so is one the output never closes.
//
// Reasoning is recognised only when Options::reasoning (the template thinks
// and the request did not turn it off); tool calls only when Options::tools
// (the request gave tools and tool_choice is not "none"). With neither, every
// byte is content at once.
//
// Thread-compatible (one parser per choice of one request). Push is
// O(text + held) per call.
//
// Example:
//   AssistantOutputParser p({.reasoning = true, .tools = true});
//   AssistantDelta d = p.Push("<think>\nhm</think>\n\nHi");  // reasoning "hm", content "Hi"
//   d = p.Finish();                                           // what was held back
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace cortiq::server::http {

struct ToolCall {
  std::string id;  // "call_" + 24 random hex digits
  std::string name;
  std::string arguments;  // JSON text of the arguments object
};

// What one Push (or Finish) hands on.
struct AssistantDelta {
  std::string content;
  std::string reasoning;
  std::vector<ToolCall> tool_calls;

  bool empty() const { return content.empty() && reasoning.empty() && tool_calls.empty(); }
};

class AssistantOutputParser {
 public:
  struct Options {
    bool reasoning = false;  // read <think>…</think> into reasoning
    // The prompt already opened the think block (Qwen3's generation prompt
    // with thinking on ends in "<think>\n"): the output starts as reasoning.
    bool start_in_reasoning = false;
    bool tools = false;  // read <tool_call>…</tool_call> into tool_calls
  };

  explicit AssistantOutputParser(Options options);

  // The next piece of output text.
  AssistantDelta Push(std::string_view text);
  // The end of the output: whatever was held back, in the mode it was in
  // (an unclosed tool call as content).
  AssistantDelta Finish();

  // Tool calls parsed so far (finish_reason "tool_calls" when > 0).
  size_t tool_calls() const { return tool_calls_; }

 private:
  enum class Mode { kContent, kReasoning, kToolCall };
  // Moves what is decided in buffer_ into `out`; holds back only what may
  // still become a tag.
  void Drain(AssistantDelta& out, bool final);
  void Emit(AssistantDelta& out, std::string_view text);
  // The call between the tags, or false when it is not one (see the banner).
  static bool ParseCall(std::string_view body, ToolCall* call);

  Options options_;
  Mode mode_;
  std::string buffer_;  // undecided text
  // Leading newlines to drop: after <think> and after </think> (the
  // template's layout, not the model's words).
  bool skip_newlines_ = false;
  size_t tool_calls_ = 0;
};

}  // namespace cortiq::server::http
