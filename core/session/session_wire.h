// The session wire format: one session's whole state (configuration, token
// history, sampler with its RNG, every layer's cache as a CQKV layer blob,
// every QSA aux blob) as one self-checking byte string, for ExportSession /
// ImportSession / MigrateSession. Byte layout: docs/WIRE_FORMAT.md.
//
// Export REFUSES (FAILED_PRECONDITION, the reason named) any state the
// requested version does not describe — the layer exporter decides per layer
// (version 1: f32 rows only; version 2: int8 rows and sealed O(1) layers too).
// Import validates EVERYTHING — magic, version, fingerprint, geometry, every
// section's length and CRC32C, section order, each layer blob, each aux blob —
// into a new Session before anything is installed: corrupt or truncated →
// DATA_LOSS, another model or geometry → FAILED_PRECONDITION, unknown
// version → FAILED_PRECONDITION. A failed import leaves no trace.
//
// Threads: ExportSessionWire reads a session whose lease the caller holds;
// ImportSessionWire builds a session nobody else can see yet.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/model/transformer.h"
#include "core/session/session.h"
#include "core/tokenizer/tokenizer.h"

namespace cortiq::session {

inline constexpr uint32_t kSessionWireMinVersion = 1;
inline constexpr uint32_t kSessionWireMaxVersion = 2;

struct SessionWireOptions {
  uint32_t version = kSessionWireMaxVersion;  // 1 or 2
  bool f16 = false;  // f32 K/V rows travel as f16 (lossy; the caller's explicit choice)
};

// The model identity both sides must share: FNV-1a 64 over the checkpoint's
// fingerprint (config, tensor names/shapes/dtypes, sampled data) and the
// tokenizer.json bytes.
uint64_t ModelWireFingerprint(const model::Checkpoint& checkpoint, std::string_view tokenizer_json);

// Serialises a leased session. FAILED_PRECONDITION for state the version
// cannot describe; INVALID_ARGUMENT for an unknown version.
absl::StatusOr<std::string> ExportSessionWire(const Session& session, uint64_t fingerprint,
                                              const SessionWireOptions& options);

// Parses and validates `wire` into a new session with id `id` for `model`
// (whose wire fingerprint is `fingerprint`). Nothing outside the returned
// object is touched.
absl::StatusOr<std::unique_ptr<Session>> ImportSessionWire(std::string_view wire,
                                                           const model::Transformer& model,
                                                           uint64_t fingerprint, std::string id);

// The version an exporter should use toward a peer that reads `peer_versions`:
// the highest one both speak; FAILED_PRECONDITION when there is none.
absl::StatusOr<uint32_t> NegotiateWireVersion(const std::vector<uint32_t>& peer_versions);

}  // namespace cortiq::session
