// `cortiq-tool ppl`: perplexity of a text file under any attention mode, in
// the protocol of seed 002 — windows of `window` tokens (default 512); each
// window is a fresh sequence whose first `prefill` tokens (default 256) are
// absorbed by one prefill (exact attention; O(1) layers freeze their
// landmarks there), and whose remaining tokens are decoded one by one
// (teacher-forced). Scored tokens: the ones predicted by the decode steps,
// i.e. positions prefill+1 .. window-1 of every window, so every mode is
// compared with exact attention over the same scored tokens. The exact
// baseline runs in the same invocation and the ratio is printed. QSA
// (--qsa) and sink + window (--sink-window) are compared the same way; the
// modes do not combine.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "core/kv/layer_kv_cache.h"
#include "core/kv/o1_config.h"
#include "core/model/transformer.h"

namespace cortiq::tools {

struct PplOptions {
  std::string model_dir;
  std::string text_file;
  size_t window = 512;
  size_t prefill = 256;
  long max_windows = -1;  // -1: every full or partial window
  kv::KvMode kv_mode = kv::KvMode::kF32;
  bool bf16_activations = true;  // model::LoadOptions (bf16 weights only)
  model::LoadOptions::Weights weights = model::LoadOptions::Weights::kCheckpoint;
  // Set: run the O(1) mode with these request-level overrides (the rest
  // resolves through env > config.json hint > defaults, as in the server).
  std::optional<kv::O1Overrides> o1;
  // Set: run QSA sparse attention on these layers (all | deepN | i,j,k) with
  // blocks of qsa_ratio tokens and qsa_budget blocks per query.
  std::optional<std::string> qsa;
  size_t qsa_ratio = 64;
  size_t qsa_budget = 16;
  // Set: run sink + sliding-window attention (StreamingLLM) on these layers,
  // keeping the first sw_sink and the last sw_window positions.
  std::optional<std::string> sink_window;
  size_t sw_sink = 4;
  size_t sw_window = 128;
  bool baseline = true;  // also run exact f32 and print the ratio
};

int RunPpl(const PplOptions& options);

}  // namespace cortiq::tools
