#include "tools/cortiq/ppl.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/model/model_files.h"
#include "core/model/transformer.h"
#include "core/tokenizer/tokenizer.h"

namespace cortiq::tools {
namespace {

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "cortiq-tool ppl: %s\n", s.ToString().c_str());
  return 1;
}

struct Score {
  double nll = 0;     // summed negative log-likelihood (nats)
  size_t tokens = 0;  // scored tokens
  size_t bytes = 0;   // their UTF-8 bytes
  size_t windows = 0;
};

// -log softmax(row)[target], in f64.
double Nll(const float* row, size_t vocab, int32_t target) {
  double mx = row[0];
  for (size_t j = 1; j < vocab; ++j) mx = std::max<double>(mx, row[j]);
  double z = 0;
  for (size_t j = 0; j < vocab; ++j) z += std::exp(double(row[j]) - mx);
  return mx + std::log(z) - double(row[target]);
}

absl::StatusOr<Score> Run(const model::Transformer& tf, const tokenizer::Tokenizer& tok,
                          const std::vector<int32_t>& ids, const PplOptions& o, kv::KvMode mode,
                          const attention::AttentionConfig& modes) {
  const size_t vocab = tf.config().vocab_size;
  std::vector<float> logits(vocab);
  model::ForwardScratch scratch;
  Score s;
  for (size_t start = 0; start < ids.size(); start += o.window) {
    if (o.max_windows >= 0 && long(s.windows) >= o.max_windows) break;
    const size_t n = std::min(o.window, ids.size() - start);
    if (n <= o.prefill) break;  // nothing left to score in this window
    const int32_t* w = ids.data() + start;
    model::SequenceKv kv(tf.config(), mode);
    if (modes.o1.has_value()) {
      absl::Status st = kv.EnableO1(*modes.o1);
      if (!st.ok()) return st;
    }
    if (modes.qsa.has_value()) {
      absl::Status st = kv.EnableQsa(*modes.qsa);
      if (!st.ok()) return st;
    }
    if (modes.window.has_value()) {
      absl::Status st = kv.EnableWindow(*modes.window);
      if (!st.ok()) return st;
    }
    kv.Reserve(n);
    absl::Status st =
        tf.Prefill(std::span<const int32_t>(w, o.prefill), kv, scratch, logits.data());
    if (!st.ok()) return st;
    tf.SealO1(kv);  // landmarks frozen at the prefill (no-op for exact modes)
    model::SequenceKv* seq[1] = {&kv};
    for (size_t i = o.prefill; i < n; ++i) {
      // logits predict w[i] from w[0..i).
      s.nll += Nll(logits.data(), vocab, w[i]);
      s.bytes += tok.TokenBytes(w[i]).size();
      ++s.tokens;
      if (i + 1 == n) break;
      st = tf.DecodeBatch(std::span<const int32_t>(w + i, 1), seq, scratch, logits.data());
      if (!st.ok()) return st;
    }
    ++s.windows;
  }
  if (s.tokens == 0) {
    return absl::InvalidArgumentError(absl::StrCat("the text has ", ids.size(),
                                                   " tokens: too few to score after a ", o.prefill,
                                                   "-token prefill"));
  }
  return s;
}

void Print(const char* label, const Score& s) {
  std::printf("%-6s ppl %.4f  nll/token %.5f  bits/byte %.5f  (%zu tokens scored in %zu windows)\n",
              label, std::exp(s.nll / double(s.tokens)), s.nll / double(s.tokens),
              s.bytes ? s.nll / std::log(2.0) / double(s.bytes) : 0.0, s.tokens, s.windows);
}

}  // namespace

int RunPpl(const PplOptions& o) {
  if (o.prefill < 1 || o.prefill >= o.window) {
    return Fail(absl::InvalidArgumentError("--prefill must be in [1, --window)"));
  }
  std::ifstream in(o.text_file, std::ios::binary);
  if (!in) return Fail(absl::NotFoundError(absl::StrCat(o.text_file, ": cannot open")));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto tok = model::LoadModelTokenizer(o.model_dir);
  if (!tok.ok()) return Fail(tok.status());
  model::LoadOptions lo;
  lo.bf16_activations = o.bf16_activations;
  lo.weights = o.weights;
  auto tf = model::Transformer::Load(o.model_dir, lo);
  if (!tf.ok()) return Fail(tf.status());
  const std::vector<int32_t> ids = tok->tokenizer.Encode(text, /*parse_special=*/false);

  std::optional<kv::O1Config> o1;
  std::string label = o.kv_mode == kv::KvMode::kInt8 ? "int8" : "exact";
  if (o.o1.has_value()) {
    auto env = kv::EnvOverrides();
    if (!env.ok()) return Fail(env.status());
    auto resolved = kv::ResolveO1Config(*o.o1, {}, *env, (*tf)->config().o1_hint,
                                        (*tf)->config().num_hidden_layers);
    if (!resolved.ok()) return Fail(resolved.status());
    o1 = *resolved;
    label = "o1";
    std::printf("o1 config: %s\n", o1->DebugString().c_str());
  }
  std::optional<model::QsaConfig> qsa;
  if (o.qsa.has_value()) {
    if (o1.has_value()) {
      return Fail(absl::InvalidArgumentError("--qsa and --o1 do not compose; give one"));
    }
    auto q = model::MakeQsaConfig(*o.qsa, o.qsa_ratio, o.qsa_budget,
                                  size_t((*tf)->config().num_hidden_layers));
    if (!q.ok()) return Fail(q.status());
    qsa = *q;
    label = "qsa";
    std::printf("%s (inert bound %zu tokens)\n", qsa->DebugString().c_str(),
                qsa->ratio * qsa->budget);
  }
  std::optional<model::WindowConfig> sink_window;
  if (o.sink_window.has_value()) {
    if (o1.has_value() || qsa.has_value()) {
      return Fail(absl::InvalidArgumentError(
          "--sink-window does not compose with --o1 or --qsa; give one"));
    }
    auto w = attention::MakeWindowConfig(*o.sink_window, o.sw_sink, o.sw_window,
                                         size_t((*tf)->config().num_hidden_layers));
    if (!w.ok()) return Fail(w.status());
    sink_window = *w;
    label = "window";
    std::printf("%s\n", sink_window->DebugString().c_str());
  }
  attention::AttentionConfig modes;
  modes.o1 = o1;
  modes.qsa = qsa;
  modes.window = sink_window;
  std::printf("text: %s, %zu bytes, %zu tokens; window %zu, prefill %zu\n", o.text_file.c_str(),
              text.size(), ids.size(), o.window, o.prefill);
  auto mode_score = Run(**tf, tok->tokenizer, ids, o, o.kv_mode, modes);
  if (!mode_score.ok()) return Fail(mode_score.status());
  const bool is_exact = !o1.has_value() && !qsa.has_value() && !sink_window.has_value() &&
                        o.kv_mode == kv::KvMode::kF32;
  if (o.baseline && !is_exact) {
    auto exact = Run(**tf, tok->tokenizer, ids, o, kv::KvMode::kF32, attention::AttentionConfig{});
    if (!exact.ok()) return Fail(exact.status());
    Print("exact", *exact);
    Print(label.c_str(), *mode_score);
    std::printf("ratio %.4f\n", std::exp((mode_score->nll - exact->nll) / double(exact->tokens)));
  } else {
    Print(label.c_str(), *mode_score);
    if (is_exact) std::printf("ratio 1.0000\n");
  }
  // Machine-readable summary of the requested mode.
  std::printf(
      "ppl %.6f\nbits_per_byte %.6f\n", std::exp(mode_score->nll / double(mode_score->tokens)),
      mode_score->bytes ? mode_score->nll / std::log(2.0) / double(mode_score->bytes) : 0.0);
  return 0;
}

}  // namespace cortiq::tools
