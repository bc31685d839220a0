// SessionRouter: where the sessions this node does not hold live.
//
// A call may name a session that lives on another node of the cluster: the
// client reconnected, a proxy balanced it elsewhere, or a drain moved the
// session. The service forwards such a call to the session's owner
// (server/forward.h relays it); this class finds the owner:
//
//   1. a forwarding record: this node moved the session away (MigrateSession,
//      drain) and remembers where to, for --forward-ttl;
//   2. an owner learned by an earlier lookup, for kOwnerCacheTtl;
//   3. a lookup: GetSession asked of every peer at once, each answering from
//      its own sessions only (the call carries the hop limit), within the
//      lookup timeout (--peer-connect-timeout) and the caller's deadline; the
//      first peer that holds it wins and is remembered.
//
// A session that no peer holds is NOT_FOUND when every peer answered, and
// UNAVAILABLE naming the silent ones when some did not (the session may be
// on one of them). Lookups are bounded: at most Options::max_lookups in
// flight (RESOURCE_EXHAUSTED beyond), and the tables keep at most
// Options::max_entries each, so no client can make a node hold more by
// naming ids that do not exist.
//
// Threads: every method is thread-safe and none blocks; a lookup's `done`
// runs once, on a gRPC client callback thread (or the caller's, when it ends
// at once), and must not block.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/channel.h"

namespace cortiq::server {

// The metadata a forwarded call carries: how many nodes it has passed
// through. A call that arrives with kMaxForwardHops is served from this
// node's own sessions only, so no forwarding loop can form.
inline constexpr char kHopsHeader[] = "x-cortiq-hops";
inline constexpr int kMaxForwardHops = 2;

class SessionRouter {
 public:
  using Clock = std::chrono::steady_clock;
  // The peers to ask (--peers and --peer-dns), and a channel to one of them
  // (PERMISSION_DENIED for an address that is not a peer).
  using PeerList = std::function<std::vector<std::string>()>;
  using Dial = std::function<absl::StatusOr<std::shared_ptr<grpc::Channel>>(const std::string&)>;
  // How long an owner learned by a lookup is trusted before the next call
  // asks again.
  static constexpr std::chrono::seconds kOwnerCacheTtl{60};

  struct Options {
    std::chrono::milliseconds forward_ttl{600'000};   // --forward-ttl
    std::chrono::milliseconds lookup_timeout{5'000};  // --peer-connect-timeout
    size_t max_lookups = 64;
    size_t max_entries = 1 << 16;
  };

  // What a lookup's peer calls carry: the caller's deadline and the
  // metadata that authenticates them (bearer token, the caller's tenant,
  // traceparent). The router adds the hop limit.
  struct LookupCall {
    std::chrono::system_clock::time_point deadline = std::chrono::system_clock::time_point::max();
    std::vector<std::pair<std::string, std::string>> metadata;
  };

  // A lookup in flight; Cancel ends it (its peer calls are cancelled, `done`
  // gets CANCELLED unless it already ran). Thread-safe, idempotent.
  class Pending {
   public:
    virtual ~Pending() = default;
    virtual void Cancel() = 0;
  };

  SessionRouter(Options options, PeerList peers, Dial dial);
  ~SessionRouter();  // cancels the lookups in flight and waits for their peer calls to end

  // This node moved session `id` to `peer`: calls naming it go there.
  void Moved(const std::string& id, const std::string& peer);
  // The session is here again, or released: no record, no cached owner.
  void Forget(const std::string& id);
  // `peer` did not serve `id` (unreachable, or it no longer holds it):
  // forget it as the owner, so the next call asks the peers again.
  void Stale(const std::string& id, const std::string& peer);
  // Where `id` lives, when a record or a fresh cached owner says so.
  std::optional<std::string> Known(const std::string& id) const;

  // Asks every peer for `id`; `done` gets the address of the first that
  // holds it (remembered as the owner), or NOT_FOUND / UNAVAILABLE (see the
  // banner), RESOURCE_EXHAUSTED (too many lookups), CANCELLED. The returned
  // handle may be dropped; keep it to cancel.
  std::shared_ptr<Pending> Lookup(const std::string& id, LookupCall call,
                                  std::function<void(absl::StatusOr<std::string>)> done);

  size_t lookups_in_flight() const;
  size_t lookups_started() const;  // since start (tests: a cached owner asks no one)

 private:
  class LookupState;
  struct Entry {
    std::string peer;
    Clock::time_point expires;
  };
  void Remember(std::unordered_map<std::string, Entry>& table, const std::string& id,
                const std::string& peer, Clock::duration ttl);
  void Ended(LookupState* state);

  const Options options_;
  const PeerList peers_;
  const Dial dial_;

  mutable std::mutex mu_;
  std::unordered_map<std::string, Entry> moved_;   // forwarding records
  std::unordered_map<std::string, Entry> owners_;  // learned by lookups
  std::vector<std::weak_ptr<LookupState>> in_flight_;  // for the destructor's cancel
  size_t lookups_in_flight_ = 0;                       // until their peer calls have ended
  size_t lookups_started_ = 0;
  std::condition_variable ended_;
};

// The hop count a call's kHopsHeader value says: 0 when absent or
// malformed (a client's own call), at most kMaxForwardHops.
int ParseHops(std::string_view value);

}  // namespace cortiq::server
