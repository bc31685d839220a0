// The answers of the OpenAI-compatible endpoints, built from a job's events:
// one whole JSON body, or SSE chunks as the events arrive.
//
//   completions: {"id":"cmpl-…","object":"text_completion","created","model",
//                 "choices":[{"index","text","logprobs","finish_reason"}],"usage"}
//     logprobs (legacy): {"tokens","token_logprobs","top_logprobs","text_offset"}
//       (a token that is not UTF-8 alone, in tokens and as a key: "bytes:\xNN...")
//   chat:        {"id":"chatcmpl-…","object":"chat.completion","created","model",
//                 "choices":[{"index","message":{"role","content",
//                   "reasoning_content"?,"tool_calls"?},"logprobs","finish_reason"}],"usage"}
//     logprobs: {"content":[{"token","logprob","bytes","top_logprobs"}]}
//   usage: {"prompt_tokens","completion_tokens","total_tokens",
//           "prompt_tokens_details":{"cached_tokens"}}
//   stream: "data: {chunk}\n\n" per piece (object "text_completion" /
//   "chat.completion.chunk", chat deltas role / content / reasoning_content
//   / tool_calls), a chunk per choice with its finish_reason, with
//   stream_options.include_usage one more with "choices": [] and the usage,
//   then "data: [DONE]\n\n". An error after the stream began is one
//   "data: {"error": …}\n\n" chunk, then [DONE].
//
// finish_reason: length → "length"; stop or end of sequence → "stop"; a
// parsed tool call → "tool_calls".
//
// Strings from the model (token bytes, text) may be any bytes: every JSON
// dump replaces what is not UTF-8 by U+FFFD, so a body always parses.
//
// Thread-compatible: one builder per request, used by the thread that
// writes its answer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/session/engine.h"
#include "core/tokenizer/tokenizer.h"
#include "server/http/api_error.h"
#include "server/http/assistant_output.h"
#include "server/http/openai_request.h"

namespace cortiq::server::http {

class ResponseBuilder {
 public:
  enum class Kind { kCompletion, kChat };

  // `parse`: how chat output is read back (ignored for completions).
  ResponseBuilder(Kind kind, const tokenizer::Tokenizer& tokenizer, std::string model,
                  OutputOptions out, AssistantOutputParser::Options parse);

  // SSE text to send first (chat: each choice's role delta), or "".
  std::string StreamStart();
  // Takes one event. Streaming: returns its SSE chunk ("" when nothing is
  // decided yet); else only accumulates and returns "".
  std::string Add(session::GenerationEvent ev);
  // Streaming: the final chunks (held-back text, finish reasons, usage) and
  // [DONE]; `r` must be OK.
  std::string StreamEnd(const session::GenerationResult& r);
  // An error after the stream began: its chunk and [DONE].
  static std::string StreamError(const ApiError& e);
  // Not streaming: the whole body; `r` must be OK.
  std::string Body(const session::GenerationResult& r);

 private:
  struct LogprobEntry {
    int32_t id = 0;
    float logprob = 0;
    std::vector<model::TokenLogprob> top;
  };
  struct Choice {
    explicit Choice(AssistantOutputParser::Options o) : parser(o) {}
    AssistantOutputParser parser;
    std::string text;  // completions: all of it; chat: content
    std::string reasoning;
    std::vector<ToolCall> tool_calls;
    std::vector<LogprobEntry> logprobs;
    size_t text_bytes = 0;  // completions' text_offset: bytes of tokens so far
    std::vector<size_t> text_offset;
  };

  Choice& ChoiceAt(uint32_t index);
  nlohmann::ordered_json Head(bool chunk) const;
  nlohmann::ordered_json Usage(const session::GenerationResult& r) const;
  std::string FinishReason(const session::GenerationResult& r, size_t index) const;
  // The logprobs of entries [from, to) of a choice, in the endpoint's shape.
  nlohmann::ordered_json Logprobs(const Choice& c, size_t from, size_t to) const;
  nlohmann::ordered_json TokenJson(int32_t id, float logprob) const;
  // A chat delta object from a parser's output (tool calls numbered from
  // `first_call`).
  static nlohmann::ordered_json Delta(const AssistantDelta& d, size_t first_call);
  std::string Sse(const nlohmann::ordered_json& chunk) const;
  // One streamed chunk holding `choice` (with "usage": null under
  // include_usage), as SSE.
  std::string ChunkSse(nlohmann::ordered_json choice) const;
  // Ends a chat choice's parser: what it held back joins the choice's
  // content / reasoning / tool calls and is returned (its tool calls
  // numbered from *first_call).
  static AssistantDelta FinishChoice(Choice& c, size_t* first_call);

  const Kind kind_;
  const tokenizer::Tokenizer& tokenizer_;
  const std::string model_;
  const OutputOptions out_;
  const AssistantOutputParser::Options parse_;
  const std::string id_;
  const int64_t created_;
  std::vector<Choice> choices_;
};

}  // namespace cortiq::server::http
