#include "server/metrics.h"

#include <algorithm>
#include <array>
#include <exception>
#include <fstream>
#include <map>
#include <mutex>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/util/page_pool.h"
#include "prometheus/client_metric.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"
#include "spdlog/spdlog.h"

namespace cortiq::server {
namespace {

// Bucket upper bounds. CPU inference of small models: a decode step of a
// batch takes ~1 ms to a few hundred ms, a first token waits behind the
// prompt's prefill (tens of ms to tens of s), a streamed Generate lasts up to
// minutes while unary RPCs take well under a millisecond.
const std::vector<double>& TtftBuckets() {
  static const std::vector<double> b = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                        1,     2.5,  5,     10,   20,  30,   60};
  return b;
}
const std::vector<double>& InterTokenBuckets() {
  static const std::vector<double> b = {0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05,
                                        0.075, 0.1,    0.15,  0.25, 0.5,  1,     2.5};
  return b;
}
const std::vector<double>& RequestBuckets() {
  static const std::vector<double> b = {0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                        1,      2.5,   5,     10,   30,    60,   120, 300};
  return b;
}
// Decode time (first token → finish) lasts as long as the whole stream.
const std::vector<double>& DecodeBuckets() {
  static const std::vector<double> b = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,   2.5,
                                        5,    10,    20,   30,  60,   120, 300, 600};
  return b;
}
// Tokens per request (prompt, generated): 1-2-5 steps up to 100k.
const std::vector<double>& TokenBuckets() {
  static const std::vector<double> b = {1,    2,    5,    10,    20,    50,    100,   200,  500,
                                        1000, 2000, 5000, 10000, 20000, 50000, 100000};
  return b;
}
const std::vector<double>& StepBuckets() {
  static const std::vector<double> b = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                        0.05,   0.1,   0.25,   0.5,   1,    2.5};
  return b;
}
const std::vector<double>& BatchBuckets() {
  static const std::vector<double> b = {1, 2, 4, 8, 16, 32, 64, 128};
  return b;
}

std::string OrUnknown(const std::string& s) { return s.empty() ? std::string("unknown") : s; }

// ---- scrape-time families ----

prometheus::MetricFamily NewFamily(const char* name, const char* help,
                                   prometheus::MetricType type) {
  prometheus::MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  return f;
}

void AddSample(prometheus::MetricFamily& f, double value,
               std::vector<prometheus::ClientMetric::Label> labels = {}) {
  prometheus::ClientMetric m;
  m.label = std::move(labels);
  if (f.type == prometheus::MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  f.metric.push_back(std::move(m));
}

prometheus::MetricFamily GaugeFamily(const char* name, const char* help, double value) {
  prometheus::MetricFamily f = NewFamily(name, help, prometheus::MetricType::Gauge);
  AddSample(f, value);
  return f;
}

prometheus::MetricFamily CounterFamily(const char* name, const char* help, double value) {
  prometheus::MetricFamily f = NewFamily(name, help, prometheus::MetricType::Counter);
  AddSample(f, value);
  return f;
}

}  // namespace

std::optional<size_t> RpcIndex(std::string_view rpc) {
  for (size_t i = 0; i < kNumRpcs; ++i) {
    if (kRpcNames[i] == rpc) return i;
  }
  return std::nullopt;
}

size_t HttpRouteIndex(std::string_view route) {
  for (size_t i = 0; i + 1 < kNumHttpRoutes; ++i) {
    if (kHttpRoutes[i] == route) return i;
  }
  return kNumHttpRoutes - 1;  // "other"
}

std::optional<size_t> HttpStatusIndex(int status) {
  if (status < 100 || status > 599) return std::nullopt;
  for (size_t i = 0; i < kNumHttpStatuses; ++i) {
    if (kHttpStatuses[i] == status) return i;
  }
  return kNumHttpStatuses + static_cast<size_t>(status / 100 - 1);
}

namespace {

// The status="..." value of label index `i` (HttpStatusIndex's inverse).
std::string HttpStatusLabel(size_t i) {
  if (i < kNumHttpStatuses) return std::to_string(kHttpStatuses[i]);
  return absl::StrCat(i - kNumHttpStatuses + 1, "xx");
}

// reason → its index in kExportRefusalLabels.
size_t ExportRefusalLabel(ExportRefusal reason) {
  switch (reason) {
    case ExportRefusal::kImportance:
      return 0;
    case ExportRefusal::kO1Overlay:
    case ExportRefusal::kO1Collecting:
      return 1;
    case ExportRefusal::kInt8Rows:
      return 2;
    case ExportRefusal::kDeadHeads:
    case ExportRefusal::kF16Range:
    case ExportRefusal::kWireVersion:
    case ExportRefusal::kOther:
      return 3;
  }
  return 3;
}

}  // namespace

size_t FinishLabelIndex(session::FinishReason reason, const absl::Status& status) {
  using session::FinishReason;
  constexpr size_t kError = kNumFinishLabels - 1;
  if (reason == FinishReason::kCancelled) return 3;
  if (!status.ok()) return kError;
  switch (reason) {
    case FinishReason::kLength: return 0;
    case FinishReason::kStop: return 1;
    case FinishReason::kEos: return 2;
    case FinishReason::kCancelled: return 3;
    case FinishReason::kNone: return kError;
  }
  return kError;
}

std::optional<size_t> MachineMemoryBytes() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  size_t value = 0;
  while (in >> key >> value) {
    std::getline(in, unit);  // " kB" (the kernel's unit is always kibibytes)
    if (key == "MemTotal:") return value * 1024;
  }
  return std::nullopt;
}

std::string_view ExportRefusalName(ExportRefusal reason) {
  return kExportRefusalLabels[ExportRefusalLabel(reason)];
}

// The series read from the sources at scrape time (called on the Exposer's
// HTTP threads; every source accessor it uses is thread-safe).
class Metrics::LiveState : public prometheus::Collectable {
 public:
  explicit LiveState(const MetricsSources& s)
      : store_(s.store),
        model_(s.model),
        memory_capacity_(s.memory_capacity_bytes),
        tenants_(s.tenants),
        persister_(s.persister),
        read_back_(s.read_back),
        engine_(s.engine) {}

  void AttachEngine(const session::Engine* engine) {
    engine_.store(engine, std::memory_order_release);
  }

  // A step's rows of one tenant (the engine thread). A tenant's entry is
  // made on its first rows (the only allocation); past kMaxTenantRowEntries
  // names, rows count under "~other".
  void AddTenantRows(std::string_view tenant, size_t decode, size_t prefill) {
    std::lock_guard lock(tenant_rows_mu_);
    auto it = std::find_if(tenant_rows_.begin(), tenant_rows_.end(),
                           [&](const TenantRows& t) { return t.tenant == tenant; });
    if (it == tenant_rows_.end()) {
      const std::string_view name =
          tenant_rows_.size() < kMaxTenantRowEntries ? tenant : kOtherTenant;
      it = std::find_if(tenant_rows_.begin(), tenant_rows_.end(),
                        [&](const TenantRows& t) { return t.tenant == name; });
      if (it == tenant_rows_.end()) {
        tenant_rows_.push_back({std::string(name), 0, 0});
        it = tenant_rows_.end() - 1;
      }
    }
    it->decode += decode;
    it->prefill += prefill;
  }

  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> out;
    if (store_ != nullptr) CollectStore(out);
    if (persister_ != nullptr) {
      CollectPersister(*persister_, out);
      if (store_ != nullptr) {
        out.push_back(GaugeFamily(
            "cortiq_sessions_in_doubt",
            "Sessions restored in doubt: their move to a peer was cut by a crash of this node; "
            "calls naming them get UNAVAILABLE until the peers say whether one holds them.",
            static_cast<double>(store_->InDoubt().size())));
      }
      if (read_back_ != nullptr) {
        out.push_back(GaugeFamily(
            "cortiq_session_read_backs_in_flight",
            "Generate and ExportSession calls on spilled sessions that wait for or run their "
            "read-back on the read-back workers (two at a time; beyond 256 waiting, calls get "
            "RESOURCE_EXHAUSTED).",
            static_cast<double>(read_back_->in_flight())));
      }
    }
    if (const session::Engine* e = engine_.load(std::memory_order_acquire)) CollectEngine(*e, out);
    if (model_ != nullptr) {
      out.push_back(GaugeFamily("cortiq_qsa_backend_live_bytes",
                                "Bytes the QSA backend holds now (indexer weights, session states, "
                                "scratches).",
                                static_cast<double>(model_->QsaBackendStats().live_bytes)));
      prometheus::MetricFamily weights = NewFamily(
          "cortiq_model_weight_bytes",
          "Bytes of the model's weight matrices (projections, lm_head, embedding) by resident "
          "copy: checkpoint (read in place from the memory-mapped file; pages of matrices "
          "replaced by a copy are handed back), int8 (the Q8_0 copy quantized at load, "
          "--weights int8), amx_tiles (the AMX tile-order copy). 0 for a copy not in use.",
          prometheus::MetricType::Gauge);
      AddSample(weights, static_cast<double>(model_->CheckpointWeightBytesInUse()),
                {{"copy", "checkpoint"}});
      AddSample(weights, static_cast<double>(model_->Int8CopyBytes()), {{"copy", "int8"}});
      AddSample(weights, static_cast<double>(model_->AmxTileBytes()), {{"copy", "amx_tiles"}});
      out.push_back(std::move(weights));
    }
    return out;
  }

 private:
  void CollectStore(std::vector<prometheus::MetricFamily>& out) const {
    using session::MemoryKind;
    const session::MemoryByKind mem = store_->MemoryByKindTotal();
    prometheus::MetricFamily by_kind = NewFamily(
        "cortiq_session_memory_bytes",
        "Bytes of session state by kind, summed over live sessions (exact, read at scrape).",
        prometheus::MetricType::Gauge);
    for (size_t k = 0; k < session::kNumMemoryKinds; ++k) {
      const auto kind = static_cast<MemoryKind>(k);
      AddSample(by_kind, static_cast<double>(mem[kind]),
                {{"kind", std::string(session::MemoryKindName(kind))}});
    }
    out.push_back(std::move(by_kind));
    out.push_back(GaugeFamily("cortiq_session_memory_total_bytes",
                              "Bytes of session state of every kind (the sum of "
                              "cortiq_session_memory_bytes).",
                              static_cast<double>(mem.total())));
    out.push_back(GaugeFamily("cortiq_sessions_active", "Live sessions on this node.",
                              static_cast<double>(store_->num_sessions())));
    out.push_back(GaugeFamily("cortiq_sessions_busy", "Sessions leased by a running call.",
                              static_cast<double>(store_->num_leased())));
    out.push_back(GaugeFamily("cortiq_sessions_spilled",
                              "Sessions whose state is on disk only (--state-dir: spilled by the "
                              "idle TTL or the memory budget); counted in cortiq_sessions_active.",
                              static_cast<double>(store_->num_spilled())));
    out.push_back(CounterFamily("cortiq_session_spills_total",
                                "Sessions spilled to disk (RAM freed, file kept).",
                                static_cast<double>(store_->spills())));
    out.push_back(CounterFamily("cortiq_session_unspills_total",
                                "Spilled sessions read back from disk by a call that named them.",
                                static_cast<double>(store_->unspills())));
    out.push_back(GaugeFamily("cortiq_sessions_max", "Session cap of this node.",
                              static_cast<double>(store_->options().max_sessions)));
    out.push_back(GaugeFamily("cortiq_memory_budget_bytes",
                              "Memory budget for session state (0 = unlimited).",
                              static_cast<double>(store_->options().memory_budget_bytes)));
    out.push_back(GaugeFamily("cortiq_memory_committed_bytes",
                              "Bytes admission counts as committed: per session the larger of its "
                              "current bytes and its running call's reservation, plus the bytes "
                              "imports in flight hold.",
                              static_cast<double>(store_->committed_bytes())));
    const util::PagePool& pool = util::PagePool::Global();
    out.push_back(GaugeFamily(
        "cortiq_page_pool_bytes",
        "Resident pages of released session buffers kept for new ones (--page-pool; handed back "
        "after 30 s without use); in no session's bytes.",
        static_cast<double>(pool.held_bytes())));
    out.push_back(CounterFamily("cortiq_page_pool_reused_bytes_total",
                                "Bytes of buffers (128 KiB and up) served from the page pool's "
                                "kept pages (no page faults).",
                                static_cast<double>(pool.reused_bytes())));
    out.push_back(CounterFamily("cortiq_page_pool_mapped_bytes_total",
                                "Bytes of buffers (128 KiB and up) mapped and faulted in fresh.",
                                static_cast<double>(pool.mapped_bytes())));
    out.push_back(GaugeFamily("cortiq_import_bytes_in_flight",
                              "Bytes ImportSession streams not yet installed hold (counted against "
                              "the memory budget); 0 when no import runs.",
                              static_cast<double>(store_->import_bytes())));
    out.push_back(GaugeFamily("cortiq_export_bytes_in_flight",
                              "Bytes ExportSession snapshots not yet sent hold (counted against "
                              "the memory budget); 0 when no export runs.",
                              static_cast<double>(store_->export_bytes())));
    // The autoscaler's "how full": committed over the budget admission
    // enforces, or — with no budget, admission refusing nothing — over the
    // memory the node has (--memory-capacity).
    const size_t budget = store_->options().memory_budget_bytes;
    const size_t denominator = budget > 0 ? budget : memory_capacity_;
    if (denominator > 0) {
      out.push_back(GaugeFamily(
          "cortiq_memory_utilization_ratio",
          "cortiq_memory_committed_bytes over the memory budget, or with no budget over "
          "--memory-capacity (default the machine's MemTotal); 1 = full.",
          static_cast<double>(store_->committed_bytes()) / static_cast<double>(denominator)));
    }
    const auto releases = store_->releases();
    prometheus::MetricFamily rel =
        NewFamily("cortiq_session_releases_total", "Sessions released, by reason.",
                  prometheus::MetricType::Counter);
    for (size_t r = 0; r < session::kNumReleaseReasons; ++r) {
      const auto reason = static_cast<session::ReleaseReason>(r);
      AddSample(rel, static_cast<double>(releases[r]),
                {{"reason", std::string(session::ReleaseReasonName(reason))}});
    }
    out.push_back(std::move(rel));
    CollectTenants(out);
  }

  // Sessions and bytes by tenant. The labels are bounded by configuration,
  // never by what a client sends: every tenant of the token file (a series
  // even at 0, so a release shows as 0 rather than a vanished series), ""
  // (a node without tokens), and "~other" (not a valid tenant name) for
  // sessions of a tenant not in the file — imported from a node with other
  // tokens, made on behalf of a caller a peer vouched for, or of a tenant
  // removed by a reload. The bytes sum exactly to
  // cortiq_session_memory_total_bytes (one locked pass of the store).
  void CollectTenants(std::vector<prometheus::MetricFamily>& out) const {
    constexpr std::string_view kOther = kOtherTenant;
    std::map<std::string, session::TenantUsage> by_label;
    by_label[""];
    if (tenants_) {
      for (std::string& t : tenants_()) by_label[std::move(t)];
    }
    // The engine's rows by tenant, under the same labels (a counter: a
    // tenant's series starts at 0 and only grows while it is configured).
    std::map<std::string, std::array<uint64_t, 2>> rows;
    for (const auto& [label, unused] : by_label) rows[label];
    {
      std::lock_guard lock(tenant_rows_mu_);
      for (const TenantRows& t : tenant_rows_) {
        auto it = rows.find(t.tenant);
        auto& r = it != rows.end() ? it->second : rows[std::string(kOther)];
        r[0] += t.decode;
        r[1] += t.prefill;
      }
    }
    prometheus::MetricFamily served = NewFamily(
        "cortiq_tenant_step_tokens_total",
        "Rows the engine's steps served each tenant: decode rows and prompt tokens absorbed "
        "(the fair-share scheduler's service; docs/METRICS.md).",
        prometheus::MetricType::Counter);
    for (const auto& [tenant, r] : rows) {
      AddSample(served, static_cast<double>(r[0]), {{"tenant", tenant}, {"kind", "decode"}});
      AddSample(served, static_cast<double>(r[1]), {{"tenant", tenant}, {"kind", "prefill"}});
    }
    out.push_back(std::move(served));
    session::TenantUsage other;
    for (const auto& [tenant, usage] : store_->UsageByTenant()) {
      auto it = by_label.find(tenant);
      session::TenantUsage& u = it != by_label.end() ? it->second : other;
      u.sessions += usage.sessions;
      u.memory_bytes += usage.memory_bytes;
    }
    if (other.sessions > 0) by_label[std::string(kOther)] = other;
    prometheus::MetricFamily sessions = NewFamily(
        "cortiq_tenant_sessions", "Live sessions on this node by tenant (docs/METRICS.md).",
        prometheus::MetricType::Gauge);
    prometheus::MetricFamily bytes =
        NewFamily("cortiq_tenant_session_memory_bytes",
                  "Bytes of session state by tenant, every kind (exact; sums to "
                  "cortiq_session_memory_total_bytes).",
                  prometheus::MetricType::Gauge);
    for (const auto& [tenant, u] : by_label) {
      AddSample(sessions, static_cast<double>(u.sessions), {{"tenant", tenant}});
      AddSample(bytes, static_cast<double>(u.memory_bytes), {{"tenant", tenant}});
    }
    out.push_back(std::move(sessions));
    out.push_back(std::move(bytes));
  }

  // --state-dir: the session files and their writes.
  static void CollectPersister(const session::SessionPersister& p,
                               std::vector<prometheus::MetricFamily>& out) {
    const session::SessionPersister::Stats s = p.stats();
    const session::SessionPersister::RestoreReport r = p.last_restore();
    out.push_back(GaugeFamily("cortiq_session_disk_bytes",
                              "Bytes of the session files in --state-dir (exact: the sum of their "
                              "sizes as written).",
                              static_cast<double>(s.disk_bytes)));
    out.push_back(GaugeFamily("cortiq_session_files", "Session files in --state-dir.",
                              static_cast<double>(s.files)));
    out.push_back(GaugeFamily("cortiq_persist_buffer_bytes",
                              "Bytes of session records held in RAM for --state-dir: queued for "
                              "the writer thread, being written, and spent buffers kept for "
                              "reuse (their capacity).",
                              static_cast<double>(s.buffer_bytes)));
    out.push_back(CounterFamily("cortiq_persist_records_total",
                                "Session records written (turn appends and whole files).",
                                static_cast<double>(s.records)));
    out.push_back(CounterFamily("cortiq_persist_rewrites_total",
                                "Session files written whole (new sessions, compactions, after a "
                                "failed write).",
                                static_cast<double>(s.rewrites)));
    out.push_back(CounterFamily("cortiq_persist_bytes_total", "Bytes written to session files.",
                                static_cast<double>(s.bytes)));
    out.push_back(CounterFamily("cortiq_persist_write_seconds_total",
                                "Seconds the persister spent writing and syncing session files.",
                                s.write_seconds));
    out.push_back(CounterFamily("cortiq_persist_failures_total",
                                "Session file writes that failed (disk full, I/O error): the call "
                                "succeeded, its durability was lost until the next write.",
                                static_cast<double>(s.failures)));
    out.push_back(CounterFamily("cortiq_persist_skipped_total",
                                "Calls whose state no record could describe (an O(1) trace cut "
                                "inside its prompt, a failed step): the file keeps the previous "
                                "turn until the next record or the idle TTL writes it.",
                                static_cast<double>(s.unpersisted)));
    out.push_back(GaugeFamily("cortiq_restore_sessions",
                              "Sessions the last start restored from --state-dir.",
                              static_cast<double>(r.restored)));
    out.push_back(GaugeFamily("cortiq_restore_quarantined_files",
                              "Session files the last start moved to quarantine/ (corrupt, "
                              "another model's).",
                              static_cast<double>(r.quarantined)));
    out.push_back(GaugeFamily("cortiq_restore_bytes", "Bytes the last start's restore read.",
                              static_cast<double>(r.bytes)));
    out.push_back(GaugeFamily("cortiq_restore_seconds", "Seconds the last start's restore took.",
                              r.seconds));
  }

  static void CollectEngine(const session::Engine& e, std::vector<prometheus::MetricFamily>& out) {
    out.push_back(GaugeFamily("cortiq_engine_batch_size",
                              "Decode rows in the engine's last step: the streams it ran.",
                              static_cast<double>(e.last_batch())));
    out.push_back(GaugeFamily("cortiq_engine_step_rows",
                              "Rows of the engine's last step: decode rows plus prefill chunk "
                              "rows.",
                              static_cast<double>(e.last_step_tokens())));
    out.push_back(GaugeFamily("cortiq_engine_step_token_budget",
                              "Rows one engine step may hold (--step-tokens).",
                              static_cast<double>(e.step_tokens())));
    prometheus::MetricFamily waiting =
        NewFamily("cortiq_engine_waiting_jobs",
                  "Jobs submitted and not yet done absorbing their prompt, by their own priority.",
                  prometheus::MetricType::Gauge);
    for (size_t p = 0; p < session::kNumPriorities; ++p) {
      const auto priority = static_cast<session::Priority>(p);
      AddSample(waiting, static_cast<double>(e.waiting_jobs(priority)),
                {{"priority", std::string(session::PriorityName(priority))}});
    }
    out.push_back(std::move(waiting));
    out.push_back(GaugeFamily("cortiq_engine_queue_depth",
                              "Jobs submitted to the engine and not yet admitted.",
                              static_cast<double>(e.queued_jobs())));
    out.push_back(GaugeFamily("cortiq_engine_active_jobs",
                              "Jobs the engine is running (prefill or decode).",
                              static_cast<double>(e.active_jobs())));
    out.push_back(CounterFamily("cortiq_engine_steps_total", "Scheduler steps the engine has run.",
                                static_cast<double>(e.steps())));
  }

  const session::SessionStore* const store_;
  const model::Transformer* const model_;
  const size_t memory_capacity_;
  const std::function<std::vector<std::string>()> tenants_;
  const session::SessionPersister* const persister_;
  const util::TaskRunner* const read_back_;
  std::atomic<const session::Engine*> engine_;
  // Rows the engine served each tenant (AddTenantRows), by the engine's name.
  struct TenantRows {
    std::string tenant;
    uint64_t decode = 0, prefill = 0;
  };
  static constexpr size_t kMaxTenantRowEntries = 1024;
  static constexpr std::string_view kOtherTenant = "~other";
  mutable std::mutex tenant_rows_mu_;
  std::vector<TenantRows> tenant_rows_;
};

namespace {

// A child of `family` for every (row, column): labels {row_label: row(r),
// column_label: column(c)}, each made with `args` (a histogram's buckets).
// `row` and `column` map an index to its label value.
template <typename T, size_t R, size_t C, typename RowName, typename ColumnName, typename... Args>
void AddGrid(prometheus::Family<T>& family, const char* row_label, RowName row,
             const char* column_label, ColumnName column, std::array<std::array<T*, C>, R>& out,
             const Args&... args) {
  for (size_t r = 0; r < R; ++r) {
    for (size_t c = 0; c < C; ++c) {
      out[r][c] = &family.Add(
          {{row_label, std::string(row(r))}, {column_label, std::string(column(c))}}, args...);
    }
  }
}

// One counter family with a child for every (row, column) (AddGrid).
template <size_t R, size_t C, typename RowName, typename ColumnName>
void RegisterCounterGrid(prometheus::Registry& reg, const char* name, const char* help,
                         const char* row_label, RowName row, const char* column_label,
                         ColumnName column,
                         std::array<std::array<prometheus::Counter*, C>, R>& out) {
  AddGrid(prometheus::BuildCounter().Name(name).Help(help).Register(reg), row_label, row,
          column_label, column, out);
}

// One histogram family with a child per label value: {label: value(i)}.
template <size_t N, typename ValueName>
void RegisterHistogramRow(prometheus::Registry& reg, const char* name, const char* help,
                          const char* label, ValueName value, const std::vector<double>& buckets,
                          std::array<prometheus::Histogram*, N>& out) {
  auto& family = prometheus::BuildHistogram().Name(name).Help(help).Register(reg);
  for (size_t i = 0; i < N; ++i) out[i] = &family.Add({{label, std::string(value(i))}}, buckets);
}

std::string_view RpcName(size_t i) { return kRpcNames[i]; }
std::string_view GrpcCodeName(size_t i) { return kGrpcCodeNames[i]; }
std::string_view FrontendLabel(size_t i) {
  return session::FrontendName(static_cast<session::Frontend>(i));
}
std::string_view PriorityLabel(size_t i) {
  return session::PriorityName(static_cast<session::Priority>(i));
}
std::string_view FinishLabel(size_t i) { return kFinishLabels[i]; }
std::string_view HttpRouteName(size_t i) { return kHttpRoutes[i]; }

}  // namespace

Metrics::~Metrics() = default;

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Create(const MetricsSources& sources) {
  std::unique_ptr<Metrics> m(new Metrics());
  absl::Status s = m->Register(sources);
  if (!s.ok()) return s;
  return m;
}

absl::Status Metrics::Register(const MetricsSources& sources) {
  // The family being registered, for the error message.
  const char* current = "";
  try {
    registry_ = std::make_shared<prometheus::Registry>();
    live_state_ = std::make_shared<LiveState>(sources);
    auto& reg = *registry_;

    current = "cortiq_requests_total";
    RegisterCounterGrid(reg, current, "Finished RPCs by method and gRPC status code.", "rpc",
                        RpcName, "code", GrpcCodeName, requests_);
    current = "cortiq_request_duration_seconds";
    RegisterHistogramRow(reg, current,
                         "Wall time of finished RPCs (a streamed Generate: until its last "
                         "message), by method.",
                         "rpc", RpcName, RequestBuckets(), request_seconds_);

    current = "cortiq_prompt_tokens_total";
    prompt_tokens_ = &prometheus::BuildCounter()
                          .Name(current)
                          .Help("Prompt tokens of finished generations.")
                          .Register(reg)
                          .Add({});
    current = "cortiq_generated_tokens_total";
    generated_tokens_ = &prometheus::BuildCounter()
                             .Name(current)
                             .Help("Tokens sampled and streamed by finished generations.")
                             .Register(reg)
                             .Add({});

    // The per-request series, one child per front end.
    auto per_frontend = [&](const char* name, const char* help,
                            const std::vector<double>& buckets, PerFrontend& out) {
      current = name;
      RegisterHistogramRow(reg, name, help, "frontend", FrontendLabel, buckets, out);
    };
    per_frontend("cortiq_time_to_first_token_seconds",
                 "Time from a generation's submission to its first token, by front end.",
                 TtftBuckets(), ttft_seconds_);
    per_frontend("cortiq_inter_token_latency_seconds",
                 "Time between consecutive tokens of one generation, by front end.",
                 InterTokenBuckets(), inter_token_seconds_);
    per_frontend("cortiq_request_queue_time_seconds",
                 "Time from a generation's submission to its first prefill chunk (waiting for "
                 "the engine), by front end; generations that produced a token.",
                 TtftBuckets(), queue_seconds_);
    per_frontend("cortiq_request_prefill_time_seconds",
                 "Time from a generation's first prefill chunk to its first token, by front end.",
                 TtftBuckets(), prefill_seconds_);
    per_frontend("cortiq_request_decode_time_seconds",
                 "Time from a generation's first token to its end, by front end.",
                 DecodeBuckets(), decode_seconds_);
    per_frontend("cortiq_request_prompt_tokens",
                 "Prompt tokens per finished generation, by front end.", TokenBuckets(),
                 request_prompt_tokens_);
    per_frontend("cortiq_request_generation_tokens",
                 "Tokens sampled per finished generation (every choice), by front end.",
                 TokenBuckets(), request_generation_tokens_);

    current = "cortiq_queue_wait_seconds";
    AddGrid(prometheus::BuildHistogram()
                .Name(current)
                .Help("Time from a generation's submission to its first prefill chunk, by front "
                      "end and the request's priority (its own level, not the aged one).")
                .Register(reg),
            "frontend", FrontendLabel, "priority", PriorityLabel, queue_wait_seconds_,
            TtftBuckets());

    current = "cortiq_requests_finished_total";
    RegisterCounterGrid(reg, current, "Finished generations by front end and how they ended.",
                        "frontend", FrontendLabel, "finished_reason", FinishLabel, finished_);
    current = "cortiq_engine_step_seconds";
    step_seconds_ = &prometheus::BuildHistogram()
                         .Name(current)
                         .Help(
                             "Wall time of one engine step (one forward of its decode rows and "
                             "prefill chunks, about --step-tokens rows at most).")
                         .Register(reg)
                         .Add({}, StepBuckets());
    current = "cortiq_engine_step_batch_size";
    step_batch_size_ = &prometheus::BuildHistogram()
                            .Name(current)
                            .Help("Decode rows per engine step that decoded.")
                            .Register(reg)
                            .Add({}, BatchBuckets());
    current = "cortiq_engine_step_tokens_total";
    auto& step_tokens = prometheus::BuildCounter()
                            .Name(current)
                            .Help(
                                "Rows the engine's steps ran, by kind: decode (one per running "
                                "stream per step) and prefill (prompt tokens absorbed).")
                            .Register(reg);
    step_decode_tokens_ = &step_tokens.Add({{"kind", "decode"}});
    step_prefill_tokens_ = &step_tokens.Add({{"kind", "prefill"}});

    current = "cortiq_exports_refused_total";
    auto& refused = prometheus::BuildCounter()
                        .Name(current)
                        .Help(
                            "Session exports refused because the wire format cannot describe "
                            "the state, by reason.")
                        .Register(reg);
    for (size_t i = 0; i < kNumExportRefusalLabels; ++i) {
      exports_refused_[i] = &refused.Add({{"reason", std::string(kExportRefusalLabels[i])}});
    }

    current = "cortiq_migrations_total";
    RegisterCounterGrid(
        reg, current,
        "Session migrations by direction (out: this node sent, in: this node imported) and "
        "result.",
        "direction", [](size_t d) { return d == 0 ? "out" : "in"; }, "result",
        [](size_t r) { return r == 0 ? "ok" : "failed"; }, migrations_);
    current = "cortiq_migration_undos_total";
    auto& undos = prometheus::BuildCounter()
                      .Name(current)
                      .Help(
                          "Outgoing migrations whose import answer did not come back, so the "
                          "peer was asked to release what it may have installed, by what it "
                          "answered (failed: the session may be on both nodes).")
                      .Register(reg);
    migration_undos_[0] = &undos.Add({{"result", "released"}});
    migration_undos_[1] = &undos.Add({{"result", "absent"}});
    migration_undos_[2] = &undos.Add({{"result", "failed"}});

    current = "cortiq_http_requests_total";
    RegisterCounterGrid(reg, current, "Finished HTTP requests by route pattern and HTTP status.",
                        "route", HttpRouteName, "status", HttpStatusLabel, http_requests_);
    current = "cortiq_http_request_duration_seconds";
    RegisterHistogramRow(reg, current,
                         "Wall time of finished HTTP requests (a stream: until its last chunk), "
                         "by route pattern.",
                         "route", HttpRouteName, RequestBuckets(), http_seconds_);

    current = "cortiq_build_info";
    prometheus::BuildGauge()
        .Name(current)
        .Help("Always 1; the labels name the server version and the loaded model.")
        .Register(reg)
        .Add({{"version", OrUnknown(sources.version)}, {"model", OrUnknown(sources.model_name)}})
        .Set(1);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("metrics: registering ", current, ": ", e.what()));
  }
  return absl::OkStatus();
}

std::shared_ptr<prometheus::Collectable> Metrics::live_state() const { return live_state_; }

void Metrics::AttachEngine(const session::Engine* engine) { live_state_->AttachEngine(engine); }

void Metrics::CountRequest(std::string_view rpc, int grpc_code) {
  const std::optional<size_t> r = RpcIndex(rpc);
  if (!r || grpc_code < 0 || grpc_code >= static_cast<int>(kNumGrpcCodes)) return;
  requests_[*r][static_cast<size_t>(grpc_code)]->Increment();
}

void Metrics::ObserveRequest(std::string_view rpc, double seconds) {
  if (const std::optional<size_t> r = RpcIndex(rpc)) request_seconds_[*r]->Observe(seconds);
}

void Metrics::CountExportRefused(ExportRefusal reason) {
  exports_refused_[ExportRefusalLabel(reason)]->Increment();
}

void Metrics::CountMigration(MigrationDirection direction, MigrationResult result) {
  migrations_[static_cast<size_t>(direction) & 1][static_cast<size_t>(result) & 1]->Increment();
}

void Metrics::CountMigrationUndo(MigrationUndo result) {
  migration_undos_[static_cast<size_t>(result) % kNumMigrationUndoLabels]->Increment();
}

void Metrics::ObserveHttpRequest(std::string_view route, int status, double seconds) {
  const std::optional<size_t> c = HttpStatusIndex(status);
  if (!c) return;
  const size_t r = HttpRouteIndex(route);
  http_requests_[r][*c]->Increment();
  http_seconds_[r]->Observe(seconds);
}

void Metrics::OnStep(size_t decode_batch, size_t prefill_tokens, double seconds) {
  step_seconds_->Observe(seconds);
  if (decode_batch > 0) {
    step_batch_size_->Observe(static_cast<double>(decode_batch));
    step_decode_tokens_->Increment(static_cast<double>(decode_batch));
  }
  if (prefill_tokens > 0) step_prefill_tokens_->Increment(static_cast<double>(prefill_tokens));
}

namespace {
// A job's front end as an index (an out-of-range value: a bug; counted as gRPC).
size_t FrontendIndex(session::Frontend frontend) {
  const auto f = static_cast<size_t>(frontend);
  return f < session::kNumFrontends ? f : 0;
}
// A job's priority as an index (an out-of-range value: a bug; counted as normal).
size_t PriorityIndex(session::Priority priority) {
  const auto p = static_cast<size_t>(priority);
  return p < session::kNumPriorities ? p : static_cast<size_t>(session::Priority::kNormal);
}
}  // namespace

void Metrics::OnTenantStep(std::string_view tenant, size_t decode_rows, size_t prefill_tokens) {
  live_state_->AddTenantRows(tenant, decode_rows, prefill_tokens);
}

void Metrics::OnQueueWait(session::Frontend frontend, session::Priority priority, double seconds) {
  queue_wait_seconds_[FrontendIndex(frontend)][PriorityIndex(priority)]->Observe(seconds);
}

void Metrics::OnFirstToken(session::Frontend frontend, double ttft_seconds) {
  ttft_seconds_[FrontendIndex(frontend)]->Observe(ttft_seconds);
}

void Metrics::OnInterToken(session::Frontend frontend, double seconds) {
  inter_token_seconds_[FrontendIndex(frontend)]->Observe(seconds);
}

void Metrics::OnFinish(session::Frontend frontend, session::FinishReason reason,
                       const absl::Status& status, const session::GenerationResult& result) {
  const size_t f = FrontendIndex(frontend);
  const auto prompt = static_cast<double>(result.prompt_tokens);
  const auto generated = static_cast<double>(result.completion_tokens);
  if (prompt > 0) prompt_tokens_->Increment(prompt);
  if (generated > 0) generated_tokens_->Increment(generated);
  request_prompt_tokens_[f]->Observe(prompt);
  request_generation_tokens_[f]->Observe(generated);
  finished_[f][FinishLabelIndex(reason, status)]->Increment();
  if (result.completion_tokens > 0) {
    queue_seconds_[f]->Observe(result.queue_seconds);
    prefill_seconds_[f]->Observe(result.ttft_seconds - result.queue_seconds);
    decode_seconds_[f]->Observe(result.total_seconds - result.ttft_seconds);
  }
}

// ---- MetricsServer ----

MetricsServer::MetricsServer(std::unique_ptr<prometheus::Exposer> exposer, int port)
    : exposer_(std::move(exposer)), port_(port) {}

MetricsServer::~MetricsServer() = default;

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& listen,
                                                                    Metrics& metrics) {
  if (listen.empty()) return absl::InvalidArgumentError("metrics listen address is empty");
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    exposer = std::make_unique<prometheus::Exposer>(listen, /*num_threads=*/2);
    exposer->RegisterCollectable(metrics.registry(), "/metrics");
    exposer->RegisterCollectable(metrics.live_state(), "/metrics");
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("metrics: cannot listen on ", listen, ": ", e.what()));
  }
  const std::vector<int> ports = exposer->GetListeningPorts();
  if (ports.empty()) {
    return absl::UnavailableError(absl::StrCat("metrics: no listening port for ", listen));
  }
  spdlog::info("metrics: serving http://{}/metrics (port {})", listen, ports.front());
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(exposer), ports.front()));
}

}  // namespace cortiq::server
