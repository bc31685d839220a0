// Moving sessions off this node: the client side of a migration, shared by
// the MigrateSession RPC and the drain.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "server/service.h"

namespace cortiq::server {

struct MigrateOutcome {
  std::string peer_session_id;
  size_t wire_bytes = 0;
  uint32_t version = 0;
};

// Leases `session_id`, learns the peer's wire versions (GetModelInfo),
// exports at the highest common version, streams it to the peer's
// ImportSession and releases the local session (reason "migrated") only
// after the peer answered OK. On any failure the session is returned intact
// and the status says why (UNAVAILABLE for an unreachable peer, the peer's
// code for a refusal). Blocking: never on a gRPC callback thread (the
// MigrateSession RPC runs it on ServiceContext::background). Counts
// cortiq_migrations_total{direction="out"}.
absl::StatusOr<MigrateOutcome> MigrateOut(ServiceContext& ctx, const std::string& session_id,
                                          const std::string& peer, const std::string& peer_token,
                                          bool f16);

}  // namespace cortiq::server
