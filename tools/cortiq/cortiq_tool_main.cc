// cortiq-tool: the local command-line tool (no server). Stable usage:
//
//   cortiq-tool mkmodel SHAPE DIR [--dtype f32|bf16|f16] [--seed N]
//   cortiq-tool tokenize --tokenizer FILE          (text on stdin → ids on stdout)
//   cortiq-tool detokenize --tokenizer FILE        (ids on stdin → text on stdout)
//   cortiq-tool logits --model DIR (--ids 1,2,3 | --prompt TEXT) --out FILE [--kv f32|int8]
//   cortiq-tool ppl --model DIR --file TEXT [--window N] [--kv f32|int8] [--max-windows N]
//   cortiq-tool generate --model DIR --prompt TEXT [--max-tokens N] [--temperature T]
//                        [--top-k K] [--top-p P] [--min-p P] [--repetition-penalty R]
//                        [--seed S] [--kv f32|int8]
//   cortiq-tool bench [--model DIR | --shape NAME] [--dtype bf16|f32|f16] [--context N]
//                     [--batches 1,8] [--steps N] [--bandwidth-gb G] [--threads N]
//
// Exit status: 0 success, 1 runtime error, 2 usage error.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/model/random_checkpoint.h"
#include "core/model/sampler.h"
#include "core/model/transformer.h"
#include "core/tokenizer/detokenizer.h"
#include "core/tokenizer/tokenizer.h"
#include "tools/cortiq/bench.h"

namespace cortiq::tools {
namespace {

constexpr const char* kUsage = R"(usage:
  cortiq-tool mkmodel SHAPE DIR [--dtype f32|bf16|f16] [--seed N]
  cortiq-tool tokenize --tokenizer FILE        (text on stdin, ids on stdout)
  cortiq-tool detokenize --tokenizer FILE      (ids on stdin, text on stdout)
  cortiq-tool logits --model DIR (--ids 1,2,3 | --prompt TEXT) --out FILE [--kv f32|int8]
  cortiq-tool ppl --model DIR --file TEXT [--window 512] [--kv f32|int8] [--max-windows N]
  cortiq-tool generate --model DIR --prompt TEXT [--max-tokens 64] [--temperature 1]
                       [--top-k 0] [--top-p 1] [--min-p 0] [--repetition-penalty 1]
                       [--seed 0] [--kv f32|int8]
  cortiq-tool bench [--model DIR | --shape qwen3-0.6b] [--dtype bf16] [--context 512]
                    [--batches 1,8] [--steps 32] [--bandwidth-gb 2] [--threads 0]
shapes: tiny, tiny-gqa, tiny-qwen2, tiny-llama, qwen3-0.6b
)";

struct UsageError {
  std::string message;
};

// Flags are --name value; positional arguments are collected in order.
struct Args {
  std::vector<std::string> positional;
  std::map<std::string, std::string> flags;

  static Args Parse(int argc, char** argv, int start) {
    Args a;
    for (int i = start; i < argc; ++i) {
      std::string s = argv[i];
      if (s.rfind("--", 0) == 0) {
        if (i + 1 >= argc) throw UsageError{absl::StrCat(s, " needs a value")};
        a.flags[s.substr(2)] = argv[++i];
      } else {
        a.positional.push_back(std::move(s));
      }
    }
    return a;
  }
  bool Has(const std::string& k) const { return flags.count(k) > 0; }
  std::string Str(const std::string& k, const std::string& def = "") const {
    auto it = flags.find(k);
    return it == flags.end() ? def : it->second;
  }
  std::string Required(const std::string& k) const {
    if (!Has(k)) throw UsageError{absl::StrCat("--", k, " is required")};
    return flags.at(k);
  }
  int64_t Int(const std::string& k, int64_t def) const {
    if (!Has(k)) return def;
    int64_t v;
    if (!absl::SimpleAtoi(flags.at(k), &v)) throw UsageError{absl::StrCat("--", k, ": not an integer")};
    return v;
  }
  double Float(const std::string& k, double def) const {
    if (!Has(k)) return def;
    double v;
    if (!absl::SimpleAtod(flags.at(k), &v)) throw UsageError{absl::StrCat("--", k, ": not a number")};
    return v;
  }
  void AllowOnly(std::initializer_list<const char*> names) const {
    for (const auto& [k, v] : flags) {
      bool ok = false;
      for (const char* n : names) ok = ok || k == n;
      if (!ok) throw UsageError{absl::StrCat("unknown flag --", k)};
    }
  }
};

int Fail(const absl::Status& s) {
  std::cerr << "cortiq-tool: " << s << "\n";
  return 1;
}

kv::KvMode ParseKv(const Args& a) {
  std::string kv = a.Str("kv", "f32");
  if (kv == "f32") return kv::KvMode::kF32;
  if (kv == "int8") return kv::KvMode::kInt8;
  throw UsageError{"--kv must be f32 or int8"};
}

std::vector<int32_t> ParseIds(std::string_view text) {
  std::vector<int32_t> ids;
  for (absl::string_view piece : absl::StrSplit(absl::string_view(text.data(), text.size()), absl::ByAnyChar(", \n\t\r"), absl::SkipEmpty())) {
    int32_t id;
    if (!absl::SimpleAtoi(piece, &id)) throw UsageError{absl::StrCat("not a token id: '", piece, "'")};
    ids.push_back(id);
  }
  return ids;
}

absl::StatusOr<tokenizer::Tokenizer> ModelTokenizer(const std::string& dir) {
  return tokenizer::Tokenizer::FromFile(dir + "/tokenizer.json");
}

int MkModel(const Args& a) {
  a.AllowOnly({"dtype", "seed"});
  if (a.positional.size() != 2) throw UsageError{"mkmodel needs SHAPE and DIR"};
  auto config = model::NamedShape(a.positional[0]);
  if (!config.ok()) return Fail(config.status());
  model::RandomCheckpointOptions opt;
  const std::string dtype = a.Str("dtype", "f32");
  if (dtype == "f32") opt.dtype = math::DType::kF32;
  else if (dtype == "bf16") opt.dtype = math::DType::kBF16;
  else if (dtype == "f16") opt.dtype = math::DType::kF16;
  else throw UsageError{"--dtype must be f32, bf16 or f16"};
  opt.seed = static_cast<uint64_t>(a.Int("seed", 1));
  absl::Status s = model::WriteRandomCheckpoint(*config, a.positional[1], opt);
  if (!s.ok()) return Fail(s);
  std::cerr << "wrote " << a.positional[0] << " (" << dtype << ") to " << a.positional[1] << "\n";
  return 0;
}

int Tokenize(const Args& a) {
  a.AllowOnly({"tokenizer"});
  auto tok = tokenizer::Tokenizer::FromFile(a.Required("tokenizer"));
  if (!tok.ok()) return Fail(tok.status());
  std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  std::vector<int32_t> ids = tok->Encode(text);
  for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? " " : "") << ids[i];
  std::cout << "\n";
  return 0;
}

int Detokenize(const Args& a) {
  a.AllowOnly({"tokenizer"});
  auto tok = tokenizer::Tokenizer::FromFile(a.Required("tokenizer"));
  if (!tok.ok()) return Fail(tok.status());
  std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  std::cout << tok->Decode(ParseIds(text));
  return 0;
}

// Ids from --ids or --prompt (tokenized with the model's tokenizer).
absl::StatusOr<std::vector<int32_t>> PromptIds(const Args& a, const std::string& model_dir) {
  if (a.Has("ids") == a.Has("prompt")) throw UsageError{"give exactly one of --ids and --prompt"};
  if (a.Has("ids")) return ParseIds(a.Str("ids"));
  auto tok = ModelTokenizer(model_dir);
  if (!tok.ok()) return tok.status();
  return tok->Encode(a.Str("prompt"));
}

int Logits(const Args& a) {
  a.AllowOnly({"model", "ids", "prompt", "out", "kv"});
  const std::string dir = a.Required("model");
  const std::string out_path = a.Required("out");
  auto ids = PromptIds(a, dir);
  if (!ids.ok()) return Fail(ids.status());
  auto tf = model::Transformer::Load(dir);
  if (!tf.ok()) return Fail(tf.status());
  model::SequenceKv kv((*tf)->config(), ParseKv(a));
  model::ForwardScratch scratch;
  std::vector<float> logits((*tf)->config().vocab_size);
  absl::Status s = (*tf)->Prefill(*ids, kv, scratch, logits.data());
  if (!s.ok()) return Fail(s);
  std::ofstream f(out_path, std::ios::binary | std::ios::trunc);
  // Little-endian f32 (every supported target is little-endian).
  f.write(reinterpret_cast<const char*>(logits.data()), std::streamsize(logits.size() * 4));
  if (!f) return Fail(absl::InternalError(absl::StrCat(out_path, ": write failed")));
  return 0;
}

// Perplexity in non-overlapping windows of `window` tokens: each window is a
// fresh sequence; every token after the first of a window is scored.
int Ppl(const Args& a) {
  a.AllowOnly({"model", "file", "window", "kv", "max-windows"});
  const std::string dir = a.Required("model");
  std::ifstream in(a.Required("file"), std::ios::binary);
  if (!in) return Fail(absl::NotFoundError(absl::StrCat(a.Str("file"), ": cannot open")));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto tok = ModelTokenizer(dir);
  if (!tok.ok()) return Fail(tok.status());
  auto tf = model::Transformer::Load(dir);
  if (!tf.ok()) return Fail(tf.status());
  const size_t window = static_cast<size_t>(a.Int("window", 512));
  const int64_t max_windows = a.Int("max-windows", -1);
  if (window < 2) throw UsageError{"--window must be at least 2"};
  const std::vector<int32_t> ids = tok->Encode(text, /*parse_special=*/false);
  const size_t vocab = (*tf)->config().vocab_size;
  std::vector<float> logits(window * vocab);
  model::ForwardScratch scratch;
  double nll = 0;
  size_t scored = 0, bytes = 0, windows = 0;
  for (size_t start = 0; start + 2 <= ids.size(); start += window) {
    if (max_windows >= 0 && int64_t(windows) >= max_windows) break;
    const size_t n = std::min(window, ids.size() - start);
    std::span<const int32_t> w(ids.data() + start, n);
    model::SequenceKv kv((*tf)->config(), ParseKv(a));
    absl::Status s = (*tf)->Prefill(w, kv, scratch, nullptr, logits.data());
    if (!s.ok()) return Fail(s);
    for (size_t i = 0; i + 1 < n; ++i) {
      const float* row = logits.data() + i * vocab;
      double mx = row[0];
      for (size_t j = 1; j < vocab; ++j) mx = std::max<double>(mx, row[j]);
      double z = 0;
      for (size_t j = 0; j < vocab; ++j) z += std::exp(double(row[j]) - mx);
      nll += (mx + std::log(z)) - row[w[i + 1]];
      bytes += tok->TokenBytes(w[i + 1]).size();
      ++scored;
    }
    ++windows;
  }
  if (scored == 0) return Fail(absl::InvalidArgumentError("ppl: the text has fewer than 2 tokens"));
  std::printf("tokens_scored %zu\nwindows %zu\nnll_per_token %.6f\nppl %.6f\nbits_per_byte %.6f\n",
              scored, windows, nll / scored, std::exp(nll / scored),
              bytes ? nll / std::log(2.0) / double(bytes) : 0.0);
  return 0;
}

int Generate(const Args& a) {
  a.AllowOnly({"model", "prompt", "ids", "max-tokens", "temperature", "top-k", "top-p", "min-p",
               "repetition-penalty", "seed", "kv"});
  const std::string dir = a.Required("model");
  auto tok = ModelTokenizer(dir);
  if (!tok.ok()) return Fail(tok.status());
  auto ids = PromptIds(a, dir);
  if (!ids.ok()) return Fail(ids.status());
  auto tf = model::Transformer::Load(dir);
  if (!tf.ok()) return Fail(tf.status());
  model::SamplingParams sp;
  sp.temperature = static_cast<float>(a.Float("temperature", 1.0));
  sp.top_k = static_cast<int32_t>(a.Int("top-k", 0));
  sp.top_p = static_cast<float>(a.Float("top-p", 1.0));
  sp.min_p = static_cast<float>(a.Float("min-p", 0.0));
  sp.repetition_penalty = static_cast<float>(a.Float("repetition-penalty", 1.0));
  sp.seed = static_cast<uint64_t>(a.Int("seed", 0));
  auto sampler = model::Sampler::Create(sp);
  if (!sampler.ok()) return Fail(sampler.status());
  const int64_t max_tokens = a.Int("max-tokens", 64);
  if (max_tokens < 1) throw UsageError{"--max-tokens must be at least 1"};

  const model::ModelConfig& c = (*tf)->config();
  model::SequenceKv kv(c, ParseKv(a));
  kv.Reserve(ids->size() + size_t(max_tokens));
  model::ForwardScratch scratch;
  std::vector<float> logits(c.vocab_size);
  std::vector<int32_t> history = *ids;
  tokenizer::IncrementalDetokenizer detok(*tok);
  std::cout << tok->Decode(*ids) << std::flush;
  absl::Status s = (*tf)->Prefill(*ids, kv, scratch, logits.data());
  if (!s.ok()) return Fail(s);
  for (int64_t n = 0; n < max_tokens; ++n) {
    const int32_t next = sampler->Sample(logits, history);
    history.push_back(next);
    if (std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), next) != c.eos_token_ids.end()) break;
    std::cout << detok.Push(next) << std::flush;
    if (n + 1 == max_tokens) break;
    model::SequenceKv* seqs[1] = {&kv};
    s = (*tf)->DecodeBatch(std::span<const int32_t>(&next, 1), seqs, scratch, logits.data());
    if (!s.ok()) return Fail(s);
  }
  std::cout << detok.Flush() << "\n";
  return 0;
}

int Bench(const Args& a) {
  a.AllowOnly({"model", "shape", "dtype", "context", "batches", "steps", "bandwidth-gb", "threads", "kv"});
  BenchOptions o;
  o.model_dir = a.Str("model");
  o.shape = a.Str("shape", o.shape);
  o.dtype = a.Str("dtype", o.dtype);
  o.kv = a.Str("kv", o.kv);
  o.context = static_cast<size_t>(a.Int("context", int64_t(o.context)));
  o.decode_steps = static_cast<size_t>(a.Int("steps", int64_t(o.decode_steps)));
  o.bandwidth_bytes = static_cast<size_t>(a.Float("bandwidth-gb", 2.0) * double(1 << 30));
  o.threads = static_cast<size_t>(a.Int("threads", 0));
  if (a.Has("batches")) {
    o.batches.clear();
    for (int32_t b : ParseIds(a.Str("batches"))) {
      if (b < 1) throw UsageError{"--batches: each batch size must be at least 1"};
      o.batches.push_back(size_t(b));
    }
  }
  return RunBench(o);
}

}  // namespace
}  // namespace cortiq::tools

int main(int argc, char** argv) {
  using namespace cortiq::tools;
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "help") == 0) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  try {
    Args a = Args::Parse(argc, argv, 2);
    if (cmd == "mkmodel") return MkModel(a);
    if (cmd == "tokenize") return Tokenize(a);
    if (cmd == "detokenize") return Detokenize(a);
    if (cmd == "logits") return Logits(a);
    if (cmd == "ppl") return Ppl(a);
    if (cmd == "generate") return Generate(a);
    if (cmd == "bench") return Bench(a);
    throw UsageError{absl::StrCat("unknown command '", cmd, "'")};
  } catch (const UsageError& e) {
    std::cerr << "cortiq-tool: " << e.message << "\n" << kUsage;
    return 2;
  }
}
