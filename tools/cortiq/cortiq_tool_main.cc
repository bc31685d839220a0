// cortiq-tool: the local command-line tool (no server). Stable usage:
//
//   cortiq-tool mkmodel SHAPE DIR [--dtype f32|bf16|f16] [--seed N]
//   cortiq-tool tokenize --tokenizer FILE          (text on stdin → ids on stdout)
//   cortiq-tool detokenize --tokenizer FILE        (ids on stdin → text on stdout)
//   cortiq-tool logits --model DIR (--ids 1,2,3 | --prompt TEXT) --out FILE [--kv f32|int8]
//   cortiq-tool ppl --model DIR --file TEXT [--window N] [--prefill N] [--kv f32|int8]
//                   [--o1 SPEC --o1-m M --o1-w W --o1-sink S --o1-rect agg|fm]
//                   [--qsa SPEC --qsa-ratio R --qsa-budget K] [--max-windows N]
//   cortiq-tool generate --model DIR --prompt TEXT [--max-tokens N] [--temperature T]
//                        [--top-k K] [--top-p P] [--min-p P] [--repetition-penalty R]
//                        [--seed S] [--kv f32|int8]
//   cortiq-tool bench [--model DIR | --shape NAME] [--dtype bf16|f32|f16] [--context N]
//                     [--batches 1,8] [--steps N] [--bandwidth-gb G] [--threads N]
//   cortiq-tool bench-context [--shape NAME] [--contexts 1024,...] [--modes exact,int8,o1,qsa]
//                             [--steps N] [--qsa SPEC --qsa-ratio R --qsa-budget K]
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
#include "tools/cortiq/ppl.h"

namespace cortiq::tools {
namespace {

constexpr const char* kUsage = R"(usage:
  cortiq-tool mkmodel SHAPE DIR [--dtype f32|bf16|f16] [--seed N]
  cortiq-tool tokenize --tokenizer FILE        (text on stdin, ids on stdout)
  cortiq-tool detokenize --tokenizer FILE      (ids on stdin, text on stdout)
  cortiq-tool logits --model DIR (--ids 1,2,3 | --prompt TEXT) --out FILE [--kv f32|int8]
  cortiq-tool ppl --model DIR --file TEXT [--window 512] [--prefill 256] [--kv f32|int8]
                  [--o1 all|deepN|i,j,k] [--o1-m 32] [--o1-w 128] [--o1-sink 4] [--o1-rect agg|fm]
                  [--qsa all|deepN|i,j,k] [--qsa-ratio 64] [--qsa-budget 16]
                  [--max-windows N] [--baseline 1]
  cortiq-tool generate --model DIR --prompt TEXT [--max-tokens 64] [--temperature 1]
                       [--top-k 0] [--top-p 1] [--min-p 0] [--repetition-penalty 1]
                       [--seed 0] [--kv f32|int8]
  cortiq-tool bench [--model DIR | --shape qwen3-0.6b] [--dtype bf16] [--context 512]
                    [--batches 1,8] [--steps 32] [--bandwidth-gb 2] [--threads 0]
                    [--kv f32|int8]
  cortiq-tool bench-context [--shape qwen3-0.6b] [--contexts 1024,4096,16384,65536]
                    [--modes exact,int8,o1,qsa] [--steps 8] [--max-state-gb 8] [--o1 all --o1-m 32 ...]
                    [--qsa all --qsa-ratio 64 --qsa-budget 16]
shapes: tiny, tiny-gqa, tiny-qwen2, tiny-llama, qwen3-0.6b
logits, ppl, generate and bench take --activations bf16|f32 (default bf16): with bf16
weights, projections round their inputs to bf16 (exact products, f32 sums); f32 keeps
them in f32. No effect on f32 or f16 weights.
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
    if (!absl::SimpleAtoi(flags.at(k), &v))
      throw UsageError{absl::StrCat("--", k, ": not an integer")};
    return v;
  }
  double Float(const std::string& k, double def) const {
    if (!Has(k)) return def;
    double v;
    if (!absl::SimpleAtod(flags.at(k), &v))
      throw UsageError{absl::StrCat("--", k, ": not a number")};
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

// --activations bf16|f32 (default bf16): model::LoadOptions::bf16_activations.
bool ParseBf16Activations(const Args& a) {
  std::string act = a.Str("activations", "bf16");
  if (act == "bf16") return true;
  if (act == "f32") return false;
  throw UsageError{"--activations must be bf16 or f32"};
}

absl::StatusOr<std::unique_ptr<model::Transformer>> LoadModel(const Args& a,
                                                              const std::string& dir) {
  model::LoadOptions lo;
  lo.bf16_activations = ParseBf16Activations(a);
  return model::Transformer::Load(dir, lo);
}

std::vector<int32_t> ParseIds(std::string_view text) {
  std::vector<int32_t> ids;
  for (absl::string_view piece : absl::StrSplit(absl::string_view(text.data(), text.size()),
                                                absl::ByAnyChar(", \n\t\r"), absl::SkipEmpty())) {
    int32_t id;
    if (!absl::SimpleAtoi(piece, &id))
      throw UsageError{absl::StrCat("not a token id: '", piece, "'")};
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
  if (dtype == "f32")
    opt.dtype = math::DType::kF32;
  else if (dtype == "bf16")
    opt.dtype = math::DType::kBF16;
  else if (dtype == "f16")
    opt.dtype = math::DType::kF16;
  else
    throw UsageError{"--dtype must be f32, bf16 or f16"};
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
  a.AllowOnly({"model", "ids", "prompt", "out", "kv", "activations"});
  const std::string dir = a.Required("model");
  const std::string out_path = a.Required("out");
  auto ids = PromptIds(a, dir);
  if (!ids.ok()) return Fail(ids.status());
  auto tf = LoadModel(a, dir);
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

int Ppl(const Args& a) {
  a.AllowOnly({"model", "file", "window", "prefill", "kv", "max-windows", "baseline", "o1", "o1-m",
               "o1-w", "o1-sink", "o1-rect", "qsa", "qsa-ratio", "qsa-budget", "activations"});
  PplOptions o;
  o.bf16_activations = ParseBf16Activations(a);
  o.model_dir = a.Required("model");
  o.text_file = a.Required("file");
  o.window = static_cast<size_t>(a.Int("window", 512));
  o.prefill = static_cast<size_t>(a.Int("prefill", int64_t(o.window / 2)));
  o.max_windows = static_cast<long>(a.Int("max-windows", -1));
  o.kv_mode = ParseKv(a);
  o.baseline = a.Int("baseline", 1) != 0;
  if (a.Has("o1") || a.Has("o1-m") || a.Has("o1-w") || a.Has("o1-sink") || a.Has("o1-rect")) {
    kv::O1Overrides req;
    if (a.Has("o1")) req.layers = a.Str("o1");
    if (a.Has("o1-m")) req.m = static_cast<size_t>(a.Int("o1-m", 32));
    if (a.Has("o1-w")) req.w = static_cast<size_t>(a.Int("o1-w", 128));
    if (a.Has("o1-sink")) req.sink = static_cast<size_t>(a.Int("o1-sink", 4));
    if (a.Has("o1-rect")) {
      auto r = kv::ParseO1Rect(a.Str("o1-rect"));
      if (!r.ok()) throw UsageError{std::string(r.status().message())};
      req.rect = *r;
    }
    if (!req.layers.has_value()) req.layers = "all";
    o.o1 = req;
  }
  if (a.Has("qsa") || a.Has("qsa-ratio") || a.Has("qsa-budget")) {
    o.qsa = a.Str("qsa", "all");
    o.qsa_ratio = static_cast<size_t>(a.Int("qsa-ratio", 64));
    o.qsa_budget = static_cast<size_t>(a.Int("qsa-budget", 16));
    if (a.Int("qsa-ratio", 64) < 1) throw UsageError{"--qsa-ratio must be at least 1"};
    if (a.Int("qsa-budget", 16) < 2) throw UsageError{"--qsa-budget must be at least 2"};
  }
  return RunPpl(o);
}

int Generate(const Args& a) {
  a.AllowOnly({"model", "prompt", "ids", "max-tokens", "temperature", "top-k", "top-p", "min-p",
               "repetition-penalty", "seed", "kv", "activations"});
  const std::string dir = a.Required("model");
  auto tok = ModelTokenizer(dir);
  if (!tok.ok()) return Fail(tok.status());
  auto ids = PromptIds(a, dir);
  if (!ids.ok()) return Fail(ids.status());
  auto tf = LoadModel(a, dir);
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
    if (std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), next) != c.eos_token_ids.end())
      break;
    std::cout << detok.Push(next) << std::flush;
    if (n + 1 == max_tokens) break;
    model::SequenceKv* seqs[1] = {&kv};
    s = (*tf)->DecodeBatch(std::span<const int32_t>(&next, 1), seqs, scratch, logits.data());
    if (!s.ok()) return Fail(s);
  }
  std::cout << detok.Flush() << "\n";
  return 0;
}

int BenchContext(const Args& a) {
  a.AllowOnly({"shape", "dtype", "contexts", "modes", "steps", "max-state-gb", "threads", "o1",
               "o1-m", "o1-w", "o1-sink", "qsa", "qsa-ratio", "qsa-budget"});
  BenchContextOptions o;
  o.shape = a.Str("shape", o.shape);
  o.dtype = a.Str("dtype", o.dtype);
  o.steps = static_cast<size_t>(a.Int("steps", int64_t(o.steps)));
  o.max_state_gb = a.Float("max-state-gb", o.max_state_gb);
  o.threads = static_cast<size_t>(a.Int("threads", 0));
  if (a.Has("contexts")) {
    o.contexts.clear();
    for (int32_t t : ParseIds(a.Str("contexts"))) {
      if (t < 1) throw UsageError{"--contexts: each context must be at least 1"};
      o.contexts.push_back(size_t(t));
    }
  }
  if (a.Has("modes")) {
    o.modes.clear();
    for (absl::string_view m : absl::StrSplit(a.Str("modes"), ',', absl::SkipEmpty())) {
      if (m != "exact" && m != "int8" && m != "o1" && m != "qsa") {
        throw UsageError{"--modes: each mode is one of exact, int8, o1, qsa"};
      }
      o.modes.emplace_back(m);
    }
  }
  o.o1.layers = a.Str("o1", "all");
  if (a.Has("o1-m")) o.o1.m = static_cast<size_t>(a.Int("o1-m", 32));
  if (a.Has("o1-w")) o.o1.w = static_cast<size_t>(a.Int("o1-w", 128));
  if (a.Has("o1-sink")) o.o1.sink = static_cast<size_t>(a.Int("o1-sink", 4));
  o.qsa = a.Str("qsa", o.qsa);
  if (a.Int("qsa-ratio", 64) < 1) throw UsageError{"--qsa-ratio must be at least 1"};
  if (a.Int("qsa-budget", 16) < 2) throw UsageError{"--qsa-budget must be at least 2"};
  o.qsa_ratio = static_cast<size_t>(a.Int("qsa-ratio", 64));
  o.qsa_budget = static_cast<size_t>(a.Int("qsa-budget", 16));
  return RunBenchContext(o);
}

int Bench(const Args& a) {
  a.AllowOnly(
      {"model", "shape", "dtype", "context", "batches", "steps", "bandwidth-gb", "threads", "kv",
       "activations"});
  BenchOptions o;
  o.bf16_activations = ParseBf16Activations(a);
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
    if (cmd == "bench-context") return BenchContext(a);
    throw UsageError{absl::StrCat("unknown command '", cmd, "'")};
  } catch (const UsageError& e) {
    std::cerr << "cortiq-tool: " << e.message << "\n" << kUsage;
    return 2;
  }
}
