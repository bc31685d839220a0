// cortiq: the command-line client of a Cortiq Serve server. Usage: kCliUsage
// in cli_args.cc (`cortiq --help`).
//
//   cortiq generate --max-tokens 32 "Why is the sky blue?"
//   cortiq --server node2:50051 sessions
//   cortiq session release 0123456789abcdef0123456789abcdef
//
// Exit status: 0 success, 1 error (a server status or a local I/O failure,
// printed as `error: CODE: message`), 2 usage error.
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "client/cli_args.h"
#include "client/client.h"
#include "core/util/flags.h"
#include "nlohmann/json.hpp"

namespace cortiq::client {
namespace {

namespace v1 = ::cortiq::v1;

constexpr int kExitOk = 0;
constexpr int kExitError = 1;
constexpr int kExitUsage = util::kExitUsage;

// The message and a hint on stderr, exit status 2 (the same in every program).
int UsageError(const absl::Status& status) { return util::ReportUsageError("cortiq", status); }

int RuntimeError(const absl::Status& status) {
  std::cerr << "error: " << absl::StatusCodeToString(status.code()) << ": " << status.message()
            << "\n";
  return kExitError;
}

// A local failure (file I/O) in the same shape as a server error.
absl::Status ErrnoError(absl::string_view what, const std::string& path) {
  const int e = errno;
  return absl::Status(absl::ErrnoToStatusCode(e),
                      absl::StrCat(what, " ", path, ": ", std::strerror(e)));
}

// One line of proto3 JSON with the proto's field names and every field (zeros
// included), so that scripts see a stable set of keys.
absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = false;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string out;
  auto status = google::protobuf::util::MessageToJsonString(message, &out, options);
  if (!status.ok()) return absl::InternalError(absl::StrCat("JSON: ", status.ToString()));
  return out;
}

// Indented JSON for people. protobuf's own indentation is one space; nlohmann
// re-indents by two, keeping the proto's field order (ordered_json).
int PrintJson(const google::protobuf::Message& message) {
  absl::StatusOr<std::string> json = ToJson(message);
  if (!json.ok()) return RuntimeError(json.status());
  const nlohmann::ordered_json parsed =
      nlohmann::ordered_json::parse(*json, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) {
    std::cout << *json << "\n";  // never expected: print protobuf's JSON as it is
  } else {
    std::cout << parsed.dump(2, ' ', /*ensure_ascii=*/false,
                             nlohmann::ordered_json::error_handler_t::replace)
              << "\n";
  }
  return kExitOk;
}

// "FINISH_REASON_LENGTH" -> "length" (the enum's prefix off, lower case).
std::string ShortEnumName(const std::string& name, absl::string_view prefix) {
  return absl::AsciiStrToLower(absl::StripPrefix(name, prefix));
}

std::string ModeName(const v1::SessionConfig& config) {
  std::string attention =
      config.attention() == v1::ATTENTION_MODE_UNSPECIFIED
          ? "default"
          : ShortEnumName(v1::AttentionMode_Name(config.attention()), "ATTENTION_MODE_");
  std::string kv = config.kv_dtype() == v1::KV_DTYPE_UNSPECIFIED
                       ? "default"
                       : ShortEnumName(v1::KvDtype_Name(config.kv_dtype()), "KV_DTYPE_");
  return absl::StrCat(attention, "/", kv);
}

int RunGenerate(const CommandLine& cl) {
  absl::StatusOr<GenerateArgs> args = ParseGenerateArgs(cl.args);
  if (!args.ok()) return UsageError(args.status());
  if (args->prompt_from_stdin) {
    std::string prompt((std::istreambuf_iterator<char>(std::cin)),
                       std::istreambuf_iterator<char>());
    if (prompt.empty()) return UsageError(absl::InvalidArgumentError("PROMPT on stdin is empty"));
    args->request.set_prompt(std::move(prompt));
  }
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(cl.client);
  if (!client.ok()) return RuntimeError(client.status());

  const bool json = args->json;
  // n > 1 in text mode: the choices' tokens interleave on the stream, so
  // each choice's text is kept and printed whole, in index order, at the end.
  const bool many = args->request.n() > 1;
  std::vector<std::string> texts(std::max<uint32_t>(args->request.n(), 1));
  bool printed_text = false;
  absl::Status print_status;
  auto on_token = [&](const v1::GeneratedToken& token) {
    if (json) {
      v1::GenerateResponse response;
      *response.mutable_token() = token;
      absl::StatusOr<std::string> line = ToJson(response);
      if (!line.ok()) {
        print_status.Update(line.status());
        return;
      }
      std::fwrite(line->data(), 1, line->size(), stdout);
      std::fputc('\n', stdout);
    } else if (many) {
      if (token.index() < texts.size()) texts[token.index()] += token.text();
      return;
    } else {
      std::fwrite(token.text().data(), 1, token.text().size(), stdout);
      printed_text = printed_text || !token.text().empty();
    }
    std::fflush(stdout);
  };
  absl::StatusOr<std::vector<v1::GenerateSummary>> summaries =
      (*client)->GenerateChoices(args->request, on_token);
  if (!summaries.ok()) {
    if (printed_text) std::fputc('\n', stdout);
    std::fflush(stdout);
    return RuntimeError(summaries.status());
  }
  if (!print_status.ok()) return RuntimeError(print_status);

  if (json) {
    for (const v1::GenerateSummary& summary : *summaries) {
      v1::GenerateResponse response;
      *response.mutable_summary() = summary;
      absl::StatusOr<std::string> line = ToJson(response);
      if (!line.ok()) return RuntimeError(line.status());
      std::cout << *line << std::endl;
    }
    return kExitOk;
  }
  if (many) {
    for (size_t i = 0; i < texts.size(); ++i) std::cout << "[choice " << i << "]\n" << texts[i] << "\n";
  } else {
    std::cout << std::endl;
  }
  for (const v1::GenerateSummary& summary : *summaries) {
    std::cerr << absl::StrFormat(
        "%sfinish=%s prompt_tokens=%u completion_tokens=%u ttft_ms=%.1f tokens_per_s=%.1f\n",
        many ? absl::StrCat("choice=", summary.index(), " ") : std::string(),
        ShortEnumName(v1::FinishReason_Name(summary.finish_reason()), "FINISH_REASON_"),
        summary.usage().prompt_tokens(), summary.usage().completion_tokens(),
        summary.timings().time_to_first_token_seconds() * 1000.0,
        summary.timings().decode_tokens_per_second());
  }
  const v1::GenerateSummary& first = summaries->front();
  if (first.session_kept()) std::cerr << "session: " << first.session_id() << "\n";
  return kExitOk;
}

int RunSessions(const CommandLine& cl) {
  absl::Status parsed = ParseNoArgs("sessions", cl.args);
  if (!parsed.ok()) return UsageError(parsed);
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(cl.client);
  if (!client.ok()) return RuntimeError(client.status());
  absl::StatusOr<v1::ListSessionsResponse> list = (*client)->ListSessions();
  if (!list.ok()) return RuntimeError(list.status());

  constexpr absl::string_view kRow = "%-32s  %-13s  %10s  %14s  %-4s  %8s\n";
  std::cout << absl::StrFormat(kRow, "ID", "MODE", "TOKENS", "BYTES", "BUSY", "IDLE_S");
  for (const v1::SessionInfo& s : list->sessions()) {
    std::cout << absl::StrFormat(kRow, s.session_id(), ModeName(s.config()),
                                 absl::StrCat(s.tokens()), absl::StrCat(s.memory().total_bytes()),
                                 s.busy() ? "yes" : "no",
                                 absl::StrFormat("%.1f", s.idle_seconds()));
  }
  std::cout << absl::StrFormat("%d session(s), %u bytes\n", list->sessions_size(),
                               list->total_memory().total_bytes());
  return kExitOk;
}

int RunSession(const CommandLine& cl) {
  if (cl.args.empty()) {
    return UsageError(absl::InvalidArgumentError("session needs show, release or create"));
  }
  const std::string& sub = cl.args[0];
  const std::vector<std::string> rest(cl.args.begin() + 1, cl.args.end());
  if (sub == "create") {
    absl::StatusOr<v1::CreateSessionRequest> request = ParseSessionCreateArgs(rest);
    if (!request.ok()) return UsageError(request.status());
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(cl.client);
    if (!client.ok()) return RuntimeError(client.status());
    absl::StatusOr<v1::SessionInfo> info = (*client)->CreateSession(*request);
    if (!info.ok()) return RuntimeError(info.status());
    std::cout << info->session_id() << "\n";
    return kExitOk;
  }
  if (sub != "show" && sub != "release") {
    return UsageError(absl::InvalidArgumentError(
        absl::StrCat("unknown session command \"", sub, "\" (show, release or create)")));
  }
  absl::StatusOr<std::string> id = ParseOnePositional(absl::StrCat("session ", sub), "ID", rest);
  if (!id.ok()) return UsageError(id.status());
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(cl.client);
  if (!client.ok()) return RuntimeError(client.status());
  if (sub == "show") {
    v1::GetSessionRequest request;
    request.set_session_id(*id);
    absl::StatusOr<v1::SessionInfo> info = (*client)->GetSession(request);
    if (!info.ok()) return RuntimeError(info.status());
    return PrintJson(*info);
  }
  v1::ReleaseSessionRequest request;
  request.set_session_id(*id);
  absl::StatusOr<v1::ReleaseSessionResponse> released = (*client)->ReleaseSession(request);
  if (!released.ok()) return RuntimeError(released.status());
  if (released->released()) {
    std::cout << "released " << released->freed_bytes() << " bytes\n";
  } else {
    std::cout << "not found (already released)\n";
  }
  return kExitOk;
}

int RunTokenize(const CommandLine& cl) {
  absl::StatusOr<TokenizeArgs> args = ParseTokenizeArgs(cl.args);
  if (!args.ok()) return UsageError(args.status());
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(cl.client);
  if (!client.ok()) return RuntimeError(client.status());
  absl::StatusOr<v1::TokenizeResponse> response = (*client)->Tokenize(args->request);
  if (!response.ok()) return RuntimeError(response.status());
  if (args->verbose) {
    for (int i = 0; i < response->token_ids_size(); ++i) {
      std::cout << response->token_ids(i) << "\t"
                << (i < response->tokens_size() ? response->tokens(i) : "") << "\n";
    }
    return kExitOk;
  }
  for (int i = 0; i < response->token_ids_size(); ++i) {
    std::cout << (i > 0 ? " " : "") << response->token_ids(i);
  }
  std::cout << "\n";
  return kExitOk;
}

int RunModel(const CommandLine& cl) {
  absl::Status parsed = ParseNoArgs("model", cl.args);
  if (!parsed.ok()) return UsageError(parsed);
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(cl.client);
  if (!client.ok()) return RuntimeError(client.status());
  absl::StatusOr<v1::ModelInfo> info = (*client)->GetModelInfo();
  if (!info.ok()) return RuntimeError(info.status());
  return PrintJson(*info);
}

int RunHealth(const CommandLine& cl) {
  absl::StatusOr<std::string> service = ParseHealthArgs(cl.args);
  if (!service.ok()) return UsageError(service.status());
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(cl.client);
  if (!client.ok()) return RuntimeError(client.status());
  absl::StatusOr<ServingStatus> status = (*client)->Health(*service);
  if (!status.ok()) return RuntimeError(status.status());
  std::cout << ServingStatusName(*status) << "\n";
  return *status == ServingStatus::kServing ? kExitOk : kExitError;
}

int RunExport(const CommandLine& cl) {
  absl::StatusOr<ExportArgs> args = ParseExportArgs(cl.args);
  if (!args.ok()) return UsageError(args.status());
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(cl.client);
  if (!client.ok()) return RuntimeError(client.status());

  const bool to_stdout = args->output == "-";
  std::ofstream file;
  if (!to_stdout) {
    file.open(args->output, std::ios::binary | std::ios::trunc);
    if (!file) return RuntimeError(ErrnoError("cannot create", args->output));
  }
  std::ostream& out = to_stdout ? std::cout : file;
  absl::StatusOr<uint64_t> bytes =
      (*client)->ExportSession(args->request, [&](const v1::WireChunk& chunk) {
        out.write(chunk.data().data(), static_cast<std::streamsize>(chunk.data().size()));
        if (!out) return ErrnoError("cannot write", args->output);
        return absl::OkStatus();
      });
  if (bytes.ok()) {
    out.flush();
    if (!out) bytes = ErrnoError("cannot write", args->output);
  }
  if (!bytes.ok()) {
    if (!to_stdout) {
      // A partial file is not a session: do not leave one behind.
      file.close();
      std::error_code ignored;
      std::filesystem::remove(args->output, ignored);
    }
    return RuntimeError(bytes.status());
  }
  std::cerr << "exported " << *bytes << " bytes"
            << (to_stdout ? std::string() : absl::StrCat(" to ", args->output)) << "\n";
  return kExitOk;
}

int RunImport(const CommandLine& cl) {
  absl::StatusOr<std::string> path = ParseImportArgs(cl.args);
  if (!path.ok()) return UsageError(path.status());
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(cl.client);
  if (!client.ok()) return RuntimeError(client.status());
  std::ifstream file;
  if (*path != "-") {
    file.open(*path, std::ios::binary);
    if (!file) return RuntimeError(ErrnoError("cannot open", *path));
  }
  std::istream& in = *path == "-" ? std::cin : file;
  absl::StatusOr<v1::ImportSessionResponse> response = (*client)->ImportSession(in);
  if (!response.ok()) return RuntimeError(response.status());
  std::cout << response->session().session_id() << "\n";
  return kExitOk;
}

// Prints one line per session and exits 1 when any could not be moved.
// A peer that speaks wire version 4 keeps the session's id; an older one
// gives it a new one, which the caller must learn: " as NEWID".
std::string RenamedAs(const std::string& id, const std::string& peer_id) {
  return peer_id.empty() || peer_id == id ? std::string() : " as " + peer_id;
}

int RunDrain(const CommandLine& cl) {
  absl::StatusOr<v1::DrainRequest> request = ParseDrainArgs(cl.args);
  if (!request.ok()) return UsageError(request.status());
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(cl.client);
  if (!client.ok()) return RuntimeError(client.status());
  absl::StatusOr<v1::DrainResponse> response = (*client)->Drain(*request);
  if (!response.ok()) return RuntimeError(response.status());
  for (const auto& s : response->sessions()) {
    if (s.migrated()) {
      std::cout << "migrated " << s.session_id() << " to " << s.peer() << " (node "
                << s.peer_node() << ")" << RenamedAs(s.session_id(), s.peer_session_id()) << "\n";
    } else {
      std::cout << "FAILED   " << s.session_id() << ": " << s.error() << "\n";
    }
  }
  std::cout << response->migrated() << " migrated, " << response->failed() << " failed\n";
  return response->failed() == 0 ? kExitOk : 1;
}

int RunMigrate(const CommandLine& cl) {
  absl::StatusOr<v1::MigrateSessionRequest> request = ParseMigrateArgs(cl.args);
  if (!request.ok()) return UsageError(request.status());
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(cl.client);
  if (!client.ok()) return RuntimeError(client.status());
  absl::StatusOr<v1::MigrateSessionResponse> response = (*client)->MigrateSession(*request);
  if (!response.ok()) return RuntimeError(response.status());
  std::cout << absl::StrFormat("migrated %s to %s (node %s)%s (%u wire bytes, version %u)\n",
                               request->session_id(), request->peer(), response->peer_node(),
                               RenamedAs(request->session_id(), response->peer_session_id()),
                               response->wire_bytes(), response->version());
  return kExitOk;
}

int Main(int argc, char** argv) {
  const std::vector<std::string> argv_list(argv + 1, argv + argc);
  absl::StatusOr<CommandLine> cl = ParseCommandLine(argv_list, CliEnvironment::FromProcess());
  if (!cl.ok()) return UsageError(cl.status());
  if (cl->help) {
    std::cout << kCliUsage;
    return kExitOk;
  }
  if (cl->command.empty()) {
    std::cout << kCliUsage;
    return kExitUsage;
  }
  const std::string& c = cl->command;
  if (c == "generate") return RunGenerate(*cl);
  if (c == "sessions") return RunSessions(*cl);
  if (c == "session") return RunSession(*cl);
  if (c == "tokenize") return RunTokenize(*cl);
  if (c == "model") return RunModel(*cl);
  if (c == "health") return RunHealth(*cl);
  if (c == "export") return RunExport(*cl);
  if (c == "import") return RunImport(*cl);
  if (c == "migrate") return RunMigrate(*cl);
  if (c == "drain") return RunDrain(*cl);
  return UsageError(absl::InvalidArgumentError(absl::StrCat("unknown command \"", c, "\"")));
}

}  // namespace
}  // namespace cortiq::client

int main(int argc, char** argv) {
  // Only allocation failures can throw here; report them like any error.
  try {
    return cortiq::client::Main(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "error: INTERNAL: " << e.what() << "\n";
    return 1;
  }
}
