// Script checkpoints (core/model/script_checkpoint.h): the text is cut into
// pieces that never repeat; the written tokenizer encodes the text back to
// those pieces (added, non-special tokens); the written model, run by the
// engine's own Transformer and greedy Sampler (not the writer's check),
// continues a prompt ending in `after` with exactly the text and then the
// end token, in f32 and bf16, from the embedded model's tokenizer and from
// the default byte-level one; a prompt ending in a later script token
// continues from there; bad texts are refused with the field named; the same
// options write the same bytes; the random checkpoint's edit hook does not
// change the draws.
#include "core/model/script_checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/model/forward_scratch.h"
#include "core/model/random_checkpoint.h"
#include "core/model/sampler.h"
#include "core/model/sequence_kv.h"
#include "core/model/transformer.h"
#include "core/tokenizer/tokenizer.h"
#include "gtest/gtest.h"

namespace cortiq::model {
namespace {

constexpr const char* kCall =
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
constexpr const char* kThinkThenCall =
    "<think>\nThe user wants the weather in Paris.\n</think>\n\n<tool_call>\n{\"name\": "
    "\"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

std::string TempDir(const std::string& name) {
  return absl::StrCat(::testing::TempDir(), "/cortiq_script_", getpid(), "_", name);
}

std::string EmbeddedModelDir() { return std::string(CORTIQ_SOURCE_DIR) + "/models/cortiq-byte-4m"; }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// What the engine's greedy decoding writes after `prompt` (up to the first
// eos id, included), as ids.
std::vector<int32_t> Greedy(const std::string& dir, const std::vector<int32_t>& prompt,
                            size_t max_tokens) {
  auto tf = Transformer::Load(dir);
  EXPECT_TRUE(tf.ok()) << tf.status();
  if (!tf.ok()) return {};
  const ModelConfig& c = (*tf)->config();
  auto sampler = Sampler::Create(SamplingParams{.temperature = 0.0f});
  EXPECT_TRUE(sampler.ok());
  SequenceKv kv(c, kv::KvMode::kF32);
  ForwardScratch scratch;
  std::vector<float> logits(size_t(c.vocab_size));
  EXPECT_TRUE((*tf)->Prefill(prompt, kv, scratch, logits.data()).ok());
  std::vector<int32_t> history = prompt, out;
  for (size_t n = 0; n < max_tokens; ++n) {
    const int32_t next = sampler->Sample(logits, history);
    history.push_back(next);
    out.push_back(next);
    if (std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), next) != c.eos_token_ids.end())
      break;
    SequenceKv* seqs[1] = {&kv};
    EXPECT_TRUE(
        (*tf)->DecodeBatch(std::span<const int32_t>(&next, 1), seqs, scratch, logits.data()).ok());
  }
  return out;
}

TEST(CutScriptTest, ToolCallPiecesNeverRepeat) {
  auto pieces = CutScript(kCall, "\n");
  ASSERT_TRUE(pieces.ok()) << pieces.status();
  // "\n" repeats the prompt's last token and "\": \"" the one after "name":
  // each is joined to the piece after it.
  EXPECT_EQ(*pieces, (std::vector<std::string>{"<tool_call>", "\n{\"", "name", "\": \"",
                                               "get_weather", "\", \"", "arguments", "\": {\"",
                                               "city", "\": \"Paris", "\"}}", "\n</tool_call>"}));
  EXPECT_EQ(absl::StrJoin(*pieces, ""), kCall);
}

TEST(CutScriptTest, JoinsUntilUniqueAndKeepsTheText) {
  for (const std::string& text :
       {std::string(kThinkThenCall), std::string("a a a a a a\n\n\n"), std::string("x\nx\nx\n"),
        std::string("<a><a><a>"), std::string("1 < 2 <b> </b> <3>")}) {
    auto pieces = CutScript(text, "\n");
    ASSERT_TRUE(pieces.ok()) << text << ": " << pieces.status();
    EXPECT_EQ(absl::StrJoin(*pieces, ""), text);
    std::set<std::string> seen{"\n"};
    for (const std::string& p : *pieces) EXPECT_TRUE(seen.insert(p).second) << text << ": " << p;
  }
  // Tags stay whole unless they repeat.
  auto tags = CutScript("<think>x</think>", "\n");
  ASSERT_TRUE(tags.ok());
  EXPECT_EQ(*tags, (std::vector<std::string>{"<think>", "x", "</think>"}));
  // The last piece repeating joins the one before it.
  auto tail = CutScript("ab-ab", "\n");
  ASSERT_TRUE(tail.ok());
  EXPECT_EQ(*tail, (std::vector<std::string>{"ab", "-ab"}));
}

TEST(CutScriptTest, OnlyThePromptsLastTokenIsRefused) {
  auto p = CutScript("\n", "\n");
  EXPECT_TRUE(absl::IsInvalidArgument(p.status())) << p.status();
  EXPECT_NE(p.status().message().find("text"), std::string_view::npos);
}

// The embedded model's tokenizer, Qwen3's thinking layout: the script from
// ChatML's generation prompt, and from Qwen3's enable_thinking=false prompt
// (which ends inside the script), in f32 and bf16.
TEST(ScriptCheckpointTest, GreedyWritesTheTextThenEnds) {
  for (math::DType dtype : {math::DType::kF32, math::DType::kBF16}) {
    SCOPED_TRACE(int(dtype));
    const std::string dir = TempDir(absl::StrCat("think_", int(dtype)));
    ScriptCheckpointOptions o;
    o.text = kThinkThenCall;
    o.tokenizer_dir = EmbeddedModelDir();
    o.dtype = dtype;
    auto plan = WriteScriptCheckpoint(dir, o);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(absl::StrJoin(plan->pieces, ""), o.text);
    ASSERT_EQ(plan->ids.size(), plan->pieces.size() + 2);
    EXPECT_EQ(std::set<int32_t>(plan->ids.begin(), plan->ids.end()).size(), plan->ids.size());

    auto tok = tokenizer::Tokenizer::FromFile(dir + "/tokenizer.json");
    ASSERT_TRUE(tok.ok()) << tok.status();
    ASSERT_TRUE(tok->im_end_id().has_value());
    EXPECT_EQ(plan->ids.back(), *tok->im_end_id());
    // The pieces are tokens of the written vocabulary; the new ones added
    // and not special (so a request's text encodes them too).
    for (size_t k = 0; k < plan->pieces.size(); ++k) {
      const int32_t id = plan->ids[k + 1];
      EXPECT_EQ(tok->TokenBytes(id), plan->pieces[k]);
      EXPECT_FALSE(tok->IsSpecial(id)) << plan->pieces[k];
      if (id >= 259) {
        EXPECT_TRUE(tok->IsAddedToken(id)) << plan->pieces[k];
      }
    }
    EXPECT_EQ(tok->TokenId("<tool_call>").value_or(-1), plan->ids[13]);
    // The chat template came along.
    EXPECT_EQ(ReadFile(dir + "/tokenizer_config.json"),
              ReadFile(EmbeddedModelDir() + "/tokenizer_config.json"));

    const std::vector<int32_t> prompt =
        tok->Encode("<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n");
    std::vector<int32_t> out = Greedy(dir, prompt, 64);
    ASSERT_FALSE(out.empty());
    EXPECT_EQ(out.back(), *tok->im_end_id());
    out.pop_back();
    EXPECT_EQ(tok->Decode(out), o.text);

    // Qwen3 with thinking off ends its prompt in "</think>\n\n": the call follows.
    out = Greedy(dir, tok->Encode("<|im_start|>assistant\n<think>\n\n</think>\n\n"), 64);
    ASSERT_FALSE(out.empty());
    out.pop_back();
    EXPECT_EQ(tok->Decode(out), std::string(kCall));
  }
}

// Without --tokenizer-from: the byte-level tokenizer of random checkpoints,
// and another `after`.
TEST(ScriptCheckpointTest, DefaultTokenizerAndAfter) {
  const std::string dir = TempDir("default");
  ScriptCheckpointOptions o;
  o.text = "Paris, then Oslo, then Rome.";
  o.after = "Cities:";
  auto plan = WriteScriptCheckpoint(dir, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(std::filesystem::exists(dir + "/tokenizer_config.json"));
  auto tok = tokenizer::Tokenizer::FromFile(dir + "/tokenizer.json");
  ASSERT_TRUE(tok.ok());
  std::vector<int32_t> out = Greedy(dir, tok->Encode("Some cities:"), 64);
  ASSERT_FALSE(out.empty());
  EXPECT_EQ(out.back(), plan->ids.back());
  out.pop_back();
  EXPECT_EQ(tok->Decode(out), o.text);
}

TEST(ScriptCheckpointTest, SameOptionsSameBytes) {
  ScriptCheckpointOptions o;
  o.text = kCall;
  o.tokenizer_dir = EmbeddedModelDir();
  const std::string a = TempDir("same_a"), b = TempDir("same_b");
  ASSERT_TRUE(WriteScriptCheckpoint(a, o).ok());
  ASSERT_TRUE(WriteScriptCheckpoint(b, o).ok());
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json"}) {
    EXPECT_EQ(ReadFile(a + "/" + f), ReadFile(b + "/" + f)) << f;
  }
}

TEST(ScriptCheckpointTest, BadTextsAreRefused) {
  const std::string dir = TempDir("bad");
  ScriptCheckpointOptions o;
  o.tokenizer_dir = EmbeddedModelDir();
  for (const std::string& text : {std::string(), std::string(kMaxScriptBytes + 1, 'a'),
                                  // A special token in the text cannot be one piece of it.
                                  std::string("done<|im_end|>"), std::string("\n")}) {
    o.text = text;
    auto plan = WriteScriptCheckpoint(dir, o);
    EXPECT_TRUE(absl::IsInvalidArgument(plan.status())) << text << ": " << plan.status();
    EXPECT_NE(plan.status().message().find("text"), std::string_view::npos) << plan.status();
  }
  o.text = "hi";
  o.after = "";
  auto plan = WriteScriptCheckpoint(dir, o);
  EXPECT_TRUE(absl::IsInvalidArgument(plan.status())) << plan.status();
  EXPECT_NE(plan.status().message().find("after"), std::string_view::npos) << plan.status();
  o.after = "x";
  o.tokenizer_dir = TempDir("no_such_dir");
  EXPECT_TRUE(absl::IsNotFound(WriteScriptCheckpoint(dir, o).status()));
}

// RandomCheckpointOptions::edit sees every tensor and does not change the draws.
TEST(RandomCheckpointEditTest, SeesEveryTensorAndKeepsTheDraws) {
  auto config = NamedShape("tiny-gqa");
  ASSERT_TRUE(config.ok());
  const std::string plain = TempDir("plain"), edited = TempDir("edited");
  ASSERT_TRUE(WriteRandomCheckpoint(*config, plain, {}).ok());
  RandomCheckpointOptions o;
  std::vector<std::string> names;
  o.edit = [&](std::string_view name, std::span<float>) { names.emplace_back(name); };
  ASSERT_TRUE(WriteRandomCheckpoint(*config, edited, o).ok());
  EXPECT_EQ(ReadFile(plain + "/model.safetensors"), ReadFile(edited + "/model.safetensors"));
  EXPECT_EQ(names.size(), size_t(2 + 3 * 11 + 1));  // embed, 3 layers × 11, norm, lm_head
  EXPECT_NE(std::find(names.begin(), names.end(), "lm_head.weight"), names.end());
}

}  // namespace
}  // namespace cortiq::model
