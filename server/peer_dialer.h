// PeerDialer: which addresses this node may dial, and the channels it dials
// them on. Every connection a node opens to another node (a migration, a
// drain, the forwarding of a call) goes through Channel(), which checks the
// address first: there is no unchecked way to get a channel.
//
// Who may be dialled: the peers — --peers (or $CORTIQ_PEERS) plus every
// address --peer-dns NAME:PORT resolves to — and the extra migration
// targets of --migrate-allow. An address is matched as the exact HOST:PORT
// string (the flags' items are trimmed when parsed): no DNS lookup of the
// asked-for name, no alias, so "localhost:5" is not "127.0.0.1:5". Anything
// else is PERMISSION_DENIED before a channel exists, so no connection is
// opened: MigrateSession used to connect to whatever `peer` its caller
// named and stream the session there (a server-side request forgery and an
// exfiltration path, issue 15).
//
// DNS: getaddrinfo has no timeout a caller sets (the resolver's own, from
// resolv.conf, is 5 s a try, tried again, per name server) and cannot be
// cancelled. So lookups run on one resolver thread the dialer owns; an
// answer (an error too: no addresses) is cached for kDnsCacheTtl, so a burst
// of Peers() calls costs one lookup; and a caller waits for a fresh answer
// at most --peer-connect-timeout, after which it gets the last answer (none
// before the first: the static peers only) and the lookup goes on to
// refresh the cache when it ends. The cost: for up to the cache's age a
// pod that left is still a peer (dialling it fails like any dead peer) and
// one that joined is not yet one.
//
// Channels: one per address, made on first use and kept (a migration, a
// drain and the forwarding share its connection). A new channel drops the
// cached ones whose address is no longer allowed (a DNS peer that left), so
// the cache holds at most the addresses allowed at one time plus one.
// Credentials: TLS when --peer-ca is set (its PEM roots; with
// --tls-cert/--tls-key, the node's own certificate as the client
// certificate), plaintext otherwise.
//
// Lifetime and threads: made by Server::Init (Create reads the --peer-ca,
// --tls-cert and --tls-key files; an unreadable one fails the start), owned
// by Server, outlives every user (ServiceContext::peers). Every method is
// thread-safe. Peers(), CheckAllowed() and Channel() may block for up to
// --peer-connect-timeout when --peer-dns is set and its cached answer is
// older than kDnsCacheTtl: call them off the gRPC callback threads (the
// migrations and the drain run on background workers). The destructor
// joins the resolver thread, so it waits for a lookup in flight (bounded
// by the resolver's own timeouts only).
//
// Example:
//   CORTIQ_ASSIGN_OR_RETURN(std::unique_ptr<PeerDialer> dialer, PeerDialer::Create(config));
//   CORTIQ_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> ch, dialer->Channel("10.0.0.7:50051"));
//   auto stub = v1::Inference::NewStub(ch);
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/channel.h"
#include "grpcpp/security/credentials.h"
#include "server/config.h"

namespace cortiq::server {

class PeerDialer {
 public:
  // Whether a call may wait for a stale --peer-dns answer to be refreshed
  // (kYes, up to --peer-connect-timeout: the migrations and the drain, on
  // background workers) or takes the last answer at once and lets the
  // refresh run (kNo: the forwarding, on gRPC's callback threads, which
  // must not block).
  enum class Wait { kYes, kNo };
  // How long a --peer-dns answer is used before the name is looked up again.
  static constexpr std::chrono::milliseconds kDnsCacheTtl{5'000};
  // The longest a cached channel waits before reconnecting to a peer that
  // went away. gRPC's default grows to 120 s; a channel made per migration
  // never saw it, a cached one would fail fast (UNAVAILABLE, not
  // wait-for-ready) for that long after a peer restarts.
  static constexpr std::chrono::milliseconds kMaxReconnectBackoff{1'000};

  // Looks up (host, port): every address as "IP:PORT" / "[IPv6]:PORT",
  // empty when none. Runs on the resolver thread only; may block.
  using Resolver =
      std::function<std::vector<std::string>(const std::string& host, const std::string& port)>;
  // getaddrinfo (any family, stream sockets), in the resolver's order,
  // without repeats; a failure is logged and answers none.
  static std::vector<std::string> ResolveWithGetaddrinfo(const std::string& host,
                                                         const std::string& port);

  // The dialer for `config` (copied: --peers, --peer-dns, --migrate-allow,
  // --peer-ca, --tls-cert/--tls-key, --peer-connect-timeout), looking
  // --peer-dns up with `resolve` (tests give a slow one).
  // InvalidArgument naming the flag when the --peer-ca file cannot be read or
  // holds no PEM certificate, or --tls-cert/--tls-key cannot be read. Starts
  // the resolver thread when --peer-dns is set; no lookup yet.
  static absl::StatusOr<std::unique_ptr<PeerDialer>> Create(
      const ServerConfig& config, Resolver resolve = ResolveWithGetaddrinfo);
  ~PeerDialer();
  PeerDialer(const PeerDialer&) = delete;
  PeerDialer& operator=(const PeerDialer&) = delete;

  // The peers now: --peers in their order, then the --peer-dns addresses
  // ("IP:PORT", "[IPv6]:PORT") not already listed. May block (see the
  // banner).
  std::vector<std::string> Peers(Wait wait = Wait::kYes);

  // OK when `address` is one of Peers() or of --migrate-allow (exact string
  // match); otherwise PERMISSION_DENIED naming the address and the flags that
  // would allow it. Opens no connection. May block (see the banner).
  absl::Status CheckAllowed(std::string_view address, Wait wait = Wait::kYes);

  // CheckAllowed(address), then the channel to it (made on first use,
  // cached): TLS with --peer-ca, plaintext otherwise; no receive size limit
  // (as migrations always dialled); reconnect backoff capped at
  // kMaxReconnectBackoff. Connects lazily, on its first call. May block (see
  // the banner).
  absl::StatusOr<std::shared_ptr<grpc::Channel>> Channel(const std::string& address,
                                                         Wait wait = Wait::kYes);

  // True when peers are dialled over TLS (--peer-ca).
  bool tls() const { return tls_; }

 private:
  PeerDialer(const ServerConfig& config, Resolver resolve,
             std::shared_ptr<grpc::ChannelCredentials> creds, bool tls);
  // The --peer-dns addresses: the cached answer, or a fresh one waited for
  // up to the connect timeout (see the banner).
  std::vector<std::string> DnsPeers(Wait wait);
  // The resolver thread: one lookup each time a caller asks for one.
  void ResolverLoop();
  // Whether `address` is in `peers` (a Peers() answer) or --migrate-allow;
  // the status form says why not.
  bool IsAllowed(std::string_view address, const std::vector<std::string>& peers) const;
  absl::Status CheckAllowedIn(std::string_view address,
                              const std::vector<std::string>& peers) const;

  const std::vector<std::string> static_peers_;  // --peers
  const std::vector<std::string> migrate_allow_;
  const std::string advertise_;                  // --advertise: this node, never its own peer
  const std::string dns_host_, dns_port_;     // --peer-dns split; empty host: none
  const std::chrono::milliseconds dns_wait_;  // --peer-connect-timeout
  const Resolver resolve_;
  const std::shared_ptr<grpc::ChannelCredentials> creds_;
  const bool tls_;

  std::mutex dns_mu_;
  std::condition_variable dns_cv_;
  std::vector<std::string> dns_peers_;  // the last answer (empty before the first)
  bool dns_answered_ = false;           // dns_peers_ holds an answer
  std::chrono::steady_clock::time_point dns_answered_at_;
  uint64_t dns_answers_ = 0;      // answers so far: a waiter sees a new one arrive
  bool dns_wanted_ = false;       // a caller wants a lookup
  bool dns_late_logged_ = false;  // "no answer in time" logged for this lookup
  bool dns_stopping_ = false;
  std::thread resolver_;  // only with --peer-dns; joined by the destructor

  std::mutex channels_mu_;
  std::map<std::string, std::shared_ptr<grpc::Channel>, std::less<>> channels_;
};

}  // namespace cortiq::server
