// Helpers for tests that run real cortiq servers in process on 127.0.0.1:
// a node (server + stub + address) and a Generate call collected whole.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "cortiq/v1/inference.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/server.h"

namespace cortiq::testing {

// A loopback port nobody listens on now (the kernel's pick; released for
// the node to take: a cluster's peers must be named before any node starts).
inline int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

inline std::string Addr(int port) { return "127.0.0.1:" + std::to_string(port); }

struct TestNode {
  std::unique_ptr<server::Server> server;
  std::unique_ptr<v1::Inference::Stub> stub;
  std::string addr;  // "127.0.0.1:PORT"
};

// Starts a server with `c` on 127.0.0.1 port 0 (or c.listen when set: a
// cluster names its peers' ports first), one math thread, metrics off
// unless `c` names a metrics address other than the default (e.g.
// "127.0.0.1:0": Server::metrics_port() tells where)
// (the model, grace and the rest come from `c`); the stub dials it with
// `creds` (TLS ones for a node with --tls-cert).
inline TestNode StartTestNode(
    server::ServerConfig c,
    std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials()) {
  if (c.listen == server::ServerConfig{}.listen) c.listen = "127.0.0.1:0";
  if (c.metrics_listen == server::ServerConfig{}.metrics_listen) c.metrics_listen = "off";
  c.threads = 1;
  auto s = server::Server::Start(c);
  EXPECT_TRUE(s.ok()) << s.status();
  TestNode n;
  if (!s.ok()) return n;
  n.server = *std::move(s);
  n.addr = Addr(n.server->port());
  n.stub = v1::Inference::NewStub(grpc::CreateChannel(n.addr, creds));
  return n;
}

struct StreamOut {
  grpc::Status status;
  std::vector<int32_t> ids;  // streamed token ids
  std::string session;       // the summary's session id
  v1::GenerateSummary summary;  // the last message (empty when the call failed)
};

// One Generate call, read to the end; with `token`, as its bearer.
inline StreamOut RunGenerate(v1::Inference::Stub& stub, const v1::GenerateRequest& r,
                             const std::string& token = "") {
  grpc::ClientContext ctx;
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  StreamOut o;
  auto reader = stub.Generate(&ctx, r);
  v1::GenerateResponse m;
  while (reader->Read(&m)) {
    if (m.has_token()) o.ids.push_back(m.token().token_id());
    if (m.has_summary()) {
      o.session = m.summary().session_id();
      o.summary = m.summary();
    }
  }
  o.status = reader->Finish();
  return o;
}

// ExportSession of `id` through `stub`, read to the end.
struct Exported {
  std::string wire;  // the chunks' data, in order
  grpc::Status status;
};
inline Exported ExportWire(v1::Inference::Stub& stub, const std::string& id) {
  grpc::ClientContext ctx;
  v1::ExportSessionRequest req;
  req.set_session_id(id);
  auto reader = stub.ExportSession(&ctx, req);
  Exported out;
  v1::WireChunk chunk;
  while (reader->Read(&chunk)) out.wire += chunk.data();
  out.status = reader->Finish();
  return out;
}

// A greedy turn of 8 tokens (EOS ignored) on the kept session `session`
// ("" opens one): the request, and the call read whole.
inline v1::GenerateRequest KeptTurnRequest(const std::string& session, const std::string& prompt) {
  v1::GenerateRequest r;
  r.set_prompt(prompt);
  r.set_max_tokens(8);
  r.set_ignore_eos(true);
  r.set_keep_session(true);
  r.set_session_id(session);
  r.mutable_sampling()->set_temperature(0.0f);
  return r;
}
inline StreamOut KeptTurn(TestNode& n, const std::string& session, const std::string& prompt) {
  return RunGenerate(*n.stub, KeptTurnRequest(session, prompt));
}

// MigrateSession(session `id` -> `peer`) on `from`: the call's status
// (*resp filled on OK).
inline grpc::Status MigrateCall(TestNode& from, const std::string& id, const std::string& peer,
                                v1::MigrateSessionResponse* resp) {
  grpc::ClientContext ctx;
  v1::MigrateSessionRequest req;
  req.set_session_id(id);
  req.set_peer(peer);
  return from.stub->MigrateSession(&ctx, req, resp);
}

// Sets `c` to test mode `mode` with parameters small enough to exercise the
// mode on the tiny test models: 0 exact f32, 1 int8 rows, 2 O(1) (m 8,
// window 16, sink 2), 3 QSA (blocks of 16, budget 4), 4 sink + window (sink
// 2, window 16: rows are dropped within a few turns).
inline void SetSessionMode(int mode, v1::SessionConfig* c) {
  if (mode == 1) c->set_kv_dtype(v1::KV_DTYPE_INT8);
  if (mode == 2) {
    c->set_attention(v1::ATTENTION_MODE_O1);
    c->mutable_o1()->set_m(8);
    c->mutable_o1()->set_window(16);
    c->mutable_o1()->set_sink(2);
  }
  if (mode == 3) {
    c->set_attention(v1::ATTENTION_MODE_QSA);
    c->mutable_qsa()->set_ratio(16);
    c->mutable_qsa()->set_budget(4);
  }
  if (mode == 4) {
    c->set_attention(v1::ATTENTION_MODE_WINDOW);
    c->mutable_window()->set_sink(2);
    c->mutable_window()->set_window(16);
  }
}

}  // namespace cortiq::testing
