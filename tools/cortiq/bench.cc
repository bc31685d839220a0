#include "tools/cortiq/bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "core/math/bench_util.h"
#include "core/math/kernels.h"
#include "core/model/random_checkpoint.h"
#include "core/model/transformer.h"
#include "core/util/thread_pool.h"

namespace cortiq::tools {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "cortiq-tool bench: %s\n", s.ToString().c_str());
  return 1;
}

// Deterministic pseudo-random token ids (the content does not matter for
// speed, but must stay inside the vocabulary).
std::vector<int32_t> TokenIds(size_t n, int64_t vocab, uint64_t seed) {
  std::vector<int32_t> ids(n);
  uint64_t s = seed;
  for (auto& id : ids) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    id = static_cast<int32_t>((s >> 33) % uint64_t(vocab));
  }
  return ids;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int RunBench(const BenchOptions& o) {
  util::ThreadPool pool(o.threads);
  std::string dir = o.model_dir;
  if (dir.empty()) {
    dir = "build/models/bench-" + o.shape + "-" + o.dtype;
    if (!std::filesystem::exists(dir + "/config.json")) {
      auto config = model::NamedShape(o.shape);
      if (!config.ok()) return Fail(config.status());
      model::RandomCheckpointOptions ro;
      ro.dtype = o.dtype == "bf16"  ? math::DType::kBF16
                 : o.dtype == "f16" ? math::DType::kF16
                                    : math::DType::kF32;
      std::fprintf(stderr, "writing a random %s checkpoint (%s) to %s ...\n", o.shape.c_str(),
                   o.dtype.c_str(), dir.c_str());
      absl::Status s = model::WriteRandomCheckpoint(*config, dir, ro);
      if (!s.ok()) return Fail(s);
    }
  }
  model::LoadOptions lo;
  lo.pool = &pool;
  lo.bf16_activations = o.bf16_activations;
  lo.weights = o.weights;
  auto loaded = model::Transformer::Load(dir, lo);
  if (!loaded.ok()) return Fail(loaded.status());
  const model::Transformer& tf = **loaded;
  const model::ModelConfig& c = tf.config();
  const kv::KvMode kv_mode = o.kv == "int8" ? kv::KvMode::kInt8 : kv::KvMode::kF32;

  std::printf("cortiq-tool bench: model %s, isa %s, threads %zu, kv %s, activations %s%s\n",
              dir.c_str(), math::IsaName(math::ActiveIsa()), pool.num_threads(), o.kv.c_str(),
              tf.bf16_activations() ? "bf16" : "f32",
              !tf.bf16_activations() || math::AmxTilesUsed() ? ""
              : math::GemmBf16Used()                         ? " (prefill GEMM on VDPBF16PS)"
                                     : " (prefill GEMM: f32 FMA on bf16-rounded x)");
  std::printf("cortiq-tool bench: weights %s (%s), %.1f MB read per decode step\n",
              model::WeightsName(tf.weights()),
              tf.Int8CopyBytes() > 0 ? "quantized to Q8_0 at load" : "as stored in the checkpoint",
              static_cast<double>(tf.WeightBytesPerStep()) / 1e6);
  if (math::Q8AmxUsed(size_t{1} << 20)) {
    std::printf(
        "cortiq-tool bench: Q8_0 matrices on AMX-INT8 tiles from batch %zu (below: "
        "VPDPBUSD)\n",
        math::Q8AmxMinBatch());
  }
  std::printf(
      "shape: hidden %lld, layers %lld, heads %lld/%lld, head_dim %lld, inter %lld, vocab %lld\n",
      (long long)c.hidden_size, (long long)c.num_hidden_layers, (long long)c.num_attention_heads,
      (long long)c.num_key_value_heads, (long long)c.head_dim, (long long)c.intermediate_size,
      (long long)c.vocab_size);

  // --- machine roofline, measured now (and again next to each decode round)
  math::ReadBandwidthProbe probe(o.bandwidth_bytes, &pool);
  const double bw = probe.Measure();
  const double peak = math::MeasureFmaPeakGflops(&pool);
  std::printf("memory read bandwidth: %.2f GB/s (%.1f GB buffer)\n", bw,
              double(o.bandwidth_bytes) / 1e9);
  std::printf("fp32 FMA peak: %.1f GFLOP/s\n", peak);

  // --- prefill of `context` tokens (after a warm-up that faults the weights in)
  const std::vector<int32_t> prompt = TokenIds(o.context, c.vocab_size, 42);
  model::ForwardScratch scratch;
  std::vector<float> logits(
      size_t(c.vocab_size) *
      std::max<size_t>(
          1, o.batches.empty() ? 1 : *std::max_element(o.batches.begin(), o.batches.end())));
  model::SequenceKv base(c, kv_mode);
  {
    model::SequenceKv warm(c, kv_mode);
    absl::Status s = tf.Prefill(prompt, warm, scratch, logits.data());
    if (!s.ok()) return Fail(s);
  }
  // The machine is shared (a VM): every figure is the median of repeats.
  std::vector<double> prefill_runs;
  absl::Status s;
  for (int rep = 0; rep < 3; ++rep) {
    model::SequenceKv run(c, kv_mode);
    auto t0 = Clock::now();
    s = tf.Prefill(prompt, run, scratch, logits.data());
    prefill_runs.push_back(Seconds(t0, Clock::now()));
    if (!s.ok()) return Fail(s);
    if (rep == 2) base = std::move(run);
  }
  const double T = double(o.context);
  const double layer_params = double(c.q_dim() + 2 * c.kv_dim()) * c.hidden_size +
                              double(c.hidden_size) * c.q_dim() +
                              3.0 * double(c.intermediate_size) * c.hidden_size;
  const double matmul_flops =
      2.0 * layer_params * c.num_hidden_layers * T + 2.0 * double(c.vocab_size) * c.hidden_size;
  // Causal attention: QK^T and PV, T^2/2 positions per head.
  const double attn_flops = 2.0 * 2.0 * double(c.num_attention_heads) * c.head_dim *
                            (T * (T + 1) / 2) * c.num_hidden_layers;
  const double prefill_s = Median(prefill_runs);
  const double prefill_gflops = (matmul_flops + attn_flops) / prefill_s / 1e9;
  std::printf(
      "prefill %zu tokens: %.3f s (median of 3), %.0f tokens/s, %.1f GFLOP/s = %.0f%% of FMA "
      "peak\n",
      o.context, prefill_s, T / prefill_s, prefill_gflops, 100.0 * prefill_gflops / peak);

  // --- decode at batch B, each sequence starting from the prefilled context.
  // The machine is a shared VM whose memory bandwidth drifts by ±20% within
  // seconds, so the steps run in rounds that interleave the batch sizes, each
  // batch's share of a round right after its own bandwidth probe. A roofline
  // share compares a round's steps with its own probe, and the ratio to batch
  // 1 compares the two batches' steps of the same round; both are reported
  // as the median over rounds (with their range), step times as the median
  // of all steps.
  const double weight_bytes = double(tf.WeightBytesPerStep());
  // KV rows a step reads: every stored position of every layer (K and V),
  // at the cache's element size (capacity beyond the rows is not read).
  const double row_bytes =
      kv_mode == kv::KvMode::kInt8 ? double(c.head_dim) + 4.0 : 4.0 * double(c.head_dim);
  struct Run {
    size_t batch;
    std::vector<model::SequenceKv> seqs;
    std::vector<model::SequenceKv*> ptrs;
    std::vector<int32_t> next;
    std::vector<double> step_times, round_step, shares, probes;
    double kv_bytes = 0;
  };
  std::vector<Run> runs(o.batches.size());
  for (size_t i = 0; i < runs.size(); ++i) {
    Run& run = runs[i];
    run.batch = o.batches[i];
    run.seqs.reserve(run.batch);
    for (size_t b = 0; b < run.batch; ++b) {
      run.seqs.push_back(base.Copy());
      run.seqs.back().Reserve(o.context + o.decode_steps + 4);
    }
    for (auto& q : run.seqs) run.ptrs.push_back(&q);
    run.next = TokenIds(run.batch, c.vocab_size, 7 + run.batch);
    // One warm-up step (grows the scratch to B rows).
    s = tf.DecodeBatch(run.next, run.ptrs, scratch, logits.data());
    if (!s.ok()) return Fail(s);
  }
  const size_t rounds = std::max<size_t>(1, std::min<size_t>(4, o.decode_steps / 4));
  for (size_t r = 0; r < rounds; ++r) {
    const size_t n = o.decode_steps / rounds + (r < o.decode_steps % rounds ? 1 : 0);
    for (Run& run : runs) {
      const double bw_r = probe.Measure();
      run.probes.push_back(bw_r);
      run.kv_bytes = 0;
      for (auto& q : run.seqs) {
        run.kv_bytes += double(q.position()) * double(c.num_hidden_layers) * 2.0 *
                        double(c.num_key_value_heads) * row_bytes;
      }
      std::vector<double> round_times;
      for (size_t step = 0; step < n; ++step) {
        auto d0 = Clock::now();
        s = tf.DecodeBatch(run.next, run.ptrs, scratch, logits.data());
        round_times.push_back(Seconds(d0, Clock::now()));
        if (!s.ok()) return Fail(s);
      }
      run.step_times.insert(run.step_times.end(), round_times.begin(), round_times.end());
      run.round_step.push_back(Median(round_times));
      run.shares.push_back((weight_bytes + run.kv_bytes) / (bw_r * 1e9) / run.round_step.back());
    }
  }
  auto min_of = [](const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); };
  auto max_of = [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); };
  const Run* one = nullptr;
  for (const Run& run : runs) {
    if (run.batch == 1) one = &run;
  }
  for (const Run& run : runs) {
    const double step_s = Median(run.step_times);
    // Bytes one step must read: every weight once + every sequence's cache.
    const double step_bytes = weight_bytes + run.kv_bytes;
    const double bw_med = Median(run.probes);
    const double roofline_step_s = step_bytes / (bw_med * 1e9);
    const double tps = double(run.batch) / step_s;
    std::printf(
        "decode batch %zu: %.2f ms/step (median of %zu), %.2f tokens/s aggregate; reads %.1f "
        "MB/step (weights %.1f + kv %.1f); bandwidth next to the %zu rounds %.1f-%.1f GB/s "
        "(median %.1f): roofline %.2f ms/step -> %.0f%% of roofline (median of the rounds' "
        "shares; range %.0f-%.0f%%)",
        run.batch, step_s * 1e3, run.step_times.size(), tps, step_bytes / 1e6, weight_bytes / 1e6,
        run.kv_bytes / 1e6, rounds, min_of(run.probes), max_of(run.probes), bw_med,
        roofline_step_s * 1e3, 100.0 * Median(run.shares), 100.0 * min_of(run.shares),
        100.0 * max_of(run.shares));
    if (run.batch > 1 && one != nullptr) {
      std::vector<double> ratio;
      for (size_t r = 0; r < rounds; ++r) {
        ratio.push_back(double(run.batch) * one->round_step[r] / run.round_step[r]);
      }
      std::printf("; %.2fx batch 1 (median of the rounds; range %.2f-%.2fx)", Median(ratio),
                  min_of(ratio), max_of(ratio));
    }
    std::printf("\n");
  }
  return 0;
}

}  // namespace cortiq::tools
