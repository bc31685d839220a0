// Command-line parsing of the `cortiq` client: see cli_args.h.
#include "client/cli_args.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
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
      --stop S (repeatable)  --logprobs  --top-logprobs N  --ignore-eos
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
  drain [--grace SECONDS]     drain the server: move its sessions to its peers, then it exits
                               move a session to another server

session flags:
  --kv f32|int8  --attention exact|o1|qsa
  --o1-layers SPEC --o1-m N --o1-window N --o1-sink N --o1-rect agg|fm   (imply --attention o1)
  --qsa-layers SPEC --qsa-ratio N --qsa-budget N                        (imply --attention qsa)
  SPEC: all | none | deep | 3,5-7 ...

Flags take their value as the next argument or after `=`; `--` ends the flags.
Exit status: 0 success, 1 error (printed as `error: CODE: message`), 2 usage error.
)";

namespace {

absl::Status FlagError(absl::string_view flag, absl::string_view what, absl::string_view value) {
  return absl::InvalidArgumentError(absl::StrCat(flag, ": ", what, " (got \"", value, "\")"));
}

bool IsGlobalFlag(absl::string_view name) {
  return name == "--server" || name == "--token" || name == "--tls" || name == "--tls-ca" ||
         name == "--timeout";
}

// A command's flags: value flags take one argument, switches none.
using ValueSetter = std::function<absl::Status(const std::string& flag, const std::string& value)>;
using Switch = std::function<void()>;
struct FlagTable {
  std::map<std::string, ValueSetter> values;
  std::map<std::string, Switch> switches;
};

// Splits `--name=value`; other arguments are returned whole.
std::pair<std::string, std::optional<std::string>> SplitInlineValue(const std::string& arg) {
  const size_t eq = arg.find('=');
  if (arg.rfind("--", 0) != 0 || eq == std::string::npos) return {arg, std::nullopt};
  return {arg.substr(0, eq), arg.substr(eq + 1)};
}

bool LooksLikeFlag(const std::string& arg) { return arg.size() > 1 && arg[0] == '-'; }

// Applies `flags` to `args` in order; positional arguments (and everything
// after `--`) are appended to `positional`.
absl::Status ScanArgs(absl::string_view command, const std::vector<std::string>& args,
                      const FlagTable& flags, std::vector<std::string>* positional) {
  bool flags_ended = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (flags_ended || !LooksLikeFlag(arg)) {
      positional->push_back(arg);
      continue;
    }
    if (arg == "--") {
      flags_ended = true;
      continue;
    }
    auto [name, inline_value] = SplitInlineValue(arg);
    if (auto it = flags.switches.find(name); it != flags.switches.end()) {
      if (inline_value.has_value()) {
        return absl::InvalidArgumentError(absl::StrCat(name, " takes no value"));
      }
      it->second();
      continue;
    }
    if (auto it = flags.values.find(name); it != flags.values.end()) {
      std::string value;
      if (inline_value.has_value()) {
        value = *std::move(inline_value);
      } else if (i + 1 < args.size()) {
        value = args[++i];
      } else {
        return absl::InvalidArgumentError(absl::StrCat(name, " needs a value"));
      }
      CORTIQ_RETURN_IF_ERROR(it->second(name, value));
      continue;
    }
    if (IsGlobalFlag(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " is a global flag: put it before the command"));
    }
    return absl::InvalidArgumentError(absl::StrCat("unknown flag ", name, " for ", command));
  }
  return absl::OkStatus();
}

// Setters for the common value kinds.
ValueSetter NonEmptyInto(std::string* out) {
  return [out](const std::string& flag, const std::string& value) {
    if (value.empty()) return absl::InvalidArgumentError(absl::StrCat(flag, ": empty value"));
    *out = value;
    return absl::OkStatus();
  };
}

template <typename T, typename Parse, typename Set>
ValueSetter ParsedInto(Parse parse, Set set) {
  return [parse, set](const std::string& flag, const std::string& value) {
    absl::StatusOr<T> parsed = parse(flag, value);
    if (!parsed.ok()) return parsed.status();
    set(*parsed);
    return absl::OkStatus();
  };
}

template <typename Set>
ValueSetter Uint32Into(Set set) {
  return ParsedInto<uint32_t>(ParseUint32Flag, set);
}
template <typename Set>
ValueSetter FloatInto(Set set) {
  return ParsedInto<float>(ParseFloatFlag, set);
}

// Session flags shared by `generate` and `session create`.
struct SessionFlags {
  v1::SessionConfig config;
  std::string first_flag;  // the first session flag given; "" = none
  std::string o1_flag;     // the first --o1-* flag given
  std::string qsa_flag;    // the first --qsa-* flag given
  bool attention_given = false;
};

// Wraps a setter so that it records which session flag was seen.
ValueSetter Noting(SessionFlags* s, std::string* family_flag, ValueSetter set) {
  return [s, family_flag, set = std::move(set)](const std::string& flag, const std::string& value) {
    if (s->first_flag.empty()) s->first_flag = flag;
    if (family_flag != nullptr && family_flag->empty()) *family_flag = flag;
    return set(flag, value);
  };
}

void AddSessionFlags(FlagTable& table, SessionFlags* s) {
  v1::SessionConfig* c = &s->config;
  table.values["--kv"] = Noting(s, nullptr, [c](const std::string& flag, const std::string& v) {
    if (v == "f32") {
      c->set_kv_dtype(v1::KV_DTYPE_F32);
    } else if (v == "int8") {
      c->set_kv_dtype(v1::KV_DTYPE_INT8);
    } else {
      return FlagError(flag, "expected f32 or int8", v);
    }
    return absl::OkStatus();
  });
  table.values["--attention"] =
      Noting(s, nullptr, [s, c](const std::string& flag, const std::string& v) {
        if (v == "exact") {
          c->set_attention(v1::ATTENTION_MODE_EXACT);
        } else if (v == "o1") {
          c->set_attention(v1::ATTENTION_MODE_O1);
        } else if (v == "qsa") {
          c->set_attention(v1::ATTENTION_MODE_QSA);
        } else {
          return FlagError(flag, "expected exact, o1 or qsa", v);
        }
        s->attention_given = true;
        return absl::OkStatus();
      });

  std::string* o1 = &s->o1_flag;
  table.values["--o1-layers"] = Noting(s, o1, [c](const std::string& flag, const std::string& v) {
    if (v.empty()) return absl::InvalidArgumentError(absl::StrCat(flag, ": empty value"));
    c->mutable_o1()->set_layers(v);
    return absl::OkStatus();
  });
  table.values["--o1-m"] =
      Noting(s, o1, Uint32Into([c](uint32_t n) { c->mutable_o1()->set_m(n); }));
  table.values["--o1-window"] =
      Noting(s, o1, Uint32Into([c](uint32_t n) { c->mutable_o1()->set_window(n); }));
  table.values["--o1-sink"] =
      Noting(s, o1, Uint32Into([c](uint32_t n) { c->mutable_o1()->set_sink(n); }));
  table.values["--o1-rect"] = Noting(s, o1, [c](const std::string& flag, const std::string& v) {
    if (v != "agg" && v != "fm") return FlagError(flag, "expected agg or fm", v);
    c->mutable_o1()->set_rect(v);
    return absl::OkStatus();
  });

  std::string* qsa = &s->qsa_flag;
  table.values["--qsa-layers"] = Noting(s, qsa, [c](const std::string& flag, const std::string& v) {
    if (v.empty()) return absl::InvalidArgumentError(absl::StrCat(flag, ": empty value"));
    c->mutable_qsa()->set_layers(v);
    return absl::OkStatus();
  });
  table.values["--qsa-ratio"] =
      Noting(s, qsa, Uint32Into([c](uint32_t n) { c->mutable_qsa()->set_ratio(n); }));
  table.values["--qsa-budget"] =
      Noting(s, qsa, Uint32Into([c](uint32_t n) { c->mutable_qsa()->set_budget(n); }));
}

// O(1) / QSA flags imply their attention mode and contradict any other.
absl::Status ResolveAttention(SessionFlags& s) {
  if (!s.o1_flag.empty() && !s.qsa_flag.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        s.o1_flag, " and ", s.qsa_flag, " cannot be combined (one attention mode per session)"));
  }
  const auto imply = [&s](const std::string& flag, v1::AttentionMode mode,
                          absl::string_view name) -> absl::Status {
    if (flag.empty()) return absl::OkStatus();
    if (!s.attention_given) {
      s.config.set_attention(mode);
    } else if (s.config.attention() != mode) {
      return absl::InvalidArgumentError(absl::StrCat(flag, " needs --attention ", name));
    }
    return absl::OkStatus();
  };
  CORTIQ_RETURN_IF_ERROR(imply(s.o1_flag, v1::ATTENTION_MODE_O1, "o1"));
  return imply(s.qsa_flag, v1::ATTENTION_MODE_QSA, "qsa");
}

template <typename T>
absl::StatusOr<T> ParseUnsigned(absl::string_view flag, absl::string_view value) {
  if (!value.empty() && value[0] == '-') return FlagError(flag, "must not be negative", value);
  T out{};
  const char* end = value.data() + value.size();
  auto [ptr, ec] = std::from_chars(value.data(), end, out);
  if (ec == std::errc::result_out_of_range) {
    return FlagError(flag, absl::StrCat("out of range, at most ", std::numeric_limits<T>::max()),
                     value);
  }
  if (ec != std::errc() || ptr != end) {
    return FlagError(flag, "expected a non-negative integer", value);
  }
  return out;
}

absl::StatusOr<double> ParseFiniteDouble(absl::string_view flag, absl::string_view value) {
  double out = 0;
  const char* end = value.data() + value.size();
  auto [ptr, ec] = std::from_chars(value.data(), end, out);
  if (ec == std::errc::result_out_of_range) return FlagError(flag, "out of range", value);
  if (ec != std::errc() || ptr != end) return FlagError(flag, "expected a number", value);
  if (!std::isfinite(out)) return FlagError(flag, "must be a finite number", value);
  return out;
}

}  // namespace

CliEnvironment CliEnvironment::FromProcess() {
  CliEnvironment env;
  if (const char* s = std::getenv("CORTIQ_SERVER")) env.server = s;
  if (const char* t = std::getenv("CORTIQ_TOKEN")) env.token = t;
  return env;
}

absl::StatusOr<uint32_t> ParseUint32Flag(absl::string_view flag, absl::string_view value) {
  return ParseUnsigned<uint32_t>(flag, value);
}

absl::StatusOr<uint64_t> ParseUint64Flag(absl::string_view flag, absl::string_view value) {
  return ParseUnsigned<uint64_t>(flag, value);
}

absl::StatusOr<int32_t> ParseNonNegativeInt32Flag(absl::string_view flag, absl::string_view value) {
  absl::StatusOr<uint32_t> n = ParseUnsigned<uint32_t>(flag, value);
  if (!n.ok()) return n.status();
  if (*n > static_cast<uint32_t>(std::numeric_limits<int32_t>::max())) {
    return FlagError(
        flag, absl::StrCat("out of range, at most ", std::numeric_limits<int32_t>::max()), value);
  }
  return static_cast<int32_t>(*n);
}

absl::StatusOr<float> ParseFloatFlag(absl::string_view flag, absl::string_view value) {
  absl::StatusOr<double> d = ParseFiniteDouble(flag, value);
  if (!d.ok()) return d.status();
  if (std::fabs(*d) > std::numeric_limits<float>::max()) {
    return FlagError(flag, "out of range", value);
  }
  return static_cast<float>(*d);
}

absl::StatusOr<std::chrono::milliseconds> ParseSecondsFlag(absl::string_view flag,
                                                           absl::string_view value) {
  absl::StatusOr<double> seconds = ParseFiniteDouble(flag, value);
  if (!seconds.ok()) return seconds.status();
  if (*seconds < 0) return FlagError(flag, "must not be negative", value);
  // 1e9 s (31 years) keeps the milliseconds far inside int64.
  if (*seconds > 1e9) return FlagError(flag, "out of range, at most 1e9 seconds", value);
  auto ms = std::chrono::milliseconds(std::llround(*seconds * 1000.0));
  // A positive timeout never rounds down to 0, which would mean "no deadline".
  if (*seconds > 0 && ms.count() == 0) ms = std::chrono::milliseconds(1);
  return ms;
}

absl::StatusOr<std::vector<int32_t>> ParseTokenIdsFlag(absl::string_view flag,
                                                       absl::string_view value) {
  std::vector<int32_t> ids;
  int position = 0;
  for (absl::string_view piece : absl::StrSplit(value, ',')) {
    ++position;
    piece = absl::StripAsciiWhitespace(piece);
    if (piece.empty()) {
      return FlagError(flag, absl::StrCat("empty id at position ", position), value);
    }
    absl::StatusOr<int32_t> id = ParseNonNegativeInt32Flag(flag, piece);
    if (!id.ok()) return id.status();
    ids.push_back(*id);
  }
  return ids;
}

absl::StatusOr<CommandLine> ParseCommandLine(const std::vector<std::string>& argv,
                                             const CliEnvironment& env) {
  CommandLine cl;
  if (env.server.has_value() && !env.server->empty()) cl.client.server = *env.server;
  if (env.token.has_value()) cl.client.token = *env.token;

  size_t i = 0;
  for (; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      cl.help = true;
      continue;
    }
    if (!LooksLikeFlag(arg)) break;  // the command
    auto [name, inline_value] = SplitInlineValue(arg);
    const bool is_switch = name == "--tls";
    if (!IsGlobalFlag(name)) return absl::InvalidArgumentError(absl::StrCat("unknown flag ", name));
    if (is_switch) {
      if (inline_value.has_value()) {
        return absl::InvalidArgumentError(absl::StrCat(name, " takes no value"));
      }
      cl.client.tls = true;
      continue;
    }
    std::string value;
    if (inline_value.has_value()) {
      value = *std::move(inline_value);
    } else if (i + 1 < argv.size()) {
      value = argv[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat(name, " needs a value"));
    }
    if (name == "--server") {
      if (value.empty()) return absl::InvalidArgumentError("--server: empty value");
      cl.client.server = value;
    } else if (name == "--token") {
      cl.client.token = value;  // "" overrides CORTIQ_TOKEN with no token
    } else if (name == "--tls-ca") {
      if (value.empty()) return absl::InvalidArgumentError("--tls-ca: empty value");
      cl.client.tls = true;
      cl.client.tls_ca_file = value;
    } else {  // --timeout
      CORTIQ_ASSIGN_OR_RETURN(cl.client.timeout, ParseSecondsFlag(name, value));
    }
  }
  if (i < argv.size()) {
    cl.command = argv[i];
    cl.args.assign(argv.begin() + static_cast<std::ptrdiff_t>(i) + 1, argv.end());
  }
  if (cl.command == "help") cl.help = true;
  for (const std::string& arg : cl.args) {
    if (arg == "--") break;
    if (arg == "--help" || arg == "-h") cl.help = true;
  }
  return cl;
}

absl::StatusOr<GenerateArgs> ParseGenerateArgs(const std::vector<std::string>& args) {
  GenerateArgs g;
  v1::GenerateRequest& r = g.request;
  r.set_max_tokens(64);
  std::optional<std::vector<int32_t>> tokens;
  SessionFlags session;

  FlagTable t;
  t.values["--max-tokens"] = [&r](const std::string& flag, const std::string& v) {
    CORTIQ_ASSIGN_OR_RETURN(uint32_t n, ParseUint32Flag(flag, v));
    if (n == 0) return FlagError(flag, "must be at least 1", v);
    r.set_max_tokens(n);
    return absl::OkStatus();
  };
  t.values["--session"] = NonEmptyInto(r.mutable_session_id());
  t.switches["--keep"] = [&r] { r.set_keep_session(true); };
  t.values["--temperature"] =
      FloatInto([&r](float f) { r.mutable_sampling()->set_temperature(f); });
  t.values["--top-k"] = ParsedInto<int32_t>(
      ParseNonNegativeInt32Flag, [&r](int32_t k) { r.mutable_sampling()->set_top_k(k); });
  t.values["--top-p"] = FloatInto([&r](float f) { r.mutable_sampling()->set_top_p(f); });
  t.values["--min-p"] = FloatInto([&r](float f) { r.mutable_sampling()->set_min_p(f); });
  t.values["--repetition-penalty"] =
      FloatInto([&r](float f) { r.mutable_sampling()->set_repetition_penalty(f); });
  t.values["--seed"] = ParsedInto<uint64_t>(
      ParseUint64Flag, [&r](uint64_t s) { r.mutable_sampling()->set_seed(s); });
  t.values["--stop"] = [&r](const std::string& flag, const std::string& v) {
    if (v.empty()) return absl::InvalidArgumentError(absl::StrCat(flag, ": empty value"));
    r.add_stop(v);
    return absl::OkStatus();
  };
  t.switches["--logprobs"] = [&r] { r.set_logprobs(true); };
  // The alternatives come with the chosen token's log-probability.
  t.values["--top-logprobs"] = Uint32Into([&r](uint32_t n) {
    r.set_top_logprobs(n);
    if (n > 0) r.set_logprobs(true);
  });
  t.switches["--ignore-eos"] = [&r] { r.set_ignore_eos(true); };
  t.values["--tokens"] = ParsedInto<std::vector<int32_t>>(
      ParseTokenIdsFlag, [&tokens](const std::vector<int32_t>& ids) { tokens = ids; });
  t.switches["--json"] = [&g] { g.json = true; };
  AddSessionFlags(t, &session);

  std::vector<std::string> positional;
  CORTIQ_RETURN_IF_ERROR(ScanArgs("generate", args, t, &positional));

  if (tokens.has_value()) {
    if (!positional.empty()) {
      return absl::InvalidArgumentError("--tokens and a PROMPT cannot be combined");
    }
    r.mutable_prompt_tokens()->Assign(tokens->begin(), tokens->end());
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

  if (!session.first_flag.empty()) {
    if (!r.session_id().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(session.first_flag,
                       " cannot be combined with --session (a session keeps its configuration)"));
    }
    CORTIQ_RETURN_IF_ERROR(ResolveAttention(session));
    *r.mutable_session_config() = std::move(session.config);
  }
  return g;
}

absl::StatusOr<v1::CreateSessionRequest> ParseSessionCreateArgs(
    const std::vector<std::string>& args) {
  SessionFlags session;
  FlagTable t;
  AddSessionFlags(t, &session);
  std::vector<std::string> positional;
  CORTIQ_RETURN_IF_ERROR(ScanArgs("session create", args, t, &positional));
  if (!positional.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("session create takes no arguments, got \"", positional[0], "\""));
  }
  CORTIQ_RETURN_IF_ERROR(ResolveAttention(session));
  v1::CreateSessionRequest request;
  *request.mutable_config() = std::move(session.config);
  return request;
}

absl::StatusOr<TokenizeArgs> ParseTokenizeArgs(const std::vector<std::string>& args) {
  TokenizeArgs a;
  FlagTable t;
  t.switches["--no-special"] = [&a] { a.request.set_parse_special(false); };
  t.switches["--verbose"] = [&a] { a.verbose = true; };
  std::vector<std::string> positional;
  CORTIQ_RETURN_IF_ERROR(ScanArgs("tokenize", args, t, &positional));
  if (positional.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokenize takes one TEXT, got ", positional.size(), " arguments (quote the text)"));
  }
  a.request.set_text(positional[0]);
  return a;
}

absl::StatusOr<ExportArgs> ParseExportArgs(const std::vector<std::string>& args) {
  ExportArgs a;
  FlagTable t;
  t.values["-o"] = NonEmptyInto(&a.output);
  t.values["--output"] = NonEmptyInto(&a.output);
  t.values["--version"] = Uint32Into([&a](uint32_t v) { a.request.set_version(v); });
  t.switches["--f16"] = [&a] { a.request.set_dtype(v1::WIRE_DTYPE_F16); };
  std::vector<std::string> positional;
  CORTIQ_RETURN_IF_ERROR(ScanArgs("export", args, t, &positional));
  if (positional.size() != 1 || positional[0].empty()) {
    return absl::InvalidArgumentError("export takes one session ID");
  }
  if (a.output.empty()) return absl::InvalidArgumentError("export needs -o FILE (`-`: stdout)");
  a.request.set_session_id(positional[0]);
  return a;
}

absl::StatusOr<std::string> ParseImportArgs(const std::vector<std::string>& args) {
  return ParseOnePositional("import", "FILE", args);
}

absl::StatusOr<v1::MigrateSessionRequest> ParseMigrateArgs(const std::vector<std::string>& args) {
  v1::MigrateSessionRequest r;
  FlagTable t;
  t.values["--to"] = NonEmptyInto(r.mutable_peer());
  t.values["--peer-token"] = NonEmptyInto(r.mutable_peer_token());
  t.switches["--f16"] = [&r] { r.set_dtype(v1::WIRE_DTYPE_F16); };
  std::vector<std::string> positional;
  CORTIQ_RETURN_IF_ERROR(ScanArgs("migrate", args, t, &positional));
  if (positional.size() != 1 || positional[0].empty()) {
    return absl::InvalidArgumentError("migrate takes one session ID");
  }
  if (r.peer().empty()) return absl::InvalidArgumentError("migrate needs --to HOST:PORT");
  r.set_session_id(positional[0]);
  return r;
}

absl::StatusOr<v1::DrainRequest> ParseDrainArgs(const std::vector<std::string>& args) {
  v1::DrainRequest r;
  FlagTable t;
  t.values["--grace"] = FloatInto([&r](float f) { r.set_grace_seconds(f); });
  std::vector<std::string> positional;
  CORTIQ_RETURN_IF_ERROR(ScanArgs("drain", args, t, &positional));
  if (!positional.empty()) return absl::InvalidArgumentError("drain takes no arguments");
  return r;
}

absl::StatusOr<std::string> ParseOnePositional(absl::string_view command, absl::string_view what,
                                               const std::vector<std::string>& args) {
  std::vector<std::string> positional;
  CORTIQ_RETURN_IF_ERROR(ScanArgs(command, args, FlagTable{}, &positional));
  if (positional.size() != 1 || positional[0].empty()) {
    return absl::InvalidArgumentError(absl::StrCat(command, " takes one ", what));
  }
  return positional[0];
}

absl::StatusOr<std::string> ParseHealthArgs(const std::vector<std::string>& args) {
  std::vector<std::string> positional;
  CORTIQ_RETURN_IF_ERROR(ScanArgs("health", args, FlagTable{}, &positional));
  if (positional.size() > 1) {
    return absl::InvalidArgumentError("health takes at most one SERVICE");
  }
  return positional.empty() ? std::string() : positional[0];
}

absl::Status ParseNoArgs(absl::string_view command, const std::vector<std::string>& args) {
  std::vector<std::string> positional;
  CORTIQ_RETURN_IF_ERROR(ScanArgs(command, args, FlagTable{}, &positional));
  if (!positional.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(command, " takes no arguments, got \"", positional[0], "\""));
  }
  return absl::OkStatus();
}

}  // namespace cortiq::client
