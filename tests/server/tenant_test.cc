// Roles and tenants end to end: a real server on loopback with a token file
// (two client tenants, an admin, a peer). A client sees only its own
// sessions — another tenant's session answers every RPC exactly as an
// unknown id does — and is refused the admin RPCs; admin sees every
// tenant's; a peer acts for the caller it names. The per-tenant gauges sum
// exactly to the totals and go back to 0; the token file is re-read by the
// SIGHUP path; log lines name tenant and role, never a token.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/session/session_store.h"
#include "cortiq/v1/inference.grpc.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/log_format.h"
#include "server/server.h"
#include "spdlog/spdlog.h"
#include "tests/common/log_capture.h"
#include "tests/common/prom_text.h"
#include "tests/common/raw_call.h"
#include "tests/common/server_test_util.h"

namespace cortiq::server {
namespace {

namespace v1 = ::cortiq::v1;
using grpc::StatusCode;

constexpr char kAlice[] = "alice-token-0123456789";
constexpr char kBob[] = "bob-token-0123456789ab";
constexpr char kOps[] = "ops-token-0123456789ab";
constexpr char kPeer[] = "peer-token-0123456789a";
constexpr char kCarol[] = "carol-token-0123456789";

std::string TokenFileText(bool with_bob, bool with_carol) {
  std::string s = absl::StrCat("# tenant_test\nalice client ", kAlice, "\nops admin ", kOps,
                               "\ncluster peer ", kPeer, "\n");
  if (with_bob) absl::StrAppend(&s, "bob client ", kBob, "\n");
  if (with_carol) absl::StrAppend(&s, "carol client ", kCarol, "\n");
  return s;
}

// A call's context carrying `token` (and x-cortiq-on-behalf-of when given).
struct Ctx {
  explicit Ctx(std::string_view token, std::string_view on_behalf_of = {}) {
    c.AddMetadata("authorization", absl::StrCat("Bearer ", std::string(token)));
    if (!on_behalf_of.empty()) c.AddMetadata(kOnBehalfOfHeader, std::string(on_behalf_of));
    c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  }
  grpc::ClientContext c;
};

// (code, message with `id` replaced by "ID"): what must be equal for a
// hidden and an unknown session.
std::pair<StatusCode, std::string> Shape(const grpc::Status& st, const std::string& id) {
  std::string m = st.error_message();
  const size_t at = m.find(id);
  if (at != std::string::npos) m.replace(at, id.size(), "ID");
  return {st.error_code(), m};
}

class TenantTest : public ::testing::Test {
 protected:
  void SetUp() override {
    token_file_ = std::filesystem::temp_directory_path() /
                  absl::StrCat("cortiq_tenant_test_", getpid(), ".tokens");
    WriteTokens(TokenFileText(/*with_bob=*/true, /*with_carol=*/false));
    ServerConfig c;
    c.model_dir = DefaultModelDir();
    c.grace = std::chrono::milliseconds(0);
    c.auth_tokens_file = token_file_.string();
    c.listen = "127.0.0.1:0";
    c.metrics_listen = "127.0.0.1:0";
    c.threads = 1;
    auto s = Server::Start(c);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    const std::string addr = absl::StrCat("127.0.0.1:", server_->port());
    channel_ = grpc::CreateChannel(addr, grpc::InsecureChannelCredentials());
    stub_ = v1::Inference::NewStub(channel_);
  }
  void TearDown() override {
    server_.reset();
    std::filesystem::remove(token_file_);
  }
  void WriteTokens(const std::string& text) {
    std::ofstream(token_file_, std::ios::trunc) << text;
    std::filesystem::permissions(
        token_file_, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  }

  // A kept session of `token`'s tenant after one turn; its id.
  std::string Open(std::string_view token) {
    v1::GenerateRequest r;
    r.set_prompt("Call me Ishmael.");
    r.set_max_tokens(4);
    r.set_ignore_eos(true);
    r.set_keep_session(true);
    const testing::StreamOut o = Generate(token, r);
    EXPECT_TRUE(o.status.ok()) << o.status.error_message();
    return o.session;
  }
  testing::StreamOut Generate(std::string_view token, const v1::GenerateRequest& r) {
    return testing::RunGenerate(*stub_, r, std::string(token));
  }
  grpc::Status Continue(std::string_view token, const std::string& id) {
    v1::GenerateRequest r;
    r.set_session_id(id);
    r.set_prompt(" more");
    r.set_max_tokens(2);
    r.set_keep_session(true);
    return Generate(token, r).status;
  }
  grpc::Status Get(std::string_view token, const std::string& id, v1::SessionInfo* info = nullptr,
                   std::string_view on_behalf_of = {}) {
    Ctx ctx(token, on_behalf_of);
    v1::GetSessionRequest req;
    req.set_session_id(id);
    v1::SessionInfo scratch;
    return stub_->GetSession(&ctx.c, req, info ? info : &scratch);
  }
  std::vector<v1::SessionInfo> List(std::string_view token, std::string_view on_behalf_of = {},
                                    v1::ListSessionsResponse* out = nullptr) {
    Ctx ctx(token, on_behalf_of);
    v1::ListSessionsResponse resp;
    const grpc::Status st = stub_->ListSessions(&ctx.c, {}, &resp);
    EXPECT_TRUE(st.ok()) << st.error_message();
    if (out) *out = resp;
    return {resp.sessions().begin(), resp.sessions().end()};
  }
  grpc::Status Release(std::string_view token, const std::string& id,
                       v1::ReleaseSessionResponse* resp) {
    Ctx ctx(token);
    v1::ReleaseSessionRequest req;
    req.set_session_id(id);
    return stub_->ReleaseSession(&ctx.c, req, resp);
  }
  grpc::Status Export(std::string_view token, const std::string& id, std::string* bytes) {
    Ctx ctx(token);
    v1::ExportSessionRequest req;
    req.set_session_id(id);
    auto reader = stub_->ExportSession(&ctx.c, req);
    v1::WireChunk chunk;
    while (reader->Read(&chunk)) *bytes += chunk.data();
    return reader->Finish();
  }
  grpc::Status Import(std::string_view token, const std::string& bytes) {
    Ctx ctx(token);
    v1::ImportSessionResponse resp;
    auto writer = stub_->ImportSession(&ctx.c, &resp);
    if (!bytes.empty()) {
      v1::WireChunk chunk;
      chunk.set_data(bytes);
      writer->Write(chunk);
    }
    writer->WritesDone();
    return writer->Finish();
  }
  grpc::Status ModelInfo(std::string_view token) {
    Ctx ctx(token);
    v1::ModelInfo info;
    return stub_->GetModelInfo(&ctx.c, {}, &info);
  }

  std::filesystem::path token_file_;
  std::unique_ptr<Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Inference::Stub> stub_;
};

TEST_F(TenantTest, AClientSeesOnlyItsOwnSessionsAndNoOracle) {
  // alice: one session from CreateSession, one from a kept Generate.
  v1::SessionInfo created;
  {
    Ctx ctx(kAlice);
    ASSERT_TRUE(stub_->CreateSession(&ctx.c, {}, &created).ok());
  }
  EXPECT_EQ(created.tenant(), "alice");
  const std::string a1 = created.session_id(), a2 = Open(kAlice), b1 = Open(kBob);
  const std::string unknown = session::SessionStore::RandomId();

  for (const std::string& a : {a1, a2}) {
    SCOPED_TRACE(a);
    v1::SessionInfo info;
    ASSERT_TRUE(Get(kAlice, a, &info).ok());
    EXPECT_EQ(info.tenant(), "alice");
    // bob: every session RPC answers as for an id that exists nowhere.
    const auto missing = Shape(Get(kBob, unknown), unknown);
    EXPECT_EQ(missing.first, StatusCode::NOT_FOUND);
    EXPECT_EQ(Shape(Get(kBob, a), a), missing);
    const auto gen_missing = Shape(Continue(kBob, unknown), unknown);
    EXPECT_EQ(gen_missing.first, StatusCode::NOT_FOUND);
    EXPECT_EQ(Shape(Continue(kBob, a), a), gen_missing);
    std::string bytes;
    const auto export_missing = Shape(Export(kBob, unknown, &bytes), unknown);
    EXPECT_EQ(export_missing.first, StatusCode::NOT_FOUND);
    EXPECT_EQ(Shape(Export(kBob, a, &bytes), a), export_missing);
    EXPECT_TRUE(bytes.empty());
    v1::ReleaseSessionResponse rel_unknown, rel_hidden;
    ASSERT_TRUE(Release(kBob, unknown, &rel_unknown).ok());
    ASSERT_TRUE(Release(kBob, a, &rel_hidden).ok());
    EXPECT_EQ(rel_hidden.SerializeAsString(), rel_unknown.SerializeAsString());
    EXPECT_FALSE(rel_hidden.released());
    // ... and the session is untouched: alice continues it.
    EXPECT_TRUE(Continue(kAlice, a).ok());
  }

  // List: each client its own, with its own total; admin every tenant's.
  v1::ListSessionsResponse bob_list;
  const std::vector<v1::SessionInfo> bobs = List(kBob, {}, &bob_list);
  ASSERT_EQ(bobs.size(), 1u);
  EXPECT_EQ(bobs[0].session_id(), b1);
  EXPECT_EQ(bobs[0].tenant(), "bob");
  EXPECT_EQ(bob_list.total_memory().total_bytes(), bobs[0].memory().total_bytes());
  EXPECT_EQ(List(kAlice).size(), 2u);
  std::map<std::string, std::string> all;
  for (const v1::SessionInfo& s : List(kOps)) all[s.session_id()] = s.tenant();
  EXPECT_EQ(all, (std::map<std::string, std::string>{{a1, "alice"}, {a2, "alice"}, {b1, "bob"}}));

  // Admin reads and exports any tenant's; a client exports its own.
  EXPECT_TRUE(Get(kOps, a1).ok());
  std::string bytes;
  EXPECT_TRUE(Export(kOps, b1, &bytes).ok());
  EXPECT_FALSE(bytes.empty());
  bytes.clear();
  EXPECT_TRUE(Export(kAlice, a2, &bytes).ok());
  EXPECT_FALSE(bytes.empty());

  // Releases: alice her own, admin bob's.
  v1::ReleaseSessionResponse r;
  ASSERT_TRUE(Release(kAlice, a1, &r).ok());
  EXPECT_TRUE(r.released());
  ASSERT_TRUE(Release(kOps, b1, &r).ok());
  EXPECT_TRUE(r.released());
  EXPECT_EQ(server_->store().num_sessions(), 1u);
}

TEST_F(TenantTest, RolesAreRefusedWhatTheyMayNotCall) {
  const std::string a = Open(kAlice);
  // A client: no Drain, MigrateSession or ImportSession — PERMISSION_DENIED
  // naming the RPC and the role, before the request is even parsed.
  {
    Ctx ctx(kAlice);
    v1::DrainResponse resp;
    const grpc::Status st = stub_->Drain(&ctx.c, {}, &resp);
    EXPECT_EQ(st.error_code(), StatusCode::PERMISSION_DENIED);
    EXPECT_EQ(st.error_message(), "Drain: the client role may not call it (allowed: admin)");
  }
  {
    Ctx ctx(kAlice);
    v1::MigrateSessionRequest req;
    req.set_session_id(a);
    req.set_peer("127.0.0.1:1");
    v1::MigrateSessionResponse resp;
    const grpc::Status st = stub_->MigrateSession(&ctx.c, req, &resp);
    EXPECT_EQ(st.error_code(), StatusCode::PERMISSION_DENIED);
    EXPECT_EQ(st.error_message(),
              "MigrateSession: the client role may not call it (allowed: admin)");
  }
  const grpc::Status import = Import(kAlice, "");
  EXPECT_EQ(import.error_code(), StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(import.error_message(),
            "ImportSession: the client role may not call it (allowed: peer, admin)");
  grpc::GenericStub raw(channel_);
  const grpc::Status garbage =
      testing::CallRaw(raw, "/cortiq.v1.Inference/Drain", {"\xff\xff\xff"}, kAlice);
  EXPECT_EQ(garbage.error_code(), StatusCode::PERMISSION_DENIED) << garbage.error_message();
  EXPECT_TRUE(Get(kAlice, a).ok());  // nothing moved, nothing drained
  EXPECT_TRUE(ModelInfo(kAlice).ok());

  // A peer on its own: GetModelInfo and ImportSession only.
  EXPECT_TRUE(ModelInfo(kPeer).ok());
  const grpc::Status peer_get = Get(kPeer, a);
  EXPECT_EQ(peer_get.error_code(), StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(peer_get.error_message(),
            "GetSession: the peer role may not call it (allowed: client, admin)");
  std::string bytes;
  ASSERT_TRUE(Export(kAlice, a, &bytes).ok());
  // The stream carries the session's id: it comes back under it once
  // released here (a session lives in one place).
  EXPECT_EQ(Import(kPeer, bytes).error_code(), StatusCode::ALREADY_EXISTS);
  v1::ReleaseSessionResponse released;
  ASSERT_TRUE(Release(kAlice, a, &released).ok());
  EXPECT_TRUE(Import(kPeer, bytes).ok());
  EXPECT_TRUE(Get(kAlice, a).ok());  // alice's again: the tenant travelled

  // No token, an unknown one: UNAUTHENTICATED as before.
  {
    grpc::ClientContext ctx;
    v1::ModelInfo info;
    EXPECT_EQ(stub_->GetModelInfo(&ctx, {}, &info).error_code(), StatusCode::UNAUTHENTICATED);
  }
  EXPECT_EQ(ModelInfo("not-a-token-0123456789").error_code(), StatusCode::UNAUTHENTICATED);
}

TEST_F(TenantTest, APeerActsForTheCallerItNamesAndNobodyElseCan) {
  const std::string a = Open(kAlice), b = Open(kBob);
  v1::SessionInfo info;
  EXPECT_TRUE(Get(kPeer, a, &info, "alice;client").ok());
  EXPECT_EQ(info.tenant(), "alice");
  EXPECT_EQ(Get(kPeer, b, nullptr, "alice;client").error_code(), StatusCode::NOT_FOUND);
  std::vector<v1::SessionInfo> seen = List(kPeer, "alice;client");
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].session_id(), a);
  EXPECT_EQ(List(kPeer, "ops;admin").size(), 2u);
  EXPECT_EQ(Get(kPeer, a, nullptr, "alice;root").error_code(), StatusCode::INVALID_ARGUMENT);
  // A client naming someone else is still itself.
  seen = List(kAlice, "bob;client");
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].session_id(), a);
  EXPECT_EQ(Get(kAlice, b, nullptr, "ops;admin").error_code(), StatusCode::NOT_FOUND);
}

TEST_F(TenantTest, TenantGaugesSumExactlyAndReturnToZero) {
  const std::string a1 = Open(kAlice), a2 = Open(kAlice), b1 = Open(kBob), o1 = Open(kOps);
  std::map<std::string, double> want_bytes;
  for (const auto& [id, tenant] : std::vector<std::pair<std::string, std::string>>{
           {a1, "alice"}, {a2, "alice"}, {b1, "bob"}, {o1, "ops"}}) {
    v1::SessionInfo info;
    ASSERT_TRUE(Get(kOps, id, &info).ok());
    want_bytes[tenant] += static_cast<double>(info.memory().total_bytes());
  }
  testing::Exposition e = testing::Scrape(server_->metrics_port());
  auto sessions = [&](const std::string& t) {
    return e.Value("cortiq_tenant_sessions", {{"tenant", t}});
  };
  auto bytes = [&](const std::string& t) {
    return e.Value("cortiq_tenant_session_memory_bytes", {{"tenant", t}});
  };
  EXPECT_EQ(sessions("alice"), 2);
  EXPECT_EQ(sessions("bob"), 1);
  EXPECT_EQ(sessions("ops"), 1);
  EXPECT_EQ(sessions("cluster"), 0);
  EXPECT_EQ(sessions(""), 0);
  EXPECT_GT(want_bytes["alice"], 0);
  for (const char* t : {"alice", "bob", "ops"}) EXPECT_EQ(bytes(t), want_bytes[t]) << t;
  double sum_bytes = 0, sum_sessions = 0;
  for (const testing::Sample* s : e.All("cortiq_tenant_session_memory_bytes"))
    sum_bytes += s->value;
  for (const testing::Sample* s : e.All("cortiq_tenant_sessions")) sum_sessions += s->value;
  EXPECT_EQ(sum_bytes, e.Value("cortiq_session_memory_total_bytes"));
  EXPECT_EQ(sum_sessions, e.Value("cortiq_sessions_active"));
  EXPECT_EQ(e.All("cortiq_tenant_sessions").size(), 5u);  // "", alice, bob, cluster, ops
  // The rows the engine served each tenant: each turn's prompt, then 3
  // decode rows (the first of its 4 tokens comes from the prompt's logits).
  auto served = [&](const std::string& t, const char* kind) {
    return e.Value("cortiq_tenant_step_tokens_total", {{"tenant", t}, {"kind", kind}});
  };
  EXPECT_EQ(e.type["cortiq_tenant_step_tokens_total"], "counter");
  EXPECT_EQ(served("alice", "decode"), 6);
  EXPECT_EQ(served("bob", "decode"), 3);
  EXPECT_EQ(served("ops", "decode"), 3);
  EXPECT_GT(served("bob", "prefill"), 0);
  EXPECT_EQ(served("alice", "prefill"), 2 * served("bob", "prefill"));
  for (const char* t : {"", "cluster"}) {
    EXPECT_EQ(served(t, "decode"), 0) << t;
    EXPECT_EQ(served(t, "prefill"), 0) << t;
  }
  EXPECT_EQ(e.All("cortiq_tenant_step_tokens_total").size(), 10u);

  // A session of a tenant not in the file (a peer vouched for it): "~other".
  {
    Ctx ctx(kPeer, "zed;admin");
    v1::SessionInfo z;
    ASSERT_TRUE(stub_->CreateSession(&ctx.c, {}, &z).ok());
    EXPECT_EQ(z.tenant(), "zed");
  }
  e = testing::Scrape(server_->metrics_port());
  EXPECT_EQ(sessions("~other"), 1);
  EXPECT_EQ(e.All("cortiq_tenant_sessions", {{"tenant", "zed"}}).size(), 0u);

  for (const v1::SessionInfo& s : List(kOps)) {
    v1::ReleaseSessionResponse r;
    ASSERT_TRUE(Release(kOps, s.session_id(), &r).ok());
  }
  e = testing::Scrape(server_->metrics_port());
  for (const char* t : {"", "alice", "bob", "cluster", "ops"}) {
    EXPECT_EQ(sessions(t), 0) << t;
    EXPECT_EQ(bytes(t), 0) << t;
  }
  EXPECT_EQ(e.All("cortiq_tenant_sessions", {{"tenant", "~other"}}).size(), 0u);
  EXPECT_EQ(e.Value("cortiq_session_memory_total_bytes"), 0);
}

// The SIGHUP path (cortiq-server's signal thread calls Server::ReloadAuth;
// python_e2e_test sends the real signal): an added token works, a removed
// one stops, a bad file keeps the tokens in use, and no line logs a token.
TEST_F(TenantTest, ReloadAddsAndRemovesTokensAndABadFileChangesNothing) {
  auto sink = std::make_shared<testing::CaptureSink>();
  const std::shared_ptr<spdlog::logger> saved = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("", sink));
  ConfigureLogging(LogFormat::kText);

  const std::string b = Open(kBob);
  EXPECT_EQ(ModelInfo(kCarol).error_code(), StatusCode::UNAUTHENTICATED);
  WriteTokens(TokenFileText(/*with_bob=*/false, /*with_carol=*/true));
  ASSERT_TRUE(server_->ReloadAuth().ok());
  EXPECT_TRUE(ModelInfo(kCarol).ok());
  EXPECT_EQ(ModelInfo(kBob).error_code(), StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(Get(kOps, b).ok());  // bob's session stays; only his token is gone

  // Line 3 is bad: the old table (with carol) stays, the server serves on.
  WriteTokens(absl::StrCat("alice client ", kAlice, "\n\ncarol client ", "tooshort\n"));
  const absl::Status st = server_->ReloadAuth();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(st.message()).find(token_file_.string() + ":3: the token (field 3) is 8"),
            std::string::npos)
      << st;
  EXPECT_TRUE(ModelInfo(kCarol).ok());
  EXPECT_TRUE(ModelInfo(kOps).ok());
  EXPECT_EQ(ModelInfo(kBob).error_code(), StatusCode::UNAUTHENTICATED);
  server_->Shutdown(std::chrono::milliseconds(0));

  const std::string log = sink->All();
  EXPECT_NE(log.find("auth: reloaded"), std::string::npos) << log;
  EXPECT_NE(log.find("auth: reload failed, the tokens in use stay"), std::string::npos) << log;
  EXPECT_NE(log.find("rpc=GetModelInfo code=OK tenant=carol role=client"), std::string::npos)
      << log;
  EXPECT_NE(log.find("rpc=GetSession code=OK session=" + b + " tenant=ops role=admin"),
            std::string::npos)
      << log;
  for (const char* secret : {kAlice, kBob, kOps, kPeer, kCarol, "tooshort"}) {
    EXPECT_EQ(log.find(secret), std::string::npos) << secret;
  }
  spdlog::set_default_logger(saved);
  ConfigureLogging(LogFormat::kText);
}

// A bad token file stops the server at start-up, naming the file and the
// line, never the line's text.
TEST(TenantStartTest, ABadTokenFileStopsTheServerNamingFileAndLine) {
  const std::filesystem::path path = std::filesystem::temp_directory_path() /
                                     absl::StrCat("cortiq_tenant_bad_", getpid(), ".tokens");
  std::ofstream(path) << "alice client " << kAlice << "\nbob client S3CRET+short\n";
  ServerConfig c;
  c.model_dir = DefaultModelDir();
  c.auth_tokens_file = path.string();
  c.listen = "127.0.0.1:0";
  c.metrics_listen = "off";
  absl::StatusOr<std::unique_ptr<Server>> s = Server::Start(c);
  std::filesystem::remove(path);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string m(s.status().message());
  EXPECT_EQ(m.rfind(path.string() + ":2: the token (field 3) is 12 bytes", 0), 0u) << m;
  EXPECT_EQ(m.find("S3CRET"), std::string::npos) << m;
}

}  // namespace
}  // namespace cortiq::server
