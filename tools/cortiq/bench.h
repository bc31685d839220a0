// `cortiq-tool bench`: decode and prefill throughput against the machine's
// own roofline (memory read bandwidth and fp32 FMA peak, measured in the same
// run). A benchmark, not a test: it prints figures and judges nothing.
#pragma once

#include <string>
#include <vector>

#include "core/kv/o1_config.h"
#include "core/model/transformer.h"

namespace cortiq::tools {

struct BenchOptions {
  std::string model_dir;  // empty: write a random checkpoint of `shape`
  std::string shape = "qwen3-0.6b";
  std::string dtype = "bf16";
  std::string kv = "f32";
  size_t context = 512;  // tokens in each sequence before decode
  std::vector<size_t> batches = {1, 8};
  size_t decode_steps = 32;
  size_t bandwidth_bytes = size_t(2) << 30;
  size_t threads = 0;  // 0 = hardware
  bool bf16_activations = true;  // model::LoadOptions
  model::LoadOptions::Weights weights = model::LoadOptions::Weights::kCheckpoint;
};

int RunBench(const BenchOptions& options);

struct BenchContextOptions {
  std::string shape = "qwen3-0.6b";
  std::string dtype = "bf16";
  std::vector<size_t> contexts = {1024, 4096, 16384, 65536};
  std::vector<std::string> modes = {"exact", "int8", "o1"};
  std::string qsa = "all";  // QSA layer spec (mode "qsa")
  size_t qsa_ratio = 64;
  size_t qsa_budget = 16;
  kv::O1Overrides o1;  // request-level O(1) settings (defaults: all layers, m=32, W=128, sink=4)
  size_t steps = 8;
  double max_state_gb = 8.0;  // skip exact points whose state would exceed this
  size_t threads = 0;
};

int RunBenchContext(const BenchContextOptions& options);

}  // namespace cortiq::tools
