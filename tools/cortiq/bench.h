// `cortiq-tool bench`: decode and prefill throughput against the machine's
// own roofline (memory read bandwidth and fp32 FMA peak, measured in the same
// run). A benchmark, not a test: it prints figures and judges nothing.
#pragma once

#include <string>
#include <vector>

namespace cortiq::tools {

struct BenchOptions {
  std::string model_dir;        // empty: write a random checkpoint of `shape`
  std::string shape = "qwen3-0.6b";
  std::string dtype = "bf16";
  std::string kv = "f32";
  size_t context = 512;          // tokens in each sequence before decode
  std::vector<size_t> batches = {1, 8};
  size_t decode_steps = 32;
  size_t bandwidth_bytes = size_t(2) << 30;
  size_t threads = 0;            // 0 = hardware
};

int RunBench(const BenchOptions& options);

}  // namespace cortiq::tools
