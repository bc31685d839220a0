// Writes the seed corpus of the GGUF fuzz target (tests/fuzz/corpus/gguf):
// small valid GGUF files from GgufWriter and WriteGgufModel — micro models of
// each architecture (qwen3 F32 / Q8_0 / F16, qwen2 with biases in BF16, llama
// with permuted q/k, a qwen3 with Q4_0 matrices), a file of K-quant tensors
// (Q4_K, Q6_K, IQ2_XXS raw blocks), one with metadata of every value type
// and alignment 64, and an empty one. Every file is named valid_* and opens.
//
// Usage: cortiq-fuzz-make-gguf-corpus OUT_DIR   (deterministic).
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/model/checkpoint.h"
#include "core/model/gguf.h"
#include "core/model/gguf_model.h"
#include "core/model/gguf_writer.h"
#include "core/model/random_checkpoint.h"

namespace cortiq::fuzz {
namespace {

namespace fs = std::filesystem;
using model::GgufWriter;

[[noreturn]] void Die(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "make_gguf_corpus: %s: %s\n", what.c_str(), s.ToString().c_str());
  std::exit(1);
}

void Check(const std::string& what, const absl::Status& s) {
  if (!s.ok()) Die(what, s);
}

// A micro model: vocab 40, hidden 32, 1 layer, 2 heads of 16, 1 kv head.
model::ModelConfig Micro(model::ModelConfig::Arch arch) {
  model::ModelConfig c = *model::NamedShape("tiny");
  c.arch = arch;
  c.qk_norm = arch == model::ModelConfig::Arch::kQwen3;
  c.attention_bias = arch == model::ModelConfig::Arch::kQwen2;
  c.vocab_size = 40;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 16;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  c.max_position_embeddings = 64;
  return c;
}

std::string Bytes(uint64_t seed, size_t n) {
  std::string b(n, '\0');
  uint64_t s = seed;
  for (char& ch : b) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    ch = static_cast<char>(s >> 56);
  }
  return b;
}

// Random blocks with small finite f16 scales at `scales` (offsets in a block).
std::string Blocks(uint32_t type, size_t n_values, std::vector<size_t> scales, uint64_t seed) {
  const model::GgmlTypeTraits* t = model::GgmlTypeInfo(type);
  std::string b = Bytes(seed, n_values / t->block_size * t->type_size);
  const uint16_t h = 0x1400;  // f16 ~0.001
  for (size_t i = 0; i < b.size() / t->type_size; ++i) {
    for (size_t off : scales) std::memcpy(&b[i * t->type_size + off], &h, 2);
  }
  return b;
}

void Model(const std::string& dir, const std::string& name, model::ModelConfig::Arch arch,
           math::DType ckpt_dtype, math::DType dtype) {
  const std::string tmp =
      absl::StrCat(fs::temp_directory_path().string(), "/cortiq_gguf_corpus_", getpid(), "_", name);
  model::RandomCheckpointOptions o;
  o.dtype = ckpt_dtype;
  o.seed = 7;
  Check(name, model::WriteRandomCheckpoint(Micro(arch), tmp, o));
  auto ck = model::Checkpoint::Open(tmp);
  if (!ck.ok()) Die(name, ck.status());
  model::GgufExportOptions e;
  e.dtype = dtype;
  Check(name, model::WriteGgufModel(*ck, dir + "/valid_" + name, e));
  fs::remove_all(tmp);
}

// The micro qwen3 with its matrices in Q4_0 (random blocks).
void Q4Model(const std::string& dir) {
  const model::ModelConfig c = Micro(model::ModelConfig::Arch::kQwen3);
  GgufWriter w;
  Check("q4", model::AddGgufModelKeys(c, w));
  const std::vector<std::string> tokens(c.vocab_size, "t");
  Check("q4", w.AddStringArray("tokenizer.ggml.tokens", tokens));
  const int64_t h = c.hidden_size, q = c.q_dim(), kv = c.kv_dim(), in = c.intermediate_size;
  struct M {
    const char* name;
    int64_t rows, cols;
  };
  const M ms[] = {{"token_embd.weight", c.vocab_size, h}, {"blk.0.attn_q.weight", q, h},
                  {"blk.0.attn_k.weight", kv, h},         {"blk.0.attn_v.weight", kv, h},
                  {"blk.0.attn_output.weight", h, q},     {"blk.0.ffn_gate.weight", in, h},
                  {"blk.0.ffn_up.weight", in, h},         {"blk.0.ffn_down.weight", h, in}};
  uint64_t seed = 1;
  for (const M& m : ms) {
    Check(m.name, w.AddRawTensor(m.name, model::ggml_type::kQ4_0, {m.rows, m.cols},
                                 Blocks(model::ggml_type::kQ4_0, m.rows * m.cols, {0}, ++seed)));
  }
  const std::vector<float> ones(static_cast<size_t>(std::max(h, c.head_dim)), 1.0f);
  for (const char* n : {"output_norm.weight", "blk.0.attn_norm.weight", "blk.0.ffn_norm.weight"}) {
    Check(n, w.AddTensor(n, math::DType::kF32, {h}, std::span(ones).first(h)));
  }
  for (const char* n : {"blk.0.attn_q_norm.weight", "blk.0.attn_k_norm.weight"}) {
    Check(n, w.AddTensor(n, math::DType::kF32, {c.head_dim}, std::span(ones).first(c.head_dim)));
  }
  Check("q4", w.Write(dir + "/valid_model_qwen3_q4_0"));
}

void KQuants(const std::string& dir) {
  GgufWriter w;
  Check("kq", w.AddString("general.architecture", "qwen3"));
  Check("kq", w.AddRawTensor("a", model::ggml_type::kQ4_K, {2, 256},
                             Blocks(model::ggml_type::kQ4_K, 512, {0, 2}, 11)));
  Check("kq", w.AddRawTensor("b", model::ggml_type::kQ6_K, {1, 256},
                             Blocks(model::ggml_type::kQ6_K, 256, {208}, 12)));
  Check("kq", w.AddRawTensor("c", model::ggml_type::kIQ2_XXS, {1, 256}, Bytes(13, 66)));
  Check("kq", w.Write(dir + "/valid_kquants"));
}

void Metadata(const std::string& dir) {
  GgufWriter w(64);
  Check("md", w.AddU8("u8", 1));
  Check("md", w.AddI8("i8", -1));
  Check("md", w.AddU16("u16", 2));
  Check("md", w.AddI16("i16", -2));
  Check("md", w.AddU32("u32", 3));
  Check("md", w.AddI32("i32", -3));
  Check("md", w.AddU64("u64", 4));
  Check("md", w.AddI64("i64", -4));
  Check("md", w.AddF32("f32", 0.5f));
  Check("md", w.AddF64("f64", 0.25));
  Check("md", w.AddBool("bool", true));
  Check("md", w.AddString("str", "text"));
  const std::vector<std::string> s = {"a", "bc"};
  Check("md", w.AddStringArray("strs", s));
  const std::vector<int32_t> i = {1, 2, 3};
  Check("md", w.AddI32Array("ints", i));
  const std::vector<float> f = {1.0f, 2.0f};
  Check("md", w.AddF32Array("floats", f));
  Check("md", w.AddTensor("t", math::DType::kQ8_0, {2, 32}, std::vector<float>(64, 0.5f)));
  Check("md", w.AddTensor("u", math::DType::kBF16, {3}, std::vector<float>(3, 0.5f)));
  Check("md", w.Write(dir + "/valid_metadata_align64"));
  Check("empty", GgufWriter().Write(dir + "/valid_empty"));
}

}  // namespace
}  // namespace cortiq::fuzz

int main(int argc, char** argv) {
  using namespace cortiq;  // NOLINT
  using Arch = model::ModelConfig::Arch;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  std::filesystem::create_directories(dir);
  fuzz::Model(dir, "model_qwen3_f32", Arch::kQwen3, math::DType::kF32, math::DType::kF32);
  fuzz::Model(dir, "model_qwen3_q8_0", Arch::kQwen3, math::DType::kF32, math::DType::kQ8_0);
  fuzz::Model(dir, "model_qwen3_f16", Arch::kQwen3, math::DType::kF16, math::DType::kF16);
  fuzz::Model(dir, "model_qwen2_bf16", Arch::kQwen2, math::DType::kBF16, math::DType::kBF16);
  fuzz::Model(dir, "model_llama_f32", Arch::kLlama, math::DType::kF32, math::DType::kF32);
  fuzz::Model(dir, "model_llama_q8_0", Arch::kLlama, math::DType::kF32, math::DType::kQ8_0);
  fuzz::Q4Model(dir);
  fuzz::KQuants(dir);
  fuzz::Metadata(dir);
  // Every seed opens (the models as models); found_* files (campaign
  // findings kept as regressions) are not seeds.
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string p = e.path().string();
    if (e.path().filename().string().rfind("valid_", 0) != 0) continue;
    auto f = model::GgufFile::Open(p);
    if (!f.ok()) fuzz::Die(p, f.status());
    if (p.find("valid_model_") != std::string::npos) {
      auto ck = model::Checkpoint::Open(p);
      if (!ck.ok()) fuzz::Die(p, ck.status());
    }
  }
  return 0;
}
