// Writes the seed corpus of the wire-import fuzz target: small valid CQSW
// session streams of every attention mode, wire version and row encoding,
// and standalone CQKV layer blobs, all for the "tiny" random checkpoint and
// kWireFuzzFingerprint (tests/fuzz/wire_fuzz_util.h). Every file is named
// valid_*: the corpus test (tests/session/wire_corpus_test.cc) requires
// those to import.
//
// Usage: cortiq-fuzz-make-corpus OUT_DIR   (deterministic: greedy and
// seeded sampling, a checkpoint of fixed shape and seed; rerunning it
// rewrites the same bytes).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/model/random_checkpoint.h"
#include "core/model/transformer.h"
#include "core/session/engine.h"
#include "core/session/session_store.h"
#include "core/session/session_wire.h"
#include "core/tokenizer/tokenizer.h"
#include "tests/fuzz/wire_fuzz_util.h"

namespace cortiq::fuzz {
namespace {

namespace fs = std::filesystem;
using session::AttentionMode;
using session::SessionConfig;

[[noreturn]] void Die(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "make_corpus: %s: %s\n", what.c_str(), s.ToString().c_str());
  std::exit(1);
}

// n ids in [0, vocab) from an LCG (the same on every machine).
std::vector<int32_t> Ids(size_t n, int64_t vocab, uint32_t seed) {
  std::vector<int32_t> ids(n);
  uint32_t s = seed;
  for (auto& id : ids) {
    s = s * 1664525u + 1013904223u;
    id = int32_t((s >> 8) % uint32_t(vocab));
  }
  return ids;
}

class Generator {
 public:
  explicit Generator(std::string out) : out_(std::move(out)) {
    dir_ = (fs::temp_directory_path() / "cortiq_make_corpus_model").string();
    auto config = model::NamedShape(kWireFuzzShape);
    if (!config.ok()) Die("NamedShape", config.status());
    if (absl::Status s = model::WriteRandomCheckpoint(*config, dir_, {}); !s.ok()) {
      Die("WriteRandomCheckpoint", s);
    }
    auto m = model::Transformer::Load(dir_);
    if (!m.ok()) Die("Load", m.status());
    model_ = *std::move(m);
    auto t = tokenizer::Tokenizer::FromFile(dir_ + "/tokenizer.json");
    if (!t.ok()) Die("tokenizer", t.status());
    tok_ = std::make_unique<tokenizer::Tokenizer>(*std::move(t));
    engine_ = std::make_unique<session::Engine>(*model_, *tok_, session::EngineOptions{});
  }
  ~Generator() {
    engine_.reset();
    fs::remove_all(dir_);
  }

  // A kept session of `config` after a prompt of `prompt` tokens and `gen`
  // generated ones (gen 0: a fresh session, nothing ran).
  std::string MakeSession(const SessionConfig& config, size_t prompt, size_t gen, bool sampled) {
    auto lease = store_.Create(*model_, config, 0);
    if (!lease.ok()) Die("Create", lease.status());
    const std::string id = (*lease)->id();
    lease->Return();
    if (gen == 0) return id;
    session::GenerationRequest r;
    r.prompt = Ids(prompt, model_->config().vocab_size, static_cast<uint32_t>(prompt * 31 + gen));
    r.max_tokens = gen;
    r.ignore_eos = true;
    r.sampling.temperature = sampled ? 0.9f : 0.0f;
    r.sampling.seed = 77;
    auto l2 = store_.Acquire(id);
    if (!l2.ok()) Die("Acquire", l2.status());
    auto job = engine_->Submit(*std::move(l2), std::move(r));
    if (!job.ok()) Die("Submit", job.status());
    session::GenerationEvent ev;
    while ((*job)->WaitPop(&ev)) {
    }
    if (!(*job)->result().status.ok()) Die("generation", (*job)->result().status);
    return id;
  }

  void WriteSession(const std::string& name, const std::string& id, uint32_t version, bool f16) {
    auto lease = store_.Acquire(id);
    if (!lease.ok()) Die("Acquire", lease.status());
    auto wire =
        session::ExportSessionWire(**lease, kWireFuzzFingerprint, {.version = version, .f16 = f16});
    if (!wire.ok()) Die(name, wire.status());
    Write(name, *wire);
  }

  // Layer `layer` of session `id` as a standalone CQKV blob.
  void WriteLayer(const std::string& name, const std::string& id, size_t layer, uint32_t version,
                  bool f16) {
    auto lease = store_.Acquire(id);
    if (!lease.ok()) Die("Acquire", lease.status());
    auto blob = (*lease)->kv().layer(layer).cache()->ExportWire({.version = version, .f16 = f16});
    if (!blob.ok()) Die(name, blob.status());
    Write(name, *blob);
  }

  const model::Transformer& model() const { return *model_; }

 private:
  void Write(const std::string& name, const std::string& bytes) {
    std::ofstream f(out_ + "/" + name, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!f) Die(name, absl::InternalError("write failed"));
    std::printf("%-40s %7zu bytes\n", name.c_str(), bytes.size());
  }

  std::string out_;
  std::string dir_;
  std::unique_ptr<model::Transformer> model_;
  std::unique_ptr<tokenizer::Tokenizer> tok_;
  session::SessionStore store_{{}};
  std::unique_ptr<session::Engine> engine_;
};

SessionConfig Exact() { return {}; }
SessionConfig Int8() {
  SessionConfig c;
  c.kv_mode = kv::KvMode::kInt8;
  return c;
}
SessionConfig O1() {
  SessionConfig c;
  c.attention = AttentionMode::kO1;
  c.o1.layers = {0, 1};
  c.o1.m = 8;
  c.o1.w = 16;
  c.o1.sink = 2;
  return c;
}
SessionConfig Qsa(size_t num_layers) {
  SessionConfig c;
  c.attention = AttentionMode::kQsa;
  auto q = model::MakeQsaConfig("all", 16, 4, num_layers);
  if (!q.ok()) Die("MakeQsaConfig", q.status());
  c.qsa = *q;
  return c;
}

int Main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  fs::create_directories(argv[1]);
  Generator g(argv[1]);
  const size_t layers = static_cast<size_t>(g.model().config().num_hidden_layers);

  const std::string exact = g.MakeSession(Exact(), 6, 4, /*sampled=*/true);
  g.WriteSession("valid_s_exact_v2_f32", exact, 2, false);
  g.WriteSession("valid_s_exact_v2_f16", exact, 2, true);
  g.WriteSession("valid_s_exact_v1_f32", exact, 1, false);
  g.WriteSession("valid_s_exact_v1_f16", exact, 1, true);
  g.WriteLayer("valid_kv_f32_v1", exact, 0, 1, false);
  g.WriteLayer("valid_kv_f16_v2", exact, 1, 2, true);

  const std::string fresh = g.MakeSession(Exact(), 0, 0, false);
  g.WriteSession("valid_s_fresh_v2", fresh, 2, false);
  g.WriteLayer("valid_kv_empty_v2", fresh, 0, 2, false);

  const std::string int8 = g.MakeSession(Int8(), 12, 3, /*sampled=*/false);
  g.WriteSession("valid_s_int8_v2", int8, 2, false);
  g.WriteLayer("valid_kv_int8_v2", int8, 1, 2, false);

  // Past sink + w (2 + 16) positions: skeleton mode with a far field.
  const std::string o1 = g.MakeSession(O1(), 30, 5, /*sampled=*/true);
  g.WriteSession("valid_s_o1_skeleton_v2", o1, 2, false);
  g.WriteLayer("valid_kv_o1_skeleton_v2", o1, 0, 2, false);
  // A short prompt: the exact-only window.
  const std::string o1_short = g.MakeSession(O1(), 5, 2, /*sampled=*/false);
  g.WriteSession("valid_s_o1_exact_only_v2", o1_short, 2, false);
  g.WriteLayer("valid_kv_o1_exact_only_v2", o1_short, 1, 2, false);

  // 40 positions at ratio 16: two pooled blocks per QSA layer.
  const std::string qsa = g.MakeSession(Qsa(layers), 36, 5, /*sampled=*/false);
  g.WriteSession("valid_s_qsa_v2", qsa, 2, false);
  g.WriteSession("valid_s_qsa_v1_f16", qsa, 1, true);
  const std::string qsa_fresh = g.MakeSession(Qsa(layers), 0, 0, false);
  g.WriteSession("valid_s_qsa_fresh_v2", qsa_fresh, 2, false);
  return 0;
}

}  // namespace
}  // namespace cortiq::fuzz

int main(int argc, char** argv) { return cortiq::fuzz::Main(argc, argv); }
