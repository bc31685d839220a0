// Command-line parsing of the `cortiq` client, kept apart from cortiq_main.cc
// so that it is testable without a server. Every function is pure: it reads
// its arguments (never the process environment or stdin) and returns either
// the parsed values or INVALID_ARGUMENT with a message that names the flag.
//
// The syntax is the shared parser's (core/util/flags.h): flags take their
// value as the next argument or after `=` (`--top-k 40`, `--top-k=40`),
// switches take none (`--keep`), `--` ends the flags (a prompt that starts
// with `-`). Each command's flags are one table of typed bindings; the global
// flags given after the command are refused with a hint.
//
// Example:
//   absl::StatusOr<CommandLine> cl = ParseCommandLine(argv, CliEnvironment::FromProcess());
//   if (cl.ok() && cl->command == "generate") {
//     absl::StatusOr<GenerateArgs> g = ParseGenerateArgs(cl->args);
//   }
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/client.h"
#include "cortiq/v1/inference.pb.h"

namespace cortiq::client {

// The usage text printed by `cortiq --help`.
extern const char kCliUsage[];

// The environment variables the command line falls back on; nullopt = unset.
struct CliEnvironment {
  std::optional<std::string> server{};  // CORTIQ_SERVER
  std::optional<std::string> token{};   // CORTIQ_TOKEN

  static CliEnvironment FromProcess();
};

struct CommandLine {
  // Flags > environment > ClientOptions defaults.
  ClientOptions client;
  // --help / -h anywhere before `--`, or the command `help`.
  bool help = false;
  // The first positional argument; empty when none was given.
  std::string command;
  // Everything after the command, unparsed.
  std::vector<std::string> args;
};

// argv without the program name. Global flags (--server, --token, --tls,
// --tls-ca (implies --tls), --timeout SECONDS) come before the command.
// --help / -h anywhere before `--` sets `help` and nothing else is checked;
// the Parse*Args functions below expect that case handled by the caller.
absl::StatusOr<CommandLine> ParseCommandLine(const std::vector<std::string>& argv,
                                             const CliEnvironment& env);

struct GenerateArgs {
  // max_tokens defaults to 64; sampling fields are set only when their flag
  // is given (the server applies its defaults to the rest); session_config is
  // set only by session flags.
  cortiq::v1::GenerateRequest request;
  bool json = false;               // --json: one GenerateResponse JSON per line
  bool prompt_from_stdin = false;  // PROMPT was `-`: the caller reads stdin
};
absl::StatusOr<GenerateArgs> ParseGenerateArgs(const std::vector<std::string>& args);

// `session create` flags: --kv, --attention, --o1-*, --qsa-*.
absl::StatusOr<cortiq::v1::CreateSessionRequest> ParseSessionCreateArgs(
    const std::vector<std::string>& args);

struct TokenizeArgs {
  cortiq::v1::TokenizeRequest request;  // parse_special set only by --no-special
  bool verbose = false;                 // id<TAB>token per line
};
absl::StatusOr<TokenizeArgs> ParseTokenizeArgs(const std::vector<std::string>& args);

struct ExportArgs {
  cortiq::v1::ExportSessionRequest request;
  std::string output;  // -o / --output FILE; `-` = stdout
};
absl::StatusOr<ExportArgs> ParseExportArgs(const std::vector<std::string>& args);

// `import FILE` (`-` = stdin): the file name.
absl::StatusOr<std::string> ParseImportArgs(const std::vector<std::string>& args);

// `drain [--grace SECONDS]`.
absl::StatusOr<cortiq::v1::DrainRequest> ParseDrainArgs(const std::vector<std::string>& args);

// `migrate ID --to HOST:PORT [--peer-token T] [--f16]`.
absl::StatusOr<cortiq::v1::MigrateSessionRequest> ParseMigrateArgs(
    const std::vector<std::string>& args);

// Commands that take exactly one positional argument and no flags (`session
// show ID`, `session release ID`); `what` names it in errors ("session ID").
absl::StatusOr<std::string> ParseOnePositional(absl::string_view command, absl::string_view what,
                                               const std::vector<std::string>& args);

// `health [SERVICE]`: the service name, "" when omitted.
absl::StatusOr<std::string> ParseHealthArgs(const std::vector<std::string>& args);

// Commands without arguments (`sessions`, `model`).
absl::Status ParseNoArgs(absl::string_view command, const std::vector<std::string>& args);

}  // namespace cortiq::client
