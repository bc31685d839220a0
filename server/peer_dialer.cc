// PeerDialer: the allow list (peers + --migrate-allow), the bounded and
// cached --peer-dns lookup on the dialer's own resolver thread, and one
// channel per peer address (TLS with --peer-ca). See peer_dialer.h.
#include "server/peer_dialer.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/util/status_macros.h"
#include "core/util/strings.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/support/channel_arguments.h"
#include "spdlog/spdlog.h"

namespace cortiq::server {

namespace {

bool Contains(const std::vector<std::string>& v, std::string_view s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

// A caller's address quoted in an error: at most kShown bytes of it (the
// message travels back as a header, whose size gRPC bounds).
std::string Quoted(std::string_view address) {
  constexpr size_t kShown = 200;
  if (address.size() <= kShown) return absl::StrCat("'", util::Sv(address), "'");
  return absl::StrCat("'", util::Sv(address.substr(0, kShown)), "...' (", address.size(),
                      " bytes)");
}

}  // namespace

// Blocking, unbounded: the resolver thread only.
std::vector<std::string> PeerDialer::ResolveWithGetaddrinfo(const std::string& host,
                                                            const std::string& port) {
  std::vector<std::string> out;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0) {
    spdlog::warn("--peer-dns {}:{}: no addresses ({})", host, port, gai_strerror(rc));
    return out;
  }
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    char ip[INET6_ADDRSTRLEN] = {0};
    const void* addr =
        a->ai_family == AF_INET
            ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr)
            : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr);
    if (inet_ntop(a->ai_family, addr, ip, sizeof(ip)) == nullptr) continue;
    std::string p =
        a->ai_family == AF_INET6 ? absl::StrCat("[", ip, "]:", port) : absl::StrCat(ip, ":", port);
    if (!Contains(out, p)) out.push_back(std::move(p));
  }
  freeaddrinfo(res);
  return out;
}

absl::StatusOr<std::unique_ptr<PeerDialer>> PeerDialer::Create(const ServerConfig& config,
                                                               Resolver resolve) {
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  const bool tls = !config.peer_ca.empty();
  if (tls) {
    grpc::SslCredentialsOptions ssl;
    CORTIQ_ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadFlagFile(config.peer_ca, "--peer-ca"));
    if (!absl::StrContains(ssl.pem_root_certs, "-----BEGIN CERTIFICATE-----")) {
      return absl::InvalidArgumentError(
          absl::StrCat("--peer-ca: '", config.peer_ca,
                       "' holds no PEM certificate (expected -----BEGIN CERTIFICATE-----)"));
    }
    // A node that serves TLS shows its own certificate when it dials too,
    // so a peer that asks for client certificates can check it.
    if (!config.tls_cert.empty()) {
      CORTIQ_ASSIGN_OR_RETURN(ssl.pem_cert_chain, ReadFlagFile(config.tls_cert, "--tls-cert"));
      CORTIQ_ASSIGN_OR_RETURN(ssl.pem_private_key, ReadFlagFile(config.tls_key, "--tls-key"));
    }
    creds = grpc::SslCredentials(ssl);
  } else if (!config.tls_cert.empty() && (!config.peers.empty() || !config.peer_dns.empty())) {
    spdlog::warn(
        "--tls-cert without --peer-ca: this node serves TLS but dials its peers in plaintext "
        "(a peer that serves TLS refuses it); give --peer-ca CA.pem");
  }
  return std::unique_ptr<PeerDialer>(
      new PeerDialer(config, std::move(resolve), std::move(creds), tls));
}

PeerDialer::PeerDialer(const ServerConfig& config, Resolver resolve,
                       std::shared_ptr<grpc::ChannelCredentials> creds, bool tls)
    : static_peers_(config.peers),
      migrate_allow_(config.migrate_allow),
      advertise_(config.advertise),
      dns_host_(config.peer_dns.substr(0, config.peer_dns.rfind(':'))),
      dns_port_(config.peer_dns.empty() ? std::string()
                                        : config.peer_dns.substr(config.peer_dns.rfind(':') + 1)),
      dns_wait_(config.peer_connect_timeout),
      resolve_(std::move(resolve)),
      creds_(std::move(creds)),
      tls_(tls) {
  if (!dns_host_.empty()) resolver_ = std::thread([this] { ResolverLoop(); });
}

PeerDialer::~PeerDialer() {
  {
    std::lock_guard lock(dns_mu_);
    dns_stopping_ = true;
  }
  dns_cv_.notify_all();
  if (resolver_.joinable()) resolver_.join();
}

void PeerDialer::ResolverLoop() {
  std::unique_lock lock(dns_mu_);
  while (true) {
    dns_cv_.wait(lock, [&] { return dns_wanted_ || dns_stopping_; });
    if (dns_stopping_) return;
    dns_wanted_ = false;
    lock.unlock();
    std::vector<std::string> answer = resolve_(dns_host_, dns_port_);
    lock.lock();
    dns_wanted_ = false;  // whoever asked while it ran gets this answer
    dns_peers_ = std::move(answer);
    dns_answered_ = true;
    dns_answered_at_ = std::chrono::steady_clock::now();
    ++dns_answers_;
    dns_late_logged_ = false;
    dns_cv_.notify_all();
  }
}

std::vector<std::string> PeerDialer::DnsPeers(Wait wait) {
  if (dns_host_.empty()) return {};
  std::unique_lock lock(dns_mu_);
  const auto now = std::chrono::steady_clock::now();
  if (dns_answered_ && now - dns_answered_at_ < kDnsCacheTtl) return dns_peers_;
  // Stale or never answered: ask for a lookup (one runs at a time; callers
  // in a burst share it) and wait for an answer, within the bound.
  const uint64_t seen = dns_answers_;
  dns_wanted_ = true;
  dns_cv_.notify_all();
  if (wait == Wait::kNo) return dns_peers_;
  const bool answered = dns_cv_.wait_until(lock, now + dns_wait_,
                                           [&] { return dns_answers_ != seen || dns_stopping_; });
  if (!answered && !dns_late_logged_) {
    dns_late_logged_ = true;
    spdlog::warn(
        "--peer-dns {}:{}: no answer within {} ms (--peer-connect-timeout); using the "
        "last answer ({} address(es)) until it comes",
        dns_host_, dns_port_, dns_wait_.count(), dns_peers_.size());
  }
  return dns_peers_;
}

std::vector<std::string> PeerDialer::Peers(Wait wait) {
  std::vector<std::string> peers = static_peers_;
  for (std::string& p : DnsPeers(wait)) {
    if (!Contains(peers, p)) peers.push_back(std::move(p));
  }
  // A headless Service resolves to this pod too: it is not its own peer.
  if (!advertise_.empty()) std::erase(peers, advertise_);
  return peers;
}

bool PeerDialer::IsAllowed(std::string_view address, const std::vector<std::string>& peers) const {
  return Contains(peers, address) || Contains(migrate_allow_, address);
}

absl::Status PeerDialer::CheckAllowedIn(std::string_view address,
                                        const std::vector<std::string>& peers) const {
  if (IsAllowed(address, peers)) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      "peer ", Quoted(address),
      " is not a peer of this node: sessions move only to --peers, --peer-dns addresses or "
      "--migrate-allow (an exact HOST:PORT match); nothing was dialled"));
}

absl::Status PeerDialer::CheckAllowed(std::string_view address, Wait wait) {
  return CheckAllowedIn(address, Peers(wait));
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> PeerDialer::Channel(const std::string& address,
                                                                   Wait wait) {
  const std::vector<std::string> peers = Peers(wait);
  CORTIQ_RETURN_IF_ERROR(CheckAllowedIn(address, peers));
  std::lock_guard lock(channels_mu_);
  if (auto it = channels_.find(address); it != channels_.end()) return it->second;
  std::erase_if(channels_, [&](const auto& entry) { return !IsAllowed(entry.first, peers); });
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, static_cast<int>(kMaxReconnectBackoff.count()));
  std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(address, creds_, args);
  channels_.emplace(address, channel);
  return channel;
}

}  // namespace cortiq::server
