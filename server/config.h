// cortiq-server's configuration: flags, their defaults, and parsing.
//
// The flags are one table of typed bindings parsed by the shared parser
// (core/util/flags.h): `--name value` or `--name=value`, no positional
// arguments. Parsing is strict: an unknown flag, a missing value, a malformed
// number or one outside its range (--max-sessions, --max-tokens, --max-batch,
// --step-tokens, --prefill-chunk, --aging-steps and --queue-capacity are
// >= 1) is an InvalidArgument error
// naming the flag; nothing is guessed. Sizes accept K/M/G/T suffixes (powers
// of 1024); durations are seconds (fractions allowed; a positive one is at
// least 1 ms).
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/kv/o1_config.h"

namespace cortiq::server {

struct ServerConfig {
  std::string model_dir;                          // empty: the embedded default model
  std::string listen = "127.0.0.1:50051";         // gRPC; port 0 = any free port
  std::string metrics_listen = "127.0.0.1:9464";  // "" or "off" disables /metrics
  size_t threads = 0;                             // math threads; 0 = every core
  std::string activations = "bf16";               // bf16 weights: bf16 | f32 activations
  std::string weights = "checkpoint";              // checkpoint | int8 (quantized at load)
  size_t max_sessions = 256;
  size_t memory_budget_bytes = 0;  // 0 = unlimited
  // The denominator of cortiq_memory_utilization_ratio when there is no
  // budget; 0 = the machine's MemTotal (server::MachineMemoryBytes).
  size_t memory_capacity_bytes = 0;
  // --page-pool: resident pages of freed session buffers (128 KiB and up)
  // kept for the next ones (util::PagePool), so that admitting a call
  // reuses them instead of faulting fresh pages in on the engine's thread;
  // handed back after kPagePoolIdle without use. 0 = off.
  size_t page_pool_bytes = size_t{256} << 20;
  std::chrono::milliseconds session_ttl{600'000};
  std::string state_dir;              // --state-dir ("" = off)
  std::string persist_sync = "turn";  // --persist-sync turn|interval|none
  std::chrono::milliseconds persist_interval{1000};
  std::chrono::milliseconds session_max_age{0};  // --session-max-age (0 = never)
  std::string kv_dtype = "f32";               // default for new sessions: f32 | int8
  std::string attention = "exact";            // default mode: exact | o1 | qsa | window
  kv::O1Overrides o1;                         // --o1-layers/-m/-window/-sink/-rect
  std::optional<std::string> qsa_layers;      // --qsa-layers (default "all")
  std::optional<size_t> qsa_ratio;            // --qsa-ratio (default 64)
  std::optional<size_t> qsa_budget;           // --qsa-budget (default 16)
  std::optional<std::string> window_layers;   // --window-layers (default "all")
  std::optional<size_t> window_sink;          // --window-sink (default 4)
  std::optional<size_t> window_size;          // --window-size (default 128)
  size_t max_tokens_limit = 4096;             // GenerateRequest.max_tokens bound
  // GenerateRequest.n bound (--max-n): a request's choices share one decode
  // step, so at most max_batch; the default 8 is lowered to a smaller
  // --max-batch, an explicit larger --max-n is a usage error.
  size_t max_n = 8;
  size_t max_context = 0;                     // 0 = the model's max_position_embeddings
  size_t max_prompt_bytes = 1 << 20;          // prompt text / tokens bound (INVALID_ARGUMENT)
  size_t max_message_bytes = 8 << 20;         // gRPC receive limit (RESOURCE_EXHAUSTED)
  size_t max_import_bytes = size_t{8} << 30;  // ImportSession stream bound (RESOURCE_EXHAUSTED)
  size_t max_concurrent_imports = 4;          // ImportSession streams at once (RESOURCE_EXHAUSTED)
  size_t max_concurrent_exports = 4;  // ExportSession snapshots at once (RESOURCE_EXHAUSTED)
  size_t max_o1_m = 256;              // session_config.o1.m a session may have (INVALID_ARGUMENT)
  std::chrono::milliseconds import_idle_timeout{30'000};  // a quiet import ends (DEADLINE_EXCEEDED)
  size_t max_batch = 32;
  // The scheduler (session::EngineOptions): rows one engine step may hold,
  // decode rows plus prefill chunk rows (--step-tokens, >= 1) ...
  size_t step_tokens = 128;
  // ... the chunk a prompt is cut into (--prefill-chunk, 1 .. step_tokens;
  // the default 64 is lowered to a smaller --step-tokens, an explicit larger
  // one is a usage error) ...
  size_t prefill_chunk = 64;
  // ... the steps a waiting request waits per priority level it rises
  // (--aging-steps, >= 1) ...
  size_t aging_steps = 64;
  // ... and each tenant's share of the steps (--tenant-weights NAME=W,...:
  // tenant names as session::IsTenantName, non-empty, each once; weights in
  // (0, kMaxTenantWeight]). A tenant not listed weighs 1.
  std::vector<std::pair<std::string, double>> tenant_weights;
  size_t queue_capacity = 64;
  std::chrono::milliseconds grace{10'000};  // shutdown: streams get this long to finish
  // How long a Generate waits for a session whose previous call is ending
  // (cancelled, lease on its way back) before ABORTED; capped by its deadline.
  std::chrono::milliseconds lease_wait{1'000};
  std::vector<std::string> peers;           // --peers H:P,H:P or CORTIQ_PEERS: drain targets
  std::string peer_dns;                     // --peer-dns NAME:PORT (every A record is a peer)
  // --migrate-allow H:P,H:P: addresses besides the peers that MigrateSession
  // may move a session to (exact HOST:PORT match; server/peer_dialer.h).
  std::vector<std::string> migrate_allow;
  std::string peer_ca;                      // --peer-ca FILE: dial peers over TLS (PEM roots)
  std::string peer_token;                   // --peer-token (default: the auth token)
  // Peer calls (migrations, drain): connect + GetModelInfo get the connect
  // timeout; an ImportSession stream of B bytes gets connect timeout +
  // B / min throughput + kPeerDeadlineFloor (server/migration.h).
  std::chrono::milliseconds peer_connect_timeout{5'000};
  size_t peer_min_throughput = 20 << 20;            // bytes per second, >= 1
  size_t drain_parallelism = 4;                     // migrations a drain runs at once
  std::chrono::milliseconds drain_timeout{60'000};  // after --grace; then the rest are cancelled
  std::string auth_token;                   // --auth-token, --auth-token-file or CORTIQ_AUTH_TOKEN
  std::string auth_tokens_file;             // --auth-tokens FILE: named tokens with roles (auth.h)
  bool insecure = false;                    // --insecure: a non-loopback --listen without a token
  std::string tls_cert, tls_key;            // PEM files; both or neither (gRPC and HTTP)
  // The OpenAI-compatible HTTP front (server/http/): HOST:PORT, port 0 = any
  // free port, "off" = none. Off here so that a server embedded in a test or
  // a tool opens no port it did not ask for; ParseServerFlags (cortiq-server)
  // defaults it to 127.0.0.1:8080.
  std::string http_listen = "off";
  size_t http_threads = 16;                     // HTTP worker threads (connections served at once)
  std::chrono::milliseconds http_timeout{600'000};  // an HTTP generation's deadline
  bool session_from_user = false;  // the `user` field names a conversation (as x-cortiq-session)
  std::string chat_template;       // --chat-template FILE: overrides the model's
  std::string log_level = "info";           // trace | debug | info | warn | error | off
  std::string log_format = "text";          // text | json (one object per line)
  // This node's name in the cluster (x-cortiq-node, SessionInfo.node,
  // ModelInfo.node); "" = DefaultNodeName(listen).
  std::string node_name;
  // How long a node remembers where it moved a session (migration, drain),
  // to forward calls that still name it here.
  std::chrono::milliseconds forward_ttl{600'000};
  // The HOST:PORT this node's peers reach it at (the pod IP in Kubernetes):
  // left out of the peers (--peer-dns resolves to every pod, this one too).
  std::string advertise;
};

// The largest --tenant-weights weight: shares stay ratios of modest numbers
// (the engine divides served rows by them).
inline constexpr double kMaxTenantWeight = 1e6;

// A node name: 1..64 bytes of [A-Za-z0-9._:-].
bool IsValidNodeName(std::string_view name);
// The name of a node given no --node-name: <hostname>:<port> when `listen`
// names its port, else <hostname>-<6 random hex digits> (port 0: the port is
// not known before the server runs, and the name must be fixed before it
// answers a call). Cut to fit IsValidNodeName.
std::string DefaultNodeName(std::string_view listen);

// Parses argv[1..]; env CORTIQ_AUTH_TOKEN, CORTIQ_PEERS and CORTIQ_MODEL fill
// the token, the peers and the model when the flags do not. The token file
// (--auth-tokens) is read by the Server (server/auth.h). A --listen that
// is not loopback (IsLoopbackListen) with no auth token and no token file is refused
// (InvalidArgument saying how to add one) unless --insecure. Sets *help (and
// checks nothing else) when --help or -h was given: the caller prints
// ServerUsage() and exits 0; on an error it exits util::kExitUsage.
// --tenant-weights NAME=W[,NAME=W...]: each name a tenant name
// (session::IsTenantName), not empty, given once; each weight finite, in
// (0, 1e6]. Errors name `flag` and the item.
absl::StatusOr<std::vector<std::pair<std::string, double>>> ParseTenantWeights(
    std::string_view flag, std::string_view value);

absl::StatusOr<ServerConfig> ParseServerFlags(const std::vector<std::string>& args, bool* help);

// True when `listen` (HOST:PORT, [V6]:PORT or unix:PATH) can only be reached
// from this machine: a unix socket, localhost, 127.0.0.0/8 or ::1. Any other
// host (0.0.0.0, [::], another address, a hostname) is not loopback; names
// other than localhost are not resolved.
bool IsLoopbackListen(std::string_view listen);

// The whole of a file a flag names (--tls-cert, --peer-ca, ...), as bytes;
// InvalidArgument "<flag>: cannot read '<path>'" when it cannot be read.
absl::StatusOr<std::string> ReadFlagFile(const std::string& path, std::string_view flag);

// The flag reference printed by --help.
std::string ServerUsage();

// The embedded default model's directory: $CORTIQ_MODEL, else the first of
// the build tree's models/<name>, <exe>/../share/cortiq/model that exists.
std::string DefaultModelDir();

}  // namespace cortiq::server
