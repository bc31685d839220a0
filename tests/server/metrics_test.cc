// server::Metrics and server::MetricsServer, end to end: a real Transformer
// (a tiny random checkpoint), a SessionStore holding sessions of every memory
// kind, an Engine running a generation; /metrics is scraped over HTTP/1.0 from
// 127.0.0.1:<port 0>, parsed, and compared with the store byte for byte.
// promtool (Debian's prometheus) lints the exposition.
#include "server/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/kv/wire_refusal.h"
#include "core/model/transformer.h"
#include "core/session/engine.h"
#include "core/session/request_plan.h"
#include "core/session/session.h"
#include "core/session/session_store.h"
#include "core/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "tests/common/alloc_counter.h"
#include "tests/common/model_test_util.h"
#include "tests/common/prom_text.h"

namespace cortiq::server {
namespace {

using session::FinishReason;
using session::Frontend;
using session::GenerationResult;
using session::MemoryByKind;
using session::MemoryKind;
using session::ReleaseReason;
using session::SessionConfig;
using session::SessionStore;

using testing::Exposition;
using testing::HttpGet;
using testing::Parse;
using testing::Sample;

// ---- fixtures ----

std::map<std::string, std::string> Kind(MemoryKind k) {
  return {{"kind", std::string(session::MemoryKindName(k))}};
}

const std::map<std::string, std::string> kGrpc = {{"frontend", "grpc"}};
const std::map<std::string, std::string> kHttp = {{"frontend", "http"}};

// cortiq_requests_finished_total{frontend, finished_reason} in `e`.
double FinishedCount(const Exposition& e, const char* frontend, const char* reason) {
  return e.Value("cortiq_requests_finished_total",
                 {{"frontend", frontend}, {"finished_reason", reason}});
}

// A finished job's result as the engine would report it.
GenerationResult Result(size_t prompt, size_t completion, double queue, double ttft,
                        double total) {
  GenerationResult r;
  r.prompt_tokens = prompt;
  r.completion_tokens = completion;
  r.queue_seconds = queue;
  r.ttft_seconds = ttft;
  r.total_seconds = total;
  return r;
}

class MetricsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(testing::TempModel("tiny"));
    auto tf = model::Transformer::Load(*dir_);
    ASSERT_TRUE(tf.ok()) << tf.status();
    model_ = tf->release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
    delete dir_;
    dir_ = nullptr;
  }

  void SetUp() override {
    ASSERT_NE(model_, nullptr);
    store_ = std::make_unique<SessionStore>(session::StoreOptions{
        .max_sessions = 7, .memory_budget_bytes = static_cast<size_t>(64) << 20});
    auto m = Metrics::Create(
        {.store = store_.get(), .model = model_, .version = "1.2.3", .model_name = "tiny-random"});
    ASSERT_TRUE(m.ok()) << m.status();
    metrics_ = *std::move(m);
    auto http = MetricsServer::Start("127.0.0.1:0", *metrics_);
    ASSERT_TRUE(http.ok()) << http.status();
    http_ = *std::move(http);
    ASSERT_GT(http_->port(), 0);
  }

  void TearDown() override {
    http_.reset();  // stops the scrapes before the sources go
    metrics_.reset();
    store_.reset();
  }

  Exposition Scrape() { return Parse(HttpGet(http_->port())); }

  const model::ModelConfig& config() const { return model_->config(); }
  size_t num_layers() const { return static_cast<size_t>(config().num_hidden_layers); }

  // A leased session of `sc` that has absorbed `prompt` tokens (sealed when
  // O(1)), with its bytes published.
  SessionStore::Lease NewSession(const SessionConfig& sc, size_t prompt) {
    auto lease = store_->Create(*model_, sc,
                                session::ProjectedSessionBytes(config(), sc, prompt + 1, prompt));
    EXPECT_TRUE(lease.ok()) << lease.status();
    if (!lease.ok()) return {};
    const std::vector<int32_t> ids = testing::TestIds(prompt, config().vocab_size, 11);
    (*lease)->AppendPrompt(ids);
    model::ForwardScratch scratch;
    absl::Status s = model_->Prefill(ids, lease->sequence(), scratch, nullptr);
    EXPECT_TRUE(s.ok()) << s;
    if (sc.attention == session::AttentionMode::kO1) {
      EXPECT_EQ(model_->SealO1(lease->sequence()), num_layers());
    }
    (*lease)->PublishMemory();
    return *std::move(lease);
  }

  static SessionConfig F32() { return {}; }
  static SessionConfig Int8() {
    SessionConfig sc;
    sc.kv_mode = kv::KvMode::kInt8;
    return sc;
  }
  SessionConfig O1() const {
    SessionConfig sc;
    sc.attention = session::AttentionMode::kO1;
    sc.o1.layers = {0, 1};
    sc.o1.m = 8;
    sc.o1.w = 16;
    sc.o1.sink = 4;
    return sc;
  }
  SessionConfig Qsa() const {
    SessionConfig sc;
    sc.attention = session::AttentionMode::kQsa;
    auto q = model::MakeQsaConfig("all", 8, 4, num_layers());
    EXPECT_TRUE(q.ok()) << q.status();
    sc.qsa = *q;
    return sc;
  }

  static std::string* dir_;
  static model::Transformer* model_;
  std::unique_ptr<SessionStore> store_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<MetricsServer> http_;
};

std::string* MetricsTest::dir_ = nullptr;
model::Transformer* MetricsTest::model_ = nullptr;

// Every scrape-time gauge reads the store's exact bytes; releases are counted
// by reason and leave every memory gauge at 0.
TEST_F(MetricsTest, SessionMemoryIsTheStoresExactBytes) {
  std::vector<SessionStore::Lease> leases;
  leases.push_back(NewSession(F32(), 40));
  leases.push_back(NewSession(Int8(), 33));
  leases.push_back(NewSession(O1(), 64));
  leases.push_back(NewSession(Qsa(), 70));
  leases.push_back(NewSession(F32(), 5));
  for (const auto& l : leases) ASSERT_TRUE(l);

  MemoryByKind sum;
  for (const auto& l : leases) sum += session::MemoryOf(l->kv());
  const MemoryByKind total = store_->MemoryByKindTotal();
  for (size_t k = 0; k < session::kNumMemoryKinds; ++k) {
    EXPECT_GT(sum.bytes[k], 0u) << session::MemoryKindName(static_cast<MemoryKind>(k));
    EXPECT_EQ(total.bytes[k], sum.bytes[k]) << session::MemoryKindName(static_cast<MemoryKind>(k));
  }

  Exposition e = Scrape();
  for (size_t k = 0; k < session::kNumMemoryKinds; ++k) {
    const auto kind = static_cast<MemoryKind>(k);
    // Doubles hold integers below 2^53 exactly: byte-for-byte equality.
    EXPECT_EQ(e.Value("cortiq_session_memory_bytes", Kind(kind)), static_cast<double>(sum[kind]))
        << session::MemoryKindName(kind);
  }
  EXPECT_EQ(e.All("cortiq_session_memory_bytes").size(), session::kNumMemoryKinds);
  EXPECT_EQ(e.Value("cortiq_session_memory_total_bytes"), static_cast<double>(sum.total()));
  EXPECT_EQ(e.Value("cortiq_sessions_active"), 5);
  EXPECT_EQ(e.Value("cortiq_sessions_busy"), 5);  // every lease still held
  EXPECT_EQ(e.Value("cortiq_sessions_max"), 7);
  EXPECT_EQ(e.Value("cortiq_memory_budget_bytes"),
            static_cast<double>(static_cast<size_t>(64) << 20));
  EXPECT_EQ(e.Value("cortiq_memory_committed_bytes"),
            static_cast<double>(store_->committed_bytes()));
  EXPECT_GE(e.Value("cortiq_memory_committed_bytes"), static_cast<double>(sum.total()));
  EXPECT_EQ(e.Value("cortiq_qsa_backend_live_bytes"),
            static_cast<double>(model_->QsaBackendStats().live_bytes));
  EXPECT_GE(e.Value("cortiq_qsa_backend_live_bytes"), static_cast<double>(sum[MemoryKind::kQsa]));
  EXPECT_EQ(e.Value("cortiq_model_weight_bytes", {{"copy", "checkpoint"}}),
            static_cast<double>(model_->CheckpointWeightBytesInUse()));
  EXPECT_GT(e.Value("cortiq_model_weight_bytes", {{"copy", "checkpoint"}}), 0);
  EXPECT_EQ(e.Value("cortiq_model_weight_bytes", {{"copy", "int8"}}), 0);
  EXPECT_EQ(e.Value("cortiq_model_weight_bytes", {{"copy", "amx_tiles"}}),
            static_cast<double>(model_->AmxTileBytes()));
  for (size_t r = 0; r < session::kNumReleaseReasons; ++r) {
    EXPECT_EQ(e.Value("cortiq_session_releases_total",
                      {{"reason",
                        std::string(session::ReleaseReasonName(static_cast<ReleaseReason>(r)))}}),
              0);
  }

  // Returned leases: no longer busy, same bytes.
  std::vector<std::string> ids;
  for (auto& l : leases) {
    ids.push_back(l->id());
    l.Return();
  }
  e = Scrape();
  EXPECT_EQ(e.Value("cortiq_sessions_busy"), 0);
  EXPECT_EQ(e.Value("cortiq_session_memory_total_bytes"), static_cast<double>(sum.total()));

  // Release every session, by several reasons.
  const ReleaseReason reasons[] = {ReleaseReason::kExplicit, ReleaseReason::kMigrated,
                                   ReleaseReason::kExplicit, ReleaseReason::kCancelled,
                                   ReleaseReason::kOneshot};
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_TRUE(store_->Release(ids[i], reasons[i]).released);
  }
  EXPECT_FALSE(store_->Release(ids[0]).released);  // idempotent: not counted again
  e = Scrape();
  for (size_t k = 0; k < session::kNumMemoryKinds; ++k) {
    EXPECT_EQ(e.Value("cortiq_session_memory_bytes", Kind(static_cast<MemoryKind>(k))), 0);
  }
  EXPECT_EQ(e.Value("cortiq_session_memory_total_bytes"), 0);
  EXPECT_EQ(e.Value("cortiq_sessions_active"), 0);
  EXPECT_EQ(e.Value("cortiq_memory_committed_bytes"), 0);
  EXPECT_EQ(e.Value("cortiq_session_releases_total", {{"reason", "explicit"}}), 2);
  EXPECT_EQ(e.Value("cortiq_session_releases_total", {{"reason", "migrated"}}), 1);
  EXPECT_EQ(e.Value("cortiq_session_releases_total", {{"reason", "cancelled"}}), 1);
  EXPECT_EQ(e.Value("cortiq_session_releases_total", {{"reason", "oneshot"}}), 1);
  EXPECT_EQ(e.Value("cortiq_session_releases_total", {{"reason", "ttl"}}), 0);
  EXPECT_EQ(e.type["cortiq_session_releases_total"], "counter");
  EXPECT_EQ(e.type["cortiq_session_memory_bytes"], "gauge");
}

// The TTL reaper's releases show up under reason="ttl".
TEST_F(MetricsTest, TtlReleasesCounted) {
  std::string id;
  {
    SessionStore::Lease l = NewSession(F32(), 3);
    ASSERT_TRUE(l);
    id = l->id();
  }
  EXPECT_EQ(store_->ReapIdle(session::Clock::now() + std::chrono::hours(1)), 1u);
  Exposition e = Scrape();
  EXPECT_EQ(e.Value("cortiq_session_releases_total", {{"reason", "ttl"}}), 1);
  EXPECT_EQ(e.Value("cortiq_session_memory_total_bytes"), 0);
}

TEST_F(MetricsTest, RequestsByRpcAndCode) {
  for (int i = 0; i < 3; ++i) metrics_->CountRequest("Generate", 0);
  metrics_->CountRequest("ExportSession", 9);    // FAILED_PRECONDITION
  metrics_->CountRequest("MigrateSession", 16);  // UNAUTHENTICATED
  metrics_->CountRequest("NoSuchRpc", 0);        // ignored
  metrics_->CountRequest("Generate", 17);        // ignored
  metrics_->CountRequest("Generate", -1);        // ignored

  Exposition e = Scrape();
  EXPECT_EQ(e.Value("cortiq_requests_total", {{"rpc", "Generate"}, {"code", "OK"}}), 3);
  EXPECT_EQ(
      e.Value("cortiq_requests_total", {{"rpc", "ExportSession"}, {"code", "FAILED_PRECONDITION"}}),
      1);
  EXPECT_EQ(
      e.Value("cortiq_requests_total", {{"rpc", "MigrateSession"}, {"code", "UNAUTHENTICATED"}}),
      1);
  // Every (rpc, code) child exists from start-up; nothing else does.
  const auto all = e.All("cortiq_requests_total");
  EXPECT_EQ(all.size(), kNumRpcs * kNumGrpcCodes);
  double total = 0;
  std::set<std::string> rpcs;
  for (const Sample* s : all) {
    total += s->value;
    rpcs.insert(s->labels.at("rpc"));
    EXPECT_EQ(s->labels.size(), 2u);
  }
  EXPECT_EQ(total, 5);
  EXPECT_EQ(rpcs.size(), kNumRpcs);
  EXPECT_EQ(rpcs.count("NoSuchRpc"), 0u);
  EXPECT_EQ(e.type["cortiq_requests_total"], "counter");
}

TEST_F(MetricsTest, HistogramsTokensAndEventCounters) {
  metrics_->ObserveRequest("Generate", 0.2);
  metrics_->ObserveRequest("Tokenize", 0.0002);
  metrics_->ObserveRequest("Nope", 1);  // ignored
  metrics_->OnFirstToken(Frontend::kGrpc, 0.3);
  metrics_->OnInterToken(Frontend::kGrpc, 0.02);
  metrics_->OnInterToken(Frontend::kGrpc, 0.04);
  metrics_->OnStep(3, 0, 0.01);
  metrics_->OnStep(0, 16, 0.05);  // prefill only: no batch size
  metrics_->OnFinish(Frontend::kGrpc, FinishReason::kLength, absl::OkStatus(),
                     Result(5, 7, 0.01, 0.3, 0.5));
  metrics_->OnFinish(Frontend::kGrpc, FinishReason::kCancelled, absl::OkStatus(),
                     Result(2, 0, 0, 0, 0.1));
  metrics_->CountExportRefused(ExportRefusal::kO1Overlay);
  metrics_->CountExportRefused(ExportRefusal::kInt8Rows);
  metrics_->CountExportRefused(ExportRefusal::kInt8Rows);
  metrics_->CountMigration(MigrationDirection::kOut, MigrationResult::kOk);
  metrics_->CountMigration(MigrationDirection::kIn, MigrationResult::kFailed);

  Exposition e = Scrape();
  const char* histograms[] = {"cortiq_time_to_first_token_seconds",
                              "cortiq_inter_token_latency_seconds",
                              "cortiq_request_duration_seconds", "cortiq_engine_step_seconds",
                              "cortiq_engine_step_batch_size"};
  for (const std::string h : histograms) {
    EXPECT_EQ(e.type[h], "histogram") << h;
    EXPECT_FALSE(e.All(h + "_bucket").empty()) << h;
    EXPECT_FALSE(e.All(h + "_sum").empty()) << h;
    EXPECT_FALSE(e.All(h + "_count").empty()) << h;
    EXPECT_FALSE(e.All(h + "_bucket", {{"le", "+Inf"}}).empty()) << h;
  }
  EXPECT_EQ(e.Value("cortiq_time_to_first_token_seconds_count", kGrpc), 1);
  EXPECT_EQ(e.Value("cortiq_time_to_first_token_seconds_count", kHttp), 0);
  EXPECT_DOUBLE_EQ(e.Value("cortiq_time_to_first_token_seconds_sum", kGrpc), 0.3);
  EXPECT_EQ(e.Value("cortiq_time_to_first_token_seconds_bucket",
                    {{"frontend", "grpc"}, {"le", "0.25"}}),
            0);
  EXPECT_EQ(e.Value("cortiq_time_to_first_token_seconds_bucket",
                    {{"frontend", "grpc"}, {"le", "0.5"}}),
            1);
  EXPECT_EQ(e.Value("cortiq_time_to_first_token_seconds_bucket",
                    {{"frontend", "grpc"}, {"le", "+Inf"}}),
            1);
  EXPECT_EQ(e.Value("cortiq_inter_token_latency_seconds_count", kGrpc), 2);
  EXPECT_DOUBLE_EQ(e.Value("cortiq_inter_token_latency_seconds_sum", kGrpc), 0.06);
  EXPECT_EQ(e.Value("cortiq_request_duration_seconds_count", {{"rpc", "Generate"}}), 1);
  EXPECT_EQ(e.Value("cortiq_request_duration_seconds_count", {{"rpc", "Tokenize"}}), 1);
  EXPECT_EQ(e.Value("cortiq_request_duration_seconds_count", {{"rpc", "GetSession"}}), 0);
  EXPECT_EQ(e.All("cortiq_request_duration_seconds_count").size(), kNumRpcs);
  EXPECT_EQ(e.Value("cortiq_engine_step_seconds_count"), 2);
  EXPECT_EQ(e.Value("cortiq_engine_step_batch_size_count"), 1);
  EXPECT_EQ(e.Value("cortiq_engine_step_batch_size_bucket", {{"le", "2"}}), 0);
  EXPECT_EQ(e.Value("cortiq_engine_step_batch_size_bucket", {{"le", "4"}}), 1);
  // The batch-size buckets are exactly 1, 2, 4, ..., 128, +Inf.
  std::set<std::string> les;
  for (const Sample* s : e.All("cortiq_engine_step_batch_size_bucket")) {
    les.insert(s->labels.at("le"));
  }
  EXPECT_EQ(les, (std::set<std::string>{"1", "2", "4", "8", "16", "32", "64", "128", "+Inf"}));

  EXPECT_EQ(e.Value("cortiq_prompt_tokens_total"), 7);
  EXPECT_EQ(e.Value("cortiq_generated_tokens_total"), 7);
  EXPECT_EQ(e.Value("cortiq_exports_refused_total", {{"reason", "o1_overlay"}}), 1);
  EXPECT_EQ(e.Value("cortiq_exports_refused_total", {{"reason", "int8_rows"}}), 2);
  EXPECT_EQ(e.Value("cortiq_exports_refused_total", {{"reason", "importance"}}), 0);
  EXPECT_EQ(e.Value("cortiq_exports_refused_total", {{"reason", "other"}}), 0);
  EXPECT_EQ(e.Value("cortiq_migrations_total", {{"direction", "out"}, {"result", "ok"}}), 1);
  EXPECT_EQ(e.Value("cortiq_migrations_total", {{"direction", "in"}, {"result", "failed"}}), 1);
  EXPECT_EQ(e.Value("cortiq_migrations_total", {{"direction", "in"}, {"result", "ok"}}), 0);
  EXPECT_EQ(e.Value("cortiq_build_info", {{"version", "1.2.3"}, {"model", "tiny-random"}}), 1);
}

// The refusal label comes from the typed reason (kv::WireRefusal) a refused
// export carries, never from its text: every kv reason lands on one of the
// four labels, whatever its message says.
TEST_F(MetricsTest, ExportRefusalLabelsComeFromTheTypedReason) {
  const std::map<kv::WireRefusal, std::string> want = {
      {kv::WireRefusal::kO1Collecting, "o1_overlay"},
      {kv::WireRefusal::kImportance, "importance"},
      {kv::WireRefusal::kDeadHeads, "other"},
      {kv::WireRefusal::kInt8Rows, "int8_rows"},
      {kv::WireRefusal::kO1Overlay, "o1_overlay"},
      {kv::WireRefusal::kF16Range, "other"},
      {kv::WireRefusal::kWireVersion, "other"},
      {kv::WireRefusal::kOther, "other"}};
  ASSERT_EQ(want.size(), kv::kNumWireRefusals);
  for (const auto& [reason, label] : want) {
    EXPECT_EQ(ExportRefusalName(reason), label) << kv::WireRefusalName(reason);
    // A message naming another reason cannot move the count.
    const absl::Status refused = kv::PrefixStatus(
        "layer 0: ", kv::WireRefused(reason, "accumulated importance in an O(1) int8 layer"));
    const std::optional<ExportRefusal> typed = kv::WireRefusalOf(refused);
    ASSERT_TRUE(typed.has_value());
    metrics_->CountExportRefused(*typed);
  }
  Exposition e = Scrape();
  EXPECT_EQ(e.Value("cortiq_exports_refused_total", {{"reason", "importance"}}), 1);
  EXPECT_EQ(e.Value("cortiq_exports_refused_total", {{"reason", "o1_overlay"}}), 2);
  EXPECT_EQ(e.Value("cortiq_exports_refused_total", {{"reason", "int8_rows"}}), 1);
  EXPECT_EQ(e.Value("cortiq_exports_refused_total", {{"reason", "other"}}), 4);
  EXPECT_EQ(e.All("cortiq_exports_refused_total").size(), kNumExportRefusalLabels);
}

// The import gauge is the store's import reservations, live; committed
// bytes include them.
TEST_F(MetricsTest, ImportBytesInFlightIsWhatImportsHold) {
  EXPECT_EQ(Scrape().Value("cortiq_import_bytes_in_flight"), 0);
  auto a = store_->BeginImport();
  auto b = store_->BeginImport();
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(a->Update(1000).ok());
  ASSERT_TRUE(b->Update(234).ok());
  Exposition e = Scrape();
  EXPECT_EQ(e.Value("cortiq_import_bytes_in_flight"), 1234);
  EXPECT_EQ(e.Value("cortiq_memory_committed_bytes"), 1234);
  *a = session::SessionStore::ImportReservation();
  EXPECT_EQ(Scrape().Value("cortiq_import_bytes_in_flight"), 234);
  b->Release();
  EXPECT_EQ(Scrape().Value("cortiq_import_bytes_in_flight"), 0);
}

// Export snapshots have their own gauge and count as committed too.
TEST_F(MetricsTest, ExportBytesInFlightIsWhatExportSnapshotsHold) {
  EXPECT_EQ(Scrape().Value("cortiq_export_bytes_in_flight"), 0);
  auto a = store_->BeginExport();
  auto i = store_->BeginImport();
  ASSERT_TRUE(a.ok() && i.ok());
  ASSERT_TRUE(a->Update(4000).ok());
  ASSERT_TRUE(i->Update(10).ok());
  Exposition e = Scrape();
  EXPECT_EQ(e.Value("cortiq_export_bytes_in_flight"), 4000);
  EXPECT_EQ(e.Value("cortiq_import_bytes_in_flight"), 10);
  EXPECT_EQ(e.Value("cortiq_memory_committed_bytes"), 4010);
  ASSERT_TRUE(a->Update(1000).ok());  // chunks sent
  EXPECT_EQ(Scrape().Value("cortiq_export_bytes_in_flight"), 1000);
  a->Release();
  EXPECT_EQ(Scrape().Value("cortiq_export_bytes_in_flight"), 0);
  EXPECT_EQ(store_->num_exports(), 0u);
  EXPECT_EQ(store_->num_imports(), 1u);
}

// Every family carries HELP and TYPE; no label is a session id.
TEST_F(MetricsTest, EveryFamilyHasHelpAndLowCardinalityLabels) {
  SessionStore::Lease l = NewSession(F32(), 4);
  ASSERT_TRUE(l);
  const std::string id = l->id();
  const std::string text = HttpGet(http_->port());
  EXPECT_EQ(text.find(id), std::string::npos);
  Exposition e = Parse(text);
  ASSERT_FALSE(e.samples.empty());
  // prometheus-cpp's Exposer adds its own exposer_* families (scrape counts,
  // bytes, latency quantiles); every other family is ours.
  auto ours = [](const std::string& name) { return name.rfind("exposer_", 0) != 0; };
  size_t families = 0;
  for (const auto& [family, type] : e.type) {
    EXPECT_FALSE(e.help[family].empty()) << family;
    if (!ours(family)) continue;
    ++families;
    EXPECT_EQ(family.rfind("cortiq_", 0), 0u) << family;
  }
  EXPECT_EQ(families, 44u);  // docs/METRICS.md lists 64; no engine here (7), no --state-dir (13)
  const std::set<std::string> allowed = {"kind",  "reason",    "rpc",      "code",
                                         "le",    "direction", "result",   "version",
                                         "model", "copy",      "frontend", "finished_reason",
                                         "route", "status",    "tenant",   "priority"};
  for (const Sample& s : e.samples) {
    if (!ours(s.name)) continue;
    for (const auto& [k, v] : s.labels) EXPECT_TRUE(allowed.count(k)) << s.name << " " << k;
  }
}

// The Engine reports through the observer; its gauges are read at scrape.
TEST_F(MetricsTest, EngineObserverAndGauges) {
  auto tok = tokenizer::Tokenizer::FromFile(*dir_ + "/tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status();
  session::Engine engine(*model_, *tok, {.observer = metrics_.get()});
  metrics_->AttachEngine(&engine);

  auto lease = store_->Create(*model_, F32(), 0);
  ASSERT_TRUE(lease.ok()) << lease.status();
  session::GenerationRequest req;
  req.prompt = testing::TestIds(9, config().vocab_size, 5);
  req.max_tokens = 6;
  req.ignore_eos = true;
  req.sampling.temperature = 0;
  auto job = engine.Submit(*std::move(lease), req);
  ASSERT_TRUE(job.ok()) << job.status();
  session::GenerationEvent ev;
  while ((*job)->WaitPop(&ev)) {
  }
  const session::GenerationResult r = (*job)->result();
  ASSERT_TRUE(r.status.ok()) << r.status;
  ASSERT_EQ(r.completion_tokens, 6u);
  engine.Shutdown();  // no step after this: the counters are final

  Exposition e = Scrape();
  EXPECT_EQ(e.Value("cortiq_time_to_first_token_seconds_count", kGrpc), 1);
  EXPECT_DOUBLE_EQ(e.Value("cortiq_time_to_first_token_seconds_sum", kGrpc), r.ttft_seconds);
  EXPECT_EQ(e.Value("cortiq_inter_token_latency_seconds_count", kGrpc), 5);
  EXPECT_EQ(e.Value("cortiq_generated_tokens_total"), 6);
  EXPECT_EQ(e.Value("cortiq_prompt_tokens_total"), static_cast<double>(r.prompt_tokens));
  EXPECT_EQ(e.Value("cortiq_engine_steps_total"), static_cast<double>(engine.steps()));
  EXPECT_EQ(e.Value("cortiq_engine_step_seconds_count"), static_cast<double>(engine.steps()));
  EXPECT_GE(e.Value("cortiq_engine_step_batch_size_count"), 5);
  EXPECT_EQ(e.Value("cortiq_engine_active_jobs"), 0);
  EXPECT_EQ(e.Value("cortiq_engine_queue_depth"), 0);
  EXPECT_EQ(e.Value("cortiq_engine_batch_size"), static_cast<double>(engine.last_batch()));
  EXPECT_EQ(e.type["cortiq_engine_steps_total"], "counter");
  // The scheduler's gauges: the step budget, the last step's rows, the
  // waiting queue by priority (every level, empty now).
  EXPECT_EQ(e.Value("cortiq_engine_step_token_budget"), 128);  // the default
  EXPECT_EQ(e.Value("cortiq_engine_step_token_budget"), static_cast<double>(engine.step_tokens()));
  EXPECT_EQ(e.Value("cortiq_engine_step_rows"), static_cast<double>(engine.last_step_tokens()));
  EXPECT_EQ(e.type["cortiq_engine_step_rows"], "gauge");
  EXPECT_EQ(e.All("cortiq_engine_waiting_jobs").size(), session::kNumPriorities);
  for (const char* p : {"low", "normal", "high"}) {
    EXPECT_EQ(e.Value("cortiq_engine_waiting_jobs", {{"priority", p}}),
              static_cast<double>(engine.waiting_jobs(*session::ParsePriority(p))))
        << p;
  }
  // Step rows by kind: every decode row the batch-size histogram saw, and
  // the prompt absorbed once.
  EXPECT_EQ(e.Value("cortiq_engine_step_tokens_total", {{"kind", "decode"}}),
            e.Value("cortiq_engine_step_batch_size_sum"));
  EXPECT_GE(e.Value("cortiq_engine_step_tokens_total", {{"kind", "decode"}}), 5);
  EXPECT_EQ(e.Value("cortiq_engine_step_tokens_total", {{"kind", "prefill"}}),
            static_cast<double>(r.prompt_tokens - r.cached_tokens));
  // The session the job filled is still live, and the gauge says exactly how big.
  EXPECT_EQ(e.Value("cortiq_session_memory_bytes", Kind(MemoryKind::kKvF32)),
            static_cast<double>(store_->MemoryByKindTotal()[MemoryKind::kKvF32]));
  EXPECT_EQ(e.Value("cortiq_session_memory_bytes", Kind(MemoryKind::kKvF32)),
            static_cast<double>(r.memory[MemoryKind::kKvF32]));
  EXPECT_GT(r.memory[MemoryKind::kKvF32], 0u);

  metrics_->AttachEngine(nullptr);
  e = Scrape();
  EXPECT_FALSE(e.Get("cortiq_engine_steps_total").has_value());
  EXPECT_FALSE(e.Get("cortiq_engine_queue_depth").has_value());
  EXPECT_TRUE(e.All("cortiq_engine_waiting_jobs").empty());
  EXPECT_FALSE(e.Get("cortiq_engine_step_rows").has_value());
  EXPECT_FALSE(e.Get("cortiq_engine_step_token_budget").has_value());
}

// The queue wait (OnQueueWait: once per job, at its first prefill chunk) by
// front end and the job's priority: all six children from start-up, each
// observation in its own child only.
TEST_F(MetricsTest, QueueWaitByFrontendAndPriority) {
  using session::Priority;
  Exposition e = Scrape();
  EXPECT_EQ(e.type["cortiq_queue_wait_seconds"], "histogram");
  EXPECT_EQ(e.All("cortiq_queue_wait_seconds_count").size(),
            session::kNumFrontends * session::kNumPriorities);
  for (const Sample* s : e.All("cortiq_queue_wait_seconds_count")) EXPECT_EQ(s->value, 0);

  struct Wait {
    Frontend frontend;
    Priority priority;
    double seconds;
  };
  const std::vector<Wait> waits = {
      {Frontend::kGrpc, Priority::kHigh, 0.002},  {Frontend::kGrpc, Priority::kHigh, 0.004},
      {Frontend::kGrpc, Priority::kLow, 3.5},     {Frontend::kHttp, Priority::kNormal, 0.2},
      {Frontend::kHttp, Priority::kLow, 12.0},    {Frontend::kHttp, Priority::kLow, 0.03},
      {Frontend::kGrpc, Priority::kNormal, 0.07},
  };
  std::map<std::pair<std::string, std::string>, std::pair<double, double>> want;  // count, sum
  for (const Wait& w : waits) {
    metrics_->OnQueueWait(w.frontend, w.priority, w.seconds);
    auto& [count, sum] = want[{std::string(session::FrontendName(w.frontend)),
                               std::string(session::PriorityName(w.priority))}];
    count += 1;
    sum += w.seconds;
  }
  e = Scrape();
  for (const char* f : {"grpc", "http"}) {
    for (const char* p : {"low", "normal", "high"}) {
      const std::map<std::string, std::string> labels = {{"frontend", f}, {"priority", p}};
      const auto [count, sum] = want[{f, p}];
      EXPECT_EQ(e.Value("cortiq_queue_wait_seconds_count", labels), count) << f << " " << p;
      EXPECT_NEAR(e.Value("cortiq_queue_wait_seconds_sum", labels), sum, 1e-12) << f << " " << p;
    }
  }
  // TTFT buckets: the 12 s wait is above 10, the 3.5 s one below 5.
  EXPECT_EQ(e.Value("cortiq_queue_wait_seconds_bucket",
                    {{"frontend", "http"}, {"priority", "low"}, {"le", "10"}}),
            1);
  EXPECT_EQ(e.Value("cortiq_queue_wait_seconds_bucket",
                    {{"frontend", "grpc"}, {"priority", "low"}, {"le", "5"}}),
            1);
  EXPECT_EQ(e.Value("cortiq_queue_wait_seconds_bucket",
                    {{"frontend", "grpc"}, {"priority", "high"}, {"le", "0.005"}}),
            2);
}

// OnStep counts its rows by kind (a step's decode rows and its prefill
// tokens), and a step without one kind adds nothing to it.
TEST_F(MetricsTest, StepTokensByKind) {
  metrics_->OnStep(4, 0, 0.01);
  metrics_->OnStep(0, 64, 0.02);
  metrics_->OnStep(3, 128, 0.03);
  Exposition e = Scrape();
  EXPECT_EQ(e.type["cortiq_engine_step_tokens_total"], "counter");
  EXPECT_EQ(e.All("cortiq_engine_step_tokens_total").size(), 2u);
  EXPECT_EQ(e.Value("cortiq_engine_step_tokens_total", {{"kind", "decode"}}), 7);
  EXPECT_EQ(e.Value("cortiq_engine_step_tokens_total", {{"kind", "prefill"}}), 192);
  EXPECT_EQ(e.Value("cortiq_engine_step_batch_size_count"), 2);  // the steps that decoded
  EXPECT_EQ(e.Value("cortiq_engine_step_seconds_count"), 3);
}

// Each finished job lands once in the finish-reason counter and the
// per-request histograms, by its front end: exact counts and sums from the
// results given.
TEST_F(MetricsTest, FinishedRequestsByReasonAndPerRequestHistograms) {
  struct Finished {
    Frontend frontend;
    FinishReason reason;
    absl::Status status;
    GenerationResult result;
  };
  const std::vector<Finished> jobs = {
      {Frontend::kGrpc, FinishReason::kLength, absl::OkStatus(), Result(10, 16, 0.002, 0.05, 0.9)},
      {Frontend::kGrpc, FinishReason::kLength, absl::OkStatus(), Result(300, 8, 0.004, 0.7, 1.5)},
      {Frontend::kGrpc, FinishReason::kEos, absl::OkStatus(), Result(3, 1, 0.001, 0.02, 0.02)},
      {Frontend::kHttp, FinishReason::kStop, absl::OkStatus(), Result(40, 5, 0.003, 0.1, 0.3)},
      // Cancelled before its first token (no timing), and by a deadline
      // after some tokens (cancelled, not error, whatever the status).
      {Frontend::kHttp, FinishReason::kCancelled, absl::OkStatus(), Result(7, 0, 0, 0, 2.0)},
      {Frontend::kHttp, FinishReason::kCancelled, absl::DeadlineExceededError("deadline"),
       Result(9, 3, 0.001, 0.2, 4.0)},
      // Failed: at admission (no reason), and mid-decode (a reason given).
      {Frontend::kGrpc, FinishReason::kNone, absl::InvalidArgumentError("temperature"),
       Result(5, 0, 0, 0, 0.001)},
      {Frontend::kHttp, FinishReason::kNone, absl::InternalError("decode"),
       Result(6, 2, 0.002, 0.04, 0.08)},
  };
  for (const Finished& j : jobs) metrics_->OnFinish(j.frontend, j.reason, j.status, j.result);

  Exposition e = Scrape();
  EXPECT_EQ(FinishedCount(e, "grpc", "length"), 2);
  EXPECT_EQ(FinishedCount(e, "grpc", "eos"), 1);
  EXPECT_EQ(FinishedCount(e, "grpc", "error"), 1);
  EXPECT_EQ(FinishedCount(e, "grpc", "stop"), 0);
  EXPECT_EQ(FinishedCount(e, "grpc", "cancelled"), 0);
  EXPECT_EQ(FinishedCount(e, "http", "stop"), 1);
  EXPECT_EQ(FinishedCount(e, "http", "cancelled"), 2);
  EXPECT_EQ(FinishedCount(e, "http", "error"), 1);
  EXPECT_EQ(FinishedCount(e, "http", "length"), 0);
  EXPECT_EQ(e.All("cortiq_requests_finished_total").size(),
            session::kNumFrontends * kNumFinishLabels);
  EXPECT_EQ(e.type["cortiq_requests_finished_total"], "counter");

  // Expected counts and sums, computed from the results the way the docs
  // define each series.
  struct Hist {
    double count = 0, sum = 0;
  };
  std::map<std::string, std::map<std::string, Hist>> want;  // series → frontend → hist
  double prompt_total = 0, generated_total = 0;
  for (const Finished& j : jobs) {
    const std::string f(session::FrontendName(j.frontend));
    const GenerationResult& r = j.result;
    auto add = [&](const char* series, double v) {
      Hist& h = want[series][f];
      h.count += 1;
      h.sum += v;
    };
    add("cortiq_request_prompt_tokens", static_cast<double>(r.prompt_tokens));
    add("cortiq_request_generation_tokens", static_cast<double>(r.completion_tokens));
    prompt_total += static_cast<double>(r.prompt_tokens);
    generated_total += static_cast<double>(r.completion_tokens);
    if (r.completion_tokens == 0) continue;
    add("cortiq_request_queue_time_seconds", r.queue_seconds);
    add("cortiq_request_prefill_time_seconds", r.ttft_seconds - r.queue_seconds);
    add("cortiq_request_decode_time_seconds", r.total_seconds - r.ttft_seconds);
  }
  ASSERT_EQ(want.size(), 5u);
  for (const auto& [series, by_frontend] : want) {
    EXPECT_EQ(e.type[series], "histogram") << series;
    for (const char* f : {"grpc", "http"}) {
      const auto it = by_frontend.find(f);
      const Hist h = it == by_frontend.end() ? Hist{} : it->second;
      EXPECT_EQ(e.Value(series + "_count", {{"frontend", f}}), h.count) << series << " " << f;
      EXPECT_NEAR(e.Value(series + "_sum", {{"frontend", f}}), h.sum, 1e-12) << series << " " << f;
      EXPECT_EQ(e.Value(series + "_bucket", {{"frontend", f}, {"le", "+Inf"}}), h.count)
          << series << " " << f;
    }
  }
  // Bucket placement: prompts of 10 and 300 tokens, 3 (grpc).
  EXPECT_EQ(e.Value("cortiq_request_prompt_tokens_bucket", {{"frontend", "grpc"}, {"le", "5"}}),
            2);  // 3 and 5 (the failed one)
  EXPECT_EQ(e.Value("cortiq_request_prompt_tokens_bucket", {{"frontend", "grpc"}, {"le", "200"}}),
            3);
  EXPECT_EQ(e.Value("cortiq_request_prompt_tokens_bucket", {{"frontend", "grpc"}, {"le", "500"}}),
            4);
  // The token counters count every finished job.
  EXPECT_EQ(e.Value("cortiq_prompt_tokens_total"), prompt_total);
  EXPECT_EQ(e.Value("cortiq_generated_tokens_total"), generated_total);
}

// The engine reports each finished job once, with its front end, its reason
// and the measurements its GenerationResult holds: a gRPC job that runs to
// max_tokens, an HTTP job that hits a stop sequence, an HTTP job past its
// deadline (cancelled before a token) and a gRPC job that fails admission.
TEST_F(MetricsTest, EngineReportsEachFinishedJobOnce) {
  auto tok = tokenizer::Tokenizer::FromFile(*dir_ + "/tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status();
  session::Engine engine(*model_, *tok, {.observer = metrics_.get()});
  const std::vector<int32_t> prompt = testing::TestIds(9, config().vocab_size, 5);
  auto request = [&](Frontend frontend) {
    session::GenerationRequest req;
    req.prompt = prompt;
    req.max_tokens = 6;
    req.ignore_eos = true;
    req.sampling.temperature = 0;  // greedy: the same tokens every run
    req.frontend = frontend;
    return req;
  };
  struct Run {
    GenerationResult result;
    std::vector<std::string> texts;
  };
  auto run = [&](const session::GenerationRequest& req) {
    Run out;
    auto lease = store_->Create(*model_, F32(), 0);
    EXPECT_TRUE(lease.ok()) << lease.status();
    if (!lease.ok()) return out;
    auto job = engine.Submit(*std::move(lease), req);
    EXPECT_TRUE(job.ok()) << job.status();
    if (!job.ok()) return out;
    session::GenerationEvent ev;
    while ((*job)->WaitPop(&ev)) out.texts.push_back(ev.text);
    out.result = (*job)->result();
    return out;
  };

  const Run length = run(request(Frontend::kGrpc));
  ASSERT_TRUE(length.result.status.ok()) << length.result.status;
  ASSERT_EQ(length.result.finish_reason, FinishReason::kLength);
  ASSERT_EQ(length.result.completion_tokens, 6u);
  // The same greedy run on HTTP, stopped by the text of its third token.
  size_t k = 2;
  while (k < length.texts.size() && length.texts[k].empty()) ++k;
  ASSERT_LT(k, length.texts.size()) << "the tiny model streamed no text to stop on";
  session::GenerationRequest stop_req = request(Frontend::kHttp);
  stop_req.stop = {length.texts[k]};
  const Run stop = run(stop_req);
  ASSERT_EQ(stop.result.finish_reason, FinishReason::kStop);
  ASSERT_GT(stop.result.completion_tokens, 0u);
  ASSERT_LE(stop.result.completion_tokens, k + 1);
  // Past its deadline at admission: cancelled with DEADLINE_EXCEEDED, no token.
  session::GenerationRequest late_req = request(Frontend::kHttp);
  late_req.deadline = session::Clock::now() - std::chrono::seconds(1);
  const Run late = run(late_req);
  ASSERT_EQ(late.result.finish_reason, FinishReason::kCancelled);
  ASSERT_EQ(late.result.status.code(), absl::StatusCode::kDeadlineExceeded);
  ASSERT_EQ(late.result.completion_tokens, 0u);
  // Sampling parameters the plan accepted but the session's sampler refuses
  // (planned, then changed: the engine trusts its plan) fail at admission.
  {
    auto lease = store_->Create(*model_, F32(), 0);
    ASSERT_TRUE(lease.ok()) << lease.status();
    session::GenerationRequest bad = request(Frontend::kGrpc);
    const session::PlanLimits limits{.max_tokens = 64, .max_context = engine.max_context()};
    auto plan = session::PlanRequest(bad, limits, config(),
                                     session::ExistingSession{0, (*lease)->config()});
    ASSERT_TRUE(plan.ok()) << plan.status();
    bad.sampling.top_p = 2;
    auto job = engine.Submit(*std::move(lease), bad, *plan);
    ASSERT_TRUE(job.ok()) << job.status();
    session::GenerationEvent ev;
    while ((*job)->WaitPop(&ev)) {
    }
    ASSERT_EQ((*job)->result().status.code(), absl::StatusCode::kInvalidArgument);
  }
  engine.Shutdown();

  Exposition e = Scrape();
  EXPECT_EQ(FinishedCount(e, "grpc", "length"), 1);
  EXPECT_EQ(FinishedCount(e, "grpc", "error"), 1);
  EXPECT_EQ(FinishedCount(e, "http", "stop"), 1);
  EXPECT_EQ(FinishedCount(e, "http", "cancelled"), 1);
  double all = 0;
  for (const Sample* s : e.All("cortiq_requests_finished_total")) all += s->value;
  EXPECT_EQ(all, 4);

  // Latency: one TTFT per job with a token, n − 1 inter-token gaps. (Sums
  // compare as doubles: the exposition prints 16 significant digits.)
  const GenerationResult& g = length.result;
  const GenerationResult& h = stop.result;
  EXPECT_EQ(e.Value("cortiq_time_to_first_token_seconds_count", kGrpc), 1);
  EXPECT_DOUBLE_EQ(e.Value("cortiq_time_to_first_token_seconds_sum", kGrpc), g.ttft_seconds);
  EXPECT_EQ(e.Value("cortiq_time_to_first_token_seconds_count", kHttp), 1);
  EXPECT_DOUBLE_EQ(e.Value("cortiq_time_to_first_token_seconds_sum", kHttp), h.ttft_seconds);
  EXPECT_EQ(e.Value("cortiq_inter_token_latency_seconds_count", kGrpc), 5);
  EXPECT_EQ(e.Value("cortiq_inter_token_latency_seconds_count", kHttp),
            static_cast<double>(h.completion_tokens - 1));
  // Queue / prefill / decode: the jobs with a token, from their results.
  for (const auto& [labels, r] : {std::pair{kGrpc, g}, std::pair{kHttp, h}}) {
    EXPECT_EQ(e.Value("cortiq_request_queue_time_seconds_count", labels), 1);
    EXPECT_DOUBLE_EQ(e.Value("cortiq_request_queue_time_seconds_sum", labels), r.queue_seconds);
    EXPECT_DOUBLE_EQ(e.Value("cortiq_request_prefill_time_seconds_sum", labels),
              r.ttft_seconds - r.queue_seconds);
    EXPECT_DOUBLE_EQ(e.Value("cortiq_request_decode_time_seconds_sum", labels),
              r.total_seconds - r.ttft_seconds);
    EXPECT_GT(r.queue_seconds, 0);
    EXPECT_GE(r.ttft_seconds, r.queue_seconds);
    EXPECT_GE(r.total_seconds, r.ttft_seconds);
  }
  // Tokens per request: every finished job (the late one with 0 generated).
  EXPECT_EQ(e.Value("cortiq_request_prompt_tokens_count", kGrpc), 2);
  EXPECT_EQ(e.Value("cortiq_request_prompt_tokens_sum", kGrpc), 2.0 * prompt.size());
  EXPECT_EQ(e.Value("cortiq_request_prompt_tokens_count", kHttp), 2);
  EXPECT_EQ(e.Value("cortiq_request_generation_tokens_sum", kGrpc), 6);
  EXPECT_EQ(e.Value("cortiq_request_generation_tokens_sum", kHttp),
            static_cast<double>(h.completion_tokens));
  EXPECT_EQ(e.Value("cortiq_request_generation_tokens_bucket", {{"frontend", "http"}, {"le", "1"}}),
            h.completion_tokens <= 1 ? 2 : 1);  // the late job's 0
  EXPECT_EQ(e.Value("cortiq_generated_tokens_total"),
            static_cast<double>(g.completion_tokens + h.completion_tokens));
}

// HTTP requests by route pattern and status: listed statuses by their code,
// others by class; unknown routes as "other"; nonsense statuses ignored.
TEST_F(MetricsTest, HttpRequestsByRouteAndStatus) {
  metrics_->ObserveHttpRequest("/v1/chat/completions", 200, 0.5);
  metrics_->ObserveHttpRequest("/v1/chat/completions", 200, 1.5);
  metrics_->ObserveHttpRequest("/v1/chat/completions", 429, 0.001);
  metrics_->ObserveHttpRequest("/v1/completions", 400, 0.002);
  metrics_->ObserveHttpRequest("/health", 503, 0.0001);
  metrics_->ObserveHttpRequest("/v1/secret/../x", 404, 0.003);  // a client's path: "other"
  metrics_->ObserveHttpRequest("/v1/models", 418, 0.004);       // not listed: its class
  metrics_->ObserveHttpRequest("/v1/models", 99, 1);            // ignored
  metrics_->ObserveHttpRequest("/v1/models", 600, 1);           // ignored

  Exposition e = Scrape();
  auto count = [&](const char* route, const char* status) {
    return e.Value("cortiq_http_requests_total", {{"route", route}, {"status", status}});
  };
  EXPECT_EQ(count("/v1/chat/completions", "200"), 2);
  EXPECT_EQ(count("/v1/chat/completions", "429"), 1);
  EXPECT_EQ(count("/v1/completions", "400"), 1);
  EXPECT_EQ(count("/health", "503"), 1);
  EXPECT_EQ(count("other", "404"), 1);
  EXPECT_EQ(count("/v1/models", "4xx"), 1);
  EXPECT_EQ(count("/v1/models", "200"), 0);
  const auto all = e.All("cortiq_http_requests_total");
  EXPECT_EQ(all.size(), kNumHttpRoutes * kNumHttpStatusLabels);
  double total = 0;
  for (const Sample* s : all) {
    total += s->value;
    EXPECT_NE(s->labels.at("route"), "/v1/secret/../x");
  }
  EXPECT_EQ(total, 7);
  EXPECT_EQ(e.type["cortiq_http_requests_total"], "counter");

  EXPECT_EQ(e.type["cortiq_http_request_duration_seconds"], "histogram");
  EXPECT_EQ(e.All("cortiq_http_request_duration_seconds_count").size(), kNumHttpRoutes);
  EXPECT_EQ(e.Value("cortiq_http_request_duration_seconds_count",
                    {{"route", "/v1/chat/completions"}}),
            3);
  EXPECT_DOUBLE_EQ(
      e.Value("cortiq_http_request_duration_seconds_sum", {{"route", "/v1/chat/completions"}}),
      2.001);
  EXPECT_EQ(e.Value("cortiq_http_request_duration_seconds_bucket",
                    {{"route", "/v1/chat/completions"}, {"le", "1"}}),
            2);
  EXPECT_EQ(e.Value("cortiq_http_request_duration_seconds_count", {{"route", "other"}}), 1);
  EXPECT_EQ(e.Value("cortiq_http_request_duration_seconds_count", {{"route", "/v1/models"}}), 1);
}

// The utilisation ratio: committed over the budget; with no budget over the
// configured capacity; with neither, not exported.
TEST_F(MetricsTest, MemoryUtilizationRatio) {
  SessionStore::Lease l = NewSession(F32(), 40);
  ASSERT_TRUE(l);
  Exposition e = Scrape();
  const double committed = e.Value("cortiq_memory_committed_bytes");
  ASSERT_GT(committed, 0);
  EXPECT_EQ(e.type["cortiq_memory_utilization_ratio"], "gauge");
  EXPECT_DOUBLE_EQ(e.Value("cortiq_memory_utilization_ratio"),
                   committed / static_cast<double>(size_t{64} << 20));

  for (const size_t capacity : {size_t{1} << 30, size_t{0}}) {
    SessionStore unbudgeted(session::StoreOptions{.max_sessions = 2});
    MetricsSources sources;
    sources.store = &unbudgeted;
    sources.memory_capacity_bytes = capacity;
    auto m = Metrics::Create(sources);
    ASSERT_TRUE(m.ok()) << m.status();
    auto http = MetricsServer::Start("127.0.0.1:0", **m);
    ASSERT_TRUE(http.ok()) << http.status();
    auto lease = unbudgeted.Create(*model_, F32(), 4096);
    ASSERT_TRUE(lease.ok()) << lease.status();
    const Exposition u = Parse(HttpGet((*http)->port()));
    ASSERT_EQ(u.Value("cortiq_memory_committed_bytes"), 4096);
    if (capacity > 0) {
      EXPECT_DOUBLE_EQ(u.Value("cortiq_memory_utilization_ratio"),
                       4096.0 / static_cast<double>(capacity));
    } else {
      EXPECT_FALSE(u.Get("cortiq_memory_utilization_ratio").has_value());
    }
    lease->Return();
    http->reset();
  }
  // The default capacity is the machine's memory (/proc/meminfo).
  const std::optional<size_t> mem = MachineMemoryBytes();
  ASSERT_TRUE(mem.has_value());
  EXPECT_GT(*mem, size_t{64} << 20);
  EXPECT_EQ(*mem % 1024, 0u);
}

// promtool lints the whole exposition: names, units, _total, HELP.
TEST_F(MetricsTest, PromtoolCheckMetricsIsSilent) {
  const char* promtool = "/usr/bin/promtool";
  if (access(promtool, X_OK) != 0) GTEST_SKIP() << promtool << " is not installed";
  SessionStore::Lease l = NewSession(O1(), 64);
  ASSERT_TRUE(l);
  metrics_->CountRequest("Generate", 0);
  metrics_->OnFirstToken(Frontend::kHttp, 0.1);
  metrics_->OnFinish(Frontend::kHttp, FinishReason::kStop, absl::OkStatus(),
                     Result(4, 2, 0.001, 0.1, 0.2));
  metrics_->ObserveHttpRequest("/v1/chat/completions", 200, 0.2);
  metrics_->OnStep(2, 0, 0.003);
  const std::string text = HttpGet(http_->port());
  ASSERT_FALSE(text.empty());

  const std::string path = absl::StrCat(::testing::TempDir(), "/cortiq_metrics_", getpid(), ".txt");
  {
    std::ofstream f(path, std::ios::binary);
    f << text;
  }
  const std::string cmd = absl::StrCat(promtool, " check metrics < '", path, "' 2>&1");
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[512];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), p)) > 0;) out.append(buf, n);
  const int status = pclose(p);
  std::filesystem::remove(path);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status << "\n" << out;
  EXPECT_EQ(out, "") << text;
}

// Port 0 binds a free port; a taken port is UNAVAILABLE naming the address.
TEST_F(MetricsTest, PortInUseIsUnavailable) {
  const std::string taken = absl::StrCat("127.0.0.1:", http_->port());
  auto second = MetricsServer::Start(taken, *metrics_);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find(taken), std::string::npos) << second.status();
  EXPECT_EQ(MetricsServer::Start("", *metrics_).status().code(),
            absl::StatusCode::kInvalidArgument);
  // The first server still serves.
  EXPECT_FALSE(HttpGet(http_->port()).empty());
}

// No sources: only the hot-path families.
TEST(MetricsNoSources, OnlyEventFamilies) {
  auto m = Metrics::Create({});
  ASSERT_TRUE(m.ok()) << m.status();
  auto http = MetricsServer::Start("127.0.0.1:0", **m);
  ASSERT_TRUE(http.ok()) << http.status();
  Exposition e = Parse(HttpGet((*http)->port()));
  EXPECT_TRUE(e.All("cortiq_session_memory_bytes").empty());
  EXPECT_TRUE(e.All("cortiq_engine_batch_size").empty());
  EXPECT_TRUE(e.All("cortiq_engine_waiting_jobs").empty());
  EXPECT_TRUE(e.All("cortiq_engine_step_rows").empty());
  EXPECT_EQ(e.All("cortiq_queue_wait_seconds_count").size(),
            session::kNumFrontends * session::kNumPriorities);
  EXPECT_EQ(e.All("cortiq_engine_step_tokens_total").size(), 2u);
  EXPECT_TRUE(e.All("cortiq_qsa_backend_live_bytes").empty());
  EXPECT_TRUE(e.All("cortiq_model_weight_bytes").empty());
  EXPECT_EQ(e.All("cortiq_requests_total").size(), kNumRpcs * kNumGrpcCodes);
  EXPECT_EQ(e.Value("cortiq_build_info", {{"version", "unknown"}, {"model", "unknown"}}), 1);
}

// The hot path allocates nothing (every child exists from start-up).
TEST(MetricsHotPath, NoAllocation) {
  auto m = Metrics::Create({});
  ASSERT_TRUE(m.ok()) << m.status();
  Metrics& metrics = **m;
  const GenerationResult result = Result(3, 4, 0.01, 0.5, 0.6);
  const absl::Status failed = absl::InternalError("model error");
  metrics.CountRequest("Generate", 0);  // warm anything lazy
  const size_t before = testing::AllocCount();
  for (int i = 0; i < 100; ++i) {
    metrics.CountRequest(kRpcNames[static_cast<size_t>(i) % kNumRpcs],
                         i % static_cast<int>(kNumGrpcCodes));
    metrics.CountRequest("unknown", 0);
    metrics.ObserveRequest("MigrateSession", 0.001 * i);
    metrics.OnStep(static_cast<size_t>(i % 9), 3, 0.002);
    metrics.OnFirstToken(Frontend::kHttp, 0.5);
    metrics.OnInterToken(Frontend::kGrpc, 0.01);
    metrics.OnQueueWait(Frontend::kHttp, static_cast<session::Priority>(i % 3), 0.001 * i);
    metrics.OnFinish(Frontend::kGrpc, FinishReason::kEos, absl::OkStatus(), result);
    metrics.OnFinish(Frontend::kHttp, FinishReason::kNone, failed, result);
    metrics.ObserveHttpRequest("/v1/completions", 200 + i, 0.01);
    metrics.ObserveHttpRequest("/unknown/path", 404, 0.01);
    metrics.CountExportRefused(ExportRefusal::kImportance);
    metrics.CountMigration(MigrationDirection::kIn, MigrationResult::kOk);
  }
  EXPECT_EQ(testing::AllocCount(), before);
}

TEST(MetricsNames, RpcIndexAndRefusalNames) {
  EXPECT_EQ(RpcIndex("Generate"), 0u);
  EXPECT_EQ(RpcIndex("MigrateSession"), 9u);
  EXPECT_EQ(RpcIndex("Drain"), kNumRpcs - 1);
  EXPECT_FALSE(RpcIndex("generate").has_value());
  EXPECT_EQ(kGrpcCodeNames[9], "FAILED_PRECONDITION");
  EXPECT_EQ(kGrpcCodeNames[16], "UNAUTHENTICATED");
  EXPECT_EQ(ExportRefusalName(ExportRefusal::kO1Overlay), "o1_overlay");
  EXPECT_EQ(ExportRefusalName(ExportRefusal::kOther), "other");
}

TEST(MetricsNames, FinishHttpRouteAndStatusLabels) {
  const absl::Status ok = absl::OkStatus();
  const absl::Status failed = absl::InternalError("x");
  auto label = [](FinishReason r, const absl::Status& s) {
    return kFinishLabels[FinishLabelIndex(r, s)];
  };
  EXPECT_EQ(label(FinishReason::kLength, ok), "length");
  EXPECT_EQ(label(FinishReason::kStop, ok), "stop");
  EXPECT_EQ(label(FinishReason::kEos, ok), "eos");
  EXPECT_EQ(label(FinishReason::kCancelled, ok), "cancelled");
  EXPECT_EQ(label(FinishReason::kCancelled, absl::DeadlineExceededError("d")), "cancelled");
  EXPECT_EQ(label(FinishReason::kNone, ok), "error");
  EXPECT_EQ(label(FinishReason::kNone, failed), "error");
  EXPECT_EQ(label(FinishReason::kLength, failed), "error");
  EXPECT_EQ(session::FrontendName(Frontend::kGrpc), "grpc");
  EXPECT_EQ(session::FrontendName(Frontend::kHttp), "http");
  EXPECT_EQ(session::GenerationRequest{}.frontend, Frontend::kGrpc);

  EXPECT_EQ(kHttpRoutes[HttpRouteIndex("/v1/chat/completions")], "/v1/chat/completions");
  EXPECT_EQ(kHttpRoutes[HttpRouteIndex("/health")], "/health");
  EXPECT_EQ(kHttpRoutes[HttpRouteIndex("/v1/chat/completions/")], "other");
  EXPECT_EQ(kHttpRoutes[HttpRouteIndex("other")], "other");
  EXPECT_EQ(kHttpRoutes[HttpRouteIndex("")], "other");
  EXPECT_EQ(HttpStatusIndex(200), 0u);
  EXPECT_EQ(HttpStatusIndex(504), kNumHttpStatuses - 1);
  EXPECT_EQ(HttpStatusIndex(100), kNumHttpStatuses + 0);  // "1xx"
  EXPECT_EQ(HttpStatusIndex(302), kNumHttpStatuses + 2);  // "3xx"
  EXPECT_EQ(HttpStatusIndex(599), kNumHttpStatuses + 4);  // "5xx"
  EXPECT_FALSE(HttpStatusIndex(99).has_value());
  EXPECT_FALSE(HttpStatusIndex(600).has_value());
  EXPECT_FALSE(HttpStatusIndex(-200).has_value());
}

}  // namespace
}  // namespace cortiq::server
