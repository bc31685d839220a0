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
// Both directions also run piece by piece, for the gRPC chunks of a
// migration: SessionWireSource reads the stream straight from the session's
// caches into the caller's buffers, SessionWireSink writes each layer
// straight into the new session's caches as the bytes arrive (one pass each
// way; no copy of the whole stream on either side). ExportSessionWire and
// ImportSessionWire are these run over one whole buffer: the same bytes, the
// same checks, the same errors in the same order.
//
// Threads: ExportSessionWire / SessionWireSource read a session whose lease
// the caller holds (for as long as the source is read); ImportSessionWire /
// SessionWireSink build a session nobody else can see yet.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/kv/layer_wire.h"
#include "core/model/transformer.h"
#include "core/session/session.h"
#include "core/tokenizer/tokenizer.h"

namespace cortiq::session {

inline constexpr uint32_t kSessionWireMinVersion = 1;
// 1: exact f32 sessions; 2: int8 rows and sealed O(1) layers too; 3: sink +
// window attention too (its held rows travel as a layer blob); 4: the
// session's identity too (its id and tenant: an import keeps them).
inline constexpr uint32_t kSessionWireMaxVersion = 4;
// The first version that carries the session's id and tenant.
inline constexpr uint32_t kSessionWireIdentityVersion = 4;

struct SessionWireOptions {
  uint32_t version = kSessionWireMaxVersion;  // 1 .. 4
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

// Parses and validates `wire` into a new session for `model` (whose wire
// fingerprint is `fingerprint`). The session takes the id and tenant the
// stream carries (version 4+), else `id` and no tenant. Nothing outside the
// returned object is touched.
absl::StatusOr<std::unique_ptr<Session>> ImportSessionWire(std::string_view wire,
                                                           const model::Transformer& model,
                                                           uint64_t fingerprint, std::string id);

// ExportSessionWire's stream, read front to back. Holds pointers into the
// session's caches: keep the lease until the last Read. Move-only.
//
// Example (one gRPC chunk at a time):
//   CORTIQ_ASSIGN_OR_RETURN(SessionWireSource src, SessionWireSource::Make(*lease, fp, {}));
//   while (src.left() > 0) { chunk.resize(1 << 20); chunk.resize(src.Read(chunk.data(), 1 << 20));
//   ... }
class SessionWireSource {
 public:
  // ExportSessionWire's refusals, every one checked here, before a byte is
  // read. Serialises the small sections (header, tokens, sampler, QSA aux,
  // end) now; the layers' rows are read from the caches by Read.
  static absl::StatusOr<SessionWireSource> Make(const Session& session, uint64_t fingerprint,
                                                const SessionWireOptions& options);

  uint64_t size() const { return size_; }  // the whole stream's bytes
  uint64_t left() const { return size_ - pos_; }
  // Writes the next min(n, left()) bytes to dst and returns how many; one
  // pass over the rows (copied and checksummed together).
  size_t Read(char* dst, size_t n);

 private:
  // Owned bytes (whole sections, or a layer section's type, length and
  // index), then, for a layer section, its blob and the section's CRC.
  struct Part {
    std::string bytes;
    std::optional<kv::LayerWireSource> layer;
    std::unique_ptr<kv::LayerKvCache> owned;  // the rows `layer` reads, when built for the stream
    uint32_t prefix_crc = 0;                  // CRC of the layer section's 20 bytes before the blob
  };
  SessionWireSource() = default;

  std::vector<Part> parts_;
  uint64_t size_ = 0, pos_ = 0;
  size_t part_ = 0;
  uint64_t in_part_ = 0;  // bytes of parts_[part_] already read
  char crc_le_[4] = {};
};

// ImportSessionWire fed piece by piece, as the chunks of an ImportSession
// arrive: each layer's rows go straight into the new session's caches. The
// checks are ImportSessionWire's, and so are the errors and their order: a
// fault in the stream's integrity (DATA_LOSS) outranks every other refusal,
// so those wait for the end of the stream. While a large layer (>= 256 KiB)
// arrives, the next layer's rows are reserved on a thread of its own
// (std::async; the destructor waits for it). Move-only; one writer.
class SessionWireSink {
 public:
  // For `model` (wire fingerprint `fingerprint`), the new session's id
  // `id` when the stream carries none (versions 1..3; version 4 carries the
  // session's own, which it keeps); `max_stream_bytes`: the most the stream may hold (the caller
  // refuses more): a layer's rows are reserved only when its bytes can
  // still arrive within it, so a forged length allocates nothing.
  SessionWireSink(const model::Transformer& model, uint64_t fingerprint, std::string id,
                  uint64_t max_stream_bytes);
  ~SessionWireSink();
  SessionWireSink(SessionWireSink&&) noexcept;

  // Asked before each allocation the stream's layers make (a layer's rows, a
  // sealed layer's body, the next layer's rows reserved ahead) with the
  // bytes about to be held: an import's memory budget
  // (SessionStore::ImportReservation). Its refusal stops the stream at once
  // (Write returns it) with that allocation not made; a refused reserve
  // ahead is only skipped. Set before the first Write.
  void SetAdmit(kv::LayerWireSink::Admit admit);

  // The stream's next bytes. An error means the stream is refused whatever
  // follows (corrupt: DATA_LOSS; an unknown version: FAILED_PRECONDITION):
  // stop sending, Finish says the same.
  absl::Status Write(std::string_view bytes);
  // After the last byte: the validated session, installed nowhere yet, or
  // why the stream is refused.
  absl::StatusOr<std::unique_ptr<Session>> Finish();
  // Heap bytes the stream holds so far: the session under construction
  // (its installed layers, history, sampler), the layer being written, the
  // next layer's rows being reserved ahead, and the sections and fields
  // being gathered. What an import is accounted for (SessionStore::
  // ImportReservation). O(layers).
  size_t held_bytes() const;
  // The new session's id, once the header section has arrived and passed
  // its checks (the stream's own from version 4, else the one given);
  // nullopt before. Lets the importer refuse an id it already holds
  // (ALREADY_EXISTS) before the rows arrive.
  std::optional<std::string> session_id() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// The header section's payload at the newest version: `model`'s geometry,
// the session's configuration, id and tenant. The journal
// (session_journal.h) opens every session file with it.
std::string EncodeSessionHeader(const model::ModelConfig& model, const Session& session);
struct SessionHeader {
  SessionConfig config;
  std::string id, tenant;
};
// Parses EncodeSessionHeader's payload with the import's checks: another
// geometry is FAILED_PRECONDITION, a malformed payload DATA_LOSS.
absl::StatusOr<SessionHeader> DecodeSessionHeader(std::string_view payload,
                                                  const model::ModelConfig& model);

// The version an exporter should use toward a peer that reads `peer_versions`:
// the highest one both speak; FAILED_PRECONDITION when there is none.
absl::StatusOr<uint32_t> NegotiateWireVersion(const std::vector<uint32_t>& peer_versions);

}  // namespace cortiq::session
