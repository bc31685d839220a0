#include "server/config.h"

#include <arpa/inet.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "core/session/session.h"
#include "core/util/flags.h"
#include "core/util/strings.h"

#ifndef CORTIQ_DEFAULT_MODEL_DIR
#define CORTIQ_DEFAULT_MODEL_DIR ""
#endif

namespace cortiq::server {

namespace {

// --peers / --migrate-allow H:P[,H:P...]: every item names a port; items
// are trimmed (the allow list is an exact string match: "a:1, b:2" must
// allow "b:2"); "" is none.
absl::StatusOr<std::vector<std::string>> ParsePeerList(std::string_view v) {
  std::vector<std::string> peers;
  for (absl::string_view p : absl::StrSplit(util::Sv(v), ',', absl::SkipWhitespace())) {
    p = absl::StripAsciiWhitespace(p);
    if (p.find(':') == absl::string_view::npos) {
      return absl::InvalidArgumentError("expected HOST:PORT[,HOST:PORT...]");
    }
    peers.emplace_back(p);
  }
  return peers;
}

absl::StatusOr<std::string> ParsePeerDns(std::string_view v) {
  if (v.find(':') == std::string_view::npos)
    return absl::InvalidArgumentError("expected NAME:PORT");
  return std::string(v);
}


// A file holding one token (--auth-token-file, --peer-token-file): its
// text less surrounding whitespace; an empty one is an error naming `flag`.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path, std::string_view flag) {
  absl::StatusOr<std::string> text = ReadFlagFile(path, flag);
  if (!text.ok()) return text.status();
  std::string t(absl::StripAsciiWhitespace(*text));
  if (t.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(util::Sv(flag), ": '", path, "' is empty"));
  }
  return t;
}

// The refusal of a reachable, unauthenticated server: says how to add a token
// and names the way out.
absl::Status InsecureListenError(const std::string& listen,
                                 std::string_view flag = "--listen") {
  return absl::InvalidArgumentError(absl::StrCat(
      util::Sv(flag), " ", listen,
      ": refusing to serve a non-loopback address without an auth token (anyone who reaches "
      "the port could generate, read and release every session). Add a token: "
      "`openssl rand -hex 32 > token && chmod 600 token`, then --auth-token-file token (or env "
      "CORTIQ_AUTH_TOKEN), or a token file with roles (--auth-tokens FILE); clients send "
      "\"authorization: Bearer <token>\". To serve without one anyway (a trusted network), pass "
      "--insecure"));
}

}  // namespace

// --tenant-weights NAME=W[,NAME=W...]: the engine's tenant shares. A name
// is a tenant name as the token file's (session::IsTenantName), not empty
// (no tenant weighs the default) and given once; a weight is a finite
// number in (0, kMaxTenantWeight]. Every error names the flag and the item.
absl::StatusOr<std::vector<std::pair<std::string, double>>> ParseTenantWeights(
    std::string_view flag, std::string_view value) {
  absl::StatusOr<std::vector<std::string_view>> items =
      util::flags_internal::SplitListFlag(flag, value, "item");
  if (!items.ok()) return items.status();
  std::vector<std::pair<std::string, double>> out;
  for (std::string_view item : *items) {
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) {
      return util::FlagValueError(flag, "expected NAME=WEIGHT[,NAME=WEIGHT...]", item);
    }
    const absl::string_view n = absl::StripTrailingAsciiWhitespace(util::Sv(item.substr(0, eq)));
    const absl::string_view w_text =
        absl::StripLeadingAsciiWhitespace(util::Sv(item.substr(eq + 1)));
    const std::string_view name(n.data(), n.size());
    const std::string_view weight(w_text.data(), w_text.size());
    if (name.empty() || !session::IsTenantName(name)) {
      return util::FlagValueError(
          flag,
          absl::StrCat("'", util::Sv(name), "' is not a tenant name (1 to ",
                       session::kMaxTenantBytes, " characters of [A-Za-z0-9._-])"),
          item);
    }
    for (const auto& [seen, w] : out) {
      if (seen == name) {
        return util::FlagValueError(
            flag, absl::StrCat("tenant '", util::Sv(name), "' is given twice"), value);
      }
    }
    absl::StatusOr<double> w =
        util::ParseNumberFlag<double>(flag, weight, {.min = 0, .max = kMaxTenantWeight});
    if (!w.ok() || *w <= 0) {
      return util::FlagValueError(
          flag,
          absl::StrCat("the weight of tenant '", util::Sv(name),
                       "' must be a number > 0 and <= ", static_cast<int64_t>(kMaxTenantWeight)),
          item);
    }
    out.emplace_back(std::string(name), *w);
  }
  return out;
}

absl::StatusOr<std::string> ReadFlagFile(const std::string& path, std::string_view flag) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    return absl::InvalidArgumentError(absl::StrCat(util::Sv(flag), ": cannot read '", path, "'"));
  }
  std::stringstream ss;
  ss << f.rdbuf();
  if (f.bad()) {
    return absl::InvalidArgumentError(absl::StrCat(util::Sv(flag), ": cannot read '", path, "'"));
  }
  return ss.str();
}

bool IsLoopbackListen(std::string_view listen) {
  if (listen.starts_with("unix:") || listen.starts_with("unix-abstract:")) return true;
  std::string_view host = listen;
  if (host.starts_with("[")) {  // [V6]:PORT
    const size_t close = host.find(']');
    if (close == std::string_view::npos) return false;
    host = host.substr(1, close - 1);
  } else if (const size_t colon = host.rfind(':'); colon != std::string_view::npos) {
    host = host.substr(0, colon);
  }
  const std::string h(host);
  if (absl::AsciiStrToLower(h) == "localhost") return true;
  in_addr v4;
  if (inet_pton(AF_INET, h.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6;
  if (inet_pton(AF_INET6, h.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;  // a hostname: it may resolve to any interface
}

std::string ServerUsage() {
  return R"(usage: cortiq-server [flags]

  --model DIR|FILE.gguf   model directory (config.json, model.safetensors, tokenizer.json) or
                          a llama.cpp GGUF file (qwen3, qwen2, llama; its own tokenizer and
                          chat template);
                          default: the embedded model ($CORTIQ_MODEL overrides)
  --listen HOST:PORT      gRPC address (default 127.0.0.1:50051; port 0 = any free port)
  --metrics-listen H:P    Prometheus /metrics address (default 127.0.0.1:9464; "off" disables)
  --threads N             math threads (default: every core)
  --activations bf16|f32  with bf16 weights, round projection inputs to bf16 (exact products,
                          f32 sums; AMX / AVX512_BF16 decode) or keep them f32 (default bf16)
  --weights checkpoint|int8  the weights as stored (default), or quantized once at load to
                          int8 Q8_0 blocks (half of bf16's bytes per token; docs/QUALITY.md)
  --max-sessions N        live session cap (default 256)
  --memory-budget BYTES   cap on projected session bytes, e.g. 8G (default 0 = unlimited)
  --memory-capacity BYTES with no --memory-budget, what cortiq_memory_utilization_ratio divides
                          the committed bytes by (default 0 = the machine's MemTotal)
  --page-pool BYTES       resident pages of released session buffers kept for new sessions'
                          buffers, so admission reuses them instead of faulting pages in
                          (default 256M; 0 = off); handed back after 30 s without use
  --session-ttl SECONDS   idle sessions are released after this long (default 600)
  --state-dir DIR         keep every kept session durable: its journal file in DIR gets each
                          call's new state; restored on start (default off; docs/PERSISTENCE.md)
  --persist-sync turn|interval|none  when session files are fsynced: before each call's last
                          message / every --persist-interval / never (default turn)
  --persist-interval SECONDS  the interval of --persist-sync interval (default 1)
                          With --state-dir, --session-ttl SPILLS an idle session (RAM freed, its
                          file kept; the next call reads it back) and admission spills the least
                          recently used idle sessions before refusing for the memory budget.
  --session-max-age SECONDS  release sessions this old for good, spilled or not (default 0 = never)
  --kv-dtype f32|int8     default K/V row type of new sessions (default f32)
  --attention exact|o1|qsa|window  default attention mode of new sessions (default exact)
  --o1-layers SPEC        O(1) layers: all | none | deepN | 3,5-7 (default all)
  --o1-m N  --o1-window N  --o1-sink N  --o1-rect agg|fm   O(1) parameters
                          (precedence: request > flags > CMF_O1* env > model hint > defaults)
  --qsa-layers SPEC  --qsa-ratio N  --qsa-budget N   QSA parameters (default all, 64, 16)
  --window-layers SPEC  --window-sink N  --window-size N
                          sink + window parameters (default all, 4, 128; f32 rows only)
  --max-tokens N          upper bound of GenerateRequest.max_tokens (default 4096)
  --max-n N               upper bound of GenerateRequest.n, choices per request
                          (default 8, at most --max-batch)
  --max-context N         positions per session (default: the model's max_position_embeddings)
  --max-prompt-bytes B    prompt size limit (default 1M)
  --max-message-bytes B   gRPC receive limit (default 8M)
  --max-import-bytes B    largest session an ImportSession stream may carry (default 8G)
  --max-concurrent-imports N  ImportSession streams at once; more are refused (default 4)
  --max-concurrent-exports N  ExportSession snapshots held at once (each counted against
                          --memory-budget until sent); more are refused (default 4)
  --max-o1-m N            largest session_config.o1.m (landmarks) a session may have; sealing a
                          prompt costs O(m^3) per head on the engine thread (default 256)
  --import-idle-timeout SECONDS  an import with no message for this long ends (default 30)
  --max-batch N           decode rows per engine step (default 32)
  --step-tokens N         rows one engine step may hold: decode rows plus prefill chunk rows;
                          bounds a step's time, so running streams' inter-token latency while
                          prompts are absorbed (default 128)
  --prefill-chunk N       a prompt is absorbed in chunks of N tokens, at most --step-tokens
                          (default 64, or --step-tokens when that is smaller)
  --aging-steps N         a waiting request rises one priority level per N engine steps, so
                          low priority is delayed, never starved (default 64)
  --tenant-weights NAME=W[,NAME=W...]  each tenant's share of prefill tokens and, when more
                          streams decode than --max-batch, of decode rows (weighted fair
                          queueing; W in (0, 1e6]; a tenant not listed weighs 1)
  --queue-capacity N      tokens buffered per stream before its job pauses (default 64)
  --grace SECONDS         on SIGTERM/SIGINT, streams get this long to finish (default 10)
  --lease-wait SECONDS    a Generate on a session whose previous call is ending (cancelled)
                          waits this long for it, within its own deadline (default 1)
  --peers H:P[,H:P...]    the peers: where a drain migrates kept sessions and MigrateSession
                          may send one (or env CORTIQ_PEERS)
  --peer-dns NAME:PORT    peers from DNS: every address NAME resolves to (a headless Service;
                          looked up at most every 5 s, waited for at most
                          --peer-connect-timeout)
  --migrate-allow H:P[,H:P...]  more addresses MigrateSession may move a session to. A
                          session moves only to a peer (--peers, --peer-dns) or one of
                          these, matched as the exact HOST:PORT string (no DNS, no
                          aliases); any other address is PERMISSION_DENIED, undialled
  --peer-ca FILE          dial peers over TLS, trusting the PEM CA certificates in FILE
                          (with --tls-cert/--tls-key, presented as the client
                          certificate); without it, peers are dialled in plaintext
  --peer-token T          bearer token for the peers (default: --auth-token); with
                          --auth-tokens, a `peer`-role token (or --peer-token-file F:
                          the token in a file, kept out of the process list)
  --peer-connect-timeout SECONDS  connecting to a peer and its GetModelInfo (default 5)
  --peer-min-throughput BYTES  slowest peer accepted, per second: a migration of B bytes
                          gets connect timeout + B / this + 1 s (default 20M)
  --drain-parallelism N   sessions a drain migrates at once (default 4)
  --drain-timeout SECONDS after --grace, how long a drain's migrations may take; then the
                          rest are cancelled and reported failed (default 60). Exit after
                          SIGTERM takes at most --grace + --drain-timeout + 10 s
  --auth-token T          require "authorization: Bearer T" (or --auth-token-file F,
                          or env CORTIQ_AUTH_TOKEN): one admin token named "admin"
  --auth-tokens FILE      named tokens with roles, one "NAME ROLE TOKEN" per line (ROLE
                          client | admin | peer; NAME is the tenant); re-read on SIGHUP.
                          Merges with --auth-token
  --insecure              allow a non-loopback --listen without an auth token (refused
                          otherwise; /metrics is never authenticated, see README)
  --tls-cert FILE --tls-key FILE   serve TLS with this PEM certificate chain and key (gRPC
                          and HTTP)
  --http-listen HOST:PORT the OpenAI-compatible HTTP API (/v1/chat/completions,
                          /v1/completions, /v1/models, /health; default 127.0.0.1:8080;
                          port 0 = any free port; "off" disables). Same tokens as gRPC
  --http-threads N        HTTP worker threads: requests served at once (default 16)
  --http-timeout SECONDS  deadline of one HTTP generation (default 600)
  --session-from-user     the `user` field of an HTTP request names its conversation, as
                          the x-cortiq-session header does
  --chat-template FILE    a Jinja chat template overriding the model's (tokenizer_config.json)
  --log-level L           trace | debug | info | warn | error | off (default info)
  --log-format text|json  log lines as text or as one JSON object each (default text)
  --node-name NAME        this node's name in the cluster: every response's x-cortiq-node,
                          SessionInfo.node, ModelInfo.node (default <hostname>:<port>)
  --forward-ttl SECONDS   how long a node remembers where it moved a session, to forward
                          calls that still name it here (default 600)
  --advertise HOST:PORT   the address peers reach this node at (e.g. the pod IP): never
                          one of its own peers, though --peer-dns lists it
  --help                  this text

Flags are --name value or --name=value; a usage error exits with status 2.
)";
}

absl::StatusOr<ServerConfig> ParseServerFlags(const std::vector<std::string>& args, bool* help) {
  using util::IntFlag;
  using util::StringFlag;
  ServerConfig c;
  c.http_listen = "127.0.0.1:8080";  // the binary serves HTTP unless told not to
  *help = false;
  std::string token_file, peer_token_file;
  std::optional<size_t> max_n;  // --max-n, resolved against --max-batch below
  std::optional<size_t> prefill_chunk;  // resolved against --step-tokens below
  const std::vector<util::Flag> flags = {
      StringFlag("model", &c.model_dir),
      StringFlag("listen", &c.listen),
      StringFlag("metrics-listen", &c.metrics_listen),
      IntFlag("threads", &c.threads),
      IntFlag("max-sessions", &c.max_sessions, {.min = 1}),
      util::BytesFlag("memory-budget", &c.memory_budget_bytes),
      util::BytesFlag("memory-capacity", &c.memory_capacity_bytes),
      util::BytesFlag("page-pool", &c.page_pool_bytes),
      util::SecondsFlag("session-ttl", &c.session_ttl),
      StringFlag("state-dir", &c.state_dir),
      util::SecondsFlag("session-max-age", &c.session_max_age),
      util::ChoiceFlag("persist-sync", &c.persist_sync, {"turn", "interval", "none"}),
      util::SecondsFlag("persist-interval", &c.persist_interval),
      util::ChoiceFlag("kv-dtype", &c.kv_dtype, {"f32", "int8"}),
      util::ChoiceFlag("activations", &c.activations, {"bf16", "f32"}),
      util::ChoiceFlag("weights", &c.weights, {"checkpoint", "int8"}),
      util::ChoiceFlag("attention", &c.attention, {"exact", "o1", "qsa", "window"}),
      StringFlag("o1-layers", &c.o1.layers),
      IntFlag("o1-m", &c.o1.m),
      IntFlag("o1-window", &c.o1.w),
      IntFlag("o1-sink", &c.o1.sink),
      util::ParsedFlag("o1-rect", &c.o1.rect, kv::ParseO1Rect),
      StringFlag("qsa-layers", &c.qsa_layers),
      IntFlag("qsa-ratio", &c.qsa_ratio),
      IntFlag("qsa-budget", &c.qsa_budget),
      StringFlag("window-layers", &c.window_layers),
      IntFlag("window-sink", &c.window_sink),
      IntFlag("window-size", &c.window_size, {.min = 1}),
      IntFlag("max-tokens", &c.max_tokens_limit, {.min = 1}),
      IntFlag("max-n", &max_n, {.min = 1}),
      IntFlag("max-context", &c.max_context),
      util::BytesFlag("max-prompt-bytes", &c.max_prompt_bytes),
      util::BytesFlag("max-message-bytes", &c.max_message_bytes),
      util::BytesFlag("max-import-bytes", &c.max_import_bytes),
      IntFlag("max-concurrent-imports", &c.max_concurrent_imports, {.min = 1}),
      IntFlag("max-concurrent-exports", &c.max_concurrent_exports, {.min = 1}),
      IntFlag("max-o1-m", &c.max_o1_m, {.min = 4}),
      util::SecondsFlag("import-idle-timeout", &c.import_idle_timeout),
      IntFlag("max-batch", &c.max_batch, {.min = 1}),
      IntFlag("step-tokens", &c.step_tokens, {.min = 1}),
      IntFlag("prefill-chunk", &prefill_chunk, {.min = 1}),
      IntFlag("aging-steps", &c.aging_steps, {.min = 1}),
      util::BoundFlag("tenant-weights", &c.tenant_weights, ParseTenantWeights),
      IntFlag("queue-capacity", &c.queue_capacity, {.min = 1}),
      util::SecondsFlag("grace", &c.grace),
      util::SecondsFlag("lease-wait", &c.lease_wait),
      util::ParsedFlag("peers", &c.peers, ParsePeerList),
      util::ParsedFlag("peer-dns", &c.peer_dns, ParsePeerDns),
      util::ParsedFlag("migrate-allow", &c.migrate_allow, ParsePeerList),
      StringFlag("peer-ca", &c.peer_ca),
      StringFlag("peer-token", &c.peer_token),
      util::SecondsFlag("peer-connect-timeout", &c.peer_connect_timeout),
      util::BytesFlag("peer-min-throughput", &c.peer_min_throughput),
      IntFlag("drain-parallelism", &c.drain_parallelism, {.min = 1}),
      util::SecondsFlag("drain-timeout", &c.drain_timeout),
      StringFlag("auth-token", &c.auth_token),
      StringFlag("auth-token-file", &token_file),
      StringFlag("peer-token-file", &peer_token_file),
      StringFlag("auth-tokens", &c.auth_tokens_file),
      util::SwitchFlag("insecure", &c.insecure),
      StringFlag("tls-cert", &c.tls_cert),
      StringFlag("tls-key", &c.tls_key),
      StringFlag("http-listen", &c.http_listen),
      IntFlag("http-threads", &c.http_threads, {.min = 1}),
      util::SecondsFlag("http-timeout", &c.http_timeout),
      util::SwitchFlag("session-from-user", &c.session_from_user),
      StringFlag("chat-template", &c.chat_template),
      util::ChoiceFlag("log-level", &c.log_level,
                       {"trace", "debug", "info", "warn", "error", "off"}),
      util::ChoiceFlag("log-format", &c.log_format, {"text", "json"}),
      StringFlag("node-name", &c.node_name),
      util::SecondsFlag("forward-ttl", &c.forward_ttl),
      StringFlag("advertise", &c.advertise),
  };
  absl::StatusOr<util::ParsedArgs> parsed =
      util::ParseFlags(flags, args, {.positionals = util::Positionals::kNone});
  if (!parsed.ok()) return parsed.status();
  if (parsed->help) {
    *help = true;
    return c;
  }
  if (!token_file.empty()) {
    auto t = ReadTokenFile(token_file, "--auth-token-file");
    if (!t.ok()) return t.status();
    c.auth_token = *t;
  }
  if (c.auth_token.empty()) {
    if (const char* env = std::getenv("CORTIQ_AUTH_TOKEN"); env != nullptr) c.auth_token = env;
  }
  if (c.peers.empty()) {
    if (const char* env = std::getenv("CORTIQ_PEERS"); env != nullptr) {
      for (absl::string_view p : absl::StrSplit(env, ',', absl::SkipWhitespace()))
        c.peers.emplace_back(absl::StripAsciiWhitespace(p));
    }
  }
  if (!peer_token_file.empty()) {
    auto t = ReadTokenFile(peer_token_file, "--peer-token-file");
    if (!t.ok()) return t.status();
    c.peer_token = *t;
  }
  if (c.peer_token.empty()) c.peer_token = c.auth_token;
  if (c.peer_connect_timeout.count() <= 0) {
    return absl::InvalidArgumentError("--peer-connect-timeout: must be > 0 seconds");
  }
  if (c.peer_min_throughput == 0) {
    return absl::InvalidArgumentError("--peer-min-throughput: must be >= 1 byte per second");
  }
  if (c.drain_timeout.count() <= 0) {
    return absl::InvalidArgumentError("--drain-timeout: must be > 0 seconds");
  }
  if (c.auth_token.empty() && c.auth_tokens_file.empty() && !c.insecure &&
      !IsLoopbackListen(c.listen)) {
    return InsecureListenError(c.listen);
  }
  if (c.http_listen.empty()) c.http_listen = "off";
  if (c.http_listen != "off" && c.auth_token.empty() && c.auth_tokens_file.empty() &&
      !c.insecure && !IsLoopbackListen(c.http_listen)) {
    return InsecureListenError(c.http_listen, "--http-listen");
  }
  if (c.http_timeout.count() <= 0) {
    return absl::InvalidArgumentError("--http-timeout: must be positive (seconds)");
  }
  if (max_n && *max_n > c.max_batch) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-n: ", *max_n, " is above --max-batch ", c.max_batch,
                     " (a request's choices decode in one step)"));
  }
  c.max_n = max_n.value_or(std::min(c.max_n, c.max_batch));
  if (c.o1.m && *c.o1.m > c.max_o1_m) {
    return absl::InvalidArgumentError(
        absl::StrCat("--o1-m: ", *c.o1.m, " is above --max-o1-m ", c.max_o1_m));
  }
  if (prefill_chunk && *prefill_chunk > c.step_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("--prefill-chunk: ", *prefill_chunk,
                                                   " is above --step-tokens ", c.step_tokens,
                                                   " (a step takes whole chunks)"));
  }
  c.prefill_chunk = prefill_chunk.value_or(std::min(c.prefill_chunk, c.step_tokens));
  if (c.import_idle_timeout.count() <= 0) {
    return absl::InvalidArgumentError("--import-idle-timeout: must be positive (seconds)");
  }
  if (c.tls_cert.empty() != c.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key: give both or neither");
  }
  if (!c.node_name.empty() && !IsValidNodeName(c.node_name)) {
    return absl::InvalidArgumentError(
        "--node-name: 1 to 64 characters of [A-Za-z0-9._:-] (it travels in response metadata)");
  }
  if (c.model_dir.empty()) c.model_dir = DefaultModelDir();
  return c;
}

namespace {
bool IsNodeNameChar(char ch) {
  return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
         ch == '.' || ch == '_' || ch == ':' || ch == '-';
}
}  // namespace

std::string DefaultNodeName(std::string_view listen) {
  char host[256] = {};
  std::string name = gethostname(host, sizeof(host) - 1) == 0 ? host : "";
  std::erase_if(name, [](char ch) { return !IsNodeNameChar(ch); });
  if (name.empty()) name = "cortiq";
  const size_t colon = listen.rfind(':');
  const std::string_view port = colon == std::string_view::npos ? "" : listen.substr(colon + 1);
  const bool named_port = !port.empty() && port != "0" &&
                          std::all_of(port.begin(), port.end(), [](char ch) {
                            return ch >= '0' && ch <= '9';
                          }) && !listen.starts_with("unix:");
  std::string suffix;
  if (named_port) {
    suffix = absl::StrCat(":", util::Sv(port));
  } else {
    std::random_device rd;
    suffix = absl::StrFormat("-%06x", rd() & 0xFFFFFF);
  }
  name = name.substr(0, 64 - suffix.size());
  return name + suffix;
}

bool IsValidNodeName(std::string_view name) {
  return !name.empty() && name.size() <= 64 && std::all_of(name.begin(), name.end(), IsNodeNameChar);
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
