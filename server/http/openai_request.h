// The request bodies of the OpenAI-compatible endpoints, read into what the
// engine takes (session::GenerationRequest) and what the answer needs
// (OutputOptions). Field by field as the OpenAI API reference has them, plus
// the extensions vLLM accepts (top_k, min_p, repetition_penalty, ignore_eos,
// min_tokens, stop_token_ids, chat_template_kwargs, add_generation_prompt),
// and Cortiq's own priority.
// Unknown fields are ignored, as the reference's servers do.
//
// Only the JSON is read here: a field of the wrong type, or a value the API
// itself rules out (prompt as a list of several prompts, echo, best_of > 1,
// tool_choice "required", response_format json_*), is INVALID_ARGUMENT
// "<field>: ..." (server/http/api_error.h turns the prefix into `param`).
// Every limit of a value (max_tokens, temperature, stop, n, top_logprobs,
// the context, ...) is left to the one request plan (session::PlanRequest),
// which the handler runs: never a second copy of it here.
//
// All functions are pure and thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/session/request_plan.h"
#include "nlohmann/json.hpp"

namespace cortiq::server::http {

using Json = nlohmann::ordered_json;  // member order is part of a rendered prompt (tool schemas)

// How the answer is shaped.
struct OutputOptions {
  bool stream = false;         // SSE chunks, then "data: [DONE]"
  bool include_usage = false;  // stream_options.include_usage: a last chunk with usage
  bool logprobs = false;       // answer logprobs (chat: content[]; completions: legacy shape)
  uint32_t top_logprobs = 0;
  size_t n = 1;
};

// The controls both endpoints share. `g` holds everything but the prompt;
// g.max_tokens is only meaningful when max_tokens is set.
struct CommonRequest {
  session::GenerationRequest g;
  std::optional<size_t> max_tokens;  // max_tokens / max_completion_tokens when given
  bool seed_given = false;
  std::string model;  // "" when absent
  std::string user;   // "" when absent
  OutputOptions out;
};

// A request body's JSON, read at a cost linear in its size. Json keeps an
// object's members in order (ordered_map) and finds each member it reads
// among the ones before it, so building a body of many-membered objects costs
// the square of their sizes: 100,000 logit_bias entries (1.2 MB) took 16 s of
// an HTTP thread. The body is therefore built by one SAX pass that checks
// each event first and stops at one nested deeper than kMaxBodyDepth,
// an object of more than kMaxObjectMembers members, or objects whose members
// would cost more than kMaxMemberScan key comparisons in all. Every refusal
// is INVALID_ARGUMENT "body: ..." naming the limit; JSON that does not parse
// is "body: not valid JSON".
inline constexpr size_t kMaxBodyDepth = 128;
inline constexpr size_t kMaxObjectMembers = 2048;
inline constexpr uint64_t kMaxMemberScan = uint64_t{1} << 24;
absl::StatusOr<Json> ParseBody(std::string_view body);

// Reads model, stream, stream_options, max_tokens (chat: also
// max_completion_tokens, which wins), temperature, top_p, seed, stop, n,
// presence_penalty, frequency_penalty, logit_bias, user, top_k, min_p,
// repetition_penalty, ignore_eos, min_tokens, stop_token_ids, and ours:
// priority ("low" | "normal" | "high"; an integer is refused). `chat`
// selects the logprobs shape (chat: logprobs bool + top_logprobs;
// completions: logprobs = the number of top entries).
absl::StatusOr<CommonRequest> ParseCommon(const Json& body, bool chat);

// A completions prompt: text, or token ids.
struct CompletionPrompt {
  std::optional<std::string> text;
  std::vector<int32_t> ids;
};
// prompt as a string, a list of one string, a list of token ids, or a list
// of one such list; several prompts, echo, suffix and best_of > 1 are
// refused ("not supported yet").
absl::StatusOr<CompletionPrompt> ParseCompletionPrompt(const Json& body);

// What a chat template renders, and how the output is read back.
struct ChatRequest {
  Json messages = Json::array();  // contents as strings (text parts joined; null → "")
  Json tools;                     // null: none (or tool_choice "none")
  bool add_generation_prompt = true;
  Json template_kwargs = Json::object();  // chat_template_kwargs
  bool parse_tools = false;               // tools given and tool_choice auto: parse <tool_call>
  bool thinking = true;                   // chat_template_kwargs.enable_thinking (default true)
};
// messages (system / developer / user / assistant / tool; content a string,
// null (an assistant's; rendered as ""), or a list of {"type":"text"} parts; assistant tool_calls;
// tool messages with tool_call_id), tools, tool_choice ("none" | "auto"; "required" / a named
// function refused), response_format ({"type":"text"}; json_object / json_schema refused),
// chat_template_kwargs, add_generation_prompt.
absl::StatusOr<ChatRequest> ParseChat(const Json& body);

// The session id of the conversation `name` in `tenant`: `name` itself when
// it has the store's id form (SessionStore::IsIdForm), else the first 32 hex
// digits of SHA-256(tenant "\0" name) — names are per tenant and ids keep
// the cluster's form.
std::string ConversationSessionId(std::string_view tenant, std::string_view name);

}  // namespace cortiq::server::http
