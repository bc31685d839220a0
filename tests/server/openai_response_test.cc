// ResponseBuilder without HTTP: synthetic engine events in, the OpenAI
// bodies and SSE chunks out — chat messages with reasoning_content and
// tool_calls (finish_reason "tool_calls", content null around a pure call),
// the streamed deltas adding up to the same message, per-choice indexes,
// usage with cached_tokens, and the request-side parsers' refusals.
#include "server/http/openai_response.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "server/config.h"
#include "server/http/openai_request.h"

namespace cortiq::server::http {
namespace {

using OJson = nlohmann::ordered_json;

const tokenizer::Tokenizer& Tok() {
  static const tokenizer::Tokenizer* t = [] {
    auto r = tokenizer::Tokenizer::FromFile(DefaultModelDir() + "/tokenizer.json");
    EXPECT_TRUE(r.ok()) << r.status();
    return new tokenizer::Tokenizer(*std::move(r));
  }();
  return *t;
}

// Events for `text`, one per byte (the byte-level model's tokens), choice `index`.
std::vector<session::GenerationEvent> Events(const std::string& text, uint32_t index = 0) {
  std::vector<session::GenerationEvent> out;
  for (unsigned char c : text) {
    session::GenerationEvent ev;
    ev.index = index;
    ev.token_id = c;
    ev.text = std::string(1, static_cast<char>(c));
    out.push_back(std::move(ev));
  }
  return out;
}

session::GenerationResult Result(size_t completion, session::FinishReason f, size_t choices = 1) {
  session::GenerationResult r;
  r.prompt_tokens = 10;
  r.completion_tokens = completion;
  r.cached_tokens = 4;
  r.finish_reason = f;
  r.choices.resize(choices, {f, completion});
  return r;
}

// The streamed chat deltas of choice 0 put back together.
struct Streamed {
  std::string content, reasoning, finish;
  OJson tool_calls = OJson::array();
  std::vector<OJson> chunks;
};
Streamed Collect(const std::string& sse) {
  Streamed s;
  for (absl::string_view piece : absl::StrSplit(sse, "\n\n", absl::SkipEmpty())) {
    std::string_view ev(piece.data(), piece.size());
    EXPECT_TRUE(ev.starts_with("data: ")) << ev;
    ev.remove_prefix(6);
    if (ev == "[DONE]") continue;
    OJson c = OJson::parse(ev);
    s.chunks.push_back(c);
    if (c["choices"].empty()) continue;
    const OJson& ch = c["choices"][0];
    const OJson& d = ch["delta"];
    if (d.contains("content")) s.content += d["content"].get<std::string>();
    if (d.contains("reasoning_content")) s.reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("tool_calls")) {
      for (const auto& t : d["tool_calls"]) s.tool_calls.push_back(t);
    }
    if (!ch["finish_reason"].is_null()) s.finish = ch["finish_reason"];
  }
  return s;
}

constexpr char kToolOutput[] =
    "<think>\nweather needed\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", "
    "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

TEST(OpenAiResponseTest, ChatToolCallAndReasoningWhole) {
  ResponseBuilder b(ResponseBuilder::Kind::kChat, Tok(), "m", OutputOptions{},
                    {.reasoning = true, .tools = true});
  for (auto& ev : Events(kToolOutput)) EXPECT_EQ(b.Add(std::move(ev)), "");
  const OJson body = OJson::parse(b.Body(Result(40, session::FinishReason::kStop)));
  EXPECT_TRUE(body["id"].get<std::string>().starts_with("chatcmpl-"));
  EXPECT_EQ(body["object"], "chat.completion");
  const OJson& choice = body["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  const OJson& m = choice["message"];
  EXPECT_EQ(m["role"], "assistant");
  EXPECT_TRUE(m["content"].is_null());
  EXPECT_EQ(m["reasoning_content"], "weather needed\n");
  ASSERT_EQ(m["tool_calls"].size(), 1u);
  EXPECT_EQ(m["tool_calls"][0]["type"], "function");
  EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(m["tool_calls"][0]["function"]["arguments"], R"({"city":"Paris"})");
  EXPECT_TRUE(m["tool_calls"][0]["id"].get<std::string>().starts_with("call_"));
  EXPECT_EQ(body["usage"]["prompt_tokens"], 10);
  EXPECT_EQ(body["usage"]["total_tokens"], 50);
  EXPECT_EQ(body["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
}

TEST(OpenAiResponseTest, ChatStreamAddsUpToTheMessage) {
  ResponseBuilder b(ResponseBuilder::Kind::kChat, Tok(), "m",
                    OutputOptions{.stream = true, .include_usage = true},
                    {.reasoning = true, .tools = true});
  std::string sse = b.StreamStart();
  for (auto& ev : Events(kToolOutput)) sse += b.Add(std::move(ev));
  sse += b.StreamEnd(Result(40, session::FinishReason::kStop));
  EXPECT_TRUE(sse.ends_with("data: [DONE]\n\n"));
  const Streamed s = Collect(sse);
  EXPECT_EQ(s.chunks.front()["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(s.reasoning, "weather needed\n");
  EXPECT_EQ(s.content, "");
  ASSERT_EQ(s.tool_calls.size(), 1u);
  EXPECT_EQ(s.tool_calls[0]["index"], 0);
  EXPECT_EQ(s.tool_calls[0]["function"]["name"], "get_weather");
  EXPECT_EQ(s.finish, "tool_calls");
  // Reasoning streamed as it arrived, not in one piece at the end.
  size_t reasoning_chunks = 0;
  for (const OJson& c : s.chunks) {
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    if (!c["choices"].empty() && c["choices"][0]["delta"].contains("reasoning_content")) {
      ++reasoning_chunks;
    }
  }
  EXPECT_GT(reasoning_chunks, 5u);
  // The usage chunk: no choices.
  EXPECT_TRUE(s.chunks.back()["choices"].empty());
  EXPECT_EQ(s.chunks.back()["usage"]["completion_tokens"], 40);
}

TEST(OpenAiResponseTest, WithoutToolsOrThinkingTagsAreContent) {
  ResponseBuilder b(ResponseBuilder::Kind::kChat, Tok(), "m", OutputOptions{}, {});
  for (auto& ev : Events(kToolOutput)) b.Add(std::move(ev));
  const OJson m = OJson::parse(b.Body(Result(40, session::FinishReason::kLength)));
  EXPECT_EQ(m["choices"][0]["message"]["content"], kToolOutput);
  EXPECT_FALSE(m["choices"][0]["message"].contains("tool_calls"));
  EXPECT_EQ(m["choices"][0]["finish_reason"], "length");
}

TEST(OpenAiResponseTest, ChoicesByIndex) {
  ResponseBuilder b(ResponseBuilder::Kind::kCompletion, Tok(), "m", OutputOptions{.n = 2}, {});
  auto a = Events("abc", 0), z = Events("xy", 1);
  b.Add(std::move(z[0]));
  b.Add(std::move(a[0]));
  b.Add(std::move(a[1]));
  b.Add(std::move(z[1]));
  b.Add(std::move(a[2]));
  session::GenerationResult r = Result(5, session::FinishReason::kLength, 2);
  r.choices[1].finish_reason = session::FinishReason::kEos;
  const OJson body = OJson::parse(b.Body(r));
  ASSERT_EQ(body["choices"].size(), 2u);
  EXPECT_EQ(body["choices"][0]["text"], "abc");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(body["choices"][1]["index"], 1);
  EXPECT_EQ(body["choices"][1]["text"], "xy");
  EXPECT_EQ(body["choices"][1]["finish_reason"], "stop");
}

// Legacy completions logprobs: a token whose bytes are a piece of a
// character is written "bytes:\xNN" (OpenAI's form), in `tokens` and as a
// top_logprobs key, so that pieces stay apart; U+FFFD made them one key,
// each overwriting the last.
TEST(OpenAiResponseTest, LegacyLogprobsKeepPiecesOfCharactersApart) {
  ResponseBuilder b(ResponseBuilder::Kind::kCompletion, Tok(), "m",
                    OutputOptions{.logprobs = true, .top_logprobs = 4}, {});
  auto event = [](int32_t id, std::string text, std::vector<model::TokenLogprob> top) {
    session::GenerationEvent ev;
    ev.token_id = id;
    ev.text = std::move(text);
    ev.logprobs = model::Logprobs{.chosen = top[0], .top = std::move(top)};
    return ev;
  };
  // "é" is C3 A9: its first byte alone is no text yet.
  b.Add(event(0xC3, "", {{0xC3, -0.5f}, {0xE2, -1.5f}, {0xF0, -2.5f}, {'a', -3.5f}}));
  b.Add(event(0xA9, "\xc3\xa9", {{0xA9, -0.25f}, {0xA8, -1.25f}, {0xAA, -2.25f}, {'b', -3.25f}}));
  const std::string text = b.Body(Result(2, session::FinishReason::kLength));
  const OJson lp = OJson::parse(text)["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], OJson::array({"bytes:\\xc3", "bytes:\\xa9"}));
  EXPECT_EQ(lp["top_logprobs"][0],
            OJson::parse(R"({"bytes:\\xc3":-0.5,"bytes:\\xe2":-1.5,"bytes:\\xf0":-2.5,"a":-3.5})"));
  EXPECT_EQ(
      lp["top_logprobs"][1],
      OJson::parse(R"({"bytes:\\xa9":-0.25,"bytes:\\xa8":-1.25,"bytes:\\xaa":-2.25,"b":-3.25})"));
  EXPECT_EQ(lp["text_offset"], OJson::array({0, 1}));  // bytes of the text before each token
  EXPECT_EQ(OJson::parse(text)["choices"][0]["text"], "\xc3\xa9");
  EXPECT_EQ(text.find("\xef\xbf\xbd"), std::string::npos) << text;  // no U+FFFD anywhere
}

// httplib's own statuses: 500 and up are the server's failures.
TEST(ApiErrorTest, HttpStatusOfTheServerIsAServerError) {
  EXPECT_EQ(ErrorOfHttpStatus(500).type, "server_error");
  EXPECT_EQ(ErrorOfHttpStatus(503).type, "server_error");
  EXPECT_EQ(ErrorOfHttpStatus(500).message, "HTTP 500");
  EXPECT_EQ(ErrorOfHttpStatus(500).status, 500);
  EXPECT_EQ(ErrorOfHttpStatus(400).type, "invalid_request_error");
  EXPECT_EQ(ErrorOfHttpStatus(414).type, "invalid_request_error");
  EXPECT_EQ(CodeNameOfHttpStatus(411), "INVALID_ARGUMENT");
  EXPECT_EQ(CodeNameOfHttpStatus(415), "INVALID_ARGUMENT");
}

TEST(OpenAiResponseTest, StreamErrorIsOneChunkThenDone) {
  ApiError e;
  e.status = 504;
  e.message = "late";
  e.type = "timeout_error";
  const std::string s = ResponseBuilder::StreamError(e);
  EXPECT_EQ(s,
            "data: {\"error\":{\"message\":\"late\",\"type\":\"timeout_error\",\"param\":null,"
            "\"code\":null}}\n\ndata: [DONE]\n\n");
}

TEST(OpenAiRequestTest, ChatFieldsAndRefusals) {
  auto chat = [](const char* json) { return ParseChat(Json::parse(json)); };
  auto ok = chat(R"({"messages":[{"role":"developer","content":"be brief"},
      {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
      {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function",
        "function":{"name":"f","arguments":"{}"}}]},
      {"role":"tool","tool_call_id":"c1","content":"42"}],
      "tools":[{"type":"function","function":{"name":"f","parameters":{"b":1,"a":2}}}],
      "chat_template_kwargs":{"enable_thinking":false}})");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->messages[0]["role"], "system");
  EXPECT_EQ(ok->messages[1]["content"], "a\nb");  // parts joined as vLLM does
  EXPECT_EQ(ok->messages[2]["content"], "");  // null: rendered as empty
  // A call's arguments string becomes the object the template renders.
  EXPECT_TRUE(ok->messages[2]["tool_calls"][0]["function"]["arguments"].is_object());
  auto args = [&](const char* a) {
    auto r = ParseChat(Json::parse(std::string(R"({"messages":[{"role":"assistant","content":null,
        "tool_calls":[{"function":{"name":"f")") +
                                   a + "}}]}]}"));
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->messages[0]["tool_calls"][0]["function"]["arguments"].dump() : "";
  };
  EXPECT_EQ(args(R"(,"arguments":"{\"city\": \"Paris\", \"a\": [1]}")"),
            R"({"city":"Paris","a":[1]})");
  EXPECT_EQ(args(""), "{}");
  EXPECT_EQ(args(R"(,"arguments":"")"), "{}");
  EXPECT_EQ(args(R"(,"arguments":"not json")"), R"("not json")");  // kept as it came
  EXPECT_EQ(args(R"(,"arguments":"[1]")"), R"("[1]")");
  EXPECT_EQ(args(R"(,"arguments":{"x":1})"), R"({"x":1})");
  EXPECT_TRUE(ok->parse_tools);
  EXPECT_FALSE(ok->thinking);
  // Member order survives (a tool schema renders as the client sent it).
  EXPECT_EQ(ok->tools[0]["function"]["parameters"].dump(), R"({"b":1,"a":2})");
  auto none = chat(R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"none",
      "tools":[{"type":"function","function":{"name":"f"}}]})");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->tools.is_null());
  EXPECT_FALSE(none->parse_tools);
  for (const char* bad :
       {R"({"messages":[]})", R"({"messages":[{"role":"user"}]})",
        R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})",
        R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"required"})",
        R"({"messages":[{"role":"user","content":"x"}],"tool_choice":{"type":"function"}})",
        R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"}})",
        R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]})",
        R"({"messages":[{"role":"user","content":"x"}],"functions":[{"name":"f"}]})",
        R"({"messages":[{"role":"user","content":"x"}],"function_call":"auto"})"}) {
    EXPECT_EQ(chat(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_TRUE(chat(R"({"messages":[{"role":"user","content":"x"}],
      "response_format":{"type":"text"}})")
                  .ok());
}

// ParseBody measures a body before building it: its depth and what its
// objects' ordered members cost to read (each key compared with the members
// before it), so no body costs more than linear time to refuse.
TEST(OpenAiRequestTest, BodyCostIsBoundedBeforeItIsBuilt) {
  auto ok = ParseBody(R"({"b":1,"a":[{"y":2,"x":3}]})");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->dump(), R"({"b":1,"a":[{"y":2,"x":3}]})");  // member order kept
  for (const char* bad : {"", "{", "[1,]", "{\"a\":}", "{} x"}) {
    const absl::Status st = ParseBody(bad).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(st.message(), "body: not valid JSON") << bad;
  }
  // An object of `members` keys "k000000".. (7 bytes each): reading it costs
  // sum over i < members of (i + 7 i) = 4 members (members - 1) comparisons.
  auto object = [](int members) {
    std::string s = "{";
    for (int i = 0; i < members; ++i) {
      s += absl::StrFormat("%s\"k%06d\":%d", i ? "," : "", i, i);
    }
    return s + "}";
  };
  // The sampler's own limit on logit_bias (1024 entries) reads; one more
  // member than kMaxObjectMembers does not, however few bytes it takes.
  EXPECT_TRUE(ParseBody(object(1024)).ok());
  EXPECT_TRUE(ParseBody(object(static_cast<int>(kMaxObjectMembers))).ok());
  for (int members : {static_cast<int>(kMaxObjectMembers) + 1, 100000}) {
    const absl::Status st = ParseBody(object(members)).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(st.message(), "body: an object with more than 2048 members");
  }
  // Across objects: 4 of 1000 members cost 15,984,000 comparisons, within
  // kMaxMemberScan (2^24); a fifth passes it.
  auto objects = [&](int n) {
    std::string s = "[";
    for (int i = 0; i < n; ++i) absl::StrAppend(&s, i ? "," : "", object(1000));
    return s + "]";
  };
  EXPECT_TRUE(ParseBody(objects(4)).ok());
  const absl::Status five = ParseBody(objects(5)).status();
  EXPECT_EQ(five.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(five.message(),
                               "body: its objects' members would take more than "
                               "16777216 key comparisons"))
      << five.message();
  // Depth: kMaxBodyDepth levels of arrays and objects read, one more does not.
  auto nested = [](size_t depth) {
    std::string open, close;
    for (size_t i = 0; i < depth; ++i) {
      open += i % 2 ? "[" : "{\"a\":";
      close = absl::StrCat(i % 2 ? "]" : "}", close);
    }
    return open + "1" + close;
  };
  EXPECT_TRUE(ParseBody(nested(kMaxBodyDepth)).ok());
  for (size_t depth : {kMaxBodyDepth + 1, size_t{100000}}) {
    const absl::Status st = ParseBody(nested(depth)).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(st.message(), "body: nested deeper than 128 levels");
  }
}

TEST(OpenAiRequestTest, CommonControls) {
  auto c = ParseCommon(Json::parse(R"({"max_completion_tokens":7,"max_tokens":3,
      "temperature":0.5,"top_p":0.9,"seed":-1,"stop":"x","n":1,"presence_penalty":0.5,
      "frequency_penalty":0.25,"logit_bias":{"12":-100,"3":5},"top_k":-1,"min_p":0.1,
      "repetition_penalty":1.1,"ignore_eos":true,"min_tokens":2,"stop_token_ids":[5],
      "logprobs":true,"top_logprobs":2,"unknown_field":{"x":1}})"),
                       /*chat=*/true);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->max_tokens, 7u);  // max_completion_tokens wins
  EXPECT_FLOAT_EQ(c->g.sampling.temperature, 0.5f);
  EXPECT_TRUE(c->seed_given);
  EXPECT_EQ(c->g.stop, std::vector<std::string>{"x"});
  EXPECT_EQ(c->g.sampling.top_k, 0);  // vLLM's -1: off
  ASSERT_EQ(c->g.sampling.logit_bias.size(), 2u);
  EXPECT_EQ(c->g.sampling.logit_bias[0].first, 3);  // sorted by id
  EXPECT_EQ(c->g.stop_token_ids, std::vector<int32_t>{5});
  EXPECT_EQ(c->g.min_tokens, 2u);
  EXPECT_TRUE(c->g.logprobs);
  EXPECT_EQ(c->g.top_logprobs, 2u);
  // Completions: logprobs is the number of top entries.
  auto legacy = ParseCommon(Json::parse(R"({"logprobs":3})"), /*chat=*/false);
  ASSERT_TRUE(legacy.ok());
  EXPECT_TRUE(legacy->g.logprobs);
  EXPECT_EQ(legacy->g.top_logprobs, 3u);
  EXPECT_FALSE(ParseCommon(Json::parse(R"({"top_logprobs":2})"), true).ok());
  EXPECT_FALSE(ParseCommon(Json::parse(R"({"n":0})"), true).ok());
  EXPECT_FALSE(ParseCommon(Json::parse(R"({"max_tokens":1.5})"), true).ok());
  EXPECT_FALSE(ParseCommon(Json::parse(R"({"stream":"yes"})"), true).ok());
  EXPECT_FALSE(ParseCommon(Json::parse(R"([1])"), true).ok());
}

// "priority": one of the level names, on both endpoints; absent or null is
// normal; an integer (vLLM's field, where lower is sooner), another name or
// another case is refused naming the field.
TEST(OpenAiRequestTest, Priority) {
  using session::Priority;
  for (bool chat : {true, false}) {
    SCOPED_TRACE(chat ? "chat" : "completions");
    auto parse = [chat](const char* body) { return ParseCommon(Json::parse(body), chat); };
    EXPECT_EQ(parse(R"({})")->g.priority, Priority::kNormal);
    EXPECT_EQ(parse(R"({"priority":null})")->g.priority, Priority::kNormal);
    EXPECT_EQ(parse(R"({"priority":"low"})")->g.priority, Priority::kLow);
    EXPECT_EQ(parse(R"({"priority":"normal"})")->g.priority, Priority::kNormal);
    EXPECT_EQ(parse(R"({"priority":"high"})")->g.priority, Priority::kHigh);
    for (const char* bad :
         {R"({"priority":0})", R"({"priority":2})", R"({"priority":-1})", R"({"priority":"HIGH"})",
          R"({"priority":"urgent"})", R"({"priority":""})", R"({"priority":["high"]})",
          R"({"priority":true})"}) {
      SCOPED_TRACE(bad);
      auto r = parse(bad);
      ASSERT_FALSE(r.ok());
      EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_EQ(r.status().message(), R"(priority: must be "low", "normal" or "high")");
    }
  }
}

TEST(OpenAiRequestTest, ConversationIds) {
  const std::string id = ConversationSessionId("alice", "chat-1");
  EXPECT_EQ(id.size(), 32u);
  EXPECT_TRUE(session::SessionStore::IsIdForm(id));
  EXPECT_EQ(id, ConversationSessionId("alice", "chat-1"));
  EXPECT_NE(id, ConversationSessionId("bob", "chat-1"));  // names are per tenant
  EXPECT_NE(ConversationSessionId("a", "bc"), ConversationSessionId("ab", "c"));
  // A name that already is an id is the id.
  EXPECT_EQ(ConversationSessionId("alice", id), id);
}

}  // namespace
}  // namespace cortiq::server::http
