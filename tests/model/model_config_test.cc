// ModelConfig: HF config.json variants (qwen3, qwen2, llama), round trips, and
// one test per defect, each checking the code and that the message names the
// file and the key.
#include "core/model/model_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "nlohmann/json.hpp"

namespace cortiq::model {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

constexpr const char* kPath = "/models/x/config.json";

// Abridged from Qwen/Qwen3-0.6B.
Json Qwen3Json() {
  return Json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": false,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 1024,
    "initializer_range": 0.02,
    "intermediate_size": 3072,
    "max_position_embeddings": 40960,
    "max_window_layers": 28,
    "model_type": "qwen3",
    "num_attention_heads": 16,
    "num_hidden_layers": 28,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": null,
    "rope_theta": 1000000,
    "sliding_window": null,
    "tie_word_embeddings": true,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": true,
    "use_sliding_window": false,
    "vocab_size": 151936
  })");
}

// Abridged from Qwen/Qwen2.5-0.5B-Instruct.
Json Qwen2Json() {
  return Json::parse(R"({
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "hidden_act": "silu",
    "hidden_size": 896,
    "initializer_range": 0.02,
    "intermediate_size": 4864,
    "max_position_embeddings": 32768,
    "max_window_layers": 21,
    "model_type": "qwen2",
    "num_attention_heads": 14,
    "num_hidden_layers": 24,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": true,
    "torch_dtype": "bfloat16",
    "use_cache": true,
    "use_sliding_window": false,
    "vocab_size": 151936
  })");
}

// Abridged from TinyLlama/TinyLlama-1.1B-Chat-v1.0.
Json LlamaJson() {
  return Json::parse(R"({
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": false,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 5632,
    "max_position_embeddings": 2048,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 22,
    "num_key_value_heads": 4,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": null,
    "rope_theta": 10000.0,
    "tie_word_embeddings": false,
    "torch_dtype": "bfloat16",
    "use_cache": true,
    "vocab_size": 32000
  })");
}

absl::StatusOr<ModelConfig> Parse(const Json& j) { return ModelConfig::FromJson(j.dump(), kPath); }

// The status has `code` and its message names the file and every piece.
void ExpectError(const absl::StatusOr<ModelConfig>& r, absl::StatusCode code,
                 std::initializer_list<const char*> pieces) {
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), code) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr(kPath));
  for (const char* p : pieces) EXPECT_THAT(std::string(r.status().message()), HasSubstr(p));
}

TEST(ModelConfigTest, ParsesQwen3) {
  auto r = Parse(Qwen3Json());
  ASSERT_TRUE(r.ok()) << r.status();
  const ModelConfig& c = *r;
  EXPECT_EQ(c.arch, ModelConfig::Arch::kQwen3);
  EXPECT_EQ(c.vocab_size, 151936);
  EXPECT_EQ(c.hidden_size, 1024);
  EXPECT_EQ(c.intermediate_size, 3072);
  EXPECT_EQ(c.num_hidden_layers, 28);
  EXPECT_EQ(c.num_attention_heads, 16);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);  // explicit, not hidden / heads = 64
  EXPECT_EQ(c.q_dim(), 2048);
  EXPECT_EQ(c.kv_dim(), 1024);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.max_position_embeddings, 40960);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.o_proj_bias);
  EXPECT_TRUE(c.qk_norm);
  ASSERT_TRUE(c.bos_token_id.has_value());
  EXPECT_EQ(*c.bos_token_id, 151643);
  EXPECT_EQ(c.eos_token_ids, std::vector<int32_t>({151645}));
  EXPECT_EQ(c.torch_dtype, "bfloat16");
  EXPECT_FALSE(c.sliding_window.has_value());
}

TEST(ModelConfigTest, ParsesQwen2WithImplicitBiasAndNoQkNorm) {
  auto r = Parse(Qwen2Json());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->arch, ModelConfig::Arch::kQwen2);
  EXPECT_TRUE(r->attention_bias);
  EXPECT_FALSE(r->o_proj_bias);
  EXPECT_FALSE(r->qk_norm);
  EXPECT_EQ(r->head_dim, 64);  // 896 / 14
  EXPECT_EQ(r->num_key_value_heads, 2);
  EXPECT_EQ(r->sliding_window, 32768);
}

TEST(ModelConfigTest, Qwen2IgnoresAttentionBiasKeyAsHfDoes) {
  Json j = Qwen2Json();
  j["attention_bias"] = false;
  auto r = Parse(j);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->attention_bias);
}

TEST(ModelConfigTest, ParsesLlama) {
  auto r = Parse(LlamaJson());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->arch, ModelConfig::Arch::kLlama);
  EXPECT_FALSE(r->attention_bias);
  EXPECT_FALSE(r->qk_norm);
  EXPECT_EQ(r->head_dim, 64);
  EXPECT_DOUBLE_EQ(r->rms_norm_eps, 1e-5);
  EXPECT_EQ(*r->bos_token_id, 1);
  EXPECT_EQ(r->eos_token_ids, std::vector<int32_t>({2}));
}

TEST(ModelConfigTest, LlamaAttentionBiasCoversOutputProjection) {
  Json j = LlamaJson();
  j["attention_bias"] = true;
  auto r = Parse(j);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->attention_bias);
  EXPECT_TRUE(r->o_proj_bias);
}

TEST(ModelConfigTest, EosMayBeAList) {
  Json j = LlamaJson();
  j["eos_token_id"] = {128001, 128008, 128009};
  j["vocab_size"] = 128256;
  auto r = Parse(j);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->eos_token_ids, std::vector<int32_t>({128001, 128008, 128009}));
}

TEST(ModelConfigTest, DefaultsFollowHf) {
  Json j = LlamaJson();
  for (const char* k :
       {"num_key_value_heads", "rope_theta", "rms_norm_eps", "max_position_embeddings",
        "tie_word_embeddings", "bos_token_id", "eos_token_id", "torch_dtype"}) {
    j.erase(k);
  }
  auto r = Parse(j);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->num_key_value_heads, 32);
  EXPECT_DOUBLE_EQ(r->rope_theta, 10000.0);
  EXPECT_DOUBLE_EQ(r->rms_norm_eps, 1e-6);
  EXPECT_EQ(r->max_position_embeddings, 2048);
  EXPECT_FALSE(r->tie_word_embeddings);
  EXPECT_FALSE(r->bos_token_id.has_value());
  EXPECT_TRUE(r->eos_token_ids.empty());
  EXPECT_TRUE(r->torch_dtype.empty());
}

TEST(ModelConfigTest, NewerDtypeKeyIsAccepted) {
  Json j = Qwen3Json();
  j.erase("torch_dtype");
  j["dtype"] = "float32";
  auto r = Parse(j);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->torch_dtype, "float32");
}

TEST(ModelConfigTest, RoundTripsEveryArch) {
  Json eos_list = LlamaJson();
  eos_list["eos_token_id"] = {1, 2};
  for (const Json& j : {Qwen3Json(), Qwen2Json(), LlamaJson(), eos_list}) {
    auto a = Parse(j);
    ASSERT_TRUE(a.ok()) << a.status();
    const std::string text = a->ToJson();
    auto b = ModelConfig::FromJson(text, "roundtrip");
    ASSERT_TRUE(b.ok()) << b.status() << "\n" << text;
    EXPECT_EQ(*a, *b) << text;
    EXPECT_EQ(text, b->ToJson());  // canonical
    // HF-compatible: the keys HF reads are there with HF's names.
    Json out = Json::parse(text);
    EXPECT_EQ(out["model_type"], j["model_type"]);
    EXPECT_EQ(out["architectures"], j["architectures"]);
    EXPECT_EQ(out["hidden_size"], j["hidden_size"]);
  }
}

TEST(ModelConfigTest, RoundTripsNonTrivialDoubles) {
  Json j = Qwen3Json();
  j["rope_theta"] = 500000.123456789;
  j["rms_norm_eps"] = 1.0000000000000002e-06;
  auto a = Parse(j);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = ModelConfig::FromJson(a->ToJson(), "roundtrip");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->rope_theta, b->rope_theta);
  EXPECT_EQ(a->rms_norm_eps, b->rms_norm_eps);
}

// The O(1) hint is parsed once, here, and read from ModelConfig (the server
// no longer opens config.json a second time for it).
TEST(ModelConfigTest, ParsesAndRoundTripsTheO1Hint) {
  auto none = Parse(Qwen3Json());
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->o1_hint, kv::O1Overrides{});
  EXPECT_FALSE(Json::parse(none->ToJson()).contains("o1_attn"));

  Json j = Qwen3Json();
  j["o1_attn"] = Json::parse(R"({"layers": [5, 1], "m": 16, "w": 64, "sink": 2})");
  auto a = Parse(j);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->o1_hint.layers, "5,1");
  EXPECT_EQ(a->o1_hint.m, 16u);
  EXPECT_EQ(a->o1_hint.w, 64u);
  EXPECT_EQ(a->o1_hint.sink, 2u);
  EXPECT_FALSE(a->o1_hint.rect.has_value());
  auto b = ModelConfig::FromJson(a->ToJson(), "roundtrip");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(*a, *b);
  EXPECT_EQ(a->ToJson(), b->ToJson());
}

TEST(ModelConfigTest, MalformedO1HintNamesTheFileAndTheKey) {
  Json j = Qwen3Json();
  j["o1_attn"] = Json::parse(R"({"m": "many"})");
  ExpectError(Parse(j), absl::StatusCode::kInvalidArgument, {kPath, "o1_attn", "m must be"});
  j["o1_attn"] = Json::parse(R"({"layers": "deep0"})");
  ExpectError(Parse(j), absl::StatusCode::kInvalidArgument, {kPath, "o1_attn.layers", "deep0"});
}

// ---- One test per defect ----

TEST(ModelConfigTest, MalformedJson) {
  ExpectError(ModelConfig::FromJson("{\"model_type\": \"qwen3\",", kPath),
              absl::StatusCode::kInvalidArgument, {"malformed JSON"});
}

TEST(ModelConfigTest, NotAnObject) {
  ExpectError(ModelConfig::FromJson("[1, 2]", kPath), absl::StatusCode::kInvalidArgument,
              {"object"});
}

TEST(ModelConfigTest, MissingKey) {
  Json j = Qwen3Json();
  j.erase("hidden_size");
  ExpectError(Parse(j), absl::StatusCode::kInvalidArgument, {"missing", "'hidden_size'"});
}

TEST(ModelConfigTest, MissingModelType) {
  Json j = Qwen3Json();
  j.erase("model_type");
  ExpectError(Parse(j), absl::StatusCode::kInvalidArgument, {"'model_type'"});
}

TEST(ModelConfigTest, RequiredKeyNull) {
  Json j = Qwen3Json();
  j["vocab_size"] = nullptr;
  ExpectError(Parse(j), absl::StatusCode::kInvalidArgument, {"'vocab_size'"});
}

TEST(ModelConfigTest, WrongTypeString) {
  Json j = Qwen3Json();
  j["hidden_size"] = "1024";
  ExpectError(Parse(j), absl::StatusCode::kInvalidArgument,
              {"'hidden_size'", "expected an integer", "string"});
}

TEST(ModelConfigTest, WrongTypeFloatForInteger) {
  Json j = Qwen3Json();
  j["num_hidden_layers"] = 28.5;
  ExpectError(Parse(j), absl::StatusCode::kInvalidArgument,
              {"'num_hidden_layers'", "expected an integer"});
}

TEST(ModelConfigTest, WrongTypeBool) {
  Json j = Qwen3Json();
  j["tie_word_embeddings"] = 1;
  ExpectError(Parse(j), absl::StatusCode::kInvalidArgument,
              {"'tie_word_embeddings'", "expected a boolean"});
}

TEST(ModelConfigTest, WrongTypeNumber) {
  Json j = Qwen3Json();
  j["rope_theta"] = "1e6";
  ExpectError(Parse(j), absl::StatusCode::kInvalidArgument, {"'rope_theta'", "a number"});
}

TEST(ModelConfigTest, WrongTypeEos) {
  Json j = Qwen3Json();
  j["eos_token_id"] = "</s>";
  ExpectError(Parse(j), absl::StatusCode::kInvalidArgument, {"'eos_token_id'"});
  j["eos_token_id"] = {1, "x"};
  ExpectError(Parse(j), absl::StatusCode::kInvalidArgument, {"'eos_token_id'"});
}

TEST(ModelConfigTest, HeadsNotDivisibleByKvHeads) {
  Json j = Qwen3Json();
  j["num_key_value_heads"] = 3;
  ExpectError(Parse(j), absl::StatusCode::kInvalidArgument,
              {"'num_key_value_heads'", "not divisible"});
}

TEST(ModelConfigTest, HiddenNotDivisibleByHeadsWithoutHeadDim) {
  Json j = LlamaJson();
  j["num_attention_heads"] = 24;
  j["num_key_value_heads"] = 4;
  ExpectError(Parse(j), absl::StatusCode::kInvalidArgument, {"'head_dim'", "not divisible"});
}

TEST(ModelConfigTest, OddHeadDim) {
  Json j = Qwen3Json();
  j["head_dim"] = 127;
  ExpectError(Parse(j), absl::StatusCode::kInvalidArgument, {"'head_dim'", "even"});
}

TEST(ModelConfigTest, NonPositiveSizes) {
  for (const char* key :
       {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings"}) {
    Json j = Qwen3Json();
    j[key] = 0;
    ExpectError(Parse(j), absl::StatusCode::kInvalidArgument, {key, "out of range"});
    j[key] = -4;
    ExpectError(Parse(j), absl::StatusCode::kInvalidArgument, {key, "out of range"});
  }
}

TEST(ModelConfigTest, AbsurdSize) {
  Json j = Qwen3Json();
  j["intermediate_size"] = int64_t{1} << 40;
  ExpectError(Parse(j), absl::StatusCode::kInvalidArgument, {"'intermediate_size'"});
  j["intermediate_size"] = 18446744073709551615ULL;  // > int64 max
  ExpectError(Parse(j), absl::StatusCode::kInvalidArgument, {"'intermediate_size'"});
}

TEST(ModelConfigTest, BadFloats) {
  Json j = Qwen3Json();
  j["rms_norm_eps"] = 0;
  ExpectError(Parse(j), absl::StatusCode::kInvalidArgument, {"'rms_norm_eps'"});
  j = Qwen3Json();
  j["rope_theta"] = -1.0;
  ExpectError(Parse(j), absl::StatusCode::kInvalidArgument, {"'rope_theta'"});
}

TEST(ModelConfigTest, TokenIdOutsideVocabulary) {
  Json j = Qwen3Json();
  j["eos_token_id"] = 200000;
  ExpectError(Parse(j), absl::StatusCode::kInvalidArgument, {"'eos_token_id'", "200000"});
  j = Qwen3Json();
  j["bos_token_id"] = -1;
  ExpectError(Parse(j), absl::StatusCode::kInvalidArgument, {"'bos_token_id'"});
}

TEST(ModelConfigTest, UnsupportedModelType) {
  Json j = Qwen3Json();
  j["model_type"] = "mistral";
  ExpectError(Parse(j), absl::StatusCode::kUnimplemented, {"'model_type'", "mistral"});
}

TEST(ModelConfigTest, UnsupportedFeaturesAreRefusedByName) {
  Json j = LlamaJson();
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  ExpectError(Parse(j), absl::StatusCode::kUnimplemented, {"'rope_scaling'"});
  j = Qwen2Json();
  j["use_sliding_window"] = true;
  ExpectError(Parse(j), absl::StatusCode::kUnimplemented, {"'use_sliding_window'"});
  j = LlamaJson();
  j["hidden_act"] = "gelu";
  ExpectError(Parse(j), absl::StatusCode::kUnimplemented, {"'hidden_act'", "gelu"});
  j = LlamaJson();
  j["mlp_bias"] = true;
  ExpectError(Parse(j), absl::StatusCode::kUnimplemented, {"'mlp_bias'"});
}

TEST(ModelConfigTest, FromFileReadsAndNamesMissingFile) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) / "model_config_test_from_file";
  fs::create_directories(dir);
  const std::string path = (dir / "config.json").string();
  {
    FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    const std::string text = Qwen2Json().dump();
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
  }
  auto r = ModelConfig::FromFile(path);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->arch, ModelConfig::Arch::kQwen2);

  auto missing = ModelConfig::FromFile((dir / "nope.json").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("nope.json"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace cortiq::model
