// Metrics: the server's Prometheus metrics (prometheus-cpp), served on their
// own port at /metrics by a MetricsServer. docs/METRICS.md lists every series.
//
// Two kinds of series:
//   * State read AT SCRAPE TIME from the session store, the engine and the
//     model (memory by kind, sessions, budget and utilisation, releases,
//     engine gauges, QSA backend bytes): a custom prometheus::Collectable
//     builds them in Collect(), so a scrape never sees a stale value and the
//     hot path never touches them.
//   * Events counted on the hot path (requests by RPC and code, HTTP
//     requests by route and status, tokens, the per-request latency and
//     token histograms and finish reasons by front end, the queue wait by
//     front end and priority, the engine's step rows by kind, refused
//     exports, migrations): every family and every labelled child is built once in
//     Create() into fixed arrays; the hot path only calls Increment() /
//     Observe() on a child it already holds — it never creates a child,
//     allocates, or takes a lock of ours (prometheus-cpp's Histogram::Observe
//     holds its own mutex for a few instructions). Labels are low-cardinality
//     only: never a session id, never a path or a string a client sent.
//
// Ownership and threads: Metrics does not own its sources. The store, engine
// and model must outlive every scrape: destroy the MetricsServer (which
// stops the HTTP threads) before them. Every public method is thread-safe.
//
// Example:
//   CORTIQ_ASSIGN_OR_RETURN(auto metrics, server::Metrics::Create(
//       {.store = &store, .model = model.get(), .version = "0.1.0", .model_name = "qwen3-0.6b"}));
//   session::Engine engine(*model, tokenizer, {.observer = metrics.get()});
//   metrics->AttachEngine(&engine);
//   CORTIQ_ASSIGN_OR_RETURN(auto http, server::MetricsServer::Start("127.0.0.1:9464", *metrics));
//   ...
//   metrics->CountRequest("Generate", grpc::StatusCode::OK);
//   http.reset();                     // before the engine, store, model go
//   metrics->AttachEngine(nullptr);
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/kv/wire_refusal.h"
#include "core/model/transformer.h"
#include "core/session/engine.h"
#include "core/session/session_persister.h"
#include "core/session/session_store.h"
#include "core/util/task_runner.h"

namespace prometheus {
class Collectable;
class Counter;
class Exposer;
class Histogram;
class Registry;
}  // namespace prometheus

namespace cortiq::server {

inline constexpr char kDefaultMetricsListen[] = "127.0.0.1:9464";

// The RPCs of cortiq.v1.Inference, the label values of rpc="...".
inline constexpr size_t kNumRpcs = 11;
inline constexpr std::array<std::string_view, kNumRpcs> kRpcNames = {
    "Generate", "CreateSession", "GetSession",    "ListSessions",  "ReleaseSession", "Tokenize",
    "GetModelInfo", "ExportSession", "ImportSession", "MigrateSession", "Drain"};

// gRPC status code names indexed by the code's number (grpc::StatusCode and
// absl::StatusCode agree on 0..16): the label values of code="...".
inline constexpr size_t kNumGrpcCodes = 17;
inline constexpr std::array<std::string_view, kNumGrpcCodes> kGrpcCodeNames = {
    "OK",        "CANCELLED",      "UNKNOWN",           "INVALID_ARGUMENT",   "DEADLINE_EXCEEDED",
    "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED",   "OUT_OF_RANGE",   "UNIMPLEMENTED",     "INTERNAL",           "UNAVAILABLE",
    "DATA_LOSS", "UNAUTHENTICATED"};

// Index of `rpc` in kRpcNames; nullopt for an unknown name. O(kNumRpcs), no
// allocation.
std::optional<size_t> RpcIndex(std::string_view rpc);

// Why an export was refused: the wire exporter's typed reason, one enum for
// the kv layer and the metrics (kv::WireRefusal, read from the refused status
// with kv::WireRefusalOf, never from its text).
using ExportRefusal = kv::WireRefusal;
// The label values of reason="..." on cortiq_exports_refused_total
// (docs/METRICS.md); several reasons share one.
inline constexpr size_t kNumExportRefusalLabels = 4;
inline constexpr std::array<std::string_view, kNumExportRefusalLabels> kExportRefusalLabels = {
    "importance", "o1_overlay", "int8_rows", "other"};
// The label of `reason`: "importance"; "o1_overlay" for a sealed O(1) layer
// and for a query trace being collected; "int8_rows"; "other" for dead heads,
// the f16 range and kOther. O(1), no allocation.
std::string_view ExportRefusalName(ExportRefusal reason);

// The HTTP front's routes, the label values of route="..." on the
// cortiq_http_* series: the route PATTERN a handler matched (never the path a
// client sent, so the label stays bounded). Anything else — an unknown path
// answered 404, a method not allowed — is counted as "other".
inline constexpr size_t kNumHttpRoutes = 5;
inline constexpr std::array<std::string_view, kNumHttpRoutes> kHttpRoutes = {
    "/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "other"};
// HTTP statuses counted by their own status="..." label; any other status in
// 100..599 is counted by its class ("1xx" .. "5xx").
inline constexpr size_t kNumHttpStatuses = 16;
inline constexpr std::array<int, kNumHttpStatuses> kHttpStatuses = {
    200, 400, 401, 403, 404, 405, 408, 413, 415, 422, 429, 499, 500, 501, 503, 504};
inline constexpr size_t kNumHttpStatusLabels = kNumHttpStatuses + 5;  // + "1xx" .. "5xx"

// Index of `route` in kHttpRoutes; an unknown route → "other"'s. O(routes),
// no allocation.
size_t HttpRouteIndex(std::string_view route);
// The status label index of `status`: its place in kHttpStatuses, else
// kNumHttpStatuses + its class − 1; nullopt outside 100..599.
std::optional<size_t> HttpStatusIndex(int status);

// How a generation ended, the label values of finished_reason="..." on
// cortiq_requests_finished_total: the engine's finish reasons (length, stop,
// eos, cancelled — a client's cancel, a deadline, a shutdown), and "error" for
// a job that failed (model error, a session that could not be admitted).
inline constexpr size_t kNumFinishLabels = 5;
inline constexpr std::array<std::string_view, kNumFinishLabels> kFinishLabels = {
    "length", "stop", "eos", "cancelled", "error"};
// The label index of a job that ended with `reason` and `status`: cancelled
// whatever the status (a deadline ends a job as cancelled with
// DEADLINE_EXCEEDED); otherwise error when the status is not OK (or no
// reason was given); else the reason's. O(1).
size_t FinishLabelIndex(session::FinishReason reason, const absl::Status& status);

enum class MigrationDirection : uint8_t { kOut = 0, kIn = 1 };  // direction="out|in"
enum class MigrationResult : uint8_t { kOk = 0, kFailed = 1 };  // result="ok|failed"
// What a migration's undo found on its peer (MigrateOut: the import's answer
// did not come back, so the peer was asked to release what it may have
// installed): result="released|absent|failed".
enum class MigrationUndo : uint8_t { kReleased = 0, kAbsent = 1, kFailed = 2 };
inline constexpr size_t kNumMigrationUndoLabels = 3;

// Where the scrape-time series come from. Non-owning; any may be null (its
// series are then not exported).
struct MetricsSources {
  const session::SessionStore* store = nullptr;
  const session::Engine* engine = nullptr;  // or attach later: Metrics::AttachEngine
  const model::Transformer* model = nullptr;
  std::string version;     // cortiq_build_info{version=...}; empty → "unknown"
  std::string model_name;  // cortiq_build_info{model=...}; empty → "unknown"
  // The denominator of cortiq_memory_utilization_ratio when the store has no
  // memory budget (--memory-capacity, default MachineMemoryBytes()); 0 with
  // no budget: the ratio is not exported.
  size_t memory_capacity_bytes = 0;
  // The configured tenants (the token file's names): the tenant="..."
  // labels of the per-tenant session series, besides "" and "~other".
  // Called at scrape time (thread-safe); empty function = none.
  std::function<std::vector<std::string>()> tenants = nullptr;
  // --state-dir's persister (the session files' series), or null.
  const session::SessionPersister* persister = nullptr;
  // The server's read-back workers (cortiq_session_read_backs_in_flight,
  // with a persister only), or null.
  const util::TaskRunner* read_back = nullptr;
};

// The machine's memory: MemTotal of /proc/meminfo, in bytes; nullopt when it
// cannot be read. In a container this is the host's memory, not the
// container's limit (pass --memory-capacity there).
std::optional<size_t> MachineMemoryBytes();

class Metrics : public session::EngineObserver {
 public:
  // Registers every family and child. A prometheus-cpp exception (an invalid
  // name or label: a bug here) becomes INTERNAL naming the metric.
  static absl::StatusOr<std::unique_ptr<Metrics>> Create(const MetricsSources& sources);
  ~Metrics() override;
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // The engine whose gauges the scrape reads. The Engine takes its observer
  // at construction, so a server creates Metrics first, then the Engine, then
  // attaches it; attach nullptr before the engine is destroyed.
  void AttachEngine(const session::Engine* engine);

  // ---- hot path: no allocation, never creates a child ----
  // One finished RPC. Unknown rpc names and codes outside 0..16 are ignored.
  void CountRequest(std::string_view rpc, int grpc_code);
  // Wall time of one finished RPC (cortiq_request_duration_seconds{rpc}).
  void ObserveRequest(std::string_view rpc, double seconds);
  void CountExportRefused(ExportRefusal reason);
  void CountMigration(MigrationDirection direction, MigrationResult result);
  void CountMigrationUndo(MigrationUndo result);
  // One finished HTTP request (the HTTP front, once per request, when its
  // response — a stream: its last chunk — is written): counts it in
  // cortiq_http_requests_total{route,status} and observes `seconds` (arrival
  // to the end of the response) in cortiq_http_request_duration_seconds{route}.
  // `route` is the pattern of kHttpRoutes (unknown → "other"); a status
  // outside 100..599 is ignored.
  void ObserveHttpRequest(std::string_view route, int status, double seconds);

  // ---- session::EngineObserver (engine thread; never blocks) ----
  // One scheduler step: its wall time, its decode batch when it decoded (a
  // prefill-only step has no batch size to record), and its rows by kind
  // (cortiq_engine_step_tokens_total{kind="decode|prefill"}).
  void OnStep(size_t decode_batch, size_t prefill_tokens, double seconds) override;
  // Once per job, at its first prefill chunk: seconds since it was submitted,
  // by front end and the job's own priority (cortiq_queue_wait_seconds).
  void OnQueueWait(session::Frontend frontend, session::Priority priority, double seconds) override;
  // A step's rows of one tenant (cortiq_tenant_step_tokens_total{tenant,
  // kind}, read at scrape under the per-tenant labels). Allocates only on a
  // tenant's first rows.
  void OnTenantStep(std::string_view tenant, size_t decode_rows, size_t prefill_tokens) override;
  void OnFirstToken(session::Frontend frontend, double ttft_seconds) override;
  void OnInterToken(session::Frontend frontend, double seconds) override;
  // The per-request series: tokens (counters and histograms) and the finish
  // reason for every job; queue, prefill (first chunk → first token:
  // ttft − queue) and decode (first token → finish: total − ttft) time for a
  // job that produced a token (one that did not has no first token to split
  // its time at).
  void OnFinish(session::Frontend frontend, session::FinishReason reason,
                const absl::Status& status, const session::GenerationResult& result) override;

  // ---- exposition (MetricsServer registers both) ----
  // The hot-path families.
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }
  // The scrape-time families (reads the sources in Collect()).
  std::shared_ptr<prometheus::Collectable> live_state() const;

 private:
  class LiveState;
  Metrics() = default;
  absl::Status Register(const MetricsSources& sources);

  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<LiveState> live_state_;

  // Children, built once by Register(); owned by registry_'s families.
  std::array<std::array<prometheus::Counter*, kNumGrpcCodes>, kNumRpcs> requests_{};
  std::array<prometheus::Histogram*, kNumRpcs> request_seconds_{};
  std::array<prometheus::Counter*, kNumExportRefusalLabels> exports_refused_{};  // [label]
  std::array<std::array<prometheus::Counter*, 2>, 2> migrations_{};  // [direction][result]
  std::array<prometheus::Counter*, kNumMigrationUndoLabels> migration_undos_{};  // [result]
  std::array<std::array<prometheus::Counter*, kNumHttpStatusLabels>, kNumHttpRoutes>
      http_requests_{};                                                // [route][status label]
  std::array<prometheus::Histogram*, kNumHttpRoutes> http_seconds_{};  // [route]
  prometheus::Counter* prompt_tokens_ = nullptr;
  prometheus::Counter* generated_tokens_ = nullptr;
  // [frontend]: indexed by session::Frontend.
  using PerFrontend = std::array<prometheus::Histogram*, session::kNumFrontends>;
  PerFrontend ttft_seconds_{};
  PerFrontend inter_token_seconds_{};
  PerFrontend queue_seconds_{};
  PerFrontend prefill_seconds_{};
  PerFrontend decode_seconds_{};
  PerFrontend request_prompt_tokens_{};
  PerFrontend request_generation_tokens_{};
  std::array<std::array<prometheus::Counter*, kNumFinishLabels>, session::kNumFrontends>
      finished_{};  // [frontend][finish label]
  // [frontend][priority]: indexed by session::Frontend, session::Priority.
  std::array<std::array<prometheus::Histogram*, session::kNumPriorities>, session::kNumFrontends>
      queue_wait_seconds_{};
  prometheus::Histogram* step_seconds_ = nullptr;
  prometheus::Histogram* step_batch_size_ = nullptr;
  prometheus::Counter* step_decode_tokens_ = nullptr;   // kind="decode"
  prometheus::Counter* step_prefill_tokens_ = nullptr;  // kind="prefill"
};

// The HTTP endpoint: a prometheus::Exposer (civetweb, 2 threads) serving
// Metrics' registry and live state at /metrics. Stops on destruction.
class MetricsServer {
 public:
  // Listens on `listen` ("HOST:PORT"; port 0 = any free port, see port()).
  // UNAVAILABLE naming the address when it cannot bind (port in use, bad
  // host); INVALID_ARGUMENT for an empty address. `metrics` must outlive the
  // server's scrapes (the server holds weak references and skips an expired
  // one).
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& listen,
                                                              Metrics& metrics);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // The bound port (the real one when started on port 0).
  int port() const { return port_; }

 private:
  MetricsServer(std::unique_ptr<prometheus::Exposer> exposer, int port);
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
};

}  // namespace cortiq::server
