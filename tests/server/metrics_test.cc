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
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/kv/wire_refusal.h"
#include "core/model/transformer.h"
#include "core/session/engine.h"
#include "core/session/session.h"
#include "core/session/session_store.h"
#include "core/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "tests/common/alloc_counter.h"
#include "tests/common/model_test_util.h"
#include "tests/common/prom_text.h"

namespace cortiq::server {
namespace {

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
            static_cast<double>(model_->WeightBytesPerStep()));
  EXPECT_GT(e.Value("cortiq_model_weight_bytes", {{"copy", "checkpoint"}}), 0);
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
  metrics_->OnFirstToken(0.3);
  metrics_->OnInterToken(0.02);
  metrics_->OnInterToken(0.04);
  metrics_->OnStep(3, 0, 0.01);
  metrics_->OnStep(0, 16, 0.05);  // prefill only: no batch size
  metrics_->OnTokens(5, 7);
  metrics_->OnTokens(2, 0);
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
  EXPECT_EQ(e.Value("cortiq_time_to_first_token_seconds_count"), 1);
  EXPECT_DOUBLE_EQ(e.Value("cortiq_time_to_first_token_seconds_sum"), 0.3);
  EXPECT_EQ(e.Value("cortiq_time_to_first_token_seconds_bucket", {{"le", "0.25"}}), 0);
  EXPECT_EQ(e.Value("cortiq_time_to_first_token_seconds_bucket", {{"le", "0.5"}}), 1);
  EXPECT_EQ(e.Value("cortiq_time_to_first_token_seconds_bucket", {{"le", "+Inf"}}), 1);
  EXPECT_EQ(e.Value("cortiq_inter_token_latency_seconds_count"), 2);
  EXPECT_DOUBLE_EQ(e.Value("cortiq_inter_token_latency_seconds_sum"), 0.06);
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
  EXPECT_EQ(families, 24u);  // docs/METRICS.md lists 28; no engine attached here (4)
  const std::set<std::string> allowed = {"kind",   "reason",  "rpc",   "code", "le",    "direction",
                                         "result", "version", "model", "copy", "tenant"};
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
  EXPECT_EQ(e.Value("cortiq_time_to_first_token_seconds_count"), 1);
  EXPECT_DOUBLE_EQ(e.Value("cortiq_time_to_first_token_seconds_sum"), r.ttft_seconds);
  EXPECT_EQ(e.Value("cortiq_inter_token_latency_seconds_count"), 5);
  EXPECT_EQ(e.Value("cortiq_generated_tokens_total"), 6);
  EXPECT_EQ(e.Value("cortiq_prompt_tokens_total"), static_cast<double>(r.prompt_tokens));
  EXPECT_EQ(e.Value("cortiq_engine_steps_total"), static_cast<double>(engine.steps()));
  EXPECT_EQ(e.Value("cortiq_engine_step_seconds_count"), static_cast<double>(engine.steps()));
  EXPECT_GE(e.Value("cortiq_engine_step_batch_size_count"), 5);
  EXPECT_EQ(e.Value("cortiq_engine_active_jobs"), 0);
  EXPECT_EQ(e.Value("cortiq_engine_queue_depth"), 0);
  EXPECT_EQ(e.Value("cortiq_engine_batch_size"), static_cast<double>(engine.last_batch()));
  EXPECT_EQ(e.type["cortiq_engine_steps_total"], "counter");
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
}

// promtool lints the whole exposition: names, units, _total, HELP.
TEST_F(MetricsTest, PromtoolCheckMetricsIsSilent) {
  const char* promtool = "/usr/bin/promtool";
  if (access(promtool, X_OK) != 0) GTEST_SKIP() << promtool << " is not installed";
  SessionStore::Lease l = NewSession(O1(), 64);
  ASSERT_TRUE(l);
  metrics_->CountRequest("Generate", 0);
  metrics_->OnFirstToken(0.1);
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
  metrics.CountRequest("Generate", 0);  // warm anything lazy
  const size_t before = testing::AllocCount();
  for (int i = 0; i < 100; ++i) {
    metrics.CountRequest(kRpcNames[static_cast<size_t>(i) % kNumRpcs],
                         i % static_cast<int>(kNumGrpcCodes));
    metrics.CountRequest("unknown", 0);
    metrics.ObserveRequest("MigrateSession", 0.001 * i);
    metrics.OnStep(static_cast<size_t>(i % 9), 3, 0.002);
    metrics.OnFirstToken(0.5);
    metrics.OnInterToken(0.01);
    metrics.OnTokens(3, 4);
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

}  // namespace
}  // namespace cortiq::server
