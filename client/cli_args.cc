// Command-line parsing of the `cortiq` client: see cli_args.h.
#include "client/cli_args.h"

#include <cstdlib>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/util/flags.h"
#include "core/util/status_macros.h"

namespace cortiq::client {

namespace v1 = ::cortiq::v1;

const char kCliUsage[] = R"(usage: cortiq [GLOBAL FLAGS] COMMAND [ARGS]

global flags (before the command):
  --server HOST:PORT   server address (env CORTIQ_SERVER; default 127.0.0.1:50051)
  --token T            bearer token (env CORTIQ_TOKEN)
  --tls                use TLS with the system roots
  --tls-ca FILE        use TLS with the PEM roots in FILE (implies --tls)
  --timeout SECONDS    deadline of each call (a generation: the whole stream); 0 = none
  -h, --help           this text

commands:
  generate [FLAGS] PROMPT      stream a generation (PROMPT `-` reads stdin)
      --max-tokens N (64)  --session ID  --keep  --json  --tokens 1,2,3
      --temperature F  --top-k N  --top-p F  --min-p F  --repetition-penalty F  --seed N
      --presence-penalty F  --frequency-penalty F  --logit-bias ID=BIAS[,ID=BIAS...]
      --stop S (repeatable)  --stop-token-id ID (repeatable)  --min-tokens N  -n/--n N
      --logprobs  --top-logprobs N  --ignore-eos
      session flags (a new session only)
  sessions                     table of live sessions
  session show ID              one session as JSON
  session release ID           free a session's memory
  session create [SESSION FLAGS]
                               create an empty session, print its id
  tokenize [--no-special] [--verbose] TEXT
                               token ids (--verbose: id<TAB>token per line)
  model                        the served model as JSON
  health [SERVICE]             SERVING / NOT_SERVING / ...; exit 0 only when SERVING
  export ID -o FILE [--version N] [--f16]
                               save a session in the wire format (FILE `-`: stdout)
  import FILE                  install a session from FILE (`-`: stdin), print its id
  migrate ID --to HOST:PORT [--peer-token T] [--f16]
                               move a session to another server
  drain [--grace SECONDS]      drain the server: move its sessions to its peers, then it exits

session flags:
  --kv f32|int8  --attention exact|o1|qsa|window
  --o1-layers SPEC --o1-m N --o1-window N --o1-sink N --o1-rect agg|fm   (imply --attention o1)
  --qsa-layers SPEC --qsa-ratio N --qsa-budget N                        (imply --attention qsa)
  --window-layers SPEC --window-sink N --window-size N                 (imply --attention window)
  SPEC: all | none | deep | 3,5-7 ...

Flags take their value as the next argument or after `=`; `--` ends the flags.
Exit status: 0 success, 1 error (printed as `error: CODE: message`), 2 usage error.
)";

namespace {

using util::Flag;
using util::IntFlag;
using util::NonEmptyStringFlag;
using util::NumberFlag;
using util::SwitchFlag;

// The global flags, bound to `c` (--tls-ca implies --tls: see ParseCommandLine).
std::vector<Flag> GlobalFlags(ClientOptions* c) {
  return {
      NonEmptyStringFlag("server", &c->server),
      util::StringFlag("token", &c->token),  // "" overrides CORTIQ_TOKEN with no token
      SwitchFlag("tls", &c->tls),
      NonEmptyStringFlag("tls-ca", &c->tls_ca_file),
      util::SecondsFlag("timeout", &c->timeout),
  };
}

// A command's flags, plus the global ones refused with a hint (they go before
// the command).
absl::StatusOr<util::ParsedArgs> ParseCommandFlags(absl::string_view command,
                                                   const std::vector<std::string>& args,
                                                   std::vector<Flag> flags) {
  ClientOptions unused;
  for (const Flag& global : GlobalFlags(&unused)) {
    flags.push_back(Flag::Refused(global.name(), "is a global flag: put it before the command"));
  }
  return util::ParseFlags(flags, args, {.command = {command.data(), command.size()}});
}

// Session flags shared by `generate` and `session create`: what was given,
// turned into a SessionConfig by BuildSessionConfig.
struct SessionValues {
  v1::KvDtype kv = v1::KV_DTYPE_UNSPECIFIED;
  v1::AttentionMode attention = v1::ATTENTION_MODE_UNSPECIFIED;
  std::optional<std::string> o1_layers, o1_rect, qsa_layers, window_layers;
  std::optional<uint32_t> o1_m, o1_window, o1_sink, qsa_ratio, qsa_budget, window_sink,
      window_size;
};

// --o1-* flags imply --attention o1, --qsa-* flags --attention qsa,
// --window-* flags --attention window.
constexpr absl::string_view kO1Prefix = "o1-";
constexpr absl::string_view kQsaPrefix = "qsa-";
constexpr absl::string_view kWindowPrefix = "window-";

std::vector<Flag> SessionFlags(SessionValues* s) {
  return {
      util::EnumFlag("kv", &s->kv, {{"f32", v1::KV_DTYPE_F32}, {"int8", v1::KV_DTYPE_INT8}}),
      util::EnumFlag("attention", &s->attention,
                     {{"exact", v1::ATTENTION_MODE_EXACT},
                      {"o1", v1::ATTENTION_MODE_O1},
                      {"qsa", v1::ATTENTION_MODE_QSA},
                      {"window", v1::ATTENTION_MODE_WINDOW}}),
      NonEmptyStringFlag("o1-layers", &s->o1_layers),
      IntFlag("o1-m", &s->o1_m),
      IntFlag("o1-window", &s->o1_window),
      IntFlag("o1-sink", &s->o1_sink),
      util::ChoiceFlag("o1-rect", &s->o1_rect, {"agg", "fm"}),
      NonEmptyStringFlag("qsa-layers", &s->qsa_layers),
      IntFlag("qsa-ratio", &s->qsa_ratio),
      IntFlag("qsa-budget", &s->qsa_budget),
      NonEmptyStringFlag("window-layers", &s->window_layers),
      IntFlag("window-sink", &s->window_sink),
      IntFlag("window-size", &s->window_size),
  };
}

// The first flag in `parsed` (spelled) that `is_one` accepts; "" = none.
template <typename Pred>
std::string FirstGiven(const util::ParsedArgs& parsed, Pred is_one) {
  for (const std::string& name : parsed.given) {
    if (is_one(absl::string_view(name))) return util::SpelledFlag(name);
  }
  return "";
}

bool IsSessionFlag(absl::string_view name) {
  SessionValues unused;
  for (const Flag& f : SessionFlags(&unused)) {
    if (f.name() == name) return true;
  }
  return false;
}

// The config the session flags describe. O(1) / QSA flags imply their
// attention mode and contradict any other.
absl::StatusOr<v1::SessionConfig> BuildSessionConfig(const SessionValues& s,
                                                     const util::ParsedArgs& parsed) {
  const std::string o1_flag =
      FirstGiven(parsed, [](absl::string_view n) { return absl::StartsWith(n, kO1Prefix); });
  const std::string qsa_flag =
      FirstGiven(parsed, [](absl::string_view n) { return absl::StartsWith(n, kQsaPrefix); });
  const std::string window_flag =
      FirstGiven(parsed, [](absl::string_view n) { return absl::StartsWith(n, kWindowPrefix); });
  const std::string* given[] = {&o1_flag, &qsa_flag, &window_flag};
  const std::string* first = nullptr;
  for (const std::string* g : given) {
    if (g->empty()) continue;
    if (first != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          *first, " and ", *g, " cannot be combined (one attention mode per session)"));
    }
    first = g;
  }
  v1::SessionConfig c;
  c.set_kv_dtype(s.kv);
  c.set_attention(s.attention);
  const auto imply = [&](const std::string& flag, v1::AttentionMode mode,
                         absl::string_view name) -> absl::Status {
    if (flag.empty()) return absl::OkStatus();
    if (!parsed.Given("attention")) {
      c.set_attention(mode);
    } else if (c.attention() != mode) {
      return absl::InvalidArgumentError(absl::StrCat(flag, " needs --attention ", name));
    }
    return absl::OkStatus();
  };
  CORTIQ_RETURN_IF_ERROR(imply(o1_flag, v1::ATTENTION_MODE_O1, "o1"));
  CORTIQ_RETURN_IF_ERROR(imply(qsa_flag, v1::ATTENTION_MODE_QSA, "qsa"));
  CORTIQ_RETURN_IF_ERROR(imply(window_flag, v1::ATTENTION_MODE_WINDOW, "window"));
  // Only what was given is sent: the server applies its defaults to the rest.
  if (s.o1_layers) c.mutable_o1()->set_layers(*s.o1_layers);
  if (s.o1_m) c.mutable_o1()->set_m(*s.o1_m);
  if (s.o1_window) c.mutable_o1()->set_window(*s.o1_window);
  if (s.o1_sink) c.mutable_o1()->set_sink(*s.o1_sink);
  if (s.o1_rect) c.mutable_o1()->set_rect(*s.o1_rect);
  if (s.qsa_layers) c.mutable_qsa()->set_layers(*s.qsa_layers);
  if (s.qsa_ratio) c.mutable_qsa()->set_ratio(*s.qsa_ratio);
  if (s.qsa_budget) c.mutable_qsa()->set_budget(*s.qsa_budget);
  if (s.window_layers) c.mutable_window()->set_layers(*s.window_layers);
  if (s.window_sink) c.mutable_window()->set_sink(*s.window_sink);
  if (s.window_size) c.mutable_window()->set_window(*s.window_size);
  return c;
}

}  // namespace

CliEnvironment CliEnvironment::FromProcess() {
  CliEnvironment env;
  if (const char* s = std::getenv("CORTIQ_SERVER")) env.server = s;
  if (const char* t = std::getenv("CORTIQ_TOKEN")) env.token = t;
  return env;
}

absl::StatusOr<CommandLine> ParseCommandLine(const std::vector<std::string>& argv,
                                             const CliEnvironment& env) {
  CommandLine cl;
  if (env.server.has_value() && !env.server->empty()) cl.client.server = *env.server;
  if (env.token.has_value()) cl.client.token = *env.token;
  CORTIQ_ASSIGN_OR_RETURN(util::ParsedArgs parsed,
                          util::ParseFlags(GlobalFlags(&cl.client), argv,
                                           {.positionals = util::Positionals::kCommand}));
  // --help / -h anywhere before `--`, the command's arguments included.
  cl.help = parsed.help;
  if (!cl.client.tls_ca_file.empty()) cl.client.tls = true;
  if (!parsed.positional.empty()) {
    cl.command = parsed.positional[0];
    cl.args.assign(parsed.positional.begin() + 1, parsed.positional.end());
  }
  if (cl.command == "help") cl.help = true;
  return cl;
}

absl::StatusOr<GenerateArgs> ParseGenerateArgs(const std::vector<std::string>& args) {
  GenerateArgs g;
  v1::GenerateRequest& r = g.request;
  uint32_t max_tokens = 64;
  std::optional<float> temperature, top_p, min_p, repetition_penalty, presence_penalty,
      frequency_penalty;
  std::vector<std::string> logit_bias, stop_token_ids;
  uint32_t min_tokens = 0, n = 1;
  std::optional<int32_t> top_k;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  bool keep = false, logprobs = false, ignore_eos = false;
  uint32_t top_logprobs = 0;
  std::vector<int32_t> tokens;
  SessionValues session;
  const std::vector<Flag> flags = util::JoinFlags({
      {
          IntFlag("max-tokens", &max_tokens, {.min = 1}),
          NonEmptyStringFlag("session", r.mutable_session_id()),
          SwitchFlag("keep", &keep),
          NumberFlag("temperature", &temperature),  // range checks are the server's
          IntFlag("top-k", &top_k, {.min = 0}),
          NumberFlag("top-p", &top_p),
          NumberFlag("min-p", &min_p),
          NumberFlag("repetition-penalty", &repetition_penalty),
          IntFlag("seed", &seed),
          NumberFlag("presence-penalty", &presence_penalty),  // ranges: the server's
          NumberFlag("frequency-penalty", &frequency_penalty),
          util::RepeatedStringFlag("logit-bias", &logit_bias),
          util::RepeatedStringFlag("stop-token-id", &stop_token_ids),
          IntFlag("min-tokens", &min_tokens),
          IntFlag("n", &n, {.min = 1}),
          util::RepeatedStringFlag("stop", &stop),
          SwitchFlag("logprobs", &logprobs),
          IntFlag("top-logprobs", &top_logprobs),
          SwitchFlag("ignore-eos", &ignore_eos),
          util::IntListFlag("tokens", &tokens, "id", {.min = 0}),
          SwitchFlag("json", &g.json),
      },
      SessionFlags(&session),
  });
  // `--n` is OpenAI's name for the choices; the shared parser spells a
  // one-letter flag `-n` only, so the long form is mapped here (before `--`).
  std::vector<std::string> spelled;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--") {
      spelled.insert(spelled.end(), args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
      break;
    }
    if (args[i] == "--n") {
      spelled.push_back("-n");
    } else if (args[i].starts_with("--n=")) {
      spelled.push_back("-n");
      spelled.push_back(args[i].substr(4));
    } else {
      spelled.push_back(args[i]);
    }
  }
  CORTIQ_ASSIGN_OR_RETURN(util::ParsedArgs parsed,
                          ParseCommandFlags("generate", spelled, flags));

  r.set_max_tokens(max_tokens);
  // Sampling fields are sent only when given.
  if (temperature) r.mutable_sampling()->set_temperature(*temperature);
  if (top_k) r.mutable_sampling()->set_top_k(*top_k);
  if (top_p) r.mutable_sampling()->set_top_p(*top_p);
  if (min_p) r.mutable_sampling()->set_min_p(*min_p);
  if (repetition_penalty) r.mutable_sampling()->set_repetition_penalty(*repetition_penalty);
  if (seed) r.mutable_sampling()->set_seed(*seed);
  if (presence_penalty) r.mutable_sampling()->set_presence_penalty(*presence_penalty);
  if (frequency_penalty) r.mutable_sampling()->set_frequency_penalty(*frequency_penalty);
  for (const std::string& list : logit_bias) {
    for (absl::string_view piece : absl::StrSplit(list, ',')) {
      const std::string_view item(piece.data(), piece.size());
      const size_t eq = item.find('=');
      if (eq == std::string_view::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat("--logit-bias: '", piece, "' is not ID=BIAS (e.g. 50256=-100)"));
      }
      CORTIQ_ASSIGN_OR_RETURN(int32_t id, util::ParseIntFlag<int32_t>(
                                              "--logit-bias", item.substr(0, eq), {.min = 0}));
      CORTIQ_ASSIGN_OR_RETURN(float bias,
                              util::ParseNumberFlag<float>("--logit-bias", item.substr(eq + 1)));
      (*r.mutable_sampling()->mutable_logit_bias())[id] = bias;
    }
  }
  for (const std::string& list : stop_token_ids) {
    CORTIQ_ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                            util::ParseIntListFlag<int32_t>("--stop-token-id", list, "id",
                                                            {.min = 0}));
    r.mutable_stop_token_ids()->Add(ids.begin(), ids.end());
  }
  r.set_min_tokens(min_tokens);
  if (n > 1) r.set_n(n);
  for (std::string& s : stop) r.add_stop(std::move(s));
  r.set_keep_session(keep);
  // The alternatives come with the chosen token's log-probability.
  r.set_logprobs(logprobs || top_logprobs > 0);
  r.set_top_logprobs(top_logprobs);
  r.set_ignore_eos(ignore_eos);

  const std::vector<std::string>& positional = parsed.positional;
  if (parsed.Given("tokens")) {
    if (!positional.empty()) {
      return absl::InvalidArgumentError("--tokens and a PROMPT cannot be combined");
    }
    r.mutable_prompt_tokens()->Assign(tokens.begin(), tokens.end());
  } else if (positional.empty()) {
    return absl::InvalidArgumentError("generate needs a PROMPT (or --tokens)");
  } else if (positional.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "generate takes one PROMPT, got ", positional.size(), " arguments (quote the prompt)"));
  } else if (positional[0] == "-") {
    g.prompt_from_stdin = true;
  } else if (positional[0].empty()) {
    return absl::InvalidArgumentError("PROMPT is empty");
  } else {
    r.set_prompt(positional[0]);
  }

  const std::string session_flag = FirstGiven(parsed, IsSessionFlag);
  if (!session_flag.empty()) {
    if (!r.session_id().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          session_flag, " cannot be combined with --session (a session keeps its configuration)"));
    }
    CORTIQ_ASSIGN_OR_RETURN(*r.mutable_session_config(), BuildSessionConfig(session, parsed));
  }
  return g;
}

absl::StatusOr<v1::CreateSessionRequest> ParseSessionCreateArgs(
    const std::vector<std::string>& args) {
  SessionValues session;
  CORTIQ_ASSIGN_OR_RETURN(util::ParsedArgs parsed,
                          ParseCommandFlags("session create", args, SessionFlags(&session)));
  if (!parsed.positional.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("session create takes no arguments, got \"", parsed.positional[0], "\""));
  }
  v1::CreateSessionRequest request;
  CORTIQ_ASSIGN_OR_RETURN(*request.mutable_config(), BuildSessionConfig(session, parsed));
  return request;
}

absl::StatusOr<TokenizeArgs> ParseTokenizeArgs(const std::vector<std::string>& args) {
  TokenizeArgs a;
  bool no_special = false;
  CORTIQ_ASSIGN_OR_RETURN(util::ParsedArgs parsed,
                          ParseCommandFlags("tokenize", args,
                                            {SwitchFlag("no-special", &no_special),
                                             SwitchFlag("verbose", &a.verbose)}));
  if (parsed.positional.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokenize takes one TEXT, got ", parsed.positional.size(), " arguments (quote the text)"));
  }
  if (no_special) a.request.set_parse_special(false);
  a.request.set_text(parsed.positional[0]);
  return a;
}

absl::StatusOr<ExportArgs> ParseExportArgs(const std::vector<std::string>& args) {
  ExportArgs a;
  uint32_t version = 0;
  bool f16 = false;
  CORTIQ_ASSIGN_OR_RETURN(util::ParsedArgs parsed,
                          ParseCommandFlags("export", args,
                                            {
                                                NonEmptyStringFlag("o", &a.output),
                                                NonEmptyStringFlag("output", &a.output),
                                                IntFlag("version", &version),
                                                SwitchFlag("f16", &f16),
                                            }));
  if (parsed.positional.size() != 1 || parsed.positional[0].empty()) {
    return absl::InvalidArgumentError("export takes one session ID");
  }
  if (a.output.empty()) return absl::InvalidArgumentError("export needs -o FILE (`-`: stdout)");
  a.request.set_session_id(parsed.positional[0]);
  a.request.set_version(version);
  if (f16) a.request.set_dtype(v1::WIRE_DTYPE_F16);
  return a;
}

absl::StatusOr<std::string> ParseImportArgs(const std::vector<std::string>& args) {
  return ParseOnePositional("import", "FILE", args);
}

absl::StatusOr<v1::MigrateSessionRequest> ParseMigrateArgs(const std::vector<std::string>& args) {
  v1::MigrateSessionRequest r;
  bool f16 = false;
  CORTIQ_ASSIGN_OR_RETURN(
      util::ParsedArgs parsed,
      ParseCommandFlags("migrate", args,
                        {
                            NonEmptyStringFlag("to", r.mutable_peer()),
                            NonEmptyStringFlag("peer-token", r.mutable_peer_token()),
                            SwitchFlag("f16", &f16),
                        }));
  if (parsed.positional.size() != 1 || parsed.positional[0].empty()) {
    return absl::InvalidArgumentError("migrate takes one session ID");
  }
  if (r.peer().empty()) return absl::InvalidArgumentError("migrate needs --to HOST:PORT");
  r.set_session_id(parsed.positional[0]);
  if (f16) r.set_dtype(v1::WIRE_DTYPE_F16);
  return r;
}

absl::StatusOr<v1::DrainRequest> ParseDrainArgs(const std::vector<std::string>& args) {
  v1::DrainRequest r;
  std::optional<float> grace;
  CORTIQ_ASSIGN_OR_RETURN(util::ParsedArgs parsed,
                          ParseCommandFlags("drain", args, {NumberFlag("grace", &grace)}));
  if (!parsed.positional.empty()) return absl::InvalidArgumentError("drain takes no arguments");
  if (grace) r.set_grace_seconds(*grace);
  return r;
}

absl::StatusOr<std::string> ParseOnePositional(absl::string_view command, absl::string_view what,
                                               const std::vector<std::string>& args) {
  CORTIQ_ASSIGN_OR_RETURN(util::ParsedArgs parsed, ParseCommandFlags(command, args, {}));
  if (parsed.positional.size() != 1 || parsed.positional[0].empty()) {
    return absl::InvalidArgumentError(absl::StrCat(command, " takes one ", what));
  }
  return parsed.positional[0];
}

absl::StatusOr<std::string> ParseHealthArgs(const std::vector<std::string>& args) {
  CORTIQ_ASSIGN_OR_RETURN(util::ParsedArgs parsed, ParseCommandFlags("health", args, {}));
  if (parsed.positional.size() > 1) {
    return absl::InvalidArgumentError("health takes at most one SERVICE");
  }
  return parsed.positional.empty() ? std::string() : parsed.positional[0];
}

absl::Status ParseNoArgs(absl::string_view command, const std::vector<std::string>& args) {
  CORTIQ_ASSIGN_OR_RETURN(util::ParsedArgs parsed, ParseCommandFlags(command, args, {}));
  if (!parsed.positional.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(command, " takes no arguments, got \"", parsed.positional[0], "\""));
  }
  return absl::OkStatus();
}

}  // namespace cortiq::client
