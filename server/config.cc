#include "server/config.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/util/strings.h"

#ifndef CORTIQ_DEFAULT_MODEL_DIR
#define CORTIQ_DEFAULT_MODEL_DIR ""
#endif

namespace cortiq::server {

namespace {

absl::Status FlagError(std::string_view flag, std::string_view value, std::string_view want) {
  return absl::InvalidArgumentError(
      absl::StrCat("--", util::Sv(flag), ": '", util::Sv(value), "' is not ", util::Sv(want)));
}

absl::StatusOr<size_t> ParseCount(std::string_view flag, std::string_view v) {
  uint64_t n;
  if (v.empty() || v[0] == '-' || !absl::SimpleAtoi(absl::string_view(v.data(), v.size()), &n)) {
    return FlagError(flag, v, "a non-negative integer");
  }
  return static_cast<size_t>(n);
}

absl::StatusOr<size_t> ParseBytes(std::string_view flag, std::string_view v) {
  std::string s(v);
  uint64_t mult = 1;
  if (!s.empty()) {
    switch (absl::ascii_toupper(s.back())) {
      case 'K': mult = 1ull << 10; break;
      case 'M': mult = 1ull << 20; break;
      case 'G': mult = 1ull << 30; break;
      case 'T': mult = 1ull << 40; break;
      default: break;
    }
    if (mult != 1) s.pop_back();
  }
  double d;
  if (s.empty() || s[0] == '-' || !absl::SimpleAtod(s, &d) || !std::isfinite(d) || d < 0 ||
      d * static_cast<double>(mult) > 1e18) {
    return FlagError(flag, v, "a byte size (e.g. 512M, 8G)");
  }
  return static_cast<size_t>(d * static_cast<double>(mult));
}

absl::StatusOr<std::chrono::milliseconds> ParseSeconds(std::string_view flag, std::string_view v) {
  double d;
  if (v.empty() || !absl::SimpleAtod(absl::string_view(v.data(), v.size()), &d) ||
      !std::isfinite(d) || d < 0 || d > 1e9) {
    return FlagError(flag, v, "a duration in seconds");
  }
  return std::chrono::milliseconds(static_cast<int64_t>(std::llround(d * 1000.0)));
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  std::ifstream f(path);
  if (!f) return absl::InvalidArgumentError(absl::StrCat("--auth-token-file: cannot read '", path, "'"));
  std::stringstream ss;
  ss << f.rdbuf();
  std::string t(absl::StripAsciiWhitespace(ss.str()));
  if (t.empty()) return absl::InvalidArgumentError(absl::StrCat("--auth-token-file: '", path, "' is empty"));
  return t;
}

}  // namespace

std::string ServerUsage() {
  return R"(usage: cortiq-server [flags]

  --model DIR             model directory (config.json, model.safetensors, tokenizer.json);
                          default: the embedded model ($CORTIQ_MODEL overrides)
  --listen HOST:PORT      gRPC address (default 127.0.0.1:50051; port 0 = any free port)
  --metrics-listen H:P    Prometheus /metrics address (default 127.0.0.1:9464; "off" disables)
  --threads N             math threads (default: every core)
  --activations bf16|f32  with bf16 weights, round projection inputs to bf16 (exact products,
                          f32 sums; AMX / AVX512_BF16 decode) or keep them f32 (default bf16)
  --max-sessions N        live session cap (default 256)
  --memory-budget BYTES   cap on projected session bytes, e.g. 8G (default 0 = unlimited)
  --session-ttl SECONDS   idle sessions are released after this long (default 600)
  --kv-dtype f32|int8     default K/V row type of new sessions (default f32)
  --attention exact|o1|qsa  default attention mode of new sessions (default exact)
  --o1-layers SPEC        O(1) layers: all | none | deepN | 3,5-7 (default all)
  --o1-m N  --o1-window N  --o1-sink N  --o1-rect agg|fm   O(1) parameters
                          (precedence: request > flags > CMF_O1* env > model hint > defaults)
  --qsa-layers SPEC  --qsa-ratio N  --qsa-budget N   QSA parameters (default all, 64, 16)
  --max-tokens N          upper bound of GenerateRequest.max_tokens (default 4096)
  --max-context N         positions per session (default: the model's max_position_embeddings)
  --max-prompt-bytes B    prompt size limit (default 1M)
  --max-message-bytes B   gRPC receive limit (default 8M)
  --max-import-bytes B    largest session an ImportSession stream may carry (default 8G)
  --max-batch N           decode rows per engine step (default 32)
  --prefill-chunk N       prompt tokens per prefill call (default 256)
  --queue-capacity N      tokens buffered per stream before its job pauses (default 64)
  --grace SECONDS         on SIGTERM/SIGINT, streams get this long to finish (default 10)
  --peers H:P[,H:P...]    peers a drain migrates kept sessions to (or env CORTIQ_PEERS)
  --peer-dns NAME:PORT    peers from DNS: every address NAME resolves to (a headless Service)
  --peer-token T          bearer token for the peers (default: --auth-token)
  --auth-token T          require "authorization: Bearer T" (or --auth-token-file F,
                          or env CORTIQ_AUTH_TOKEN)
  --tls-cert FILE --tls-key FILE   serve TLS with this PEM certificate chain and key
  --log-level L           trace | debug | info | warn | error | off (default info)
  --help                  this text
)";
}

absl::StatusOr<ServerConfig> ParseServerFlags(const std::vector<std::string>& args, bool* help) {
  ServerConfig c;
  *help = false;
  std::string token_file;
  using Setter = std::function<absl::Status(std::string_view flag, std::string_view v)>;
  auto count = [](size_t* out) -> Setter {
    return [out](std::string_view f, std::string_view v) -> absl::Status {
      auto n = ParseCount(f, v);
      if (!n.ok()) return n.status();
      *out = *n;
      return absl::OkStatus();
    };
  };
  auto opt_count = [](std::optional<size_t>* out) -> Setter {
    return [out](std::string_view f, std::string_view v) -> absl::Status {
      auto n = ParseCount(f, v);
      if (!n.ok()) return n.status();
      *out = *n;
      return absl::OkStatus();
    };
  };
  auto bytes = [](size_t* out) -> Setter {
    return [out](std::string_view f, std::string_view v) -> absl::Status {
      auto n = ParseBytes(f, v);
      if (!n.ok()) return n.status();
      *out = *n;
      return absl::OkStatus();
    };
  };
  auto seconds = [](std::chrono::milliseconds* out) -> Setter {
    return [out](std::string_view f, std::string_view v) -> absl::Status {
      auto n = ParseSeconds(f, v);
      if (!n.ok()) return n.status();
      *out = *n;
      return absl::OkStatus();
    };
  };
  auto str = [](std::string* out) -> Setter {
    return [out](std::string_view, std::string_view v) {
      *out = std::string(v);
      return absl::OkStatus();
    };
  };
  auto choice = [](std::string* out, std::vector<std::string> allowed) -> Setter {
    return [out, allowed](std::string_view f, std::string_view v) -> absl::Status {
      for (const auto& a : allowed) {
        if (v == a) {
          *out = a;
          return absl::OkStatus();
        }
      }
      std::string list;
      for (const auto& a : allowed) absl::StrAppend(&list, list.empty() ? "" : " | ", a);
      return FlagError(f, v, list);
    };
  };
  std::map<std::string, Setter, std::less<>> flags = {
      {"model", str(&c.model_dir)},
      {"listen", str(&c.listen)},
      {"metrics-listen", str(&c.metrics_listen)},
      {"threads", count(&c.threads)},
      {"max-sessions", count(&c.max_sessions)},
      {"memory-budget", bytes(&c.memory_budget_bytes)},
      {"session-ttl", seconds(&c.session_ttl)},
      {"kv-dtype", choice(&c.kv_dtype, {"f32", "int8"})},
      {"activations", choice(&c.activations, {"bf16", "f32"})},
      {"attention", choice(&c.attention, {"exact", "o1", "qsa"})},
      {"o1-layers", [&c](std::string_view, std::string_view v) {
         c.o1.layers = std::string(v);
         return absl::OkStatus();
       }},
      {"o1-m", opt_count(&c.o1.m)},
      {"o1-window", opt_count(&c.o1.w)},
      {"o1-sink", opt_count(&c.o1.sink)},
      {"o1-rect", [&c](std::string_view f, std::string_view v) -> absl::Status {
         auto r = kv::ParseO1Rect(v);
         if (!r.ok()) return FlagError(f, v, "agg | fm");
         c.o1.rect = *r;
         return absl::OkStatus();
       }},
      {"qsa-layers", [&c](std::string_view, std::string_view v) {
         c.qsa_layers = std::string(v);
         return absl::OkStatus();
       }},
      {"qsa-ratio", opt_count(&c.qsa_ratio)},
      {"qsa-budget", opt_count(&c.qsa_budget)},
      {"max-tokens", count(&c.max_tokens_limit)},
      {"max-context", count(&c.max_context)},
      {"max-prompt-bytes", bytes(&c.max_prompt_bytes)},
      {"max-message-bytes", bytes(&c.max_message_bytes)},
      {"max-import-bytes", bytes(&c.max_import_bytes)},
      {"max-batch", count(&c.max_batch)},
      {"prefill-chunk", count(&c.prefill_chunk)},
      {"queue-capacity", count(&c.queue_capacity)},
      {"grace", seconds(&c.grace)},
      {"peers", [&c](std::string_view f, std::string_view v) -> absl::Status {
         c.peers.clear();
         for (absl::string_view p : absl::StrSplit(util::Sv(v), ',', absl::SkipEmpty())) {
           if (p.find(':') == absl::string_view::npos) return FlagError(f, v, "HOST:PORT[,HOST:PORT...]");
           c.peers.emplace_back(p);
         }
         return absl::OkStatus();
       }},
      {"peer-dns", [&c](std::string_view f, std::string_view v) -> absl::Status {
         if (v.find(':') == std::string_view::npos) return FlagError(f, v, "NAME:PORT");
         c.peer_dns = std::string(v);
         return absl::OkStatus();
       }},
      {"peer-token", str(&c.peer_token)},
      {"auth-token", str(&c.auth_token)},
      {"auth-token-file", str(&token_file)},
      {"tls-cert", str(&c.tls_cert)},
      {"tls-key", str(&c.tls_key)},
      {"log-level", choice(&c.log_level, {"trace", "debug", "info", "warn", "error", "off"})},
  };
  for (size_t i = 0; i < args.size(); ++i) {
    std::string_view a = args[i];
    if (a == "--help" || a == "-h") {
      *help = true;
      return c;
    }
    if (a.substr(0, 2) != "--") {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", util::Sv(a), "' (flags are --name value)"));
    }
    a.remove_prefix(2);
    std::string_view name = a, value;
    bool has_value = false;
    if (size_t eq = a.find('='); eq != std::string_view::npos) {
      name = a.substr(0, eq);
      value = a.substr(eq + 1);
      has_value = true;
    }
    auto it = flags.find(name);
    if (it == flags.end()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", util::Sv(name), " (see --help)"));
    }
    if (!has_value) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(absl::StrCat("--", util::Sv(name), ": missing value"));
      }
      value = args[++i];
    }
    if (absl::Status s = it->second(name, value); !s.ok()) return s;
  }
  if (!token_file.empty()) {
    auto t = ReadTokenFile(token_file);
    if (!t.ok()) return t.status();
    c.auth_token = *t;
  }
  if (c.auth_token.empty()) {
    if (const char* env = std::getenv("CORTIQ_AUTH_TOKEN"); env != nullptr) c.auth_token = env;
  }
  if (c.peers.empty()) {
    if (const char* env = std::getenv("CORTIQ_PEERS"); env != nullptr) {
      for (absl::string_view p : absl::StrSplit(env, ',', absl::SkipEmpty())) c.peers.emplace_back(p);
    }
  }
  if (c.peer_token.empty()) c.peer_token = c.auth_token;
  if (c.tls_cert.empty() != c.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key: give both or neither");
  }
  if (c.max_sessions == 0) return absl::InvalidArgumentError("--max-sessions: must be >= 1");
  if (c.max_batch == 0) return absl::InvalidArgumentError("--max-batch: must be >= 1");
  if (c.prefill_chunk == 0) return absl::InvalidArgumentError("--prefill-chunk: must be >= 1");
  if (c.queue_capacity == 0) return absl::InvalidArgumentError("--queue-capacity: must be >= 1");
  if (c.max_tokens_limit == 0) return absl::InvalidArgumentError("--max-tokens: must be >= 1");
  if (c.model_dir.empty()) c.model_dir = DefaultModelDir();
  return c;
}

std::string DefaultModelDir() {
  if (const char* env = std::getenv("CORTIQ_MODEL"); env != nullptr && *env != '\0') return env;
  std::vector<std::string> candidates;
  if (*CORTIQ_DEFAULT_MODEL_DIR != '\0') candidates.push_back(CORTIQ_DEFAULT_MODEL_DIR);
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    exe[n] = '\0';
    const auto dir = std::filesystem::path(exe).parent_path();
    candidates.push_back((dir / "../share/cortiq/model").lexically_normal().string());
  }
  for (const auto& c : candidates) {
    if (std::filesystem::exists(c + "/config.json")) return c;
  }
  return candidates.empty() ? std::string() : candidates.front();
}

}  // namespace cortiq::server
