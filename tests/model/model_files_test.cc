// --model as a directory or a GGUF file: the tokenizer, its identity and the
// embedded chat template (core/model/model_files.h), and the GGUF export
// that `cortiq-tool gguf` runs, round-tripped through both loaders.
#include "core/model/model_files.h"

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/model/gguf.h"
#include "core/model/gguf_model.h"
#include "core/model/gguf_writer.h"
#include "core/model/sequence_kv.h"
#include "core/model/transformer.h"
#include "core/tokenizer/gguf_vocab.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/model_test_util.h"

namespace cortiq::model {
namespace {

const std::string kEmbedded = std::string(CORTIQ_SOURCE_DIR) + "/models/cortiq-byte-4m";

std::string TempPath(const std::string& name) {
  return absl::StrCat(::testing::TempDir(), "/cortiq_files_", getpid(), "_", name);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The last position's logits after prefilling `ids`.
std::vector<float> LastLogits(const Transformer& m, const std::vector<int32_t>& ids) {
  SequenceKv kv(m.config(), kv::KvMode::kF32);
  ForwardScratch s;
  std::vector<float> last(m.config().vocab_size);
  EXPECT_TRUE(m.Prefill(ids, kv, s, last.data(), nullptr).ok());
  return last;
}

const std::vector<std::string>& Texts() {
  static const std::vector<std::string> texts = {
      "Call me Ishmael. Some years ago -- never mind how long precisely --",
      "<|im_start|>user\nWhere is the whale?<|im_end|>\n<|im_start|>assistant\n",
      "digits 1234567 and unicode: caf\xc3\xa9, \xe6\x97\xa5\xe6\x9c\xac, \xf0\x9f\x90\x8b",
      "  leading spaces\n\n\ttabs and <|endoftext|> in the middle",
  };
  return texts;
}

TEST(ModelFilesTest, PathsAndNames) {
  EXPECT_TRUE(CheckModelPath(kEmbedded).ok());
  EXPECT_FALSE(IsModelFile(kEmbedded));
  EXPECT_EQ(ModelName(kEmbedded), "cortiq-byte-4m");
  EXPECT_EQ(ModelName(kEmbedded + "/"), "cortiq-byte-4m");
  const absl::Status missing = CheckModelPath("/nonexistent/model");
  EXPECT_TRUE(absl::IsNotFound(missing));
  EXPECT_NE(missing.message().find("'/nonexistent/model'"), std::string::npos) << missing;
  EXPECT_NE(missing.message().find(".gguf"), std::string::npos) << missing;
  EXPECT_TRUE(absl::IsNotFound(CheckModelPath("")));
  // A directory without config.json is not a model.
  EXPECT_TRUE(absl::IsNotFound(CheckModelPath(std::string(CORTIQ_SOURCE_DIR) + "/docs")));
}

// The embedded model as GGUF (F32): the same ids on every text, the same
// chat template with the same eos text, the same logits bit for bit, a
// different tokenizer identity (other bytes), and a name without ".gguf".
TEST(ModelFilesTest, EmbeddedModelAsGgufTokenizesAndRunsTheSame) {
  const std::string gguf = TempPath("embedded.gguf");
  ASSERT_TRUE(ExportGgufModel(kEmbedded, gguf, math::DType::kF32).ok());
  ASSERT_TRUE(CheckModelPath(gguf).ok());
  EXPECT_TRUE(IsModelFile(gguf));
  EXPECT_EQ(ModelName(gguf), absl::StrCat("cortiq_files_", getpid(), "_embedded"));

  absl::StatusOr<ModelTokenizer> dir = LoadModelTokenizer(kEmbedded);
  absl::StatusOr<ModelTokenizer> file = LoadModelTokenizer(gguf);
  ASSERT_TRUE(dir.ok()) << dir.status();
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(dir->identity, ReadFile(kEmbedded + "/tokenizer.json"));
  EXPECT_NE(file->identity, dir->identity);
  EXPECT_EQ(file->tokenizer.vocab_size(), dir->tokenizer.vocab_size());
  for (const std::string& t : Texts()) {
    for (const bool special : {true, false}) {
      const std::vector<int32_t> ids = dir->tokenizer.Encode(t, special);
      EXPECT_EQ(file->tokenizer.Encode(t, special), ids) << t;
      EXPECT_EQ(file->tokenizer.Decode(ids), dir->tokenizer.Decode(ids)) << t;
    }
  }
  const nlohmann::json config =
      nlohmann::json::parse(ReadFile(kEmbedded + "/tokenizer_config.json"));
  EXPECT_TRUE(dir->chat_template.empty());  // a directory's stays in tokenizer_config.json
  EXPECT_EQ(file->chat_template, config["chat_template"].get<std::string>());
  EXPECT_EQ(file->eos_token, config["eos_token"].get<std::string>());

  auto a = Transformer::Load(kEmbedded);
  auto b = Transformer::Load(gguf);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  const std::vector<int32_t> ids = dir->tokenizer.Encode(Texts()[0]);
  const std::vector<float> la = LastLogits(**a, ids), lb = LastLogits(**b, ids);
  ASSERT_EQ(la.size(), lb.size());
  EXPECT_EQ(0, std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)));
  // The same vocabulary loads to the same identity (deterministic bytes).
  absl::StatusOr<ModelTokenizer> again = LoadModelTokenizer(gguf);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->identity, file->identity);
  std::filesystem::remove(gguf);
}

// ReadGgufVocab gives back what AddGgufVocabKeys wrote, every field; a file
// without a tokenizer says so.
TEST(ModelFilesTest, VocabKeysRoundTrip) {
  tokenizer::GgufVocab v;
  v.model = "gpt2";
  v.pre = "qwen2";
  v.tokens = {"a", "b", "ab", "<|end|>", "[PAD4]"};
  v.token_types = {1, 1, 1, 3, 5};
  v.merges = {"a b"};
  v.bos = 3;
  v.eos = 3;
  v.pad = 4;
  v.add_bos = false;
  v.chat_template = "{{ messages[0].content }}";
  GgufWriter w;
  ASSERT_TRUE(w.AddString("general.architecture", "qwen3").ok());
  ASSERT_TRUE(AddGgufVocabKeys(v, w).ok());
  absl::StatusOr<GgufFile> f = GgufFile::FromBuffer(w.Serialize(), "vocab.gguf");
  ASSERT_TRUE(f.ok()) << f.status();
  absl::StatusOr<tokenizer::GgufVocab> r = ReadGgufVocab(*f);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->model, v.model);
  EXPECT_EQ(r->pre, v.pre);
  EXPECT_EQ(r->tokens, v.tokens);
  EXPECT_EQ(r->token_types, v.token_types);
  EXPECT_EQ(r->merges, v.merges);
  EXPECT_EQ(r->bos, v.bos);
  EXPECT_EQ(r->eos, v.eos);
  EXPECT_EQ(r->pad, v.pad);
  EXPECT_EQ(r->unk, std::nullopt);
  EXPECT_EQ(r->add_bos, v.add_bos);
  EXPECT_EQ(r->add_eos, std::nullopt);
  EXPECT_EQ(r->chat_template, v.chat_template);
  // (What the fields mean is gguf_vocab_test's; a byte-level vocabulary
  // needs all 256 byte tokens, so this one is refused as a tokenizer.)

  GgufWriter bare;
  ASSERT_TRUE(bare.AddString("general.architecture", "qwen3").ok());
  absl::StatusOr<GgufFile> g = GgufFile::FromBuffer(bare.Serialize(), "bare.gguf");
  ASSERT_TRUE(g.ok());
  const absl::StatusOr<tokenizer::GgufVocab> none = ReadGgufVocab(*g);
  EXPECT_TRUE(absl::IsNotFound(none.status()));
  EXPECT_NE(none.status().message().find("tokenizer.ggml.tokens"), std::string::npos);
  // A key of the wrong type is named.
  GgufWriter bad;
  ASSERT_TRUE(bad.AddString("tokenizer.ggml.model", "gpt2").ok());
  ASSERT_TRUE(bad.AddString("tokenizer.ggml.tokens", "not an array").ok());
  absl::StatusOr<GgufFile> h = GgufFile::FromBuffer(bad.Serialize(), "bad.gguf");
  ASSERT_TRUE(h.ok());
  const absl::StatusOr<tokenizer::GgufVocab> wrong = ReadGgufVocab(*h);
  EXPECT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("tokenizer.ggml.tokens"), std::string::npos)
      << wrong.status();
}

// A random mkmodel checkpoint (byte-level tokenizer padded to the config's
// vocabulary) exported as Q8_0: the tokenizer covers every embedding row, the
// model loads and runs, and its logits are the Q8_0 rounding of the f32 ones.
TEST(ModelFilesTest, RandomCheckpointAsQ8_0Gguf) {
  const std::string dir = testing::TempModel("tiny");
  const std::string gguf = TempPath("tiny_q8.gguf");
  ASSERT_TRUE(ExportGgufModel(dir, gguf, math::DType::kQ8_0).ok());
  absl::StatusOr<ModelTokenizer> file = LoadModelTokenizer(gguf);
  ASSERT_TRUE(file.ok()) << file.status();
  auto a = Transformer::Load(dir);
  auto b = Transformer::Load(gguf);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(file->tokenizer.vocab_size(), static_cast<size_t>((*b)->config().vocab_size));
  const std::vector<int32_t> ids = testing::TestIds(12, (*a)->config().vocab_size, 7);
  const std::vector<float> la = LastLogits(**a, ids), lb = LastLogits(**b, ids);
  ASSERT_EQ(la.size(), lb.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < la.size(); ++i) {
    num += (double(la[i]) - lb[i]) * (double(la[i]) - lb[i]);
    den += double(la[i]) * la[i];
  }
  EXPECT_LT(std::sqrt(num / den), 0.05);
  EXPECT_GT(num, 0.0);  // quantized: not the f32 model
  std::filesystem::remove(gguf);
}

TEST(ModelFilesTest, ExportErrorsNameTheFile) {
  const absl::Status s =
      ExportGgufModel("/nonexistent/dir", TempPath("never.gguf"), math::DType::kF32);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("/nonexistent/dir/tokenizer.json"), std::string::npos) << s;
  EXPECT_FALSE(std::filesystem::exists(TempPath("never.gguf")));
}

}  // namespace
}  // namespace cortiq::model
