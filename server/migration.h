// Moving sessions off this node: the client side of a migration, shared by
// the MigrateSession RPC and the drain.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/client_context.h"
#include "server/service.h"

namespace cortiq::server {

struct MigrateOutcome {
  std::string peer_session_id;  // the session's id on the peer (its own, from wire version 4)
  std::string peer_node;        // the peer's --node-name
  size_t wire_bytes = 0;
  uint32_t version = 0;
};

// Added to every ImportSession deadline, so a tiny session on a fast peer
// still has time for the peer's import and answer.
inline constexpr std::chrono::milliseconds kPeerDeadlineFloor{1'000};

// How long the ImportSession stream of `wire_bytes` may take: the connect
// timeout + wire_bytes / min_throughput (bytes per second, >= 1) +
// kPeerDeadlineFloor (--peer-connect-timeout, --peer-min-throughput).
std::chrono::milliseconds PeerStreamBudget(std::chrono::milliseconds connect_timeout,
                                           size_t min_throughput, size_t wire_bytes);

// Stops a running migration from another thread: MigrateSession's OnCancel
// (the caller cancelled or its deadline passed), the session's lease
// canceller (ReleaseSession, shutdown), a drain that ran out of time. Cancel
// TryCancels the peer call in flight (its blocked operations end at once)
// and makes every later one end before it starts. Thread-safe.
class MigrationCancel {
 public:
  void Cancel();  // idempotent
  bool cancelled() const;
  // Binds the next peer call's context; Cancel reaches it until Detach.
  // Cancelled already: the context is cancelled now (the call fails at once).
  void Attach(grpc::ClientContext* c);
  void Detach();

 private:
  mutable std::mutex mu_;
  bool cancelled_ = false;
  grpc::ClientContext* call_ = nullptr;
};

// What bounds one migration: the caller's deadline (every peer deadline is
// at most this; max = none) and who may cancel it (null: only the lease's
// canceller, which MigrateOut sets either way).
struct MigrateBounds {
  std::chrono::system_clock::time_point deadline = std::chrono::system_clock::time_point::max();
  std::shared_ptr<MigrationCancel> cancel;
  std::string deadline_name = "the caller's deadline";  // for the error message
  std::string traceparent;  // the caller's W3C trace context, forwarded to the peer (may be empty)
};

// Checks `peer` (ctx.peers->Channel: a peer or a --migrate-allow address,
// else PERMISSION_DENIED with nothing dialled and the session untouched),
// leases `session_id`, learns the peer's wire versions (GetModelInfo, which
// also connects: --peer-connect-timeout), exports at the highest common
// version, streams it to the peer's ImportSession (deadline
// PeerStreamBudget) and releases the local session (reason "migrated") only
// after the peer answered OK. Every peer deadline is at most
// bounds.deadline. A cancel (bounds.cancel, or a ReleaseSession of the
// session while it runs) ends the peer call at once. On any failure the
// session is returned intact and unleased, and the status says why:
// PERMISSION_DENIED (not an allowed peer), CANCELLED (cancelled),
// DEADLINE_EXCEEDED (bounds.deadline passed),
// UNAVAILABLE (peer unreachable or slower than --peer-min-throughput), the
// peer's code for a refusal. Blocking: never on a gRPC callback thread (the
// MigrateSession RPC runs it on ServiceContext::background). Counts
// cortiq_migrations_total{direction="out"}.
absl::StatusOr<MigrateOutcome> MigrateOut(ServiceContext& ctx, const std::string& session_id,
                                          const std::string& peer, const std::string& peer_token,
                                          bool f16, const MigrateBounds& bounds = {});

}  // namespace cortiq::server
