#include "server/http/openai_response.h"

#include <chrono>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/tokenizer/unicode.h"

namespace cortiq::server::http {

namespace {

using OJson = nlohmann::ordered_json;

std::string ResponseId(ResponseBuilder::Kind kind) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return absl::StrFormat("%s-%016x%016x",
                         kind == ResponseBuilder::Kind::kChat ? "chatcmpl" : "cmpl", rng(), rng());
}

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string Dump(const OJson& j) { return j.dump(-1, ' ', false, OJson::error_handler_t::replace); }

// A token in the legacy completions logprobs (`tokens`, the `top_logprobs`
// keys): its bytes when they are UTF-8, else "bytes:\xNN..." as OpenAI
// writes a piece of a character. Dump would turn every such piece into the
// same U+FFFD, and as keys of one object they would overwrite each other.
std::string LegacyToken(std::string_view bytes) {
  if (tokenizer::IsValidUtf8(bytes)) return std::string(bytes);
  std::string s = "bytes:";
  for (unsigned char c : bytes) absl::StrAppendFormat(&s, "\\x%02x", c);
  return s;
}

}  // namespace

ResponseBuilder::ResponseBuilder(Kind kind, const tokenizer::Tokenizer& tokenizer,
                                 std::string model, OutputOptions out,
                                 AssistantOutputParser::Options parse)
    : kind_(kind),
      tokenizer_(tokenizer),
      model_(std::move(model)),
      out_(out),
      parse_(kind == Kind::kChat ? parse : AssistantOutputParser::Options{}),
      id_(ResponseId(kind)),
      created_(UnixSeconds()) {
  for (size_t i = 0; i < std::max<size_t>(out_.n, 1); ++i) choices_.emplace_back(parse_);
}

ResponseBuilder::Choice& ResponseBuilder::ChoiceAt(uint32_t index) {
  // The engine numbers choices 0 .. n-1; anything else is a bug, kept
  // harmless by growing.
  while (choices_.size() <= index) choices_.emplace_back(parse_);
  return choices_[index];
}

OJson ResponseBuilder::Head(bool chunk) const {
  OJson j;
  j["id"] = id_;
  j["object"] = kind_ == Kind::kChat ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                     : "text_completion";
  j["created"] = created_;
  j["model"] = model_;
  return j;
}

OJson ResponseBuilder::Usage(const session::GenerationResult& r) const {
  OJson u;
  u["prompt_tokens"] = r.prompt_tokens;
  u["completion_tokens"] = r.completion_tokens;
  u["total_tokens"] = r.prompt_tokens + r.completion_tokens;
  u["prompt_tokens_details"] = OJson{{"cached_tokens", r.cached_tokens}};
  return u;
}

std::string ResponseBuilder::FinishReason(const session::GenerationResult& r, size_t index) const {
  if (index < choices_.size() && choices_[index].parser.tool_calls() > 0) return "tool_calls";
  session::FinishReason f = r.finish_reason;
  if (index < r.choices.size()) f = r.choices[index].finish_reason;
  return f == session::FinishReason::kLength ? "length" : "stop";
}

OJson ResponseBuilder::TokenJson(int32_t id, float logprob) const {
  const std::string_view bytes = tokenizer_.TokenBytes(id);
  OJson t;
  t["token"] = std::string(bytes);
  t["logprob"] = logprob;
  OJson b = OJson::array();
  for (unsigned char c : bytes) b.push_back(static_cast<int>(c));
  t["bytes"] = std::move(b);
  return t;
}

OJson ResponseBuilder::Logprobs(const Choice& c, size_t from, size_t to) const {
  if (kind_ == Kind::kChat) {
    OJson content = OJson::array();
    for (size_t i = from; i < to; ++i) {
      const LogprobEntry& e = c.logprobs[i];
      OJson t = TokenJson(e.id, e.logprob);
      OJson top = OJson::array();
      for (const auto& alt : e.top) top.push_back(TokenJson(alt.id, alt.logprob));
      t["top_logprobs"] = std::move(top);
      content.push_back(std::move(t));
    }
    return OJson{{"content", std::move(content)}};
  }
  OJson tokens = OJson::array(), lps = OJson::array(), tops = OJson::array(),
        offsets = OJson::array();
  for (size_t i = from; i < to; ++i) {
    const LogprobEntry& e = c.logprobs[i];
    tokens.push_back(LegacyToken(tokenizer_.TokenBytes(e.id)));
    lps.push_back(e.logprob);
    OJson top = OJson::object();
    for (const auto& alt : e.top) {
      // Two tokens with the same bytes share a key: the likelier (first) one's.
      const std::string key = LegacyToken(tokenizer_.TokenBytes(alt.id));
      if (!top.contains(key)) top[key] = alt.logprob;
    }
    tops.push_back(std::move(top));
    offsets.push_back(c.text_offset[i]);
  }
  OJson j;
  j["tokens"] = std::move(tokens);
  j["token_logprobs"] = std::move(lps);
  j["top_logprobs"] = std::move(tops);
  j["text_offset"] = std::move(offsets);
  return j;
}

OJson ResponseBuilder::Delta(const AssistantDelta& d, size_t first_call) {
  OJson delta = OJson::object();
  if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
  if (!d.content.empty()) delta["content"] = d.content;
  if (!d.tool_calls.empty()) {
    OJson calls = OJson::array();
    for (size_t k = 0; k < d.tool_calls.size(); ++k) {
      const ToolCall& c = d.tool_calls[k];
      calls.push_back(OJson{{"index", first_call + k},
                            {"id", c.id},
                            {"type", "function"},
                            {"function", OJson{{"name", c.name}, {"arguments", c.arguments}}}});
    }
    delta["tool_calls"] = std::move(calls);
  }
  return delta;
}

std::string ResponseBuilder::Sse(const OJson& chunk) const {
  return absl::StrCat("data: ", Dump(chunk), "\n\n");
}

std::string ResponseBuilder::ChunkSse(OJson choice) const {
  OJson chunk = Head(true);
  chunk["choices"] = OJson::array({std::move(choice)});
  if (out_.include_usage) chunk["usage"] = nullptr;
  return Sse(chunk);
}

AssistantDelta ResponseBuilder::FinishChoice(Choice& c, size_t* first_call) {
  AssistantDelta d = c.parser.Finish();
  c.text += d.content;
  c.reasoning += d.reasoning;
  *first_call = c.tool_calls.size();
  for (const ToolCall& call : d.tool_calls) c.tool_calls.push_back(call);
  return d;
}

std::string ResponseBuilder::StreamStart() {
  if (kind_ != Kind::kChat) return "";
  std::string out;
  for (size_t i = 0; i < choices_.size(); ++i) {
    OJson choice;
    choice["index"] = i;
    choice["delta"] = OJson{{"role", "assistant"}, {"content", ""}};
    choice["logprobs"] = nullptr;
    choice["finish_reason"] = nullptr;
    out += ChunkSse(std::move(choice));
  }
  return out;
}

std::string ResponseBuilder::Add(session::GenerationEvent ev) {
  Choice& c = ChoiceAt(ev.index);
  const size_t lp_from = c.logprobs.size();
  // The end token is not in the text: OpenAI's logprobs list the content's
  // tokens only, so that their texts join up to it.
  if (out_.logprobs && ev.logprobs && !ev.end_token) {
    c.logprobs.push_back({ev.token_id, ev.logprobs->chosen.logprob, std::move(ev.logprobs->top)});
    c.text_offset.push_back(c.text_bytes);
  }
  if (!ev.end_token) c.text_bytes += tokenizer_.TokenBytes(ev.token_id).size();
  AssistantDelta d;
  if (kind_ == Kind::kChat) {
    d = c.parser.Push(ev.text);
    c.text += d.content;
    c.reasoning += d.reasoning;
  } else {
    c.text += ev.text;
  }
  const size_t first_call = c.tool_calls.size();
  for (const ToolCall& call : d.tool_calls) c.tool_calls.push_back(call);
  if (!out_.stream) return "";
  const bool has_lp = c.logprobs.size() > lp_from;
  OJson choice;
  choice["index"] = ev.index;
  if (kind_ == Kind::kChat) {
    if (d.empty() && !has_lp) return "";
    choice["delta"] = Delta(d, first_call);
  } else {
    if (ev.text.empty() && !has_lp) return "";
    choice["text"] = ev.text;
  }
  choice["logprobs"] = has_lp ? Logprobs(c, lp_from, c.logprobs.size()) : OJson();
  choice["finish_reason"] = nullptr;
  return ChunkSse(std::move(choice));
}

std::string ResponseBuilder::StreamEnd(const session::GenerationResult& r) {
  std::string out;
  for (size_t i = 0; i < choices_.size(); ++i) {
    Choice& c = choices_[i];
    OJson choice;
    choice["index"] = i;
    if (kind_ == Kind::kChat) {
      size_t first_call = 0;
      const AssistantDelta d = FinishChoice(c, &first_call);
      choice["delta"] = Delta(d, first_call);
    } else {
      choice["text"] = "";
    }
    choice["logprobs"] = nullptr;
    choice["finish_reason"] = FinishReason(r, i);
    out += ChunkSse(std::move(choice));
  }
  if (out_.include_usage) {
    OJson chunk = Head(true);
    chunk["choices"] = OJson::array();
    chunk["usage"] = Usage(r);
    out += Sse(chunk);
  }
  out += "data: [DONE]\n\n";
  return out;
}

std::string ResponseBuilder::StreamError(const ApiError& e) {
  return absl::StrCat("data: ", ErrorJson(e), "\n\ndata: [DONE]\n\n");
}

std::string ResponseBuilder::Body(const session::GenerationResult& r) {
  OJson body = Head(false);
  OJson choices = OJson::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    Choice& c = choices_[i];
    OJson choice;
    choice["index"] = i;
    if (kind_ == Kind::kChat) {
      size_t first_call = 0;
      FinishChoice(c, &first_call);
      OJson message;
      message["role"] = "assistant";
      // With tool calls and nothing but layout around them, content is null
      // (as OpenAI answers a pure tool call).
      const bool blank = c.text.find_first_not_of(" \t\r\n") == std::string::npos;
      message["content"] = c.tool_calls.empty() || !blank ? OJson(c.text) : OJson();
      if (!c.reasoning.empty()) message["reasoning_content"] = c.reasoning;
      if (!c.tool_calls.empty()) {
        OJson calls = OJson::array();
        for (const ToolCall& call : c.tool_calls) {
          calls.push_back(
              OJson{{"id", call.id},
                    {"type", "function"},
                    {"function", OJson{{"name", call.name}, {"arguments", call.arguments}}}});
        }
        message["tool_calls"] = std::move(calls);
      }
      choice["message"] = std::move(message);
    } else {
      choice["text"] = c.text;
    }
    choice["logprobs"] = out_.logprobs ? Logprobs(c, 0, c.logprobs.size()) : OJson();
    choice["finish_reason"] = FinishReason(r, i);
    choices.push_back(std::move(choice));
  }
  body["choices"] = std::move(choices);
  body["usage"] = Usage(r);
  return Dump(body);
}

}  // namespace cortiq::server::http
