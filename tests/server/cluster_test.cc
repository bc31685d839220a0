// Three real nodes on loopback, all peers of each other: one session space.
//
// A client that only knows node A reaches every session wherever it lives
// (forwarded to its owner), through two drains that move the sessions from
// node to node (a rolling restart): every continuation equals, token for
// token, the same greedy conversation on a node that never moved it;
// nothing is NOT_FOUND, and the session bytes summed over the cluster are
// the same before and after the drains. Also: a session that exists nowhere
// is NOT_FOUND saying so; a loop of forwarding records ends at the hop
// limit; ListSessions(cluster) sees every node's sessions; the owner found
// by a lookup is remembered; create_if_missing creates here only what no
// node holds.
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "cortiq/v1/inference.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "server/session_router.h"
#include "tests/common/model_test_util.h"
#include "tests/common/server_test_util.h"

namespace cortiq::server {
namespace {

using std::chrono::milliseconds;
namespace v1 = ::cortiq::v1;
using Node = testing::TestNode;
using Out = testing::StreamOut;

using testing::Addr;
using testing::FreePort;

// A node named `name` on `port`, whose peers are `peers` (with a token
// file and the peer token, when given).
Node StartNamed(const std::string& model, const std::string& name, int port,
                std::vector<std::string> peers, const std::string& tokens_file = "",
                const std::string& peer_token = "") {
  ServerConfig c;
  c.model_dir = model;
  c.auth_tokens_file = tokens_file;
  c.peer_token = peer_token;
  c.grace = milliseconds(0);
  c.node_name = name;
  c.peers = std::move(peers);
  c.listen = Addr(port);
  c.metrics_listen = "off";
  c.threads = 1;
  auto s = Server::Start(c);
  EXPECT_TRUE(s.ok()) << s.status();
  Node n;
  if (!s.ok()) return n;
  n.server = *std::move(s);
  n.addr = Addr(n.server->port());
  n.stub = v1::Inference::NewStub(grpc::CreateChannel(n.addr, grpc::InsecureChannelCredentials()));
  return n;
}

struct Cluster {
  std::map<std::string, Node> nodes;  // "a", "b", "c"
  Node& operator[](const std::string& n) { return nodes.at(n); }
};

Cluster StartCluster(const std::string& model, const std::string& tokens_file = "",
                     const std::string& peer_token = "") {
  const std::map<std::string, int> ports = {{"a", FreePort()}, {"b", FreePort()}, {"c", FreePort()}};
  Cluster cl;
  for (const auto& [name, port] : ports) {
    std::vector<std::string> peers;
    for (const auto& [other, p] : ports) {
      if (other != name) peers.push_back(Addr(p));
    }
    cl.nodes[name] = StartNamed(model, name, port, peers, tokens_file, peer_token);
  }
  return cl;
}

// Session bytes summed over the live nodes.
size_t ClusterBytes(Cluster& cl) {
  size_t bytes = 0;
  for (auto& [name, n] : cl.nodes) {
    if (n.server) bytes += n.server->store().MemoryByKindTotal().total();
  }
  return bytes;
}

size_t ClusterSessions(Cluster& cl) {
  size_t sessions = 0;
  for (auto& [name, n] : cl.nodes) {
    if (n.server) sessions += n.server->store().num_sessions();
  }
  return sessions;
}

std::string NodeOf(const grpc::ClientContext& ctx) {
  const auto& md = ctx.GetServerInitialMetadata();
  auto it = md.find("x-cortiq-node");
  return it == md.end() ? "" : std::string(it->second.data(), it->second.size());
}

// A greedy kept turn of `mode` (a new session when `id` is empty).
v1::GenerateRequest Turn(const std::string& id, int mode, const std::string& prompt) {
  v1::GenerateRequest r = testing::KeptTurnRequest(id, prompt);
  if (id.empty()) testing::SetSessionMode(mode, r.mutable_session_config());
  return r;
}

TEST(ClusterTest, DrainsKeepEveryConversationReachableThroughOneNode) {
  const std::string model = testing::TempModel("tiny");
  Cluster cl = StartCluster(model);
  Node ref = testing::StartTestNode([&] {
    ServerConfig c;
    c.model_dir = model;
    c.grace = milliseconds(0);
    return c;
  }());
  const std::vector<std::string> prompts = {std::string(40, 'a') + "Call me Ishmael.",
                                            " Some years ago", " never mind how long",
                                            " precisely", " having little money"};
  // Sessions of every mode live on B (made there: the setup's own client);
  // the same conversations on the reference node, which never moves them.
  struct Conv {
    int mode;
    std::string id, ref_id;
  };
  std::vector<Conv> convs;
  for (int mode = 0; mode < 5; ++mode) {
    for (int k = 0; k < 2; ++k) {
      Out on_b = testing::RunGenerate(*cl["b"].stub, Turn("", mode, prompts[0]));
      Out on_r = testing::RunGenerate(*ref.stub, Turn("", mode, prompts[0]));
      ASSERT_TRUE(on_b.status.ok() && on_r.status.ok()) << on_b.status.error_message();
      ASSERT_EQ(on_b.ids, on_r.ids);
      convs.push_back({mode, on_b.session, on_r.session});
    }
  }
  // The client knows A only.
  Node& a = cl["a"];
  auto turn = [&](size_t step) {
    for (const Conv& c : convs) {
      SCOPED_TRACE(::testing::Message() << "mode " << c.mode << " step " << step);
      Out via_a = testing::RunGenerate(*a.stub, Turn(c.id, c.mode, prompts[step]));
      Out direct = testing::RunGenerate(*ref.stub, Turn(c.ref_id, c.mode, prompts[step]));
      ASSERT_TRUE(via_a.status.ok()) << via_a.status.error_message();
      ASSERT_TRUE(direct.status.ok()) << direct.status.error_message();
      EXPECT_EQ(via_a.ids, direct.ids);
      EXPECT_EQ(via_a.session, c.id);
    }
  };
  turn(1);  // forwarded A -> B
  {
    grpc::ClientContext ctx;
    v1::GetSessionRequest req;
    req.set_session_id(convs[0].id);
    v1::SessionInfo info;
    ASSERT_TRUE(a.stub->GetSession(&ctx, req, &info).ok());
    EXPECT_EQ(info.node(), "b");
    EXPECT_EQ(NodeOf(ctx), "b");  // the owner answered, through A
  }
  // Rolling restart: B drains (its sessions go to A and C) and stops; the
  // client carries on through A (A's cached owner, B, is gone: the retry
  // finds each session on A or C); then C drains and stops, and the client
  // carries on again.
  size_t step = 2;
  for (const std::string name : {"b", "c"}) {
    SCOPED_TRACE(name);
    std::map<std::string, size_t> per_before;  // session -> bytes
    for (auto& [node, n] : cl.nodes) {
      if (!n.server) continue;
      for (const auto& s : n.server->store().List()) per_before[s.id] = s.memory.total();
    }
    const size_t bytes_before = ClusterBytes(cl);
    ASSERT_EQ(ClusterSessions(cl), convs.size());
    const DrainReport report = cl[name].server->Drain(milliseconds(0));
    EXPECT_EQ(report.failed, 0u);
    cl[name].server->Shutdown(milliseconds(0));
    cl[name].server.reset();
    // Nothing lost, nothing copied: the same sessions and bytes, each
    // session holding exactly what it held.
    EXPECT_EQ(ClusterSessions(cl), convs.size());
    EXPECT_EQ(ClusterBytes(cl), bytes_before);
    for (auto& [node, n] : cl.nodes) {
      if (!n.server) continue;
      for (const auto& s : n.server->store().List()) {
        EXPECT_EQ(s.memory.total(), per_before.at(s.id)) << s.id << " on " << node;
      }
    }
    turn(step++);
  }
  EXPECT_EQ(a.server->store().num_sessions(), convs.size());
  EXPECT_EQ(a.server->store().num_sessions(), convs.size());
}

TEST(ClusterTest, ASessionFoundByLookupIsRememberedAndOneThatIsNowhereIsNotFound) {
  const std::string model = testing::TempModel("tiny");
  Cluster cl = StartCluster(model);
  Out on_c = testing::RunGenerate(*cl["c"].stub, Turn("", 0, "Call me"));
  ASSERT_TRUE(on_c.status.ok());
  SessionRouter& router = *cl["a"].server->context().router;
  const size_t before = router.lookups_started();
  for (int i = 0; i < 3; ++i) {
    Out via_a = testing::RunGenerate(*cl["a"].stub, Turn(on_c.session, 0, " Ishmael"));
    ASSERT_TRUE(via_a.status.ok()) << via_a.status.error_message();
  }
  EXPECT_EQ(router.lookups_started(), before + 1);  // one lookup, then the cached owner

  // An id that exists nowhere: NOT_FOUND, and the message says where it looked.
  const std::string nowhere = "0123456789abcdef0123456789abcdef";
  Out missing = testing::RunGenerate(*cl["a"].stub, Turn(nowhere, 0, "x"));
  EXPECT_EQ(missing.status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(missing.status.error_message().find("on this node or its 2 peers"), std::string::npos)
      << missing.status.error_message();
  grpc::ClientContext ctx;
  v1::GetSessionRequest req;
  req.set_session_id(nowhere);
  v1::SessionInfo info;
  EXPECT_EQ(cl["b"].stub->GetSession(&ctx, req, &info).error_code(), grpc::StatusCode::NOT_FOUND);
}

// Forwarding records that point at each other (A says B, B says A) cannot
// make a loop: the hop limit ends it with NOT_FOUND.
TEST(ClusterTest, AForwardingLoopEndsAtTheHopLimit) {
  const std::string model = testing::TempModel("tiny");
  Cluster cl = StartCluster(model);
  const std::string id = "fedcba9876543210fedcba9876543210";
  cl["a"].server->context().router->Moved(id, cl["b"].addr);
  cl["b"].server->context().router->Moved(id, cl["a"].addr);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  v1::GetSessionRequest req;
  req.set_session_id(id);
  v1::SessionInfo info;
  const grpc::Status st = cl["a"].stub->GetSession(&ctx, req, &info);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND) << st.error_message();
  Out gen = testing::RunGenerate(*cl["a"].stub, Turn(id, 0, "x"));
  EXPECT_EQ(gen.status.error_code(), grpc::StatusCode::NOT_FOUND) << gen.status.error_message();
}

TEST(ClusterTest, ListSessionsOfTheClusterSeesEveryNode) {
  const std::string model = testing::TempModel("tiny");
  Cluster cl = StartCluster(model);
  std::map<std::string, std::string> where;  // session -> node
  for (const std::string name : {"a", "b", "c"}) {
    Out o = testing::RunGenerate(*cl[name].stub, Turn("", 0, "Call me"));
    ASSERT_TRUE(o.status.ok());
    where[o.session] = name;
  }
  grpc::ClientContext ctx;
  v1::ListSessionsRequest req;
  req.set_cluster(true);
  v1::ListSessionsResponse list;
  ASSERT_TRUE(cl["a"].stub->ListSessions(&ctx, req, &list).ok());
  EXPECT_EQ(list.unreachable_peers_size(), 0);
  ASSERT_EQ(list.sessions_size(), 3);
  size_t total = 0;
  for (const auto& s : list.sessions()) {
    EXPECT_EQ(s.node(), where.at(s.session_id()));
    total += s.memory().total_bytes();
  }
  EXPECT_EQ(list.total_memory().total_bytes(), total);
  // Without cluster: A's own only.
  grpc::ClientContext local_ctx;
  v1::ListSessionsResponse local;
  ASSERT_TRUE(cl["a"].stub->ListSessions(&local_ctx, {}, &local).ok());
  ASSERT_EQ(local.sessions_size(), 1);
  EXPECT_EQ(local.sessions(0).node(), "a");
}

// Tenants hold across nodes: a forwarded call acts for its caller (the peer
// token plus x-cortiq-on-behalf-of), so the owner applies the same filter.
// Another tenant's session elsewhere is NOT_FOUND with the very message of
// an id that exists nowhere; a client's own one is served through any node.
TEST(ClusterTest, AForwardedCallActsForItsCallerOnly) {
  const std::string model = testing::TempModel("tiny");
  const std::string file = (std::filesystem::temp_directory_path() /
                            ("cortiq_cluster_test_" + std::to_string(getpid()) + ".tokens"))
                               .string();
  std::ofstream(file) << "alice client alice-token-0123456789\n"
                         "bob client bob-token-0123456789ab\n"
                         "nodes peer peer-token-0123456789a\n";
  Cluster cl = StartCluster(model, file, "peer-token-0123456789a");
  Out mine = testing::RunGenerate(*cl["b"].stub, Turn("", 0, "Call me"), "alice-token-0123456789");
  ASSERT_TRUE(mine.status.ok()) << mine.status.error_message();
  Out again =
      testing::RunGenerate(*cl["a"].stub, Turn(mine.session, 0, " Ishmael"), "alice-token-0123456789");
  EXPECT_TRUE(again.status.ok()) << again.status.error_message();
  Out theirs =
      testing::RunGenerate(*cl["a"].stub, Turn(mine.session, 0, " Ishmael"), "bob-token-0123456789ab");
  EXPECT_EQ(theirs.status.error_code(), grpc::StatusCode::NOT_FOUND);
  const std::string other = "00112233445566778899aabbccddeeff";
  Out nowhere =
      testing::RunGenerate(*cl["a"].stub, Turn(other, 0, " Ishmael"), "bob-token-0123456789ab");
  EXPECT_EQ(nowhere.status.error_code(), grpc::StatusCode::NOT_FOUND);
  std::string expected = nowhere.status.error_message();
  expected.replace(expected.find(other), other.size(), mine.session);
  EXPECT_EQ(theirs.status.error_message(), expected);
  // A client token cannot act for another tenant: its on-behalf-of is ignored.
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer bob-token-0123456789ab");
  ctx.AddMetadata("x-cortiq-on-behalf-of", "alice;client");
  v1::GetSessionRequest req;
  req.set_session_id(mine.session);
  v1::SessionInfo info;
  EXPECT_EQ(cl["b"].stub->GetSession(&ctx, req, &info).error_code(), grpc::StatusCode::NOT_FOUND);
  std::filesystem::remove(file);
}

// create_if_missing in a cluster: an id no node holds is created on the node
// the client called (not NOT_FOUND), and then continued there; an id a peer
// holds is forwarded to it and continued, nothing created.
TEST(ClusterTest, CreateIfMissingCreatesHereOnlyWhatNoPeerHolds) {
  const std::string model = testing::TempModel("tiny");
  Cluster cl = StartCluster(model);
  const std::string id = "00112233445566778899aabbccddeeff";
  v1::GenerateRequest r = Turn(id, 0, "Call me");
  r.set_create_if_missing(true);
  Out created = testing::RunGenerate(*cl["a"].stub, r);
  ASSERT_TRUE(created.status.ok()) << created.status.error_message();
  EXPECT_EQ(created.session, id);
  EXPECT_TRUE(cl["a"].server->store().Get(id).has_value());
  EXPECT_EQ(ClusterSessions(cl), 1u);
  // Continued through another node: forwarded to A, nothing created.
  Out again = testing::RunGenerate(*cl["b"].stub, r);
  ASSERT_TRUE(again.status.ok()) << again.status.error_message();
  EXPECT_EQ(ClusterSessions(cl), 1u);
  EXPECT_EQ(cl["a"].server->store().Get(id)->tokens, 2u * (7 + 8));

  // A session C holds, named with create_if_missing through A: forwarded.
  Out on_c = testing::RunGenerate(*cl["c"].stub, Turn("", 0, "Call me"));
  ASSERT_TRUE(on_c.status.ok());
  v1::GenerateRequest more = Turn(on_c.session, 0, " Ishmael");
  more.set_create_if_missing(true);
  grpc::ClientContext ctx;
  auto reader = cl["a"].stub->Generate(&ctx, more);
  v1::GenerateResponse m;
  while (reader->Read(&m)) {
  }
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_EQ(NodeOf(ctx), "c");
  EXPECT_EQ(ClusterSessions(cl), 2u);
  EXPECT_FALSE(cl["a"].server->store().Get(on_c.session).has_value());
}

}  // namespace
}  // namespace cortiq::server
