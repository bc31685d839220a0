// Models from GGUF files: random checkpoints (random_checkpoint.h) exported
// to GGUF (WriteGgufModel) give the same logits, bit for bit, as their
// safetensors twins in F32 / F16 / BF16 (prefill and decode), llama's
// permuted q/k rows included; Q8_0 runs close to f32; Q4_0 / Q4_K / Q6_K files
// load as the Q8_0 file of their dequantized values; and each model-level
// defect gets its error.
#include "core/model/gguf_model.h"

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/math/kernels.h"
#include "core/model/checkpoint.h"
#include "core/model/gguf.h"
#include "core/model/gguf_writer.h"
#include "core/model/random_checkpoint.h"
#include "core/model/transformer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "tests/common/log_capture.h"
#include "tests/common/model_test_util.h"

namespace cortiq::model {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string TempPath(const std::string& name) {
  return absl::StrCat(::testing::TempDir(), "/cortiq_gguf_", getpid(), "_", name, ".gguf");
}

// The safetensors twin and its GGUF export.
std::string Export(const std::string& dir, const std::string& name, math::DType dtype) {
  auto ckpt = Checkpoint::Open(dir);
  EXPECT_TRUE(ckpt.ok()) << ckpt.status();
  const std::string path = TempPath(name);
  GgufExportOptions o;
  o.dtype = dtype;
  absl::Status s = WriteGgufModel(*ckpt, path, o);
  EXPECT_TRUE(s.ok()) << s;
  return path;
}

// Logits of a 24-token prefill (every position) and then 3 decode steps.
std::vector<float> RunModel(const std::string& model_path, const LoadOptions& options = {}) {
  auto m = Transformer::Load(model_path, options);
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return {};
  const ModelConfig& c = (*m)->config();
  const size_t V = c.vocab_size;
  const std::vector<int32_t> ids = cortiq::testing::TestIds(24, c.vocab_size, 5);
  SequenceKv kv(c, kv::KvMode::kF32);
  ForwardScratch s;
  std::vector<float> out(ids.size() * V), last(V);
  EXPECT_TRUE((*m)->Prefill(ids, kv, s, last.data(), out.data()).ok());
  for (int step = 0; step < 3; ++step) {
    const int32_t tok = static_cast<int32_t>((step * 37 + 11) % c.vocab_size);
    SequenceKv* kvs[] = {&kv};
    EXPECT_TRUE((*m)->DecodeBatch({&tok, 1}, kvs, s, last.data()).ok());
    out.insert(out.end(), last.begin(), last.end());
  }
  return out;
}

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && !a.empty() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct TwinCase {
  const char* shape;
  math::DType dtype;
};

class GgufTwinTest : public ::testing::TestWithParam<TwinCase> {};

TEST_P(GgufTwinTest, SameLogitsAsTheSafetensorsTwin) {
  const TwinCase c = GetParam();
  const std::string dir = cortiq::testing::TempModel(c.shape, c.dtype);
  const std::string gguf =
      Export(dir, absl::StrCat(c.shape, "_", math::DTypeName(c.dtype)), c.dtype);
  auto a = Checkpoint::Open(dir);
  auto b = Checkpoint::Open(gguf);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(b->is_gguf());
  EXPECT_TRUE(b->load_note().empty());
  ModelConfig want = a->config();
  want.torch_dtype.clear();  // GGUF has no such key
  EXPECT_EQ(b->config(), want);
  EXPECT_EQ(b->TensorNames(), a->TensorNames());
  EXPECT_EQ(b->FilePaths(), std::vector<std::string>{gguf});
  const std::vector<float> x = RunModel(dir), y = RunModel(gguf);
  EXPECT_TRUE(BitEqual(x, y)) << c.shape << " " << math::DTypeName(c.dtype);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GgufTwinTest,
                         ::testing::Values(TwinCase{"tiny", math::DType::kF32},
                                           TwinCase{"tiny-gqa", math::DType::kF32},
                                           TwinCase{"tiny-qwen2", math::DType::kF32},
                                           TwinCase{"tiny-llama", math::DType::kF32},
                                           TwinCase{"tiny", math::DType::kF16},
                                           TwinCase{"tiny-llama", math::DType::kF16},
                                           TwinCase{"tiny", math::DType::kBF16},
                                           TwinCase{"tiny-qwen2", math::DType::kBF16},
                                           TwinCase{"tiny-llama", math::DType::kBF16}),
                         [](const ::testing::TestParamInfo<TwinCase>& i) {
                           std::string n =
                               absl::StrCat(i.param.shape, "_", math::DTypeName(i.param.dtype));
                           for (char& ch : n) ch = ch == '-' ? '_' : ch;
                           return n;
                         });

TEST(GgufModelTest, LlamaQkRowsArePermutedInTheFileAndRestoredAtLoad) {
  const std::string dir = cortiq::testing::TempModel("tiny-llama");
  const std::string gguf = Export(dir, "llama_perm", math::DType::kF32);
  auto hf = Checkpoint::Open(dir);
  auto file = GgufFile::Open(gguf);
  auto ck = Checkpoint::Open(gguf);
  ASSERT_TRUE(file.ok() && ck.ok());
  const size_t hd = hf->config().head_dim, cols = hf->config().hidden_size;
  for (const char* n : {"q_proj", "k_proj"}) {
    const std::string name = absl::StrCat("model.layers.1.self_attn.", n, ".weight");
    auto want = hf->GetAnyShape(name);
    auto raw = file->Get(*GgufTensorName(name));
    auto got = ck->GetAnyShape(name);
    ASSERT_TRUE(want.ok() && raw.ok() && got.ok());
    const auto* w = static_cast<const float*>(want->data);
    const auto* r = static_cast<const float*>(raw->data);
    // GGUF row 1 is HF row hd/2 (the partner of row 0 in rotate-half).
    EXPECT_EQ(std::memcmp(r + 1 * cols, w + (hd / 2) * cols, cols * 4), 0) << n;
    EXPECT_NE(std::memcmp(r + 1 * cols, w + 1 * cols, cols * 4), 0) << n;
    EXPECT_EQ(std::memcmp(got->data, want->data, want->nbytes), 0) << n;
  }
}

TEST(GgufModelTest, Q8_0RunsCloseToF32) {
  for (const char* shape : {"tiny", "tiny-llama", "tiny-qwen2"}) {
    const std::string dir = cortiq::testing::TempModel(shape);
    const std::string gguf = Export(dir, absl::StrCat(shape, "_q8"), math::DType::kQ8_0);
    auto ck = Checkpoint::Open(gguf);
    ASSERT_TRUE(ck.ok()) << ck.status();
    EXPECT_EQ(ck->GetAnyShape("model.layers.0.mlp.up_proj.weight")->dtype, math::DType::kQ8_0);
    // Read in place: the views point into the file mapping, not a copy.
    EXPECT_FALSE(ck->OwnsData(ck->GetAnyShape("model.layers.0.mlp.up_proj.weight")->data));
    EXPECT_FALSE(ck->OwnsData(ck->GetAnyShape("model.embed_tokens.weight")->data));
    EXPECT_EQ(ck->OwnsData(ck->GetAnyShape("model.layers.0.self_attn.q_proj.weight")->data),
              std::string(shape) == "tiny-llama");  // un-permuted rows are a copy
    EXPECT_EQ(ck->GetAnyShape("model.embed_tokens.weight")->dtype, math::DType::kQ8_0);
    EXPECT_EQ(ck->GetAnyShape("model.norm.weight")->dtype, math::DType::kF32);
    const std::vector<float> x = RunModel(dir), y = RunModel(gguf);
    ASSERT_EQ(x.size(), y.size());
    const double err = cortiq::testing::MaxRelErr(y.data(), x.data(), x.size());
    std::printf("[%s] Q8_0 GGUF vs f32: max relative logit error %.3g\n", shape, err);
    EXPECT_LT(err, 0.05) << shape;
    EXPECT_GT(err, 0.0) << shape;  // it is quantized
  }
}

// Logits of a 40-token prefill and 3 decode steps with QSA on every layer:
// the indexer is derived from the checkpoint's q_proj / k_proj at first use,
// after Load has packed (and handed back) the weight sources.
std::vector<float> RunQsa(const std::string& model_path, const LoadOptions& options) {
  auto m = Transformer::Load(model_path, options);
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return {};
  const ModelConfig& c = (*m)->config();
  auto qsa = MakeQsaConfig("all", 8, 4, c.num_hidden_layers);
  EXPECT_TRUE(qsa.ok()) << qsa.status();
  SequenceKv kv(c, kv::KvMode::kF32);
  EXPECT_TRUE(kv.EnableQsa(*qsa).ok());
  ForwardScratch s;
  std::vector<float> out, logits(c.vocab_size);
  const std::vector<int32_t> ids = cortiq::testing::TestIds(40, c.vocab_size, 9);
  EXPECT_TRUE((*m)->Prefill(ids, kv, s, logits.data()).ok());
  out = logits;
  for (int step = 0; step < 3; ++step) {
    const int32_t tok = step + 3;
    SequenceKv* kvs[] = {&kv};
    EXPECT_TRUE((*m)->DecodeBatch({&tok, 1}, kvs, s, logits.data()).ok());
    out.insert(out.end(), logits.begin(), logits.end());
  }
  return out;
}

// QSA derives its indexer from q_proj / k_proj: on Q8_0 weights it widens
// them to f32 (core/qsa/indexer_weights.cc) and runs.
TEST(GgufModelTest, QsaRunsOnQ8_0Weights) {
  const std::string gguf = Export(cortiq::testing::TempModel("tiny"), "qsa_q8", math::DType::kQ8_0);
  const std::vector<float> logits = RunQsa(gguf, {});
  ASSERT_FALSE(logits.empty());
  for (float v : logits) ASSERT_TRUE(std::isfinite(v));
}

TEST(GgufModelTest, FingerprintIsStableAndTellsStorageApart) {
  const std::string dir = cortiq::testing::TempModel("tiny");
  const std::string f32 = Export(dir, "fp_f32", math::DType::kF32);
  const std::string q8 = Export(dir, "fp_q8", math::DType::kQ8_0);
  auto a = Checkpoint::Open(f32), b = Checkpoint::Open(f32), c = Checkpoint::Open(q8);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->Fingerprint(), b->Fingerprint());
  EXPECT_NE(a->Fingerprint(), c->Fingerprint());
  EXPECT_NE(a->Fingerprint(), 0u);
}

// ---- Q4_0 / Q4_K / Q6_K: converted at load

// Random blocks of `type`: every byte uniform, the f16 scales small and finite.
std::string RandomBlocks(uint32_t type, size_t n_values, uint64_t seed) {
  const GgmlTypeTraits* t = GgmlTypeInfo(type);
  const size_t blocks = n_values / t->block_size;
  std::string b(blocks * t->type_size, '\0');
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (char& ch : b) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    ch = static_cast<char>(s >> 56);
  }
  std::vector<size_t> scales;  // offsets of f16 scales in a block
  float mag = 0;
  if (type == ggml_type::kQ4_0) scales = {0}, mag = 0.02f;
  if (type == ggml_type::kQ4_K) scales = {0, 2}, mag = 0.0005f;
  if (type == ggml_type::kQ6_K) scales = {208}, mag = 0.0005f;
  for (size_t i = 0; i < blocks; ++i) {
    for (size_t off : scales) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      const float v = mag * (float((s >> 40) % 1000) / 1000.0f + 0.1f);
      const uint16_t h = math::F32ToF16(v);
      std::memcpy(&b[i * t->type_size + off], &h, 2);
    }
  }
  return b;
}

// A qwen3 / llama model with rows of 256 (K-quant blocks): two files, one
// with its matrices in Q4_0 / Q4_K / Q6_K (random blocks, cycling), one with
// the Q8_0 of their dequantized values.
struct ConvertedPair {
  std::string quant, q8;
  size_t matrices = 0;
};

// "tiny" widened to 64-dim heads (4 query, 2 KV) of `arch`.
ModelConfig WideTiny(ModelConfig::Arch arch) {
  ModelConfig c = *NamedShape("tiny");
  c.arch = arch;
  c.qk_norm = arch == ModelConfig::Arch::kQwen3;
  c.hidden_size = 256;
  c.intermediate_size = 512;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 64;
  return c;
}

ConvertedPair WriteConvertedPair(ModelConfig::Arch arch, const std::string& tag) {
  const ModelConfig c = WideTiny(arch);
  const std::string dir = absl::StrCat(::testing::TempDir(), "/cortiq_gguf_", getpid(), "_", tag);
  EXPECT_TRUE(WriteRandomCheckpoint(c, dir, {}).ok());
  auto ck = Checkpoint::Open(dir);
  EXPECT_TRUE(ck.ok()) << ck.status();
  GgufWriter quant, q8;
  EXPECT_TRUE(AddGgufModelKeys(ck->config(), quant).ok());
  EXPECT_TRUE(AddGgufModelKeys(ck->config(), q8).ok());
  const uint32_t types[] = {ggml_type::kQ4_0, ggml_type::kQ4_K, ggml_type::kQ6_K};
  ConvertedPair out;
  std::vector<float> values;
  for (const std::string& hf : ck->TensorNames()) {
    const TensorView t = *ck->GetAnyShape(hf);
    const std::string name = *GgufTensorName(hf);
    values.resize(t.numel());
    if (t.shape.size() == 1) {
      math::ConvertToF32(t.data, t.dtype, values.size(), values.data());
      EXPECT_TRUE(quant.AddTensor(name, math::DType::kF32, t.shape, values).ok());
      EXPECT_TRUE(q8.AddTensor(name, math::DType::kF32, t.shape, values).ok());
      continue;
    }
    const uint32_t type = types[out.matrices++ % 3];
    const std::string blocks = RandomBlocks(type, values.size(), out.matrices);
    EXPECT_TRUE(quant.AddRawTensor(name, type, t.shape, blocks).ok());
    EXPECT_TRUE(DequantizeGgufRows(type, blocks.data(), values.size(), values.data()));
    EXPECT_TRUE(q8.AddTensor(name, math::DType::kQ8_0, t.shape, values).ok());
  }
  out.quant = TempPath(tag + "_quant");
  out.q8 = TempPath(tag + "_q8");
  EXPECT_TRUE(quant.Write(out.quant).ok());
  EXPECT_TRUE(q8.Write(out.q8).ok());
  return out;
}

TEST(GgufModelTest, KQuantsLoadAsTheQ8_0OfTheirValues) {
  for (auto arch : {ModelConfig::Arch::kQwen3, ModelConfig::Arch::kLlama}) {
    const std::string tag = ModelConfig::ArchName(arch);
    const ConvertedPair p = WriteConvertedPair(arch, "kq_" + tag);
    // ONE log line for the whole conversion.
    auto sink = std::make_shared<cortiq::testing::CaptureSink>();
    const std::shared_ptr<spdlog::logger> saved = spdlog::default_logger();
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("", sink));
    auto a = Checkpoint::Open(p.quant);
    spdlog::set_default_logger(saved);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_EQ(sink->Lines().size(), 1u) << sink->All();
    EXPECT_THAT(sink->Lines()[0], HasSubstr(a->load_note()));
    EXPECT_THAT(a->load_note(),
                HasSubstr(absl::StrCat(": converted ", p.matrices,
                                       " tensors (Q4_0, Q4_K, Q6_K) to Q8_0 at load: ")));
    EXPECT_THAT(a->load_note(), StartsWith(p.quant));
    auto b = Checkpoint::Open(p.q8);
    ASSERT_TRUE(b.ok());
    EXPECT_TRUE(b->load_note().empty());
    for (const std::string& n : a->TensorNames()) {
      const TensorView x = *a->GetAnyShape(n), y = *b->GetAnyShape(n);
      ASSERT_EQ(x.dtype, y.dtype) << n;
      ASSERT_EQ(x.nbytes, y.nbytes) << n;
      EXPECT_EQ(std::memcmp(x.data, y.data, x.nbytes), 0) << n;
    }
    EXPECT_EQ(a->Fingerprint(), b->Fingerprint());  // same bytes for the engine
    // The converted rows are the file's rows, llama's q/k ones put back.
    auto file = GgufFile::Open(p.quant);
    const GgufFile::TensorInfo* q = file->Info("blk.1.attn_q.weight");
    const TensorView got = *a->GetAnyShape("model.layers.1.self_attn.q_proj.weight");
    const size_t cols = q->ne[0], rows = q->ne[1], src_row = q->nbytes / rows;
    std::vector<float> f(cols);
    std::vector<uint8_t> want(math::RowBytes(math::DType::kQ8_0, cols));
    for (size_t r = 0; r < rows; ++r) {
      const size_t from = arch == ModelConfig::Arch::kLlama ? LlamaGgufRow(r, 64) : r;
      DequantizeGgufRows(q->type, file->RawData(q->name).data() + from * src_row, cols, f.data());
      math::QuantizeQ8_0(f.data(), cols, want.data());
      ASSERT_EQ(std::memcmp(static_cast<const uint8_t*>(got.data) + r * want.size(), want.data(),
                            want.size()),
                0)
          << tag << " row " << r;
    }
    const std::vector<float> x = RunModel(p.quant), y = RunModel(p.q8);
    EXPECT_TRUE(BitEqual(x, y)) << tag;
  }
}

// --weights int8 hands the pages of the sources it quantized back to the
// kernel. A llama GGUF's q/k (un-permuted at Open) and converted K-quant
// tensors live in memory the Checkpoint owns, where that would read back as
// zeros: they are kept. Checked three ways: the checkpoint's q/k still equal
// the HF twin's after Load, the int8 logits equal those of the twin's int8
// load bit for bit, and so do QSA's (its indexer reads q/k after Load).
TEST(GgufModelTest, Int8WeightsKeepTheCheckpointsOwnedTensors) {
  LoadOptions int8;
  int8.weights = LoadOptions::Weights::kInt8;
  for (math::DType dtype : {math::DType::kF32, math::DType::kBF16}) {
    const std::string dir = cortiq::testing::TempModel("tiny-llama", dtype);
    const std::string gguf =
        Export(dir, absl::StrCat("int8_llama_", math::DTypeName(dtype)), dtype);
    auto hf = Checkpoint::Open(dir);
    auto m = Transformer::Load(gguf, int8);
    ASSERT_TRUE(hf.ok() && m.ok());
    EXPECT_EQ((*m)->weights(), LoadOptions::Weights::kInt8);
    EXPECT_GT((*m)->Int8CopyBytes(), 0u);
    for (int layer = 0; layer < hf->config().num_hidden_layers; ++layer) {
      for (const char* n : {"q_proj", "k_proj"}) {
        const std::string name = absl::StrCat("model.layers.", layer, ".self_attn.", n, ".weight");
        const TensorView want = *hf->GetAnyShape(name);
        const TensorView got = *(*m)->checkpoint().GetAnyShape(name);
        EXPECT_TRUE((*m)->checkpoint().OwnsData(got.data)) << name;
        ASSERT_EQ(got.nbytes, want.nbytes);
        EXPECT_EQ(std::memcmp(got.data, want.data, want.nbytes), 0) << name;
      }
    }
    m->reset();
    const std::vector<float> x = RunModel(dir, int8), y = RunModel(gguf, int8);
    EXPECT_TRUE(BitEqual(x, y)) << math::DTypeName(dtype);
    // Quantized, and close to the checkpoint-dtype logits (not zeros).
    const std::vector<float> ref = RunModel(dir);
    ASSERT_EQ(ref.size(), y.size());
    const double err = cortiq::testing::MaxRelErr(y.data(), ref.data(), ref.size());
    EXPECT_GT(err, 0.0);
    EXPECT_LT(err, 0.05);
    EXPECT_TRUE(BitEqual(RunQsa(dir, int8), RunQsa(gguf, int8))) << math::DTypeName(dtype);
  }
  // Q4_0 / Q4_K / Q6_K converted to Q8_0 at Open (llama: q/k un-permuted
  // too): read in place by int8, the same logits as the Q8_0 file's.
  const ConvertedPair p = WriteConvertedPair(ModelConfig::Arch::kLlama, "int8_kq");
  const std::vector<float> y = RunModel(p.quant, int8);
  EXPECT_TRUE(BitEqual(y, RunModel(p.q8)));
  EXPECT_TRUE(BitEqual(y, RunModel(p.quant)));
  EXPECT_TRUE(BitEqual(RunQsa(p.quant, int8), RunQsa(p.q8, {})));
}

// ---- model-level defects

// A GGUF of the "tiny" model (F32): keys(writer) runs first, then the
// model's keys are added (when model_keys), then the tensors whose GGUF name
// `skip` does not drop.
std::string TinyWith(const std::string& tag, const std::function<void(GgufWriter&)>& keys,
                     const std::function<bool(const std::string&)>& skip = nullptr,
                     bool model_keys = true, uint32_t alignment = GgufFile::kDefaultAlignment) {
  auto ck = Checkpoint::Open(cortiq::testing::TempModel("tiny"));
  GgufWriter w(alignment);
  keys(w);
  if (model_keys) {
    EXPECT_TRUE(AddGgufModelKeys(ck->config(), w).ok());
  }
  std::vector<float> v;
  for (const std::string& hf : ck->TensorNames()) {
    const std::string name = *GgufTensorName(hf);
    if (skip && skip(name)) continue;
    const TensorView t = *ck->GetAnyShape(hf);
    v.resize(t.numel());
    math::ConvertToF32(t.data, t.dtype, v.size(), v.data());
    EXPECT_TRUE(w.AddTensor(name, math::DType::kF32, t.shape, v).ok());
  }
  const std::string path = TempPath(tag);
  EXPECT_TRUE(w.Write(path).ok());
  return path;
}

void ExpectOpenError(const std::string& path, absl::StatusCode code, const std::string& what) {
  auto c = Checkpoint::Open(path);
  ASSERT_FALSE(c.ok()) << "opened; expected: " << what;
  EXPECT_EQ(c.status().code(), code) << c.status();
  EXPECT_THAT(std::string(c.status().message()), StartsWith(path));
  EXPECT_THAT(std::string(c.status().message()), HasSubstr(what));
}

TEST(GgufModelErrorsTest, UnknownArchitecture) {
  const std::string p = TinyWith(
      "arch", [](GgufWriter& w) { (void)w.AddString("general.architecture", "gemma3"); }, nullptr,
      /*model_keys=*/false);
  ExpectOpenError(
      p, absl::StatusCode::kUnimplemented,
      "general.architecture 'gemma3' is not supported (supported: qwen3, qwen2, llama)");
}

TEST(GgufModelErrorsTest, MissingAndMistypedKeys) {
  auto only_arch = [](GgufWriter& w) { (void)w.AddString("general.architecture", "qwen3"); };
  ExpectOpenError(TinyWith("nokeys", only_arch, nullptr, false), absl::StatusCode::kNotFound,
                  "metadata key 'qwen3.block_count' not found");
  ExpectOpenError(TinyWith(
                      "noarch", [](GgufWriter&) {}, nullptr, false),
                  absl::StatusCode::kNotFound, "metadata key 'general.architecture' not found");
  auto typed = [](GgufWriter& w) {
    (void)w.AddString("general.architecture", "qwen3");
    (void)w.AddString("qwen3.block_count", "2");
  };
  ExpectOpenError(TinyWith("typed", typed, nullptr, false), absl::StatusCode::kInvalidArgument,
                  "metadata key 'qwen3.block_count' has type string, expected an integer");
  auto zero = [](GgufWriter& w) {
    (void)w.AddString("general.architecture", "qwen3");
    (void)w.AddU32("qwen3.block_count", 0);
  };
  ExpectOpenError(TinyWith("zero", zero, nullptr, false), absl::StatusCode::kInvalidArgument,
                  "metadata key 'qwen3.block_count': value 0 out of range");
}

TEST(GgufModelErrorsTest, VocabularyAndEmbeddingDisagree) {
  const std::vector<std::string> tokens(300, "t");
  ExpectOpenError(
      TinyWith("vocab",
               [&](GgufWriter& w) { (void)w.AddStringArray("tokenizer.ggml.tokens", tokens); }),
      absl::StatusCode::kInvalidArgument,
      "the vocabulary has 300 tokens (tokenizer.ggml.tokens) but tensor 'token_embd.weight' has "
      "259 rows");
  const std::vector<std::string> right(259, "t");
  EXPECT_TRUE(Checkpoint::Open(TinyWith("vocab_ok", [&](GgufWriter& w) {
                (void)w.AddStringArray("tokenizer.ggml.tokens", right);
              })).ok());
  ExpectOpenError(TinyWith(
                      "noembd", [](GgufWriter&) {},
                      [](const std::string& n) { return n == "token_embd.weight"; }),
                  absl::StatusCode::kNotFound, "tensor 'token_embd.weight' not found");
}

TEST(GgufModelErrorsTest, RopeScalingIsRefused) {
  ExpectOpenError(
      TinyWith("rope", [](GgufWriter& w) { (void)w.AddString("qwen3.rope.scaling.type", "yarn"); }),
      absl::StatusCode::kUnimplemented, "RoPE scaling 'yarn' is not supported");
  EXPECT_TRUE(Checkpoint::Open(TinyWith("rope_none", [](GgufWriter& w) {
                (void)w.AddString("qwen3.rope.scaling.type", "none");
              })).ok());
}

// llama.cpp reads a linear factor without a type key (the type defaults to
// "linear"), from rope.scaling.factor or the older rope.scale_linear: one
// that scales is refused, whatever key it came in; 0 and 1 scale nothing.
TEST(GgufModelErrorsTest, LinearRopeFactorWithoutTypeIsRefused) {
  ExpectOpenError(
      TinyWith("rope_factor",
               [](GgufWriter& w) { (void)w.AddF32("qwen3.rope.scaling.factor", 8.0f); }),
      absl::StatusCode::kUnimplemented,
      "metadata key 'qwen3.rope.scaling.factor': linear RoPE scaling by 8 is not "
      "supported");
  ExpectOpenError(
      TinyWith("rope_linear",
               [](GgufWriter& w) { (void)w.AddF32("qwen3.rope.scale_linear", 4.0f); }),
      absl::StatusCode::kUnimplemented,
      "metadata key 'qwen3.rope.scale_linear': linear RoPE scaling by 4 is not supported");
  ExpectOpenError(TinyWith("rope_typed",
                           [](GgufWriter& w) {
                             (void)w.AddString("qwen3.rope.scaling.type", "linear");
                             (void)w.AddF32("qwen3.rope.scaling.factor", 2.0f);
                           }),
                  absl::StatusCode::kUnimplemented, "linear RoPE scaling by 2 is not supported");
  for (const float factor : {0.0f, 1.0f}) {
    EXPECT_TRUE(Checkpoint::Open(TinyWith(absl::StrCat("rope_one_", factor), [&](GgufWriter& w) {
                  (void)w.AddF32("qwen3.rope.scaling.factor", factor);
                })).ok());
  }
  EXPECT_TRUE(Checkpoint::Open(TinyWith("rope_none_factor", [](GgufWriter& w) {
                (void)w.AddString("qwen3.rope.scaling.type", "none");
                (void)w.AddF32("qwen3.rope.scaling.factor", 8.0f);
              })).ok());
}

// NaN and infinity reach config.json as null, which reads as "absent": the
// model ran on the default theta / eps instead of refusing the file.
TEST(GgufModelErrorsTest, NonFiniteHyperparametersAreRefused) {
  auto with = [](const std::string& tag, const std::function<void(ModelConfig&)>& edit) {
    return TinyWith(
        tag,
        [&](GgufWriter& w) {
          ModelConfig c = *NamedShape("tiny");
          edit(c);
          EXPECT_TRUE(AddGgufModelKeys(c, w).ok());
        },
        nullptr, /*model_keys=*/false);
  };
  ExpectOpenError(with("theta_nan", [](ModelConfig& c) { c.rope_theta = std::nan(""); }),
                  absl::StatusCode::kInvalidArgument,
                  "metadata key 'qwen3.rope.freq_base': value nan is not finite");
  ExpectOpenError(with("eps_inf", [](ModelConfig& c) { c.rms_norm_eps = INFINITY; }),
                  absl::StatusCode::kInvalidArgument,
                  "metadata key 'qwen3.attention.layer_norm_rms_epsilon': value inf is not finite");
}

// The token types are counted against the tokens before the array is read
// (widened to 8 bytes an element).
TEST(GgufModelErrorsTest, TokenTypesMustMatchTheTokens) {
  GgufWriter w;
  const std::vector<std::string> tokens = {"a", "b", "c"};
  ASSERT_TRUE(w.AddString("tokenizer.ggml.model", "gpt2").ok());
  ASSERT_TRUE(w.AddStringArray("tokenizer.ggml.tokens", tokens).ok());
  ASSERT_TRUE(w.AddI32Array("tokenizer.ggml.token_type", std::vector<int32_t>(5, 1)).ok());
  const std::string p = TempPath("token_types");
  ASSERT_TRUE(w.Write(p).ok());
  auto f = GgufFile::Open(p);
  ASSERT_TRUE(f.ok()) << f.status();
  auto v = ReadGgufVocab(*f);
  ASSERT_FALSE(v.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(v.status())) << v.status();
  EXPECT_THAT(std::string(v.status().message()),
              HasSubstr("metadata key 'tokenizer.ggml.token_type': 5 types for 3 tokens"));
}

// The llama export permutes q/k rows within each head: rows that are not
// whole heads were written past the end of the buffer (heap corruption)
// before the check.
TEST(GgufModelErrorsTest, ExportRefusesRopeRowsThatAreNotWholeHeads) {
  const std::string dir =
      absl::StrCat(::testing::TempDir(), "/cortiq_gguf_", getpid(), "_export_heads");
  ASSERT_TRUE(WriteRandomCheckpoint(WideTiny(ModelConfig::Arch::kLlama), dir, {}).ok());
  // config.json says 48 dims a head; q_proj keeps its 256 rows (not 48s).
  nlohmann::json j;
  std::ifstream(dir + "/config.json") >> j;
  j["head_dim"] = 48;
  std::ofstream(dir + "/config.json") << j.dump();
  auto ck = Checkpoint::Open(dir);
  ASSERT_TRUE(ck.ok()) << ck.status();
  const std::string path = TempPath("export_heads");
  const absl::Status s = WriteGgufModel(*ck, path, {});
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("is not whole heads of head_dim 48 rows"));
}

TEST(GgufModelErrorsTest, MissingTensorAndWrongShapeNameTheGgufTensor) {
  const std::string p = TinyWith(
      "noup", [](GgufWriter&) {}, [](const std::string& n) { return n == "blk.1.ffn_up.weight"; });
  ASSERT_TRUE(Checkpoint::Open(p).ok());  // the checkpoint maps what is there
  auto m = Transformer::Load(p);
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(absl::IsNotFound(m.status()));
  EXPECT_EQ(m.status().message(),
            absl::StrCat(p,
                         ": tensor 'blk.1.ffn_up.weight' (model.layers.1.mlp.up_proj.weight) "
                         "not found"));
  // A wrong shape: the keys say feed_forward_length 100, the tensors 192.
  const std::string q = TinyWith(
      "ffn",
      [](GgufWriter& w) {
        ModelConfig c = *NamedShape("tiny");
        c.intermediate_size = 100;
        EXPECT_TRUE(AddGgufModelKeys(c, w).ok());
      },
      nullptr, /*model_keys=*/false);
  auto m2 = Transformer::Load(q);
  ASSERT_FALSE(m2.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(m2.status()));
  EXPECT_EQ(m2.status().message(),
            absl::StrCat(q,
                         ": tensor 'blk.0.ffn_gate.weight' (model.layers.0.mlp.gate_proj.weight)"
                         ": shape [192, 64] expected [100, 64]"));
}

// general.alignment 1 packs the tensors right after the header: a padding
// key of 0..3 bytes moves every F32 tensor through the four residues mod 4,
// and only the aligned one opens.
TEST(GgufModelErrorsTest, MisalignedInPlaceTensorIsRefused) {
  int opened = 0;
  for (int pad = 0; pad < 4; ++pad) {
    const std::string p = TinyWith(
        absl::StrCat("align1_", pad),
        [&](GgufWriter& w) { (void)w.AddString("pad", std::string(pad, 'x')); }, nullptr, true,
        /*alignment=*/1);
    auto f = GgufFile::Open(p);
    ASSERT_TRUE(f.ok()) << f.status();  // the file itself is well formed
    auto c = Checkpoint::Open(p);
    if (f->data_start() % 4 == 0) {
      EXPECT_TRUE(c.ok()) << c.status();
      ++opened;
      continue;
    }
    ASSERT_FALSE(c.ok());
    EXPECT_TRUE(absl::IsDataLoss(c.status())) << c.status();
    EXPECT_THAT(std::string(c.status().message()), StartsWith(p));
    EXPECT_THAT(std::string(c.status().message()),
                HasSubstr("-byte aligned for F32 (general.alignment 1)"));
  }
  EXPECT_EQ(opened, 1);
}

TEST(GgufModelErrorsTest, UnsupportedTensorTypeNamesTypeAndList) {
  ModelConfig c = *NamedShape("tiny");
  c.hidden_size = 256;
  c.head_dim = 64;
  GgufWriter w;
  ASSERT_TRUE(AddGgufModelKeys(c, w).ok());
  ASSERT_TRUE(w.AddTensor("token_embd.weight", math::DType::kF32, {c.vocab_size, 256},
                          std::vector<float>(c.vocab_size * 256, 0.1f))
                  .ok());
  ASSERT_TRUE(w.AddRawTensor("blk.0.attn_q.weight", ggml_type::kIQ2_XXS, {256, 256},
                             std::string(256 * 66, '\0'))
                  .ok());
  const std::string p = TempPath("iq2");
  ASSERT_TRUE(w.Write(p).ok());
  ExpectOpenError(p, absl::StatusCode::kUnimplemented,
                  "tensor 'blk.0.attn_q.weight' has type IQ2_XXS, which is not supported "
                  "(supported: F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K)");
}

TEST(GgufModelTest, NameMapping) {
  EXPECT_EQ(HfTensorName("blk.12.attn_q.weight"), "model.layers.12.self_attn.q_proj.weight");
  EXPECT_EQ(HfTensorName("blk.0.ffn_norm.weight"),
            "model.layers.0.post_attention_layernorm.weight");
  EXPECT_EQ(HfTensorName("output.weight"), "lm_head.weight");
  EXPECT_EQ(GgufTensorName("model.layers.3.self_attn.k_proj.bias"), "blk.3.attn_k.bias");
  EXPECT_EQ(HfTensorName("blk.01.attn_q.weight"), std::nullopt);
  EXPECT_EQ(HfTensorName("blk..attn_q.weight"), std::nullopt);
  EXPECT_EQ(HfTensorName("blk.1.attn_qkv.weight"), std::nullopt);
  EXPECT_EQ(HfTensorName("rope_freqs.weight"), std::nullopt);
  // LlamaGgufRow: a permutation within each head.
  for (size_t hd : {2u, 8u, 64u}) {
    std::vector<int> seen(3 * hd, 0);
    for (size_t r = 0; r < 3 * hd; ++r) {
      const size_t g = LlamaGgufRow(r, hd);
      ASSERT_EQ(g / hd, r / hd);
      ++seen[g];
    }
    for (int s : seen) EXPECT_EQ(s, 1);
  }
  EXPECT_EQ(LlamaGgufRow(4, 8), 1u);  // HF row hd/2 is GGUF row 1
}

}  // namespace
}  // namespace cortiq::model
