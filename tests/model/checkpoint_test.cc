// Checkpoint: model directories (single file and sharded) written by the test,
// and one test per defect, each checking the code and that the message names
// the file and the tensor.
#include "core/model/checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace cortiq::model {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using Json = nlohmann::json;

// A tiny qwen3: vocab 32, hidden 16, 2 layers, 4 heads of 8, 2 kv heads.
constexpr const char* kConfig = R"({
  "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
  "vocab_size": 32, "hidden_size": 16, "intermediate_size": 24,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
  "head_dim": 8, "rope_theta": 1000000, "rms_norm_eps": 1e-06,
  "max_position_embeddings": 128, "tie_word_embeddings": true,
  "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16"
})";

struct Tensor {
  std::string name;
  math::DType dtype;
  std::vector<int64_t> shape;
};

std::vector<Tensor> TinyTensors() {
  std::vector<Tensor> t = {{"model.embed_tokens.weight", math::DType::kBF16, {32, 16}},
                           {"model.norm.weight", math::DType::kF32, {16}}};
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    t.push_back({p + "self_attn.q_proj.weight", math::DType::kBF16, {32, 16}});
    t.push_back({p + "self_attn.k_proj.weight", math::DType::kF16, {16, 16}});
    t.push_back({p + "self_attn.q_norm.weight", math::DType::kF32, {8}});
  }
  return t;
}

std::vector<float> Values(const Tensor& t, float scale = 1.0f) {
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  std::vector<float> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = scale * static_cast<float>(i % 17) * 0.25f;
  return v;
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "checkpoint_test_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Dir() const { return dir_.string(); }
  std::string Path(const std::string& f) const { return (dir_ / f).string(); }

  void WriteText(const std::string& file, const std::string& text) {
    std::ofstream out(Path(file), std::ios::binary | std::ios::trunc);
    out << text;
    ASSERT_TRUE(out.good());
  }

  void WriteShard(const std::string& file, const std::vector<Tensor>& tensors, float scale = 1.0f) {
    SafetensorsWriter w;
    for (const Tensor& t : tensors) {
      ASSERT_TRUE(w.AddF32(t.name, t.dtype, t.shape, Values(t, scale)).ok());
    }
    ASSERT_TRUE(w.Write(Path(file)).ok());
  }

  // config.json + model.safetensors holding `tensors`.
  void WriteSingle(const std::vector<Tensor>& tensors = TinyTensors()) {
    WriteText("config.json", kConfig);
    WriteShard("model.safetensors", tensors);
  }

  // config.json + two shards + index mapping each tensor to its shard.
  void WriteSharded() {
    WriteText("config.json", kConfig);
    std::vector<Tensor> all = TinyTensors(), first, second;
    Json weight_map = Json::object();
    for (size_t i = 0; i < all.size(); ++i) {
      const bool in_first = i % 2 == 0;
      (in_first ? first : second).push_back(all[i]);
      weight_map[all[i].name] =
          in_first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
    }
    WriteShard("model-00001-of-00002.safetensors", first);
    WriteShard("model-00002-of-00002.safetensors", second);
    WriteText("model.safetensors.index.json",
              Json{{"metadata", {{"total_size", 1234}}}, {"weight_map", weight_map}}.dump(2));
  }

  void ExpectOpenError(absl::StatusCode code, std::initializer_list<std::string> pieces) {
    auto r = Checkpoint::Open(Dir());
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), code) << r.status();
    for (const std::string& p : pieces) {
      EXPECT_THAT(std::string(r.status().message()), HasSubstr(p));
    }
  }

  fs::path dir_;
};

TEST_F(CheckpointTest, OpensSingleFile) {
  WriteSingle();
  auto ck = Checkpoint::Open(Dir());
  ASSERT_TRUE(ck.ok()) << ck.status();
  EXPECT_EQ(ck->config().vocab_size, 32);
  EXPECT_TRUE(ck->config().qk_norm);
  EXPECT_EQ(ck->FilePaths(), std::vector<std::string>({Path("model.safetensors")}));
  EXPECT_EQ(ck->TensorNames().size(), TinyTensors().size());
  EXPECT_TRUE(ck->Has("model.norm.weight"));
  EXPECT_FALSE(ck->Has("lm_head.weight"));

  auto emb = ck->Get("model.embed_tokens.weight", {32, 16});
  ASSERT_TRUE(emb.ok()) << emb.status();
  EXPECT_EQ(emb->dtype, math::DType::kBF16);
  std::vector<float> got(32 * 16);
  math::ConvertToF32(emb->data, emb->dtype, got.size(), got.data());
  EXPECT_EQ(got, Values(TinyTensors()[0]));

  const std::vector<int64_t> shape = {8};
  EXPECT_TRUE(ck->Get("model.layers.1.self_attn.q_norm.weight", shape).ok());
  EXPECT_TRUE(ck->GetAnyShape("model.layers.1.self_attn.k_proj.weight").ok());
}

TEST_F(CheckpointTest, ViewsSurviveMovingTheCheckpoint) {
  WriteSingle();
  auto ck = Checkpoint::Open(Dir());
  ASSERT_TRUE(ck.ok()) << ck.status();
  TensorView v = *ck->Get("model.norm.weight", {16});
  Checkpoint moved = std::move(*ck);
  EXPECT_EQ(moved.Get("model.norm.weight", {16})->data, v.data);
  EXPECT_EQ(static_cast<const float*>(v.data)[5], 1.25f);
}

TEST_F(CheckpointTest, OpensShardedAndEachShardOnce) {
  WriteSharded();
  auto ck = Checkpoint::Open(Dir());
  ASSERT_TRUE(ck.ok()) << ck.status();
  EXPECT_EQ(ck->FilePaths(), std::vector<std::string>({Path("model-00001-of-00002.safetensors"),
                                                       Path("model-00002-of-00002.safetensors")}));
  EXPECT_EQ(ck->TensorNames().size(), TinyTensors().size());
  for (const Tensor& t : TinyTensors()) {
    auto v = ck->Get(t.name, t.shape);
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(v->dtype, t.dtype);
  }
}

TEST_F(CheckpointTest, SingleFileWinsOverIndex) {
  WriteSharded();
  WriteShard("model.safetensors", {{"only.here", math::DType::kF32, {2}}});
  auto ck = Checkpoint::Open(Dir());
  ASSERT_TRUE(ck.ok()) << ck.status();
  EXPECT_EQ(ck->TensorNames(), std::vector<std::string>({"only.here"}));
}

TEST_F(CheckpointTest, FingerprintIsStableAndIgnoresSharding) {
  WriteSharded();
  auto sharded = Checkpoint::Open(Dir());
  ASSERT_TRUE(sharded.ok()) << sharded.status();
  auto again = Checkpoint::Open(Dir());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(sharded->Fingerprint(), again->Fingerprint());

  fs::remove(Path("model.safetensors.index.json"));
  WriteSingle();
  auto single = Checkpoint::Open(Dir());
  ASSERT_TRUE(single.ok()) << single.status();
  EXPECT_EQ(single->Fingerprint(), sharded->Fingerprint());
}

TEST_F(CheckpointTest, FingerprintChangesWithConfigShapesAndWeights) {
  WriteSingle();
  const uint64_t base = Checkpoint::Open(Dir())->Fingerprint();

  WriteShard("model.safetensors", TinyTensors(), /*scale=*/2.0f);  // other weights
  EXPECT_NE(Checkpoint::Open(Dir())->Fingerprint(), base);

  std::vector<Tensor> reshaped = TinyTensors();
  reshaped[1].shape = {4, 4};  // same bytes, other shape
  WriteShard("model.safetensors", reshaped);
  EXPECT_NE(Checkpoint::Open(Dir())->Fingerprint(), base);

  WriteShard("model.safetensors", TinyTensors());
  EXPECT_EQ(Checkpoint::Open(Dir())->Fingerprint(), base);
  Json cfg = Json::parse(kConfig);
  cfg["rope_theta"] = 10000;
  WriteText("config.json", cfg.dump());
  EXPECT_NE(Checkpoint::Open(Dir())->Fingerprint(), base);
}

// ---- One test per defect ----

TEST_F(CheckpointTest, WrongShapeNamesFileTensorAndBothShapes) {
  WriteSingle();
  auto ck = Checkpoint::Open(Dir());
  ASSERT_TRUE(ck.ok());
  auto v = ck->Get("model.layers.1.self_attn.q_proj.weight", {16, 32});
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(v.status().message()),
            Path("model.safetensors") +
                ": tensor 'model.layers.1.self_attn.q_proj.weight': shape [32, 16] expected "
                "[16, 32]");
  // Rank mismatch too.
  EXPECT_EQ(ck->Get("model.norm.weight", {16, 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(CheckpointTest, WrongShapeInShardNamesTheShard) {
  WriteSharded();
  auto ck = Checkpoint::Open(Dir());
  ASSERT_TRUE(ck.ok());
  auto v = ck->Get("model.norm.weight", {17});
  ASSERT_FALSE(v.ok());
  EXPECT_THAT(std::string(v.status().message()), HasSubstr("model-0000"));
  EXPECT_THAT(std::string(v.status().message()), HasSubstr("'model.norm.weight'"));
}

TEST_F(CheckpointTest, MissingTensorNamesFileSearched) {
  WriteSingle();
  auto ck = Checkpoint::Open(Dir());
  ASSERT_TRUE(ck.ok());
  auto v = ck->Get("lm_head.weight", {32, 16});
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(v.status().message()), HasSubstr(Path("model.safetensors")));
  EXPECT_THAT(std::string(v.status().message()), HasSubstr("'lm_head.weight'"));
}

TEST_F(CheckpointTest, MissingTensorInShardedNamesIndex) {
  WriteSharded();
  auto ck = Checkpoint::Open(Dir());
  ASSERT_TRUE(ck.ok());
  auto v = ck->Get("lm_head.weight", {32, 16});
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(v.status().message()), HasSubstr("model.safetensors.index.json"));
  EXPECT_THAT(std::string(v.status().message()), HasSubstr("'lm_head.weight'"));
}

TEST_F(CheckpointTest, UnsupportedDtypeNamesFileAndTensor) {
  WriteText("config.json", kConfig);
  const std::string header =
      R"({"model.norm.weight":{"dtype":"F64","shape":[2],"data_offsets":[0,16]}})";
  uint64_t n = header.size();
  WriteText("model.safetensors",
            std::string(reinterpret_cast<const char*>(&n), 8) + header + std::string(16, '\0'));
  auto ck = Checkpoint::Open(Dir());
  ASSERT_TRUE(ck.ok()) << ck.status();
  auto v = ck->Get("model.norm.weight", {2});
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(v.status().message()), HasSubstr(Path("model.safetensors")));
  EXPECT_THAT(std::string(v.status().message()), HasSubstr("'model.norm.weight'"));
  EXPECT_THAT(std::string(v.status().message()), HasSubstr("F64"));
}

TEST_F(CheckpointTest, NoWeightsFile) {
  WriteText("config.json", kConfig);
  ExpectOpenError(absl::StatusCode::kNotFound,
                  {Dir(), "model.safetensors", "model.safetensors.index.json"});
}

TEST_F(CheckpointTest, NoConfig) {
  WriteShard("model.safetensors", TinyTensors());
  ExpectOpenError(absl::StatusCode::kNotFound, {"config.json"});
}

TEST_F(CheckpointTest, BadConfigNamesConfigAndKey) {
  WriteSingle();
  Json cfg = Json::parse(kConfig);
  cfg["num_key_value_heads"] = 3;
  WriteText("config.json", cfg.dump());
  ExpectOpenError(absl::StatusCode::kInvalidArgument,
                  {Path("config.json"), "'num_key_value_heads'"});
}

TEST_F(CheckpointTest, CorruptSingleFileNamesIt) {
  WriteSingle();
  fs::resize_file(Path("model.safetensors"), fs::file_size(Path("model.safetensors")) - 5);
  ExpectOpenError(absl::StatusCode::kDataLoss, {Path("model.safetensors"), "truncated"});
}

TEST_F(CheckpointTest, ShardedIndexMalformed) {
  WriteSharded();
  WriteText("model.safetensors.index.json", R"({"weight_map": {"a": "x.safetensors"})");
  ExpectOpenError(absl::StatusCode::kDataLoss, {"model.safetensors.index.json", "malformed"});
}

TEST_F(CheckpointTest, ShardedIndexWithoutWeightMap) {
  WriteSharded();
  WriteText("model.safetensors.index.json", R"({"metadata": {}})");
  ExpectOpenError(absl::StatusCode::kDataLoss, {"model.safetensors.index.json", "'weight_map'"});
}

TEST_F(CheckpointTest, ShardedIndexShardNotAString) {
  WriteSharded();
  WriteText("model.safetensors.index.json", R"({"weight_map": {"model.norm.weight": 3}})");
  ExpectOpenError(absl::StatusCode::kDataLoss,
                  {"model.safetensors.index.json", "'model.norm.weight'"});
}

TEST_F(CheckpointTest, ShardedIndexPointsToMissingShard) {
  WriteSharded();
  fs::remove(Path("model-00002-of-00002.safetensors"));
  ExpectOpenError(absl::StatusCode::kNotFound,
                  {"model.safetensors.index.json", "model-00002-of-00002.safetensors"});
}

TEST_F(CheckpointTest, ShardedTensorNotInItsShard) {
  WriteSharded();
  // Map the first shard's embedding to the second shard.
  Json index = Json::parse(std::ifstream(Path("model.safetensors.index.json")));
  index["weight_map"]["model.embed_tokens.weight"] = "model-00002-of-00002.safetensors";
  WriteText("model.safetensors.index.json", index.dump());
  ExpectOpenError(absl::StatusCode::kDataLoss,
                  {"model.safetensors.index.json", "'model.embed_tokens.weight'",
                   Path("model-00002-of-00002.safetensors"), "does not contain"});
}

TEST_F(CheckpointTest, ShardedIndexEscapingTheDirectory) {
  WriteSharded();
  for (const char* shard :
       {"../model-00001-of-00002.safetensors", "/etc/passwd", "a/../../x.safetensors", ""}) {
    Json index = {{"weight_map", {{"model.norm.weight", shard}}}};
    WriteText("model.safetensors.index.json", index.dump());
    ExpectOpenError(absl::StatusCode::kDataLoss,
                    {"model.safetensors.index.json", "'model.norm.weight'", "relative path"});
  }
}

TEST_F(CheckpointTest, CorruptShardNamesIndexAndShard) {
  WriteSharded();
  fs::resize_file(Path("model-00001-of-00002.safetensors"), 6);
  ExpectOpenError(absl::StatusCode::kDataLoss,
                  {"model.safetensors.index.json", Path("model-00001-of-00002.safetensors")});
}

TEST_F(CheckpointTest, TensorsOutsideTheIndexAreNotVisible) {
  WriteSharded();
  Json index = Json::parse(std::ifstream(Path("model.safetensors.index.json")));
  index["weight_map"].erase("model.norm.weight");
  WriteText("model.safetensors.index.json", index.dump());
  auto ck = Checkpoint::Open(Dir());
  ASSERT_TRUE(ck.ok()) << ck.status();
  EXPECT_FALSE(ck->Has("model.norm.weight"));
  EXPECT_EQ(ck->TensorNames().size(), TinyTensors().size() - 1);
}

}  // namespace
}  // namespace cortiq::model
