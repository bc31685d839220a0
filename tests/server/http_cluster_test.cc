// The HTTP (OpenAI) front in a cluster: three real nodes on loopback, peers
// of each other, each serving HTTP on port 0, and a single-node reference.
//
// A conversation (x-cortiq-session) begun through node A's HTTP and
// continued through B's is answered by A, its owner (x-cortiq-node: a,
// x-cortiq-forwarded-by: b), reusing A's session (cached_tokens > 0), with
// the same tokens as the same greedy conversation on the reference, and B
// holds no session of it; streamed or not. A client that closes a relayed
// stream on B ends A's job and leaves A's kept session in place. After A
// drains (the session moves to B or C), the next turn through the other node
// still reuses the moved session, and so
// does one through A, which relays it (its forwarding record) while draining.
// A node that shuts down cancels the generations it relays. A cached owner
// that stopped is forgotten and the owner looked up again.
#include <httplib.h>

#include <map>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "server/http/owner_relay.h"
#include "server/server.h"
#include "tests/common/server_test_util.h"

namespace cortiq::server {
namespace {

using Json = nlohmann::json;
namespace v1 = ::cortiq::v1;
using std::chrono::milliseconds;
using std::chrono::seconds;

using testing::Addr;
using testing::FreePort;

struct Node {
  testing::TestNode node;
  Server* server = nullptr;
  std::unique_ptr<httplib::Client> http;
};

Node StartNode(const std::string& name, int port, std::vector<std::string> peers) {
  ServerConfig c;
  c.model_dir = DefaultModelDir();
  c.grace = milliseconds(0);
  c.node_name = name;
  c.peers = std::move(peers);
  if (port > 0) c.listen = Addr(port);
  c.http_listen = "127.0.0.1:0";
  Node n;
  n.node = testing::StartTestNode(c);
  n.server = n.node.server.get();
  if (n.server == nullptr) return n;
  n.http = std::make_unique<httplib::Client>("127.0.0.1", n.server->http_port());
  n.http->set_read_timeout(60, 0);
  return n;
}

// Nodes "a", "b", "c", peers of each other, and "ref", alone.
std::map<std::string, Node> StartCluster() {
  const std::map<std::string, int> ports = {{"a", FreePort()}, {"b", FreePort()}, {"c", FreePort()}};
  std::map<std::string, Node> nodes;
  for (const auto& [name, port] : ports) {
    std::vector<std::string> peers;
    for (const auto& [other, p] : ports) {
      if (other != name) peers.push_back(Addr(p));
    }
    nodes[name] = StartNode(name, port, peers);
  }
  nodes["ref"] = StartNode("ref", 0, {});
  return nodes;
}

struct Answer {
  int status = 0;
  std::string text;  // the completion (streamed: its chunks joined)
  int64_t cached = -1;
  std::string node, forwarded_by;
  std::string session;  // x-cortiq-session-id
  std::string body;
};

std::string HeaderOf(const httplib::Headers& h, const std::string& key) {
  auto it = h.find(key);
  return it == h.end() ? "" : it->second;
}

// One greedy turn of conversation `conv`: `prompt` is the whole conversation
// so far (the session keeps its longest common prefix).
Answer Turn(Node& n, const std::string& conv, const std::string& prompt, bool stream = false,
            int max_tokens = 8) {
  Json b = {{"model", "cortiq-byte-4m"}, {"prompt", prompt},     {"max_tokens", max_tokens},
            {"temperature", 0},          {"ignore_eos", true}, {"stream", stream}};
  if (stream) b["stream_options"] = {{"include_usage", true}};
  auto r = n.http->Post("/v1/completions", {{"x-cortiq-session", conv}}, b.dump(),
                        "application/json");
  Answer a;
  if (!r) {
    a.status = -1;
    return a;
  }
  a.status = r->status;
  a.body = r->body;
  a.node = HeaderOf(r->headers, "x-cortiq-node");
  a.forwarded_by = HeaderOf(r->headers, "x-cortiq-forwarded-by");
  a.session = HeaderOf(r->headers, "x-cortiq-session-id");
  auto take = [&](const Json& j) {
    if (!j.is_object()) return;
    if (j.contains("choices") && !j["choices"].empty()) a.text += j["choices"][0].value("text", "");
    if (j.contains("usage") && j["usage"].is_object()) {
      a.cached = j["usage"]["prompt_tokens_details"].value("cached_tokens", int64_t{-1});
    }
  };
  if (!stream) {
    take(Json::parse(r->body, nullptr, false));
    return a;
  }
  size_t at = 0;
  while (at < r->body.size()) {
    const size_t end = r->body.find("\n\n", at);
    if (end == std::string::npos) break;
    const std::string data = r->body.substr(at + 6, end - at - 6);
    if (data != "[DONE]") take(Json::parse(data, nullptr, false));
    at = end + 2;
  }
  return a;
}

const std::string kTurn1 = std::string(40, 'a') + "Call me Ishmael.";
const std::string kTurn2 = " Some years ago";
const std::string kTurn3 = " never mind how long";

// The cluster, and the conversation "moby" begun on A.
class HttpClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    nodes = StartCluster();
    for (auto& [name, n] : nodes) ASSERT_TRUE(n.server) << name;
    first = Turn(nodes["a"], "moby", kTurn1);
    ASSERT_EQ(first.status, 200) << first.body;
  }
  std::map<std::string, Node> nodes;
  Answer first;
};

TEST_F(HttpClusterTest, AConversationIsAnsweredByItsOwnerThroughAnyNode) {
  Node &a = nodes["a"], &b = nodes["b"], &c = nodes["c"], &ref = nodes["ref"];
  EXPECT_EQ(first.node, "a");
  EXPECT_EQ(first.forwarded_by, "");
  const Answer ref1 = Turn(ref, "moby", kTurn1);
  ASSERT_EQ(ref1.status, 200) << ref1.body;
  EXPECT_EQ(first.text, ref1.text);

  // Turn 2 through B: run on A, its owner, reusing A's session.
  std::string convo = kTurn1 + first.text + kTurn2;
  const Answer second = Turn(b, "moby", convo);
  ASSERT_EQ(second.status, 200) << second.body;
  EXPECT_EQ(second.node, "a");
  EXPECT_EQ(second.forwarded_by, "b");
  EXPECT_GT(second.cached, 0) << second.body;
  const Answer ref2 = Turn(ref, "moby", convo);
  EXPECT_EQ(second.text, ref2.text);
  EXPECT_EQ(second.cached, ref2.cached);
  EXPECT_EQ(b.server->store().num_sessions(), 0u);
  EXPECT_EQ(a.server->store().num_sessions(), 1u);

  // Turn 3 streamed through C: the same writers, the same answer.
  convo += second.text + kTurn3;
  const Answer third = Turn(c, "moby", convo, /*stream=*/true);
  ASSERT_EQ(third.status, 200) << third.body;
  EXPECT_EQ(third.node, "a");
  EXPECT_EQ(third.forwarded_by, "c");
  EXPECT_GT(third.cached, 0) << third.body;
  const Answer ref3 = Turn(ref, "moby", convo, /*stream=*/true);
  EXPECT_EQ(third.text, ref3.text);
  EXPECT_EQ(c.server->store().num_sessions(), 0u);
  EXPECT_EQ(a.server->store().num_sessions(), 1u);

  // n choices with logprobs, relayed: the same choices as the reference's.
  convo += third.text;
  Json many = {{"model", "cortiq-byte-4m"}, {"prompt", convo + " precisely"},
               {"max_tokens", 6},           {"temperature", 0},
               {"ignore_eos", true},        {"n", 2},
               {"logprobs", 2}};
  auto via_b = b.http->Post("/v1/completions", {{"x-cortiq-session", "moby"}}, many.dump(),
                            "application/json");
  auto on_ref = ref.http->Post("/v1/completions", {{"x-cortiq-session", "moby"}}, many.dump(),
                               "application/json");
  ASSERT_TRUE(via_b && on_ref);
  ASSERT_EQ(via_b->status, 200) << via_b->body;
  EXPECT_EQ(HeaderOf(via_b->headers, "x-cortiq-node"), "a");
  const Json jb = Json::parse(via_b->body), jr = Json::parse(on_ref->body);
  ASSERT_EQ(jb["choices"].size(), 2u) << via_b->body;
  EXPECT_EQ(jb["choices"], jr["choices"]);
  EXPECT_EQ(jb["usage"], jr["usage"]);

  // A conversation no node holds is created where it is asked for.
  const Answer fresh = Turn(b, "pequod", kTurn1);
  ASSERT_EQ(fresh.status, 200) << fresh.body;
  EXPECT_EQ(fresh.node, "b");
  EXPECT_EQ(fresh.forwarded_by, "");
  EXPECT_EQ(b.server->store().num_sessions(), 1u);
}

// A turn relayed to its owner is checked here first, as one run here would
// be: a count above 2^32 was cast to the wire's uint32 (max_tokens 2^32 + 5
// ran as 5) and n sized this node's answer (2^32 + 2 choices: bad_alloc).
TEST_F(HttpClusterTest, ARelayedTurnIsCheckedHereFirst) {
  Node &a = nodes["a"], &b = nodes["b"];
  const std::string convo = kTurn1 + first.text + kTurn2;
  const int64_t above = int64_t{1} << 32;
  for (const auto& [field, value] : std::vector<std::pair<std::string, int64_t>>{
           {"max_tokens", above + 5}, {"min_tokens", above + 1}, {"n", above + 2}}) {
    SCOPED_TRACE(field);
    Json body = {
        {"model", "cortiq-byte-4m"}, {"prompt", convo}, {"max_tokens", 8}, {"temperature", 0}};
    body[field] = value;
    auto r = b.http->Post("/v1/completions", {{"x-cortiq-session", "moby"}}, body.dump(),
                          "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << r->body;
    const Json e = Json::parse(r->body, nullptr, false);
    ASSERT_TRUE(e.is_object() && e.contains("error")) << r->body;
    EXPECT_EQ(e["error"]["param"], field) << r->body;
    EXPECT_EQ(HeaderOf(r->headers, "x-cortiq-node"), "b");  // refused here, not relayed
  }
  EXPECT_EQ(b.server->store().num_sessions(), 0u);
  EXPECT_EQ(a.server->store().num_sessions(), 1u);
  // The conversation goes on through B as before.
  const Answer next = Turn(b, "moby", convo);
  ASSERT_EQ(next.status, 200) << next.body;
  EXPECT_EQ(next.node, "a");
  EXPECT_GT(next.cached, 0) << next.body;
}

TEST_F(HttpClusterTest, AClosedRelayedStreamEndsTheOwnersJobAndKeepsItsSession) {
  Node &a = nodes["a"], &b = nodes["b"];

  // A long stream through B, closed by its client after its first bytes.
  Json body = {{"model", "cortiq-byte-4m"}, {"prompt", kTurn1 + first.text + kTurn2},
               {"max_tokens", 1500},       {"temperature", 0},
               {"ignore_eos", true},       {"stream", true}};
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.headers = {{"x-cortiq-session", "moby"}, {"Content-Type", "application/json"}};
  req.body = body.dump();
  bool got_data = false;
  req.content_receiver = [&](const char* data, size_t size, uint64_t, uint64_t) {
    got_data = std::string_view(data, size).find("data: ") != std::string_view::npos;
    return false;  // the client goes away
  };
  auto r = b.http->send(req);
  EXPECT_FALSE(r);  // cancelled by the receiver
  EXPECT_TRUE(got_data);

  // B's stream notices (a failed write or its liveness check) and cancels
  // the gRPC call; A's job ends, its kept session stays.
  const auto until = std::chrono::steady_clock::now() + seconds(30);
  ASSERT_TRUE(b.server->context().streams_in_flight.WaitIdleUntil(until));
  ASSERT_TRUE(a.server->context().jobs_in_flight.WaitIdleUntil(until));
  ASSERT_TRUE(a.server->context().streams_in_flight.WaitIdleUntil(until));
  EXPECT_EQ(a.server->store().num_sessions(), 1u);
  EXPECT_EQ(b.server->store().num_sessions(), 0u);
  // The cancel reached A: its job stopped before its 1500 tokens (79 prompt).
  const auto kept = a.server->store().Get(first.session);
  ASSERT_TRUE(kept.has_value()) << first.session;
  EXPECT_LT(kept->tokens, 79u + 1500u);

  // The conversation goes on, on A.
  const Answer next = Turn(b, "moby", kTurn1 + first.text + kTurn2);
  ASSERT_EQ(next.status, 200) << next.body;
  EXPECT_EQ(next.node, "a");
  EXPECT_GT(next.cached, 0) << next.body;
}

TEST_F(HttpClusterTest, AfterTheOwnerDrainsTheConversationStillReuses) {
  Node& a = nodes["a"];

  const DrainReport report = a.server->Drain(milliseconds(0));
  ASSERT_EQ(a.server->store().num_sessions(), 0u);
  // The node that took it, and the one that did not: the next turn through
  // the latter is relayed to the former.
  const bool to_b = nodes["b"].server->store().num_sessions() == 1;
  ASSERT_EQ(nodes["b"].server->store().num_sessions() + nodes["c"].server->store().num_sessions(),
            1u);
  const std::string owner = to_b ? "b" : "c", other = to_b ? "c" : "b";
  const Answer next = Turn(nodes[other], "moby", kTurn1 + first.text + kTurn2);
  ASSERT_EQ(next.status, 200) << next.body;
  EXPECT_EQ(next.node, owner);
  EXPECT_EQ(next.forwarded_by, other);
  EXPECT_GT(next.cached, 0) << next.body;
  EXPECT_EQ(nodes[other].server->store().num_sessions(), 0u);
  // The drained node still relays its moved conversation (its forwarding
  // record), as its gRPC front does; the turn after reuses it again.
  const Answer via_a = Turn(a, "moby", kTurn1 + first.text + kTurn2 + next.text + kTurn3);
  ASSERT_EQ(via_a.status, 200) << via_a.body;
  EXPECT_EQ(via_a.node, owner);
  EXPECT_EQ(via_a.forwarded_by, "a");
  EXPECT_GT(via_a.cached, 0) << via_a.body;
  EXPECT_EQ(a.server->store().num_sessions(), 0u);
  // A conversation nobody holds is not started on the drained node.
  EXPECT_EQ(Turn(a, "pequod", kTurn1).status, 503);
  EXPECT_EQ(report.migrated, 1u);
}

TEST_F(HttpClusterTest, ShutdownCancelsTheRelayedGenerationsInFlight) {
  Node &a = nodes["a"], &b = nodes["b"];

  // A long turn through B, not streamed: B's worker waits for A's answer.
  Answer relayed;
  std::thread client([&] {
    relayed = Turn(b, "moby", kTurn1 + first.text + kTurn2, /*stream=*/false, 1500);
  });
  // Once A runs it, B stops: Quiesce has no job of its own to cancel, the
  // HTTP front's Stop cancels the relayed call, and A's job ends.
  const auto until = std::chrono::steady_clock::now() + seconds(30);
  while (a.server->context().jobs_in_flight.count() == 0 &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::yield();
  }
  ASSERT_EQ(a.server->context().jobs_in_flight.count(), 1u);
  b.server->Shutdown(milliseconds(0));
  client.join();
  EXPECT_EQ(relayed.status, 503) << relayed.body;  // as a job the server cancelled
  ASSERT_TRUE(a.server->context().jobs_in_flight.WaitIdleUntil(until));
  const auto kept = a.server->store().Get(first.session);
  ASSERT_TRUE(kept.has_value());
  EXPECT_LT(kept->tokens, 79u + 1500u);
}

TEST_F(HttpClusterTest, AStaleCachedOwnerIsLookedUpAgain) {
  Node &a = nodes["a"], &b = nodes["b"];
  // B learns that A owns the conversation ...
  const std::string convo = kTurn1 + first.text + kTurn2;
  const Answer second = Turn(b, "moby", convo);
  ASSERT_EQ(second.status, 200) << second.body;
  ASSERT_EQ(second.node, "a");
  // ... then A moves the session to C and stops: B's cached owner is
  // unreachable (UNAVAILABLE), forgotten, and the lookup finds C.
  v1::MigrateSessionResponse moved;
  ASSERT_TRUE(testing::MigrateCall(a.node, first.session, nodes["c"].node.addr, &moved).ok());
  a.server->Shutdown(milliseconds(0));
  const Answer third = Turn(b, "moby", convo + second.text + kTurn3);
  ASSERT_EQ(third.status, 200) << third.body;
  EXPECT_EQ(third.node, "c");
  EXPECT_EQ(third.forwarded_by, "b");
  EXPECT_GT(third.cached, 0) << third.body;
  EXPECT_EQ(b.server->store().num_sessions(), 0u);
}

// A peer that does not answer the lookup (nothing listens on its port):
// a new conversation is still served here — the client resends all of it,
// so a session made here answers it correctly — and its next turn reuses it.
TEST(HttpClusterSilentPeerTest, ANewConversationIsCreatedHereWhenAPeerIsSilent) {
  Node a = StartNode("a", FreePort(), {Addr(FreePort())});
  ASSERT_TRUE(a.server);
  const Answer t1 = Turn(a, "moby", kTurn1);
  ASSERT_EQ(t1.status, 200) << t1.body;
  EXPECT_EQ(t1.node, "a");
  EXPECT_EQ(a.server->store().Get(t1.session).has_value(), true);
  const Answer t2 = Turn(a, "moby", kTurn1 + t1.text + kTurn2);
  ASSERT_EQ(t2.status, 200) << t2.body;
  EXPECT_GT(t2.cached, 0);
}

// A conversation created here while a peer was silent may exist on that
// peer too when it comes back (a restart restores it from its state dir, a
// frozen node wakes: the persist soak saw such copies pile up). The reaper
// keeps asking; once a peer holds the session, the copy here is released
// (reason duplicate) and the next turn here is relayed to that peer.
TEST(HttpClusterSilentPeerTest, ACopyMadeWhileAPeerWasSilentGoesOnceThePeerHoldsIt) {
  const int port_a = FreePort(), port_b = FreePort();
  Node b = StartNode("b", port_b, {Addr(port_a)});
  Node a = StartNode("a", port_a, {Addr(port_b), Addr(FreePort())});  // the second is silent
  ASSERT_TRUE(a.server && b.server);
  const Answer t1 = Turn(a, "moby", kTurn1);
  ASSERT_EQ(t1.status, 200) << t1.body;
  EXPECT_EQ(t1.node, "a");
  const std::string id = t1.session;
  // Asked again and again: B does not hold it, the silent peer never answers.
  std::this_thread::sleep_for(milliseconds(1500));
  ASSERT_TRUE(a.server->store().Get(id).has_value());
  // B comes to hold a copy of it (here an import of A's, under its id).
  std::string wire;
  {
    grpc::ClientContext ctx;
    v1::ExportSessionRequest req;
    req.set_session_id(id);
    auto reader = a.node.stub->ExportSession(&ctx, req);
    for (v1::WireChunk c; reader->Read(&c);) wire += c.data();
    ASSERT_TRUE(reader->Finish().ok());
  }
  {
    grpc::ClientContext ctx;
    v1::ImportSessionResponse resp;
    auto writer = b.node.stub->ImportSession(&ctx, &resp);
    v1::WireChunk c;
    c.set_data(wire);
    ASSERT_TRUE(writer->Write(c));
    writer->WritesDone();
    const grpc::Status st = writer->Finish();
    ASSERT_TRUE(st.ok()) << st.error_message();
    ASSERT_EQ(resp.session().session_id(), id);
  }
  // A's reaper finds it on B: A's copy goes (backoff up to 30 s between asks).
  const auto until = std::chrono::steady_clock::now() + seconds(45);
  while (a.server->store().Get(id).has_value() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_FALSE(a.server->store().Get(id).has_value());
  EXPECT_TRUE(b.server->store().Get(id).has_value());
  EXPECT_EQ(a.server->store().releases()[size_t(session::ReleaseReason::kDuplicate)], 1u);
  // The conversation goes on through A, answered by B from B's copy.
  const Answer t2 = Turn(a, "moby", kTurn1 + t1.text + kTurn2);
  ASSERT_EQ(t2.status, 200) << t2.body;
  EXPECT_EQ(t2.node, "b");
  EXPECT_EQ(t2.forwarded_by, "a");
  EXPECT_GT(t2.cached, 0);
  EXPECT_FALSE(a.server->store().Get(id).has_value());
}

// Every peer answers at last and none holds it: the copy here is the only
// one and stays.
TEST(HttpClusterSilentPeerTest, ACopyNoPeerHoldsStays) {
  const int port_a = FreePort(), port_b = FreePort();
  Node b = StartNode("b", port_b, {Addr(port_a)});
  Node a = StartNode("a", port_a, {Addr(port_b)});
  ASSERT_TRUE(a.server && b.server);
  const Answer t1 = Turn(a, "moby", kTurn1);
  ASSERT_EQ(t1.status, 200) << t1.body;
  std::this_thread::sleep_for(milliseconds(1500));
  EXPECT_TRUE(a.server->store().Get(t1.session).has_value());
  EXPECT_EQ(a.server->store().releases()[size_t(session::ReleaseReason::kDuplicate)], 0u);
}

// What the wire's uint32 fields cannot carry is refused, never cast.
TEST(ToRelayedRequestTest, RefusesCountsAboveTheWiresUint32) {
  session::GenerationRequest g;
  g.prompt = {1, 2, 3};
  g.max_tokens = 7;
  g.min_tokens = 2;
  g.n = 3;
  GenerationTarget target;
  target.session_id = "s";
  absl::StatusOr<v1::GenerateRequest> ok = http::ToRelayedRequest(g, target);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->max_tokens(), 7u);
  EXPECT_EQ(ok->min_tokens(), 2u);
  EXPECT_EQ(ok->n(), 3u);
  const size_t above = size_t{1} << 32;
  for (size_t session::GenerationRequest::*field :
       {&session::GenerationRequest::max_tokens, &session::GenerationRequest::min_tokens,
        &session::GenerationRequest::n}) {
    session::GenerationRequest bad = g;
    bad.*field = above + 5;
    const absl::Status st = http::ToRelayedRequest(bad, target).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("4294967301 is above 4294967295"), std::string::npos) << st;
  }
}

}  // namespace
}  // namespace cortiq::server
