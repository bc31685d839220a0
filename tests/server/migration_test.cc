// Sessions moving between two real servers on loopback: Export/Import over
// gRPC, MigrateSession in the middle of a conversation (token-identical
// continuation in every mode), and every failure leaving the source session
// intact and usable: peer down, peer refusing (another model), a peer dying
// mid-stream; corrupt, truncated and oversize imports install nothing.
// The chunk messages on the wire: at most 1 MiB each, and ImportSession (on
// the raw byte API) takes every valid encoding of a WireChunk.
#include <filesystem>
#include <future>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/session/session_wire.h"
#include "core/util/tsan_annotations.h"
#include "cortiq/v1/inference.grpc.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "tests/common/model_test_util.h"
#include "tests/common/prom_text.h"
#include "tests/common/raw_call.h"
#include "tests/common/server_test_util.h"
#include "tests/common/tcp_proxy.h"

namespace cortiq::server {
namespace {

using std::chrono::milliseconds;
namespace v1 = ::cortiq::v1;

using Node = testing::TestNode;
using Out = testing::StreamOut;
using testing::MigrateCall;

// A node whose MigrateSession may move sessions to `allow` (--migrate-allow:
// the targets must be started first, their ports being chosen at start).
Node StartNode(const std::string& model_dir, std::vector<std::string> allow = {},
               size_t max_import_bytes = size_t{1} << 30) {
  ServerConfig c;
  c.model_dir = model_dir;
  c.grace = milliseconds(0);
  c.max_import_bytes = max_import_bytes;
  c.migrate_allow = std::move(allow);
  return testing::StartTestNode(c);
}

v1::GenerateRequest Turn(const std::string& session, std::string prompt, bool sampled) {
  v1::GenerateRequest r;
  r.set_prompt(std::move(prompt));
  r.set_max_tokens(10);
  r.set_ignore_eos(true);
  r.set_keep_session(true);
  r.set_session_id(session);
  r.mutable_sampling()->set_temperature(sampled ? 0.9f : 0.0f);
  return r;
}

Out Generate(Node& n, const v1::GenerateRequest& r) { return testing::RunGenerate(*n.stub, r); }

// A new kept session of `mode` on `n` after a first turn; returns its id.
std::string Open(Node& n, int mode, bool sampled) {
  v1::GenerateRequest r = Turn("", std::string(120, 'a') + "Call me Ishmael.", sampled);
  r.mutable_sampling()->set_seed(1234);
  testing::SetSessionMode(mode, r.mutable_session_config());
  Out o = Generate(n, r);
  EXPECT_TRUE(o.status.ok()) << o.status.error_message();
  return o.session;
}

std::string ExportBytes(Node& n, const std::string& id) {
  grpc::ClientContext ctx;
  v1::ExportSessionRequest req;
  req.set_session_id(id);
  auto reader = n.stub->ExportSession(&ctx, req);
  std::string out;
  v1::WireChunk chunk;
  while (reader->Read(&chunk)) {
    EXPECT_LE(chunk.data().size(), size_t{1} << 20);
    out += chunk.data();
  }
  EXPECT_TRUE(reader->Finish().ok());
  return out;
}

grpc::Status ImportBytes(Node& n, const std::string& wire, v1::ImportSessionResponse* resp,
                         size_t chunk_bytes = 1 << 20) {
  grpc::ClientContext ctx;
  auto writer = n.stub->ImportSession(&ctx, resp);
  v1::WireChunk chunk;
  for (size_t off = 0; off < wire.size(); off += chunk_bytes) {
    chunk.set_data(wire.substr(off, chunk_bytes));
    if (!writer->Write(chunk)) break;
  }
  writer->WritesDone();
  return writer->Finish();
}

TEST(MigrationTest, MidConversationMoveContinuesTokenIdenticallyInEveryMode) {
  const std::string model = testing::TempModel("tiny");
  Node b = StartNode(model), a = StartNode(model, {b.addr});
  for (int mode = 0; mode < 5; ++mode) {
    for (bool sampled : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "mode " << mode << " sampled " << sampled);
      // Reference: the whole conversation on A without a move.
      const std::string ref = Open(a, mode, sampled);
      const std::string moved = Open(a, mode, sampled);
      ASSERT_EQ(Generate(a, Turn(ref, " Some years ago", sampled)).status.error_code(),
                grpc::StatusCode::OK);
      ASSERT_TRUE(Generate(a, Turn(moved, " Some years ago", sampled)).status.ok());
      v1::MigrateSessionResponse resp;
      grpc::Status st = MigrateCall(a, moved, b.addr, &resp);
      ASSERT_TRUE(st.ok()) << st.error_message();
      EXPECT_EQ(resp.version(), session::kSessionWireMaxVersion);  // the highest both speak
      EXPECT_GT(resp.wire_bytes(), 0u);
      // The session keeps its id, and the answer names the node it went to.
      EXPECT_EQ(resp.peer_session_id(), moved);
      EXPECT_EQ(resp.peer_node(), b.server->config().node_name);
      // Moved, not copied: gone from A, present on B.
      EXPECT_FALSE(a.server->store().Get(moved).has_value());
      EXPECT_TRUE(b.server->store().Get(moved).has_value());
      Out on_b = Generate(b, Turn(moved, " never mind how long", sampled));
      Out on_a = Generate(a, Turn(ref, " never mind how long", sampled));
      ASSERT_TRUE(on_b.status.ok()) << on_b.status.error_message();
      EXPECT_EQ(on_b.ids, on_a.ids);
    }
  }
  EXPECT_EQ(a.server->store().releases()[static_cast<size_t>(session::ReleaseReason::kMigrated)],
            10u);  // 5 modes, greedy and sampled
}

// Every response names the node that served it (x-cortiq-node), errors
// included, and so do SessionInfo and ModelInfo.
TEST(MigrationTest, EveryResponseNamesItsNode) {
  const std::string model = testing::TempModel("tiny");
  ServerConfig c;
  c.model_dir = model;
  c.grace = milliseconds(0);
  c.node_name = "node-a.test:1";
  Node a = testing::StartTestNode(c);
  auto node_of = [](const grpc::ClientContext& ctx) {
    const auto& md = ctx.GetServerInitialMetadata();
    auto it = md.find("x-cortiq-node");
    return it == md.end() ? std::string("<none>") : std::string(it->second.data(), it->second.size());
  };
  {
    grpc::ClientContext ctx;
    v1::ModelInfo info;
    ASSERT_TRUE(a.stub->GetModelInfo(&ctx, {}, &info).ok());
    EXPECT_EQ(node_of(ctx), "node-a.test:1");
    EXPECT_EQ(info.node(), "node-a.test:1");
  }
  const std::string id = Open(a, 0, false);
  {
    grpc::ClientContext ctx;
    v1::GetSessionRequest req;
    req.set_session_id(id);
    v1::SessionInfo info;
    ASSERT_TRUE(a.stub->GetSession(&ctx, req, &info).ok());
    EXPECT_EQ(node_of(ctx), "node-a.test:1");
    EXPECT_EQ(info.node(), "node-a.test:1");
  }
  {
    grpc::ClientContext ctx;
    v1::ListSessionsResponse list;
    ASSERT_TRUE(a.stub->ListSessions(&ctx, {}, &list).ok());
    ASSERT_EQ(list.sessions_size(), 1);
    EXPECT_EQ(list.sessions(0).node(), "node-a.test:1");
    EXPECT_EQ(node_of(ctx), "node-a.test:1");
  }
  {  // a stream, and an error
    grpc::ClientContext ctx;
    auto reader = a.stub->Generate(&ctx, Turn(id, " and so", false));
    v1::GenerateResponse r;
    while (reader->Read(&r)) {
    }
    EXPECT_TRUE(reader->Finish().ok());
    EXPECT_EQ(node_of(ctx), "node-a.test:1");
    grpc::ClientContext bad;
    v1::TokenizeRequest t;
    t.set_text(std::string(c.max_prompt_bytes + 1, 'x'));
    v1::TokenizeResponse tr;
    EXPECT_EQ(a.stub->Tokenize(&bad, t, &tr).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(node_of(bad), "node-a.test:1");
  }
  {  // the export stream
    grpc::ClientContext ctx;
    v1::ExportSessionRequest req;
    req.set_session_id(id);
    auto reader = a.stub->ExportSession(&ctx, req);
    v1::WireChunk chunk;
    while (reader->Read(&chunk)) {
    }
    EXPECT_TRUE(reader->Finish().ok());
    EXPECT_EQ(node_of(ctx), "node-a.test:1");
  }
}

TEST(MigrationTest, ExportImportOverGrpcIsByteExact) {
  const std::string model = testing::TempModel("tiny");
  Node a = StartNode(model), b = StartNode(model);
  const std::string id = Open(a, 0, false);
  const std::string wire = ExportBytes(a, id);
  ASSERT_GT(wire.size(), 0u);
  v1::ImportSessionResponse resp;
  ASSERT_TRUE(ImportBytes(b, wire, &resp, 1000).ok());
  EXPECT_EQ(resp.session().tokens(), a.server->store().Get(id)->tokens);
  EXPECT_EQ(resp.session().memory().total_bytes(), a.server->store().Get(id)->memory.total());
  EXPECT_EQ(ExportBytes(b, resp.session().session_id()), wire);
  EXPECT_TRUE(a.server->store().Get(id).has_value());  // export copies; only migrate moves
}

// ImportSession fed raw messages (each one a serialised WireChunk, or not).
grpc::Status ImportMessages(Node& n, const std::vector<std::string>& messages,
                            v1::ImportSessionResponse* resp) {
  grpc::GenericStub stub(grpc::CreateChannel(n.addr, grpc::InsecureChannelCredentials()));
  std::string reply;
  const grpc::Status status =
      testing::CallRaw(stub, "/cortiq.v1.Inference/ImportSession", messages, "", &reply);
  if (status.ok()) {
    EXPECT_TRUE(resp->ParseFromString(reply));
  }
  return status;
}

TEST(MigrationTest, ImportTakesEveryEncodingOfAChunk) {
  const std::string model = testing::TempModel("tiny");
  Node a = StartNode(model), b = StartNode(model);
  const std::string wire = ExportBytes(a, Open(a, 0, false));
  ASSERT_GT(wire.size(), 3000u);
  auto chunk = [](std::string_view data) {
    v1::WireChunk c;
    c.set_data(std::string(data));
    return c.SerializeAsString();
  };
  std::vector<std::string> messages = {
      chunk(wire.substr(0, 1000)),
      "",  // an empty chunk (no field at all)
      std::string("\x78\x01", 2) + chunk(wire.substr(1000, 1000)),  // an unknown field first
      chunk("ignored") + chunk(wire.substr(2000, 1000)),  // the field twice: the last one counts
      chunk(wire.substr(3000))};
  v1::ImportSessionResponse resp;
  grpc::Status st = ImportMessages(b, messages, &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(ExportBytes(b, resp.session().session_id()), wire);
  // The same stream again: its session is live here (ALREADY_EXISTS, as
  // soon as its first section names it).
  st = ImportMessages(b, {chunk(wire.substr(0, 1000))}, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::ALREADY_EXISTS) << st.error_message();
  EXPECT_EQ(b.server->store().num_sessions(), 1u);
  // Not a WireChunk at all (a truncated field): refused, nothing installed.
  ASSERT_TRUE(b.server->store().Release(resp.session().session_id()).released);
  const std::string truncated_field = {'\x0a', '\x05', 'a', 'b'};  // 5 bytes announced, 2 there
  st = ImportMessages(b, {chunk(wire.substr(0, 1000)), truncated_field}, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
  EXPECT_EQ(b.server->store().num_sessions(), 0u);
}

TEST(MigrationTest, LargeSessionsTravelInChunksOfAtMostOneMiB) {
  const std::string model = testing::TempModel("tiny");
  Node b = StartNode(model), c = StartNode(model), a = StartNode(model, {c.addr});
  v1::GenerateRequest r = Turn("", std::string(3000, 'a'), false);
  Out o = Generate(a, r);
  ASSERT_TRUE(o.status.ok()) << o.status.error_message();
  grpc::ClientContext ctx;
  v1::ExportSessionRequest req;
  req.set_session_id(o.session);
  auto reader = a.stub->ExportSession(&ctx, req);
  std::string wire;
  v1::WireChunk chunk;
  size_t chunks = 0;
  while (reader->Read(&chunk)) {
    EXPECT_LE(chunk.data().size(), size_t{1} << 20);
    wire += chunk.data();
    ++chunks;
  }
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_GE(chunks, 2u);
  EXPECT_EQ(wire.size() / (size_t{1} << 20) + 1, chunks) << "full chunks but the last";
  v1::ImportSessionResponse resp;
  ASSERT_TRUE(ImportBytes(b, wire, &resp).ok());
  EXPECT_EQ(ExportBytes(b, resp.session().session_id()), wire);
  // MigrateSession sends the same stream (the peer re-exports it unchanged).
  v1::MigrateSessionResponse moved;
  grpc::Status st = MigrateCall(a, o.session, c.addr, &moved);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(moved.wire_bytes(), wire.size());
  EXPECT_EQ(ExportBytes(c, moved.peer_session_id()), wire);
  EXPECT_FALSE(a.server->store().Get(o.session).has_value());
}

TEST(MigrationTest, CorruptTruncatedAndOversizeImportsInstallNothing) {
  const std::string model = testing::TempModel("tiny");
  Node a = StartNode(model), b = StartNode(model, {}, /*max_import_bytes=*/200'000);
  const std::string wire = ExportBytes(a, Open(a, 0, false));
  ASSERT_LT(wire.size(), 200'000u);
  v1::ImportSessionResponse resp;
  std::string flipped = wire;
  flipped[wire.size() / 2] ^= 1;
  EXPECT_EQ(ImportBytes(b, flipped, &resp).error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_EQ(ImportBytes(b, wire.substr(0, wire.size() - 9), &resp).error_code(),
            grpc::StatusCode::DATA_LOSS);
  EXPECT_EQ(ImportBytes(b, "", &resp).error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_EQ(
      ImportBytes(b, wire + wire + wire + wire + wire + wire + wire, &resp, 4096).error_code(),
      grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(b.server->store().num_sessions(), 0u);
  // Another model: refused as incompatible.
  Node c = StartNode(testing::TempModel("tiny", math::DType::kF32, /*seed=*/99));
  grpc::Status st = ImportBytes(c, wire, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << st.error_message();
  EXPECT_EQ(c.server->store().num_sessions(), 0u);
}

// A peer that answers GetModelInfo and then dies in the middle of the import.
class DyingPeer final : public v1::Inference::CallbackService {
 public:
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* ctx,
                                         const v1::GetModelInfoRequest*,
                                         v1::ModelInfo* info) override {
    info->add_wire_versions(1);
    info->add_wire_versions(2);
    auto* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }
  grpc::ServerReadReactor<v1::WireChunk>* ImportSession(grpc::CallbackServerContext*,
                                                        v1::ImportSessionResponse*) override {
    class Reactor : public grpc::ServerReadReactor<v1::WireChunk> {
     public:
      Reactor() {
        util::TsanRelease(this);
        StartRead(&chunk_);
      }
      void OnReadDone(bool) override {
        util::TsanAcquire(this);
        util::TsanRelease(this);
        Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "peer process killed"));
      }
      void OnDone() override {
        util::TsanAcquire(this);
        delete this;
      }
      v1::WireChunk chunk_;
    };
    return new Reactor;
  }
};

TEST(MigrationTest, EveryFailureLeavesTheSourceSessionIntactAndUsable) {
  const std::string model = testing::TempModel("tiny");
  // The targets, each allowed on A: one serving another model, and one that
  // dies mid-stream.
  Node other = StartNode(testing::TempModel("tiny", math::DType::kF32, /*seed=*/99));
  DyingPeer dying;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&dying);
  auto dying_server = builder.BuildAndStart();
  const std::string dying_addr = "127.0.0.1:" + std::to_string(port);
  Node a = StartNode(model, {"127.0.0.1:1", other.addr, dying_addr});
  const std::string id = Open(a, 0, false);
  const auto before = a.server->store().Get(id);
  auto check_intact = [&](const char* what) {
    SCOPED_TRACE(what);
    auto now = a.server->store().Get(id);
    ASSERT_TRUE(now.has_value());
    EXPECT_EQ(now->tokens, before->tokens);
    EXPECT_EQ(now->memory.bytes, before->memory.bytes);
    EXPECT_FALSE(now->busy);
  };
  v1::MigrateSessionResponse resp;
  // Peer down: nothing listens there.
  grpc::Status st = MigrateCall(a, id, "127.0.0.1:1", &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << st.error_message();
  EXPECT_NE(st.error_message().find("127.0.0.1:1"), std::string::npos);
  check_intact("peer down");
  // Peer refuses: it serves another model.
  st = MigrateCall(a, id, other.addr, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << st.error_message();
  check_intact("peer refuses");
  // Peer dies mid-stream.
  st = MigrateCall(a, id, dying_addr, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << st.error_message();
  check_intact("peer died");
  dying_server->Shutdown();
  // Unknown session and bad requests.
  EXPECT_EQ(MigrateCall(a, "0123456789abcdef0123456789abcdef", other.addr, &resp).error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(MigrateCall(a, id, "", &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // Still usable: the conversation goes on.
  Out more = Generate(a, Turn(id, " and on", false));
  EXPECT_TRUE(more.status.ok());
  EXPECT_EQ(more.ids.size(), 10u);
}

// A migration whose import answer is lost on the way back: the peer
// installed the session, wrote its file and answered OK, and the connection
// broke before the answer arrived. The caller is told the move failed, so
// the source keeps the session, and the peer is asked to release its copy:
// the session is on one node, not on both (it used to stay on both). When
// the peer cannot be asked either, the source still keeps it and the
// failure is counted. The peer is reached through a proxy that loses its
// answers from the moment the import's file is written.
TEST(MigrationTest, AnImportWhoseAnswerIsLostLeavesTheSessionOnItsSourceOnly) {
  namespace fs = std::filesystem;
  const std::string model = testing::TempModel("tiny");
  const fs::path dir =
      absl::StrCat(::testing::TempDir(), "/cortiq_migration_lost_answer_", getpid());
  fs::remove_all(dir);
  ServerConfig bc;
  bc.model_dir = model;
  bc.grace = milliseconds(0);
  bc.state_dir = dir.string();
  bc.metrics_listen = "127.0.0.1:0";
  Node b = testing::StartTestNode(bc);
  testing::TcpProxy proxy(b.server->port());
  ASSERT_TRUE(proxy.ok());
  ServerConfig ac;
  ac.model_dir = model;
  ac.grace = milliseconds(0);
  ac.migrate_allow = {proxy.addr()};
  ac.metrics_listen = "127.0.0.1:0";
  ac.peer_connect_timeout = milliseconds(1'000);
  Node a = testing::StartTestNode(ac);
  auto imported_ok = [&] {
    return testing::Scrape(b.server->metrics_port())
        .Value("cortiq_migrations_total", {{"direction", "in"}, {"result", "ok"}});
  };
  auto undos = [&](const std::string& result) {
    return testing::Scrape(a.server->metrics_port())
        .Value("cortiq_migration_undos_total", {{"result", result}});
  };
  // Migrates `id` with B's answer lost; `refuse`: B cannot be reached after.
  auto migrate_losing_the_answer = [&](const std::string& id, bool refuse) {
    const double imported_before = imported_ok();
    b.server->persister()->set_write_hook([&, refuse](const std::string&) {
      proxy.LoseReplies(true);
      if (refuse) proxy.Refuse(true);
    });
    auto migrating = std::async(std::launch::async, [&] {
      v1::MigrateSessionResponse resp;
      return MigrateCall(a, id, proxy.addr(), &resp);
    });
    // B's import answered OK (its call ended and was counted), into the void.
    for (int i = 0; i < 3000 && imported_ok() < imported_before + 1; ++i) {
      std::this_thread::sleep_for(milliseconds(10));
    }
    EXPECT_EQ(imported_ok(), imported_before + 1);
    b.server->persister()->set_write_hook(nullptr);
    proxy.LoseReplies(false);
    proxy.CutAll();
    return migrating.get();
  };

  const std::string id = Open(a, 0, false);
  const auto before = a.server->store().Get(id);
  grpc::Status st = migrate_losing_the_answer(id, /*refuse=*/false);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << st.error_message();
  // Here, intact, and not on B (released there, its file deleted).
  auto now = a.server->store().Get(id);
  ASSERT_TRUE(now.has_value());
  EXPECT_EQ(now->tokens, before->tokens);
  EXPECT_FALSE(now->busy);
  EXPECT_FALSE(b.server->store().Get(id).has_value());
  EXPECT_FALSE(fs::exists(dir / (id + ".cqsj")));
  EXPECT_EQ(undos("released"), 1);
  EXPECT_EQ(undos("failed"), 0);
  // The conversation goes on here, and a later move goes through.
  Out more = Generate(a, Turn(id, " and on", false));
  EXPECT_TRUE(more.status.ok()) << more.status.error_message();
  v1::MigrateSessionResponse resp;
  st = MigrateCall(a, id, proxy.addr(), &resp);
  EXPECT_TRUE(st.ok()) << st.error_message();
  EXPECT_FALSE(a.server->store().Get(id).has_value());
  EXPECT_TRUE(b.server->store().Get(id).has_value());

  // B unreachable once its answer is lost: the source keeps the session,
  // still usable, and says it may be on both nodes.
  const std::string id2 = Open(a, 0, false);
  st = migrate_losing_the_answer(id2, /*refuse=*/true);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << st.error_message();
  EXPECT_TRUE(a.server->store().Get(id2).has_value());
  EXPECT_EQ(undos("failed"), 1);
  EXPECT_TRUE(Generate(a, Turn(id2, " still here", false)).status.ok());
  proxy.Refuse(false);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace cortiq::server
