// `cortiq-tool bench-context`: decode step time and per-session state bytes
// against context length, per attention mode, at a named shape.
//
// Contexts of 64K tokens cannot be prefilled through the model here in
// reasonable time (the attention alone is O(T²)), and a decode step's cost
// does not depend on what the cached rows contain, only on how many there
// are. So each layer's state is synthesised directly through the cache API
// the forward pass itself uses: T rows of random K/V appended (exact, int8),
// or appended with a random query trace and sealed (O(1): O1Begin → Append +
// O1PushQ → O1Seal, one layer at a time so the trace never exists for all
// layers at once). QSA reads the exact rows, so mode `qsa` appends them as
// exact does and then ingests T rows through each QSA layer's indexer
// (Transformer::QsaIngestRows, chunks of 256): the indexer projects keys from
// the layer's normed input, so random hidden rows scaled to unit RMS stand in
// for it (what RmsNorm with unit weights yields). The timed decode steps then
// run the real forward pass: ingest + selection + attention over the
// `budget` selected blocks instead of all T rows.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/kv/o1_config.h"
#include "core/model/random_checkpoint.h"
#include "core/model/transformer.h"
#include "tools/cortiq/bench.h"

namespace cortiq::tools {
namespace {

using Clock = std::chrono::steady_clock;

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "cortiq-tool bench-context: %s\n", s.ToString().c_str());
  return 1;
}

// A pool of random rows reused cyclically (values in [-1, 1)).
struct RowPool {
  std::vector<float> data;
  size_t row = 0, rows = 0;
  RowPool(size_t row_floats, size_t n, uint64_t seed)
      : data(row_floats * n), row(row_floats), rows(n) {
    uint64_t s = seed;
    for (float& x : data) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      x = float(double(s >> 11) * 0x1.0p-53 * 2.0 - 1.0);
    }
  }
  std::span<const float> Get(size_t i) const { return {data.data() + (i % rows) * row, row}; }
};

absl::StatusOr<model::SequenceKv> Synthesize(const model::Transformer& tf, const std::string& mode,
                                             size_t T, size_t extra, const kv::O1Config& o1,
                                             const model::QsaConfig& qsa) {
  const model::ModelConfig& c = tf.config();
  const size_t kvw = size_t(c.num_key_value_heads * c.head_dim);
  const size_t qw = size_t(c.num_attention_heads * c.head_dim);
  RowPool keys(kvw, 1024, 1), values(kvw, 1024, 2), queries(qw, 1024, 3);
  model::SequenceKv seq(c, mode == "int8" ? kv::KvMode::kInt8 : kv::KvMode::kF32);
  if (mode == "qsa") {
    absl::Status s = seq.EnableQsa(qsa);
    if (!s.ok()) return s;
  } else if (mode == "o1") {
    absl::Status s = seq.EnableO1(o1);
    if (!s.ok()) return s;
  }
  const size_t hidden = size_t(c.hidden_size);
  constexpr size_t kChunk = 256;
  std::vector<float> normed;
  if (mode == "qsa") {
    // Unit-RMS rows: uniform [-1, 1) has RMS 1/sqrt(3).
    RowPool h(hidden, kChunk, 4);
    normed = h.data;
    for (float& x : normed) x *= 1.7320508f;
  }
  for (size_t l = 0; l < seq.num_layers(); ++l) {
    // The layer's rows are written straight into a cache, which the layer's
    // state then takes over (a prefill of T positions would take minutes).
    kv::LayerKvCache cache(size_t(c.num_key_value_heads), size_t(c.head_dim), seq.mode());
    const bool o1_layer = mode == "o1" && o1.IsO1Layer(l);
    if (o1_layer) {
      absl::Status s = cache.O1Begin(o1.m, o1.w, o1.sink, o1.rect);
      if (!s.ok()) return s;
    } else {
      cache.Reserve(T + extra);
    }
    for (size_t p = 0; p < T; ++p) {
      cache.Append(keys.Get(p * 7 + l), values.Get(p * 5 + l));
      if (o1_layer) cache.O1PushQ(queries.Get(p * 3 + l));
    }
    if (o1_layer) {
      absl::Status s = cache.O1Seal(size_t(c.num_attention_heads));
      if (!s.ok()) return s;
    }
    absl::Status s = seq.layer(l).InstallCache(std::move(cache), T);
    if (!s.ok()) return s;
  }
  if (mode == "qsa") {
    absl::Status s = tf.BindQsa(seq);  // states sized to the reserved capacity
    if (!s.ok()) return s;
    for (size_t l : qsa.layers) {
      for (size_t p = 0; p < T; p += kChunk) {
        s = tf.QsaIngestRows(seq, l, normed.data(), std::min(kChunk, T - p));
        if (!s.ok()) return s;
      }
    }
  }
  return seq;
}

}  // namespace

int RunBenchContext(const BenchContextOptions& o) {
  util::ThreadPool pool(o.threads);
  auto config = model::NamedShape(o.shape);
  if (!config.ok()) return Fail(config.status());
  // The shape's own context limit (40960 for Qwen3-0.6B) is raised to the
  // longest context measured, as a long-context deployment would configure.
  size_t longest = 0;
  for (size_t t : o.contexts) longest = std::max(longest, t);
  config->max_position_embeddings =
      std::max<int64_t>(config->max_position_embeddings, int64_t(longest + o.steps + 8));
  const std::string dir = absl::StrCat("build/models/bench-", o.shape, "-", o.dtype, "-ctx",
                                       config->max_position_embeddings);
  if (!std::filesystem::exists(dir + "/config.json")) {
    model::RandomCheckpointOptions ro;
    ro.dtype = o.dtype == "bf16" ? math::DType::kBF16 : math::DType::kF32;
    std::fprintf(stderr, "writing a random %s checkpoint to %s ...\n", o.shape.c_str(),
                 dir.c_str());
    absl::Status s = model::WriteRandomCheckpoint(*config, dir, ro);
    if (!s.ok()) return Fail(s);
  }
  auto loaded = model::Transformer::Load(dir, &pool);
  if (!loaded.ok()) return Fail(loaded.status());
  const model::Transformer& tf = **loaded;
  const model::ModelConfig& c = tf.config();

  auto o1 = kv::ResolveO1Config(o.o1, {}, {}, {}, size_t(c.num_hidden_layers));
  if (!o1.ok()) return Fail(o1.status());
  auto qsa = model::MakeQsaConfig(o.qsa, o.qsa_ratio, o.qsa_budget, size_t(c.num_hidden_layers));
  if (!qsa.ok()) return Fail(qsa.status());
  std::printf("bench-context: %s (%s), threads %zu, %zu decode steps per point; o1: %s; %s\n",
              o.shape.c_str(), o.dtype.c_str(), pool.num_threads(), o.steps,
              o1->DebugString().c_str(), qsa->DebugString().c_str());
  std::printf(
      "| mode | context | step ms | state MB | of which o1 / qsa MB |\n"
      "|---|---|---|---|---|\n");
  std::vector<float> logits(size_t(c.vocab_size));
  model::ForwardScratch scratch;
  for (const std::string& mode : o.modes) {
    for (size_t T : o.contexts) {
      const double projected_gb =
          double(kv::LayerKvCache::ProjectedBytes(
              c.num_key_value_heads, c.head_dim,
              mode == "int8" ? kv::KvMode::kInt8 : kv::KvMode::kF32, T + o.steps + 1)) *
          double(c.num_hidden_layers) / 1e9;
      if (mode != "o1" && projected_gb > o.max_state_gb) {
        std::printf("| %s | %zu | skipped: %.1f GB of state > --max-state-gb %.1f | | |\n",
                    mode.c_str(), T, projected_gb, o.max_state_gb);
        std::fflush(stdout);
        continue;
      }
      auto seq = Synthesize(tf, mode, T, o.steps + 2, *o1, *qsa);
      if (!seq.ok()) return Fail(seq.status());
      model::SequenceKv* seqs[1] = {&*seq};
      int32_t token = 1;
      absl::Status s =
          tf.DecodeBatch(std::span<const int32_t>(&token, 1), seqs, scratch, logits.data());
      if (!s.ok()) return Fail(s);
      const size_t bytes = seq->MemoryBytes();
      auto t0 = Clock::now();
      for (size_t i = 0; i < o.steps; ++i) {
        token = int32_t((i * 31 + 7) % uint64_t(c.vocab_size));
        s = tf.DecodeBatch(std::span<const int32_t>(&token, 1), seqs, scratch, logits.data());
        if (!s.ok()) return Fail(s);
      }
      const double ms =
          std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / double(o.steps);
      std::printf("| %s | %zu | %.2f | %.1f | %.1f |\n", mode.c_str(), T, ms, double(bytes) / 1e6,
                  double(seq->O1MemoryBytes() + seq->QsaMemoryBytes()) / 1e6);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace cortiq::tools
