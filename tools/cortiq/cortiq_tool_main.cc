// cortiq-tool: the local command-line tool (no server). Stable usage:
//
//   cortiq-tool mkmodel SHAPE DIR [--dtype f32|bf16|f16] [--seed N]
//   cortiq-tool mkmodel script DIR --text TEXT [--after TEXT] [--tokenizer-from DIR]
//                       [--dtype f32|bf16|f16] [--seed N]
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
// Flags are `--name value` or `--name=value` (core/util/flags.h); each command
// declares its flags once, as a table of typed bindings, and parses them before
// anything runs. --help anywhere (before `--`) prints the usage.
// Exit status: 0 success, 1 runtime error, 2 usage error (the message and a
// hint on stderr).
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/model/gguf_model.h"
#include "core/model/model_files.h"
#include "core/model/random_checkpoint.h"
#include "core/model/sampler.h"
#include "core/model/script_checkpoint.h"
#include "core/model/transformer.h"
#include "core/tokenizer/detokenizer.h"
#include "core/tokenizer/tokenizer.h"
#include "core/util/flags.h"
#include "core/util/status_macros.h"
#include "tools/cortiq/bench.h"
#include "tools/cortiq/ppl.h"

namespace cortiq::tools {
namespace {

constexpr const char* kUsage = R"(usage:
  cortiq-tool mkmodel SHAPE DIR [--dtype f32|bf16|f16] [--seed N]
  cortiq-tool mkmodel script DIR --text TEXT [--after '<|im_start|>assistant\n']
                      [--tokenizer-from DIR] [--dtype f32|bf16|f16] [--seed N]
  cortiq-tool gguf --model DIR --out FILE.gguf [--type f32|f16|bf16|q8_0]
  cortiq-tool tokenize --tokenizer FILE        (text on stdin, ids on stdout)
  cortiq-tool detokenize --tokenizer FILE      (ids on stdin, text on stdout)
  cortiq-tool logits --model DIR (--ids 1,2,3 | --prompt TEXT) --out FILE [--kv f32|int8]
  cortiq-tool ppl --model DIR --file TEXT [--window 512] [--prefill 256] [--kv f32|int8]
                  [--o1 all|deepN|i,j,k] [--o1-m 32] [--o1-w 128] [--o1-sink 4] [--o1-rect agg|fm]
                  [--qsa all|deepN|i,j,k] [--qsa-ratio 64] [--qsa-budget 16]
                  [--sink-window all|deepN|i,j,k] [--sw-sink 4] [--sw-window 128]
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
mkmodel script writes a test model whose greedy continuation of any prompt ending in
--after is exactly --text, then <|im_end|> (e.g. a <tool_call> block); --tokenizer-from
extends that model's tokenizer.json (one added token per piece of the text) and copies its
tokenizer_config.json. --text and --after take C escapes (\n, \t, \", \\).
gguf writes a model directory as one llama.cpp GGUF file (weights, tokenizer, chat
template); --type stores the matrices (default f32; q8_0 keeps a matrix whose rows are
not a multiple of 32 in f32). Every --model DIR also takes such a FILE.gguf.
logits, ppl, generate and bench take --activations bf16|f32 (default bf16): with bf16
weights, projections round their inputs to bf16 (exact products, f32 sums); f32 keeps
them in f32. No effect on f32 or f16 weights. They also take --weights checkpoint|int8
(default checkpoint): int8 quantizes every weight matrix once at load to Q8_0 blocks
(int8 values, one f16 scale per 32) and computes on them; activations are quantized to
int8 per block of 32 at each projection.
Flags are --name value or --name=value; --help prints this text. Exit status: 0 success,
1 runtime error, 2 usage error.
)";

using util::Flag;
using util::IntFlag;
using util::StringFlag;

int UsageError(const absl::Status& s) { return util::ReportUsageError("cortiq-tool", s); }

int Fail(const absl::Status& s) {
  std::cerr << "cortiq-tool: " << s << "\n";
  return 1;
}

// A command's flags; `positionals` says whether it takes positional arguments.
absl::StatusOr<util::ParsedArgs> ParseCommandFlags(
    std::string_view command, const std::vector<std::string>& args, const std::vector<Flag>& flags,
    util::Positionals positionals = util::Positionals::kNone) {
  return util::ParseFlags(flags, args, {.command = command, .positionals = positionals});
}

// Flags several commands share.
Flag KvFlag(kv::KvMode* out) {
  return util::EnumFlag("kv", out, {{"f32", kv::KvMode::kF32}, {"int8", kv::KvMode::kInt8}});
}

// --activations bf16|f32 (default bf16): model::LoadOptions::bf16_activations.
Flag ActivationsFlag(bool* bf16) {
  return util::EnumFlag("activations", bf16, {{"bf16", true}, {"f32", false}});
}

// --weights checkpoint|int8 (default checkpoint): model::LoadOptions::weights.
Flag WeightsFlag(model::LoadOptions::Weights* w) {
  return util::EnumFlag("weights", w,
                        {{"checkpoint", model::LoadOptions::Weights::kCheckpoint},
                         {"int8", model::LoadOptions::Weights::kInt8}});
}

// --o1 SPEC --o1-m M --o1-w W --o1-sink S: request-level O(1) overrides.
std::vector<Flag> O1Flags(kv::O1Overrides* o1) {
  return {StringFlag("o1", &o1->layers), IntFlag("o1-m", &o1->m), IntFlag("o1-w", &o1->w),
          IntFlag("o1-sink", &o1->sink)};
}

// --qsa SPEC --qsa-ratio R (>= 1) --qsa-budget K (>= 2).
template <typename Layers>
std::vector<Flag> QsaFlags(Layers* layers, size_t* ratio, size_t* budget) {
  return {StringFlag("qsa", layers), IntFlag("qsa-ratio", ratio, {.min = 1}),
          IntFlag("qsa-budget", budget, {.min = 2})};
}

// A model directory's tokenizer.json, or a GGUF file's embedded vocabulary.
absl::StatusOr<tokenizer::Tokenizer> ModelTokenizer(const std::string& model) {
  CORTIQ_ASSIGN_OR_RETURN(model::ModelTokenizer t, model::LoadModelTokenizer(model));
  return std::move(t.tokenizer);
}

// What logits and generate share: --model DIR (required), the prompt as
// --ids 1,2,3 or --prompt TEXT (exactly one), --kv and --activations.
struct PromptRunArgs {
  std::string model_dir;
  std::vector<int32_t> ids;
  std::optional<std::string> prompt;
  kv::KvMode kv = kv::KvMode::kF32;
  bool bf16_activations = true;
  model::LoadOptions::Weights weights = model::LoadOptions::Weights::kCheckpoint;
};

// Parses `command`'s own `flags` and the shared ones into `p`.
absl::Status ParsePromptRunArgs(std::string_view command, const std::vector<std::string>& args,
                                std::vector<Flag> flags, PromptRunArgs* p) {
  CORTIQ_ASSIGN_OR_RETURN(
      util::ParsedArgs parsed,
      ParseCommandFlags(command, args,
                        util::JoinFlags({std::move(flags),
                                         {
                                             StringFlag("model", &p->model_dir).Required(),
                                             util::IntListFlag("ids", &p->ids, "id", {.min = 0}),
                                             StringFlag("prompt", &p->prompt),
                                             KvFlag(&p->kv),
                                             ActivationsFlag(&p->bf16_activations),
                                             WeightsFlag(&p->weights),
                                         }})));
  if (parsed.Given("ids") == parsed.Given("prompt")) {
    return absl::InvalidArgumentError("give exactly one of --ids and --prompt");
  }
  return absl::OkStatus();
}

// The model and the prompt's ids (--prompt tokenized with the model's tokenizer).
struct PromptRun {
  std::unique_ptr<model::Transformer> model;
  std::vector<int32_t> ids;
};

absl::StatusOr<PromptRun> LoadPromptRun(const PromptRunArgs& p) {
  PromptRun run;
  if (p.prompt.has_value()) {
    CORTIQ_ASSIGN_OR_RETURN(tokenizer::Tokenizer tok, ModelTokenizer(p.model_dir));
    run.ids = tok.Encode(*p.prompt);
  } else {
    run.ids = p.ids;
  }
  model::LoadOptions lo;
  lo.bf16_activations = p.bf16_activations;
  lo.weights = p.weights;
  CORTIQ_ASSIGN_OR_RETURN(run.model, model::Transformer::Load(p.model_dir, lo));
  return run;
}

// Token ids on stdin: integers separated by commas or whitespace.
absl::StatusOr<std::vector<int32_t>> ParseStdinIds(std::string_view text) {
  std::vector<int32_t> ids;
  for (absl::string_view piece : absl::StrSplit(absl::string_view(text.data(), text.size()),
                                                absl::ByAnyChar(", \n\t\r"), absl::SkipEmpty())) {
    int32_t id;
    if (!absl::SimpleAtoi(piece, &id)) {
      return absl::InvalidArgumentError(absl::StrCat("not a token id: '", piece, "'"));
    }
    ids.push_back(id);
  }
  return ids;
}

// ---------------------------------------------------------------------------
// mkmodel SHAPE DIR [--dtype f32|bf16|f16] [--seed N]
// mkmodel script DIR --text TEXT [--after TEXT] [--tokenizer-from DIR] [--dtype] [--seed]

constexpr std::string_view kScriptShape = "script";

struct MkModelArgs {
  std::string shape, dir;
  std::string dtype = "f32";
  uint64_t seed = 1;
  // Shape "script" only (model::ScriptCheckpointOptions), C escapes decoded.
  std::optional<std::string> text;
  std::optional<std::string> after;
  std::string tokenizer_from;
};

// --text / --after with their C escapes decoded.
absl::Status Unescape(const char* flag, std::optional<std::string>* value) {
  if (!value->has_value()) return absl::OkStatus();
  std::string out, error;
  if (!absl::CUnescape(**value, &out, &error)) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", error));
  }
  *value = std::move(out);
  return absl::OkStatus();
}

absl::StatusOr<MkModelArgs> ParseMkModelArgs(const std::vector<std::string>& args) {
  MkModelArgs a;
  CORTIQ_ASSIGN_OR_RETURN(
      util::ParsedArgs parsed,
      ParseCommandFlags(
          "mkmodel", args,
          {util::ChoiceFlag("dtype", &a.dtype, {"f32", "bf16", "f16"}), IntFlag("seed", &a.seed),
           StringFlag("text", &a.text), StringFlag("after", &a.after),
           StringFlag("tokenizer-from", &a.tokenizer_from)},
          util::Positionals::kInterleaved));
  if (parsed.positional.size() != 2)
    return absl::InvalidArgumentError("mkmodel needs SHAPE and DIR");
  a.shape = parsed.positional[0];
  a.dir = parsed.positional[1];
  if (a.shape == kScriptShape) {
    if (!a.text.has_value()) return absl::InvalidArgumentError("mkmodel script needs --text");
  } else if (parsed.Given("text") || parsed.Given("after") || parsed.Given("tokenizer-from")) {
    return absl::InvalidArgumentError(
        "--text, --after and --tokenizer-from are for mkmodel script only");
  }
  CORTIQ_RETURN_IF_ERROR(Unescape("text", &a.text));
  CORTIQ_RETURN_IF_ERROR(Unescape("after", &a.after));
  return a;
}

math::DType DTypeOf(std::string_view name) {
  return name == "bf16"  ? math::DType::kBF16
         : name == "f16" ? math::DType::kF16
                         : math::DType::kF32;
}

int MkScriptModel(const MkModelArgs& a) {
  model::ScriptCheckpointOptions opt;
  opt.text = *a.text;
  if (a.after.has_value()) opt.after = *a.after;
  opt.tokenizer_dir = a.tokenizer_from;
  opt.dtype = DTypeOf(a.dtype);
  opt.seed = a.seed;
  absl::StatusOr<model::ScriptPlan> plan = model::WriteScriptCheckpoint(a.dir, opt);
  if (!plan.ok()) return Fail(plan.status());
  std::vector<std::string> escaped;
  for (const std::string& piece : plan->pieces) escaped.push_back(absl::CEscape(piece));
  std::cerr << "wrote a script model (" << plan->pieces.size() << " tokens, " << plan->added_tokens
            << " added) to " << a.dir << ": " << absl::StrJoin(escaped, "|") << "\n";
  return 0;
}

int MkModel(const MkModelArgs& a) {
  if (a.shape == kScriptShape) return MkScriptModel(a);
  auto config = model::NamedShape(a.shape);
  if (!config.ok()) return Fail(config.status());
  model::RandomCheckpointOptions opt;
  opt.dtype = DTypeOf(a.dtype);
  opt.seed = a.seed;
  absl::Status s = model::WriteRandomCheckpoint(*config, a.dir, opt);
  if (!s.ok()) return Fail(s);
  std::cerr << "wrote " << a.shape << " (" << a.dtype << ") to " << a.dir << "\n";
  return 0;
}

// ---------------------------------------------------------------------------
// gguf --model DIR --out FILE [--type f32|f16|bf16|q8_0]

struct GgufArgs {
  std::string model_dir, out;
  std::string type = "f32";
};

absl::StatusOr<GgufArgs> ParseGgufArgs(const std::vector<std::string>& args) {
  GgufArgs a;
  CORTIQ_RETURN_IF_ERROR(
      ParseCommandFlags(
          "gguf", args,
          {StringFlag("model", &a.model_dir).Required(), StringFlag("out", &a.out).Required(),
           util::ChoiceFlag("type", &a.type, {"f32", "f16", "bf16", "q8_0"})})
          .status());
  return a;
}

int WriteGguf(const GgufArgs& a) {
  const math::DType dtype = a.type == "q8_0" ? math::DType::kQ8_0 : DTypeOf(a.type);
  if (absl::Status s = model::ExportGgufModel(a.model_dir, a.out, dtype); !s.ok()) return Fail(s);
  std::cerr << "wrote " << a.out << " (" << a.type << ") from " << a.model_dir << "\n";
  return 0;
}

// ---------------------------------------------------------------------------
// tokenize / detokenize --tokenizer FILE

struct TokenizerArgs {
  std::string tokenizer;
};

absl::StatusOr<TokenizerArgs> ParseTokenizerArgs(std::string_view command,
                                                 const std::vector<std::string>& args) {
  TokenizerArgs a;
  CORTIQ_RETURN_IF_ERROR(
      ParseCommandFlags(command, args, {StringFlag("tokenizer", &a.tokenizer).Required()})
          .status());
  return a;
}

int Tokenize(const TokenizerArgs& a) {
  auto tok = tokenizer::Tokenizer::FromFile(a.tokenizer);
  if (!tok.ok()) return Fail(tok.status());
  std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  std::vector<int32_t> ids = tok->Encode(text);
  for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? " " : "") << ids[i];
  std::cout << "\n";
  return 0;
}

int Detokenize(const TokenizerArgs& a) {
  auto tok = tokenizer::Tokenizer::FromFile(a.tokenizer);
  if (!tok.ok()) return Fail(tok.status());
  std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  absl::StatusOr<std::vector<int32_t>> ids = ParseStdinIds(text);
  if (!ids.ok()) return UsageError(ids.status());
  std::cout << tok->Decode(*ids);
  return 0;
}

// ---------------------------------------------------------------------------
// logits --model DIR (--ids 1,2,3 | --prompt TEXT) --out FILE [--kv] [--activations]

struct LogitsArgs {
  PromptRunArgs run;
  std::string out_path;
};

absl::StatusOr<LogitsArgs> ParseLogitsArgs(const std::vector<std::string>& args) {
  LogitsArgs a;
  CORTIQ_RETURN_IF_ERROR(
      ParsePromptRunArgs("logits", args, {StringFlag("out", &a.out_path).Required()}, &a.run));
  return a;
}

int Logits(const LogitsArgs& a) {
  absl::StatusOr<PromptRun> run = LoadPromptRun(a.run);
  if (!run.ok()) return Fail(run.status());
  const std::unique_ptr<model::Transformer>& tf = run->model;
  const std::vector<int32_t>& ids = run->ids;
  model::SequenceKv kv(tf->config(), a.run.kv);
  model::ForwardScratch scratch;
  std::vector<float> logits(tf->config().vocab_size);
  absl::Status s = tf->Prefill(ids, kv, scratch, logits.data());
  if (!s.ok()) return Fail(s);
  std::ofstream f(a.out_path, std::ios::binary | std::ios::trunc);
  // Little-endian f32 (every supported target is little-endian).
  f.write(reinterpret_cast<const char*>(logits.data()), std::streamsize(logits.size() * 4));
  if (!f) return Fail(absl::InternalError(absl::StrCat(a.out_path, ": write failed")));
  return 0;
}

// ---------------------------------------------------------------------------
// ppl: see ppl.h

absl::StatusOr<PplOptions> ParsePplArgs(const std::vector<std::string>& args) {
  PplOptions o;
  std::optional<size_t> prefill;  // default: half the window
  int64_t baseline = 1;
  kv::O1Overrides o1;
  std::vector<Flag> flags = util::JoinFlags({
      {
          StringFlag("model", &o.model_dir).Required(),
          StringFlag("file", &o.text_file).Required(),
          IntFlag("window", &o.window),
          IntFlag("prefill", &prefill),
          KvFlag(&o.kv_mode),
          IntFlag("max-windows", &o.max_windows),
          IntFlag("baseline", &baseline),
          util::ParsedFlag("o1-rect", &o1.rect, kv::ParseO1Rect),
          ActivationsFlag(&o.bf16_activations),
          WeightsFlag(&o.weights),
      },
      O1Flags(&o1),
      QsaFlags(&o.qsa, &o.qsa_ratio, &o.qsa_budget),
      {
          StringFlag("sink-window", &o.sink_window),
          IntFlag("sw-sink", &o.sw_sink),
          IntFlag("sw-window", &o.sw_window, {.min = 1}),
      },
  });
  CORTIQ_ASSIGN_OR_RETURN(util::ParsedArgs parsed, ParseCommandFlags("ppl", args, flags));
  o.prefill = prefill.value_or(o.window / 2);
  o.baseline = baseline != 0;
  // Any O(1) flag runs the O(1) mode (on every layer unless --o1 says).
  if (o1.layers || o1.m || o1.w || o1.sink || o1.rect) {
    if (!o1.layers.has_value()) o1.layers = "all";
    o.o1 = o1;
  }
  // Any QSA flag runs QSA (on every layer unless --qsa says).
  if (!o.qsa.has_value() && (parsed.Given("qsa-ratio") || parsed.Given("qsa-budget"))) {
    o.qsa = "all";
  }
  // Either sink + window size runs the mode (on every layer unless
  // --sink-window says).
  if (!o.sink_window.has_value() && (parsed.Given("sw-sink") || parsed.Given("sw-window"))) {
    o.sink_window = "all";
  }
  return o;
}

// ---------------------------------------------------------------------------
// generate --model DIR (--prompt TEXT | --ids 1,2,3) [sampling] [--max-tokens N] [--kv]

struct GenerateArgs {
  PromptRunArgs run;
  int64_t max_tokens = 64;
  model::SamplingParams sampling;  // validated by Sampler::Create
};

absl::StatusOr<GenerateArgs> ParseGenerateArgs(const std::vector<std::string>& args) {
  GenerateArgs a;
  model::SamplingParams& sp = a.sampling;
  CORTIQ_RETURN_IF_ERROR(
      ParsePromptRunArgs("generate", args,
                         {
                             IntFlag("max-tokens", &a.max_tokens, {.min = 1}),
                             util::NumberFlag("temperature", &sp.temperature),
                             IntFlag("top-k", &sp.top_k),
                             util::NumberFlag("top-p", &sp.top_p),
                             util::NumberFlag("min-p", &sp.min_p),
                             util::NumberFlag("repetition-penalty", &sp.repetition_penalty),
                             IntFlag("seed", &sp.seed),
                         },
                         &a.run));
  return a;
}

int Generate(const GenerateArgs& a) {
  auto tok = ModelTokenizer(a.run.model_dir);
  if (!tok.ok()) return Fail(tok.status());
  absl::StatusOr<PromptRun> run = LoadPromptRun(a.run);
  if (!run.ok()) return Fail(run.status());
  const std::unique_ptr<model::Transformer>& tf = run->model;
  const std::vector<int32_t>& ids = run->ids;
  auto sampler = model::Sampler::Create(a.sampling);
  if (!sampler.ok()) return Fail(sampler.status());
  const int64_t max_tokens = a.max_tokens;

  const model::ModelConfig& c = tf->config();
  model::SequenceKv kv(c, a.run.kv);
  kv.Reserve(ids.size() + size_t(max_tokens));
  model::ForwardScratch scratch;
  std::vector<float> logits(c.vocab_size);
  std::vector<int32_t> history = ids;
  tokenizer::IncrementalDetokenizer detok(*tok);
  std::cout << tok->Decode(ids) << std::flush;
  absl::Status s = tf->Prefill(ids, kv, scratch, logits.data());
  if (!s.ok()) return Fail(s);
  for (int64_t n = 0; n < max_tokens; ++n) {
    const int32_t next = sampler->Sample(logits, history);
    history.push_back(next);
    if (std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), next) != c.eos_token_ids.end())
      break;
    std::cout << detok.Push(next) << std::flush;
    if (n + 1 == max_tokens) break;
    model::SequenceKv* seqs[1] = {&kv};
    s = tf->DecodeBatch(std::span<const int32_t>(&next, 1), seqs, scratch, logits.data());
    if (!s.ok()) return Fail(s);
  }
  std::cout << detok.Flush() << "\n";
  return 0;
}

// ---------------------------------------------------------------------------
// bench-context and bench: see bench.h

// --modes exact,int8,o1,qsa
absl::StatusOr<std::vector<std::string>> ParseModes(std::string_view value) {
  std::vector<std::string> modes;
  for (absl::string_view m :
       absl::StrSplit(absl::string_view(value.data(), value.size()), ',', absl::SkipEmpty())) {
    if (m != "exact" && m != "int8" && m != "o1" && m != "qsa") {
      return absl::InvalidArgumentError("each mode is one of exact, int8, o1, qsa");
    }
    modes.emplace_back(m);
  }
  return modes;
}

absl::StatusOr<BenchContextOptions> ParseBenchContextArgs(const std::vector<std::string>& args) {
  BenchContextOptions o;
  std::vector<Flag> flags = util::JoinFlags({
      {
          StringFlag("shape", &o.shape),
          StringFlag("dtype", &o.dtype),
          util::IntListFlag("contexts", &o.contexts, "context", {.min = 1}),
          util::ParsedFlag("modes", &o.modes, ParseModes),
          IntFlag("steps", &o.steps),
          util::NumberFlag("max-state-gb", &o.max_state_gb),
          IntFlag("threads", &o.threads),
      },
      O1Flags(&o.o1),
      QsaFlags(&o.qsa, &o.qsa_ratio, &o.qsa_budget),
  });
  CORTIQ_RETURN_IF_ERROR(ParseCommandFlags("bench-context", args, flags).status());
  if (!o.o1.layers.has_value()) o.o1.layers = "all";
  return o;
}

absl::StatusOr<BenchOptions> ParseBenchArgs(const std::vector<std::string>& args) {
  BenchOptions o;
  double bandwidth_gb = 2.0;
  CORTIQ_RETURN_IF_ERROR(
      ParseCommandFlags("bench", args,
                        {
                            StringFlag("model", &o.model_dir),
                            StringFlag("shape", &o.shape),
                            StringFlag("dtype", &o.dtype),
                            util::ChoiceFlag("kv", &o.kv, {"f32", "int8"}),
                            IntFlag("context", &o.context),
                            util::IntListFlag("batches", &o.batches, "batch size", {.min = 1}),
                            IntFlag("steps", &o.decode_steps),
                            util::NumberFlag("bandwidth-gb", &bandwidth_gb, {.min = 0}),
                            IntFlag("threads", &o.threads),
                            ActivationsFlag(&o.bf16_activations),
                            WeightsFlag(&o.weights),
                        })
          .status());
  o.bandwidth_bytes = static_cast<size_t>(bandwidth_gb * double(1 << 30));
  return o;
}

// Usage errors exit 2 before anything runs; `run` returns the exit status.
template <typename Options>
int ParseThenRun(const absl::StatusOr<Options>& options, int (*run)(const Options&)) {
  if (!options.ok()) return UsageError(options.status());
  return run(*options);
}

int Main(const std::vector<std::string>& argv) {
  // No global flags: the command comes first, its flags after it.
  absl::StatusOr<util::ParsedArgs> global =
      util::ParseFlags({}, argv, {.positionals = util::Positionals::kCommand});
  if (!global.ok()) return UsageError(global.status());
  const std::vector<std::string>& positional = global->positional;
  if (global->help || (!positional.empty() && positional[0] == "help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (positional.empty()) {
    std::fputs(kUsage, stderr);
    return util::kExitUsage;
  }
  const std::string& cmd = positional[0];
  const std::vector<std::string> args(positional.begin() + 1, positional.end());
  if (cmd == "mkmodel") return ParseThenRun(ParseMkModelArgs(args), MkModel);
  if (cmd == "gguf") return ParseThenRun(ParseGgufArgs(args), WriteGguf);
  if (cmd == "tokenize") return ParseThenRun(ParseTokenizerArgs(cmd, args), Tokenize);
  if (cmd == "detokenize") return ParseThenRun(ParseTokenizerArgs(cmd, args), Detokenize);
  if (cmd == "logits") return ParseThenRun(ParseLogitsArgs(args), Logits);
  if (cmd == "ppl") return ParseThenRun(ParsePplArgs(args), RunPpl);
  if (cmd == "generate") return ParseThenRun(ParseGenerateArgs(args), Generate);
  if (cmd == "bench") return ParseThenRun(ParseBenchArgs(args), RunBench);
  if (cmd == "bench-context") return ParseThenRun(ParseBenchContextArgs(args), RunBenchContext);
  return UsageError(absl::InvalidArgumentError(absl::StrCat("unknown command '", cmd, "'")));
}

}  // namespace
}  // namespace cortiq::tools

int main(int argc, char** argv) {
  return cortiq::tools::Main(std::vector<std::string>(argv + 1, argv + argc));
}
