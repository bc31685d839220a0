// Who a node dials (issue 15, requirements 4 and 6). A session moves only
// to a peer (--peers, --peer-dns) or a --migrate-allow address: any other is
// PERMISSION_DENIED before a connection is opened, which a raw TCP listener
// here checks by seeing none, and the session stays intact and usable; an
// allowed address is dialled (the same listener sees the connection); a
// drain uses the peers, never the allow list; --peer-dns addresses are peers
// by their exact "IP:PORT", and a hanging lookup holds a caller for
// --peer-connect-timeout at most while an answer is cached. With --peer-ca, peers talk TLS: a CA and a node
// certificate for IP:127.0.0.1 are made here with the openssl CLI, a
// session migrates between two TLS nodes and continues token-identically,
// and a node trusting another CA fails the migration and keeps the session.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <vector>

#include "absl/strings/str_join.h"
#include "cortiq/v1/inference.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/config.h"
#include "server/peer_dialer.h"
#include "server/server.h"
#include "tests/common/model_test_util.h"
#include "tests/common/server_test_util.h"

namespace cortiq::server {
namespace {

using std::chrono::milliseconds;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
namespace v1 = ::cortiq::v1;

// A TCP listener on 127.0.0.1 that speaks nothing: it only counts the
// connections made to it (and holds them open, so a gRPC client that
// reached it waits for an HTTP/2 answer that never comes).
class RawListener {
 public:
  RawListener() {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    EXPECT_GE(fd_, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(listen(fd_, 16), 0);
    socklen_t len = sizeof(a);
    EXPECT_EQ(getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len), 0);
    port_ = ntohs(a.sin_port);
  }
  ~RawListener() {
    for (int c : accepted_) close(c);
    close(fd_);
  }
  RawListener(const RawListener&) = delete;
  RawListener& operator=(const RawListener&) = delete;

  int port() const { return port_; }
  std::string addr() const { return "127.0.0.1:" + std::to_string(port_); }

  // Accepts every connection waiting now (never blocks); the count so far.
  size_t Accepted() {
    for (int c; (c = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC)) >= 0;) accepted_.push_back(c);
    return accepted_.size();
  }
  // Waits up to `timeout` for a connection to arrive (poll on the socket);
  // the count so far.
  size_t WaitAccepted(milliseconds timeout) {
    if (Accepted() > 0) return accepted_.size();
    pollfd p{fd_, POLLIN, 0};
    poll(&p, 1, static_cast<int>(timeout.count()));
    return Accepted();
  }

 private:
  int fd_ = -1;
  int port_ = 0;
  std::vector<int> accepted_;
};

ServerConfig NodeConfig() {
  ServerConfig c;
  c.model_dir = testing::TempModel("tiny");
  c.grace = milliseconds(0);
  c.peer_connect_timeout = milliseconds(300);  // the silent listener: given up after this
  return c;
}

using testing::KeptTurn;
using testing::MigrateCall;

// The session's state now, for "intact" checks: tokens, bytes, not leased.
void ExpectIntact(testing::TestNode& n, const session::SessionSnapshot& before,
                  const std::string& what) {
  SCOPED_TRACE(what);
  std::optional<session::SessionSnapshot> now = n.server->store().Get(before.id);
  ASSERT_TRUE(now.has_value()) << "the session is gone";
  EXPECT_EQ(now->tokens, before.tokens);
  EXPECT_EQ(now->memory.bytes, before.memory.bytes);
  EXPECT_FALSE(now->busy);
}

// Names that are not an allowed peer are refused before anything is dialled:
// the listener they name sees no connection, the answer names the address
// and the flags that would allow it, and the session goes on.
TEST(PeerSecurityTest, MigrationToANonPeerIsRefusedBeforeAnyConnection) {
  RawListener listener;
  ServerConfig c = NodeConfig();
  c.peers = {"127.0.0.1:1"};
  c.migrate_allow = {"127.0.0.1:2"};
  testing::TestNode a = testing::StartTestNode(c);
  ASSERT_TRUE(a.server);
  testing::StreamOut s = KeptTurn(a, "", "a session that stays home");
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();
  const session::SessionSnapshot before = *a.server->store().Get(s.session);
  // The listener itself, an alias of it (no lookup, no alias: the exact
  // string is the rule), the same with spaces around it, another host.
  const std::string port = std::to_string(listener.port());
  const std::vector<std::string> targets = {
      listener.addr(), "localhost:" + port, " " + listener.addr() + " ",
      "[::ffff:127.0.0.1]:" + port, "metadata.google.internal:80"};
  for (const std::string& target : targets) {
    SCOPED_TRACE(target);
    v1::MigrateSessionResponse resp;
    const grpc::Status st = MigrateCall(a, s.session, target, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED) << st.error_message();
    EXPECT_THAT(st.error_message(), HasSubstr("'" + target + "'"));
    EXPECT_THAT(st.error_message(), HasSubstr("--peers"));
    EXPECT_THAT(st.error_message(), HasSubstr("--migrate-allow"));
    EXPECT_EQ(listener.Accepted(), 0u) << "a refused address was dialled";
    ExpectIntact(a, before, target);
  }
  // An unknown session to a non-peer: refused the same way (the address is
  // checked first; nothing says whether the session exists).
  v1::MigrateSessionResponse resp;
  EXPECT_EQ(MigrateCall(a, "0123456789abcdef0123456789abcdef", listener.addr(), &resp).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // The session generates on as if nothing was asked.
  testing::StreamOut more = KeptTurn(a, s.session, " and on");
  ASSERT_TRUE(more.status.ok()) << more.status.error_message();
  EXPECT_EQ(more.ids.size(), 8u);
  // A connection started in the background would have arrived by now; give
  // it a last short window all the same.
  EXPECT_EQ(listener.WaitAccepted(milliseconds(200)), 0u);
}

// A node whose --migrate-allow names a raw listener (and that has no peer).
class AllowedListenerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerConfig c = NodeConfig();
    c.migrate_allow = {listener_.addr()};
    a_ = testing::StartTestNode(c);
    ASSERT_TRUE(a_.server);
  }
  RawListener listener_;
  testing::TestNode a_;
};

// The same listener named in --migrate-allow is dialled: it sees the
// connection, never answers, and the migration fails (UNAVAILABLE after
// --peer-connect-timeout) with the session intact.
TEST_F(AllowedListenerTest, AnAllowedAddressIsDialled) {
  testing::StreamOut s = KeptTurn(a_, "", "a session to send nowhere");
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();
  const session::SessionSnapshot before = *a_.server->store().Get(s.session);
  v1::MigrateSessionResponse resp;
  auto call = std::async(std::launch::async,
                         [&] { return MigrateCall(a_, s.session, listener_.addr(), &resp); });
  EXPECT_EQ(listener_.WaitAccepted(milliseconds(10'000)), 1u)
      << "the allowed address was not dialled";
  const grpc::Status st = call.get();
  EXPECT_TRUE(st.error_code() == grpc::StatusCode::UNAVAILABLE ||
              st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED)
      << st.error_code() << " " << st.error_message();
  EXPECT_THAT(st.error_message(), HasSubstr(listener_.addr()));
  ExpectIntact(a_, before, "after the failed migration");
  testing::StreamOut more = KeptTurn(a_, s.session, " still here");
  EXPECT_TRUE(more.status.ok()) << more.status.error_message();
}

// A drain moves sessions to the peers only: a --migrate-allow address is a
// target an operator names per call, not one a drain picks.
TEST_F(AllowedListenerTest, ADrainUsesThePeersNotTheAllowList) {
  EXPECT_TRUE(a_.server->peer_dialer().Peers().empty());
  testing::StreamOut s = KeptTurn(a_, "", "a session with no peer to go to");
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();
  const DrainReport r = a_.server->Drain(milliseconds(0));
  ASSERT_EQ(r.sessions.size(), 1u);
  EXPECT_FALSE(r.sessions[0].migrated);
  EXPECT_THAT(r.sessions[0].error, HasSubstr("no peer configured"));
  EXPECT_EQ(r.failed, 1u);
  EXPECT_EQ(listener_.WaitAccepted(milliseconds(200)), 0u);
  EXPECT_TRUE(a_.server->store().Get(s.session).has_value());
}

// --peer-dns NAME:PORT: every address NAME resolves to is a peer, as
// "IP:PORT"; the name itself is not (the allow list is exact strings), and
// a session migrates to the resolved address and continues there.
TEST(PeerSecurityTest, PeerDnsAddressesArePeersByTheirExactAddress) {
  testing::TestNode b = testing::StartTestNode(NodeConfig());
  ASSERT_TRUE(b.server);
  const std::string port = std::to_string(b.server->port());
  ServerConfig c = NodeConfig();
  c.peers = {"127.0.0.1:1"};
  c.peer_dns = "localhost:" + port;
  testing::TestNode a = testing::StartTestNode(c);
  ASSERT_TRUE(a.server);
  const std::vector<std::string> peers = a.server->peer_dialer().Peers();
  ASSERT_GE(peers.size(), 2u);
  EXPECT_EQ(peers[0], "127.0.0.1:1");  // the static peers first, in their order
  EXPECT_NE(std::find(peers.begin(), peers.end(), b.addr), peers.end())
      << "--peer-dns localhost:" << port << " gave " << absl::StrJoin(peers, ",");
  EXPECT_TRUE(a.server->peer_dialer().CheckAllowed(b.addr).ok());
  EXPECT_EQ(a.server->peer_dialer().CheckAllowed(c.peer_dns).code(),
            absl::StatusCode::kPermissionDenied);

  testing::StreamOut moved = KeptTurn(a, "", "resolved"), twin = KeptTurn(a, "", "resolved");
  ASSERT_TRUE(moved.status.ok() && twin.status.ok());
  v1::MigrateSessionResponse resp;
  grpc::Status st = MigrateCall(a, moved.session, c.peer_dns, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED) << st.error_message();
  st = MigrateCall(a, moved.session, b.addr, &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  testing::StreamOut on_b = KeptTurn(b, resp.peer_session_id(), " onwards");
  testing::StreamOut on_a = KeptTurn(a, twin.session, " onwards");
  ASSERT_TRUE(on_b.status.ok()) << on_b.status.error_message();
  EXPECT_EQ(on_b.ids, on_a.ids);
}

// A --peer-dns resolver that blocks until opened, counting its lookups.
class GatedResolver {
 public:
  explicit GatedResolver(std::vector<std::string> answer) : answer_(std::move(answer)) {}
  PeerDialer::Resolver Fn() {
    return [this](const std::string&, const std::string&) {
      std::unique_lock lock(mu_);
      ++lookups_;
      cv_.wait(lock, [&] { return open_; });
      return answer_;
    };
  }
  void Open() {
    {
      std::lock_guard lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  int lookups() {
    std::lock_guard lock(mu_);
    return lookups_;
  }

 private:
  const std::vector<std::string> answer_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
  int lookups_ = 0;
};

// getaddrinfo cannot be given a timeout: a lookup that hangs holds a caller
// for --peer-connect-timeout at most, which then sees the peers it knows
// (here the static ones: no answer yet); an answer is cached, so a burst of
// checks costs one lookup; the static peers come first and an address both
// lists name is listed once.
TEST(PeerDialerDnsTest, ALookupIsWaitedForBoundedlyAndCached) {
  ServerConfig c;
  c.peers = {"10.0.0.1:1"};
  c.peer_dns = "peers.test:50051";
  c.peer_connect_timeout = milliseconds(300);
  GatedResolver gate({"10.0.0.2:50051", "10.0.0.1:1"});
  absl::StatusOr<std::unique_ptr<PeerDialer>> d = PeerDialer::Create(c, gate.Fn());
  ASSERT_TRUE(d.ok()) << d.status();
  // The dialer's destructor joins its resolver: open the gate before it runs.
  struct OpenOnExit {
    GatedResolver& gate;
    ~OpenOnExit() { gate.Open(); }
  } open_on_exit{gate};

  // The lookup hangs: the check returns (after the bound) and knows only
  // the static peer.
  EXPECT_EQ((*d)->CheckAllowed("10.0.0.2:50051").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE((*d)->CheckAllowed("10.0.0.1:1").ok());
  EXPECT_EQ(gate.lookups(), 1);  // one lookup in flight serves every waiter

  gate.Open();
  // Each call waits (on the dialer's condition variable, up to the bound)
  // for the answer the resolver thread is now storing.
  std::vector<std::string> peers;
  for (int i = 0; i < 20 && peers.size() < 2; ++i) peers = (*d)->Peers();
  EXPECT_THAT(peers, ElementsAre("10.0.0.1:1", "10.0.0.2:50051"));
  const auto answered = std::chrono::steady_clock::now();
  for (int i = 0; i < 50; ++i) {
    EXPECT_TRUE((*d)->CheckAllowed("10.0.0.2:50051").ok());
    EXPECT_EQ((*d)->CheckAllowed("peers.test:50051").code(), absl::StatusCode::kPermissionDenied);
  }
  if (std::chrono::steady_clock::now() - answered < PeerDialer::kDnsCacheTtl) {
    EXPECT_EQ(gate.lookups(), 1) << "a cached answer was looked up again";
  }
}

// --peer-ca must be a readable file of PEM certificates: anything else
// stops the start with InvalidArgument naming the flag.
TEST(PeerSecurityTest, PeerCaMustBeAReadablePemFile) {
  const std::string dir = ::testing::TempDir() + "/cortiq_peer_ca_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  { std::ofstream(dir + "/not_pem.txt") << "not a certificate\n"; }
  ServerConfig c = NodeConfig();
  for (const std::string& ca : {dir + "/missing.pem", dir, dir + "/not_pem.txt"}) {
    SCOPED_TRACE(ca);
    c.peer_ca = ca;
    absl::StatusOr<std::unique_ptr<PeerDialer>> d = PeerDialer::Create(c);
    ASSERT_FALSE(d.ok());
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(d.status().message()), HasSubstr("--peer-ca"));
    EXPECT_THAT(std::string(d.status().message()), HasSubstr(ca));
  }
  // The server refuses to start with it.
  c.peer_ca = dir + "/missing.pem";
  c.listen = "127.0.0.1:0";
  c.metrics_listen = "off";
  absl::StatusOr<std::unique_ptr<Server>> s = Server::Start(c);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("--peer-ca"));
  std::filesystem::remove_all(dir);
}

// Two CAs and a node certificate for IP:127.0.0.1 signed by the first,
// made with the openssl CLI in a temp dir.
class PeerTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::system("openssl version >/dev/null 2>&1") != 0) {
      GTEST_SKIP() << "the openssl command is missing: the TLS peer tests need it to make "
                      "their certificates (apt-get install openssl)";
    }
    dir_ = ::testing::TempDir() + "/cortiq_peer_tls_" + std::to_string(getpid());
    std::filesystem::create_directories(dir_);
    const std::string key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    const std::vector<std::string> steps = {
        "openssl req -x509 " + key + " -days 1 -subj /CN=cortiq-test-ca -keyout ca.key -out ca.pem",
        "openssl req -x509 " + key +
            " -days 1 -subj /CN=cortiq-other-ca -keyout ca2.key -out ca2.pem",
        "openssl req " + key + " -subj /CN=127.0.0.1 -keyout node.key -out node.csr",
        "openssl x509 -req -in node.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 "
        "-extfile node.ext -out node.pem",
    };
    std::ofstream(dir_ + "/node.ext") << "subjectAltName=IP:127.0.0.1\n"
                                         "basicConstraints=CA:FALSE\n"
                                         "extendedKeyUsage=serverAuth,clientAuth\n";
    for (const std::string& step : steps) {
      const std::string cmd = "cd '" + dir_ + "' && " + step + " >>openssl.log 2>&1";
      ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd << " failed; see " << dir_ << "/openssl.log";
    }
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // A node serving TLS with the node certificate, dialling its peers with
  // `peer_ca` as their trusted root.
  testing::TestNode StartTlsNode(const std::string& peer_ca, std::vector<std::string> peers) {
    ServerConfig c = NodeConfig();
    c.peer_connect_timeout = milliseconds(5'000);
    c.tls_cert = dir_ + "/node.pem";
    c.tls_key = dir_ + "/node.key";
    c.peer_ca = dir_ + "/" + peer_ca;
    c.peers = std::move(peers);
    return testing::StartTestNode(c, ClientCredentials());
  }
  // The test's own clients trust the first CA.
  std::shared_ptr<grpc::ChannelCredentials> ClientCredentials() {
    grpc::SslCredentialsOptions ssl;
    absl::StatusOr<std::string> ca = ReadFlagFile(dir_ + "/ca.pem", "ca.pem");
    EXPECT_TRUE(ca.ok()) << ca.status();
    ssl.pem_root_certs = ca.value_or("");
    return grpc::SslCredentials(ssl);
  }

  std::string dir_;
};

TEST_F(PeerTlsTest, MigrationOverTlsContinuesTokenIdentically) {
  testing::TestNode b = StartTlsNode("ca.pem", {});
  ASSERT_TRUE(b.server);
  testing::TestNode a = StartTlsNode("ca.pem", {b.addr});
  ASSERT_TRUE(a.server);
  EXPECT_TRUE(a.server->peer_dialer().tls());
  const std::string opening = std::string(60, 'x') + " Call me Ishmael.";
  testing::StreamOut moved = KeptTurn(a, "", opening), twin = KeptTurn(a, "", opening);
  ASSERT_TRUE(moved.status.ok()) << moved.status.error_message();
  ASSERT_TRUE(twin.status.ok()) << twin.status.error_message();
  v1::MigrateSessionResponse resp;
  const grpc::Status st = MigrateCall(a, moved.session, b.addr, &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_FALSE(a.server->store().Get(moved.session).has_value());
  // B serves TLS only: the session got there over TLS. It continues as its
  // twin that never moved does on A.
  testing::StreamOut on_b = KeptTurn(b, resp.peer_session_id(), " Some years ago");
  testing::StreamOut on_a = KeptTurn(a, twin.session, " Some years ago");
  ASSERT_TRUE(on_b.status.ok()) << on_b.status.error_message();
  ASSERT_TRUE(on_a.status.ok()) << on_a.status.error_message();
  EXPECT_EQ(on_b.ids.size(), 8u);
  EXPECT_EQ(on_b.ids, on_a.ids);
}

TEST_F(PeerTlsTest, APeerCertificateFromAnotherCaFailsTheMigrationAndKeepsTheSession) {
  testing::TestNode b = StartTlsNode("ca.pem", {});
  ASSERT_TRUE(b.server);
  testing::TestNode c = StartTlsNode("ca2.pem", {b.addr});  // trusts the other CA only
  ASSERT_TRUE(c.server);
  testing::StreamOut s = KeptTurn(c, "", "a session that must not leave");
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();
  const session::SessionSnapshot before = *c.server->store().Get(s.session);
  v1::MigrateSessionResponse resp;
  const grpc::Status st = MigrateCall(c, s.session, b.addr, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << st.error_message();
  EXPECT_THAT(st.error_message(), HasSubstr(b.addr));
  ExpectIntact(c, before, "after the refused handshake");
  EXPECT_EQ(b.server->store().num_sessions(), 0u);
  testing::StreamOut more = KeptTurn(c, s.session, " and on");
  EXPECT_TRUE(more.status.ok()) << more.status.error_message();
}

}  // namespace
}  // namespace cortiq::server
