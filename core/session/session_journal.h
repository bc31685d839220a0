// The session journal: one kept session's state as a file that grows turn
// by turn (--state-dir; docs/PERSISTENCE.md has the byte layout).
//
// A file is a 24-byte header (magic "CQSJ", version, the model's wire
// fingerprint) followed by records framed as the session wire's sections
// (type, a frame check in place of their reserved field, length, payload,
// CRC32C): one `session` record (the
// session wire's header payload: geometry, configuration, id, tenant),
// then `turn` records. A turn record says how much of the state before it
// is kept (history tokens, positions: a reuse_prefix rollback keeps less)
// and carries what lies past that: the new history tokens, the new exact
// rows of every layer that keeps appendable rows (exact f32 / int8, QSA),
// the new QSA indexer keys, the whole state of every layer that is bounded
// in size (a sealed O(1) layer, sink + window), the sampler with its RNG and
// the detokenizer's held-back bytes. The cost of a turn is its new rows,
// never the whole session.
//
// BuildJournalRecord makes the record that brings a session's file from
// its JournalMark to the state now: a turn record to append, or the whole
// file to write anew (the first record of a session, or a compaction when
// the file's dead bytes would pass its live bytes). RestoreJournal reads a
// file back into a new session: a torn last record (a crash mid-write) is
// dropped and the session comes back at its last complete turn; anything
// else that fails its checks is DATA_LOSS (the caller quarantines the
// file), another model's file FAILED_PRECONDITION.
//
// Threads: BuildJournalRecord reads a session whose lease the caller holds;
// RestoreJournal builds a session nobody else sees yet.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "core/model/transformer.h"
#include "core/session/session.h"

namespace cortiq::session {

inline constexpr uint32_t kJournalVersion = 1;
inline constexpr size_t kJournalHeaderBytes = 24;  // magic, version, flags, reserved, fingerprint
inline constexpr std::string_view kJournalSuffix = ".cqsj";

struct JournalRecord {
  // A turn record to append to the file, or (rewrite) the whole file.
  std::string bytes;
  bool rewrite = false;
  // The session's mark once these bytes are in the file.
  Session::JournalMark mark;
  // The bytes a file rewritten now would hold (the live bytes).
  uint64_t live_bytes = 0;
};

// The record bringing `session`'s file from session.journal_mark() to the
// session's state now; `rewrite` (or a mark that is not written) asks for
// the whole file. Does not change the session (the caller sets the mark
// once the record is queued). FAILED_PRECONDITION for a state no record
// describes (an O(1) trace being collected: a call cancelled inside its
// prompt; dead heads; accumulated importance). O(new rows) for a turn,
// O(session bytes) for a whole file.
// `buffer`: an emptied string whose capacity the record's bytes reuse (a
// recycled record: no fresh pages to fault in on the engine thread).
absl::StatusOr<JournalRecord> BuildJournalRecord(const Session& session,
                                                 const model::ModelConfig& model,
                                                 uint64_t fingerprint, bool rewrite = false,
                                                 std::string buffer = {});

struct RestoredJournal {
  std::unique_ptr<Session> session;  // installed nowhere yet; its mark set
  size_t turns = 0;                  // turn records applied
  uint64_t valid_bytes = 0;          // the file's bytes up to the last complete record
  uint64_t torn_bytes = 0;           // bytes after it (a torn last record), dropped
};

// Reads a journal file's bytes into a new session of `model` (wire
// fingerprint `fingerprint`). DATA_LOSS (naming the record and what failed)
// for a corrupt file: a bad magic, header or checksum with complete
// records after it, a record that disagrees with the state before it;
// FAILED_PRECONDITION for another model's file.
//
// `file` may be a mapping of a cold file. The restore reads its layout
// first (the records' frames, the session header, the layer headers of the
// record the state starts at: small reads here and there), then calls
// `start_reading` once, where the caller starts streaming the file in from
// its start, and reads the rest in file order; scattered reads queued
// behind large ones would each wait for one. Reading a 500 MB session, the
// state's rows are reserved on a second thread, in file order, while this
// one copies behind it.
//
// `fd`, when not -1, is an open descriptor of the same file: the file
// header, the records' frames, the rows and the checksums then read it with
// pread (the kernel's copy from the page cache; a layer's rows in one
// preadv) instead of through the mapping. Under a hypervisor that shadows
// page tables each first touch of a mapped 4 KiB page costs microseconds,
// and copying a 500 MB file's rows out of its mapping ran at 0.4-0.5 GB/s
// (docs/PERFORMANCE.md, 2026-12-06). A failed read (EIO, a file shorter
// than `file`) is DATA_LOSS naming it, never a read of the mapping, where
// the same error raises SIGBUS. The rest of each record (its header
// fields, tokens, sampler, whole-layer blobs, QSA keys) is parsed in place
// through the mapping.
absl::StatusOr<RestoredJournal> RestoreJournal(std::string_view file,
                                               const model::Transformer& model,
                                               uint64_t fingerprint,
                                               const std::function<void()>& start_reading = {},
                                               int fd = -1);

namespace internal {
// The record size from which a restore reserves on a second thread (tests
// lower it to run that path on small sessions).
inline std::atomic<size_t> restore_parallel_bytes{size_t{8} << 20};
}  // namespace internal

}  // namespace cortiq::session
