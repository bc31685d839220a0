// ChatTemplate: tokenizer_config.json forms (string, named list, special
// tokens as strings or {"content"}), NOT_FOUND for the fall-back cases, the
// variables a template sees, input and raise_exception errors, and the
// ChatML template shared with the default model and the training script.
#include "core/chat/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace cortiq::chat {
namespace {

using nlohmann::ordered_json;

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class ChatTemplateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(CORTIQ_BINARY_DIR) / "chat_template_test" /
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  std::filesystem::path Write(const std::string& text) {
    const auto path = dir_ / "tokenizer_config.json";
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  std::filesystem::path dir_;
};

ChatTemplate::Inputs UserSays(const std::string& text) {
  ChatTemplate::Inputs in;
  in.messages = ordered_json::array({{{"role", "user"}, {"content", text}}});
  return in;
}

TEST_F(ChatTemplateTest, StringTemplateAndSpecialTokens) {
  auto t = ChatTemplate::FromTokenizerConfig(
      Write(R"({"chat_template": "{{ bos_token }}|{{ eos_token }}|{{ messages[0].content }}",
                "bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>"})"));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->bos_token(), "<s>");
  EXPECT_EQ(*t->Render(UserSays("hi")), "<s>|</s>|hi");
}

TEST_F(ChatTemplateTest, NamedTemplateListPicksDefault) {
  auto t = ChatTemplate::FromTokenizerConfig(Write(
      R"({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]})"));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t->Render(UserSays("x")), "D");
  auto none = ChatTemplate::FromTokenizerConfig(Write(R"({"chat_template": [{"name": "rag", "template": "R"}]})"));
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ChatTemplateTest, MissingTemplateOrFileIsNotFound) {
  EXPECT_EQ(ChatTemplate::FromTokenizerConfig(Write(R"({"eos_token": "</s>"})")).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(ChatTemplate::FromTokenizerConfig(Write(R"({"chat_template": null})")).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(ChatTemplate::FromTokenizerConfig(dir_ / "absent.json").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ChatTemplateTest, MalformedConfigIsInvalidArgumentNamingTheFile) {
  for (const char* text : {"{not json", R"({"chat_template": 5})", R"({"chat_template": "x", "eos_token": 3})",
                           R"({"chat_template": [{"name": "default"}]})"}) {
    auto t = ChatTemplate::FromTokenizerConfig(Write(text));
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_NE(t.status().message().find("tokenizer_config.json"), std::string::npos) << t.status();
  }
  auto t = ChatTemplate::FromTokenizerConfig(Write(R"({"chat_template": "line1\n{% include 'x' %}"})"));
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("chat_template:2:4: unsupported tag 'include'"), std::string::npos)
      << t.status();
}

TEST_F(ChatTemplateTest, VariablesAsTransformersPassesThem) {
  auto t = ChatTemplate::Parse(
      "{{ bos_token is defined }} {{ eos_token }} {{ tools is none }} {{ add_generation_prompt }} "
      "{{ enable_thinking }} {{ messages|length }}",
      "", "<|im_end|>");
  ASSERT_TRUE(t.ok()) << t.status();
  ChatTemplate::Inputs in = UserSays("x");
  in.add_generation_prompt = false;
  in.extra = {{"enable_thinking", false}};
  EXPECT_EQ(*t->Render(in), "false <|im_end|> true false false 1");
}

TEST_F(ChatTemplateTest, BadInputsAreInvalidArgument) {
  auto t = ChatTemplate::Parse("{{ messages|length }}", "", "");
  ASSERT_TRUE(t.ok());
  ChatTemplate::Inputs in;
  in.messages = ordered_json::object();
  EXPECT_EQ(t->Render(in).status().message(), "messages must be an array");
  in = UserSays("x");
  in.tools = "search";
  EXPECT_EQ(t->Render(in).status().message(), "tools must be null or an array");
  in = UserSays("x");
  in.extra = {{"messages", 1}};
  EXPECT_EQ(t->Render(in).status().message(), "chat template variable 'messages' is reserved");
  in.extra = {{"raise_exception", 1}};
  EXPECT_EQ(t->Render(in).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ChatTemplateTest, RaiseExceptionBecomesInvalidArgumentWithTheMessage) {
  auto t = ChatTemplate::Parse(
      "{% if messages[0].role != 'system' %}{{ raise_exception('System message first!') }}{% endif %}", "", "");
  ASSERT_TRUE(t.ok());
  auto out = t->Render(UserSays("x"));
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out.status().message(), "chat template: System message first!");
}

TEST_F(ChatTemplateTest, ChatMl) {
  auto t = ChatTemplate::Parse(ChatMlTemplate(), "", "<|endoftext|>");
  ASSERT_TRUE(t.ok()) << t.status();
  ChatTemplate::Inputs in;
  in.messages = ordered_json::parse(R"([
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}, {"type": "text", "text": "b"}]},
      {"role": "assistant", "content": null},
      {"role": "tool", "content": "42"}])");
  EXPECT_EQ(*t->Render(in),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nab<|im_end|>\n"
            "<|im_start|>assistant\n<|im_end|>\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n");
  in.add_generation_prompt = false;
  EXPECT_EQ(t->Render(in)->substr(t->Render(in)->size() - 11), "<|im_end|>\n");
}

// The ChatML text lives in three places; they must not drift apart.
TEST_F(ChatTemplateTest, ChatMlIsTheDefaultModelsAndTheTrainingScripts) {
  const ordered_json config =
      ordered_json::parse(ReadFile(CORTIQ_SOURCE_DIR "/models/cortiq-byte-4m/tokenizer_config.json"));
  EXPECT_EQ(config.at("chat_template").get<std::string>(), ChatMlTemplate());
  std::istringstream train(ReadFile(CORTIQ_SOURCE_DIR "/tools/train/train.py"));
  std::string line;
  bool found = false;
  while (std::getline(train, line)) {
    const std::string prefix = "CHATML_TEMPLATE = ";
    if (line.rfind(prefix, 0) != 0) continue;
    found = true;
    EXPECT_EQ(ordered_json::parse(line.substr(prefix.size())).get<std::string>(), ChatMlTemplate());
  }
  EXPECT_TRUE(found) << "tools/train/train.py has no one-line CHATML_TEMPLATE";
  auto from_model = ChatTemplate::FromTokenizerConfig(CORTIQ_SOURCE_DIR "/models/cortiq-byte-4m/tokenizer_config.json");
  ASSERT_TRUE(from_model.ok()) << from_model.status();
  EXPECT_EQ(from_model->eos_token(), "<|endoftext|>");
}

}  // namespace
}  // namespace cortiq::chat
