// AssistantOutputParser without HTTP: <think> into reasoning, <tool_call>
// into tool calls, the rest content; the same result however the text is
// cut into pushes (every split point of the whole output), nothing held back
// that cannot start a tag, malformed and unclosed calls left as content.
#include "server/http/assistant_output.h"

#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace cortiq::server::http {
namespace {

using Options = AssistantOutputParser::Options;

// Everything a parser hands on, accumulated.
struct Whole {
  std::string content, reasoning;
  std::vector<ToolCall> calls;
  void Add(const AssistantDelta& d) {
    content += d.content;
    reasoning += d.reasoning;
    calls.insert(calls.end(), d.tool_calls.begin(), d.tool_calls.end());
  }
};

Whole Parse(Options o, const std::vector<std::string>& pieces) {
  AssistantOutputParser p(o);
  Whole w;
  for (const std::string& s : pieces) w.Add(p.Push(s));
  w.Add(p.Finish());
  return w;
}

// Parses `text` whole, byte by byte, and split at every point: all agree.
Whole ParseEverySplit(Options o, const std::string& text) {
  const Whole whole = Parse(o, {text});
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  const Whole by_byte = Parse(o, bytes);
  EXPECT_EQ(by_byte.content, whole.content);
  EXPECT_EQ(by_byte.reasoning, whole.reasoning);
  EXPECT_EQ(by_byte.calls.size(), whole.calls.size());
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    const Whole two = Parse(o, {text.substr(0, cut), text.substr(cut)});
    EXPECT_EQ(two.content, whole.content) << "cut at " << cut;
    EXPECT_EQ(two.reasoning, whole.reasoning) << "cut at " << cut;
    EXPECT_EQ(two.calls.size(), whole.calls.size()) << "cut at " << cut;
  }
  return whole;
}

TEST(AssistantOutputTest, PlainTextPassesAtOnce) {
  AssistantOutputParser p({});
  EXPECT_EQ(p.Push("a <think> b <tool_call>").content, "a <think> b <tool_call>");
  EXPECT_TRUE(p.Finish().empty());
}

TEST(AssistantOutputTest, HoldsBackOnlyAPossibleTag) {
  AssistantOutputParser p({.reasoning = true, .tools = true});
  EXPECT_EQ(p.Push("Hello <").content, "Hello ");
  EXPECT_EQ(p.Push("b>").content, "<b>");  // not a tag after all
  EXPECT_EQ(p.Push("x <tool").content, "x ");
  EXPECT_EQ(p.Finish().content, "<tool");  // the end: nothing is a tag any more
}

TEST(AssistantOutputTest, ThinkBlockIsReasoning) {
  const Whole w =
      ParseEverySplit({.reasoning = true}, "<think>\nLet me see: 2+2.\n</think>\n\nIt is 4.");
  EXPECT_EQ(w.reasoning, "Let me see: 2+2.\n");
  EXPECT_EQ(w.content, "It is 4.");
}

TEST(AssistantOutputTest, ThinkOpenedByThePrompt) {
  const Whole w =
      ParseEverySplit({.reasoning = true, .start_in_reasoning = true}, "\nhmm</think>\n\nAnswer");
  EXPECT_EQ(w.reasoning, "hmm");
  EXPECT_EQ(w.content, "Answer");
  // Without reasoning, the tags are content.
  const Whole off = Parse({.reasoning = false, .start_in_reasoning = true}, {"<think>x</think>y"});
  EXPECT_EQ(off.content, "<think>x</think>y");
  EXPECT_TRUE(off.reasoning.empty());
}

TEST(AssistantOutputTest, UnclosedThinkStaysReasoning) {
  const Whole w = ParseEverySplit({.reasoning = true}, "<think>\nstill thinking </thi");
  EXPECT_EQ(w.reasoning, "still thinking </thi");
  EXPECT_TRUE(w.content.empty());
}

TEST(AssistantOutputTest, ToolCallsAreParsed) {
  const std::string text =
      "I'll check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\", \"days\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": "
      "{}}\n</tool_call>";
  const Whole w = ParseEverySplit({.tools = true}, text);
  EXPECT_EQ(w.content, "I'll check.\n\n");
  ASSERT_EQ(w.calls.size(), 2u);
  EXPECT_EQ(w.calls[0].name, "get_weather");
  EXPECT_EQ(nlohmann::json::parse(w.calls[0].arguments),
            nlohmann::json({{"city", "Paris"}, {"days", 2}}));
  EXPECT_EQ(w.calls[1].name, "now");
  EXPECT_EQ(w.calls[1].arguments, "{}");
  EXPECT_TRUE(w.calls[0].id.starts_with("call_"));
  EXPECT_NE(w.calls[0].id, w.calls[1].id);
  // Without tools the same text is content.
  EXPECT_EQ(Parse({}, {text}).content, text);
}

TEST(AssistantOutputTest, ThinkingThenToolCall) {
  AssistantOutputParser p({.reasoning = true, .start_in_reasoning = true, .tools = true});
  Whole w;
  w.Add(p.Push("\nneed weather</think>\n\n<tool_call>\n{\"name\":\"w\",\"arguments\":{\"c\":1}}"));
  EXPECT_TRUE(w.calls.empty());  // not closed yet: held
  w.Add(p.Push("\n</tool_call>"));
  w.Add(p.Finish());
  EXPECT_EQ(w.reasoning, "need weather");
  EXPECT_EQ(w.content, "");
  ASSERT_EQ(w.calls.size(), 1u);
  EXPECT_EQ(p.tool_calls(), 1u);
  EXPECT_EQ(w.calls[0].arguments, R"({"c":1})");
}

TEST(AssistantOutputTest, MalformedOrUnclosedCallsStayContent) {
  for (const std::string body : {"{not json}", "[1,2]", "{\"arguments\": {}}", "{\"name\": 3}",
                                 "{\"name\": \"f\", \"arguments\": 7}"}) {
    const std::string text = "a<tool_call>" + body + "</tool_call>b";
    const Whole w = ParseEverySplit({.tools = true}, text);
    EXPECT_EQ(w.content, text) << body;
    EXPECT_TRUE(w.calls.empty()) << body;
  }
  const Whole open = ParseEverySplit({.tools = true}, "x<tool_call>{\"name\": \"f\"");
  EXPECT_EQ(open.content, "x<tool_call>{\"name\": \"f\"");
  // A string "arguments" is passed as the model wrote it.
  const Whole s =
      Parse({.tools = true}, {"<tool_call>{\"name\":\"f\",\"arguments\":\"{}\"}</tool_call>"});
  ASSERT_EQ(s.calls.size(), 1u);
  EXPECT_EQ(s.calls[0].arguments, "{}");
}

}  // namespace
}  // namespace cortiq::server::http
