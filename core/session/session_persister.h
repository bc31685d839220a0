// SessionPersister: the --state-dir. Every kept session has one journal file
// there (DIR/<id>.cqsj, session_journal.h), appended after each call that
// changes it, deleted when the session is released, read back at start.
//
// Writes run on the persister's own thread, in the order they were
// submitted: the engine prepares a record (Prepare: a copy of the new rows,
// on the engine thread, with the session's lease) and hands it over
// (Submit); the call's final message waits for the write (the `done`
// callback), so under --persist-sync turn a client that saw a call complete
// has that turn on disk. The sync modes:
//   turn      fdatasync each record before `done` (a crash loses no turn a
//             client saw complete);
//   interval  fdatasync the files written in the last --persist-interval,
//             every interval (a machine crash loses at most that window; a
//             process crash loses nothing, the page cache survives it);
//   none      never (the kernel writes back when it will; a process crash
//             loses nothing, a machine crash what was not yet written back).
// A file is created, and compacted, by writing it whole beside the old one
// and renaming it over it: a crash leaves the old file or the new, never a
// mix. An append that fails (disk full, I/O error) is cut back off the file,
// logged and counted, and the session's next record rewrites its file
// whole; the call itself succeeds (durability is lost, not the session). A
// record prepared as an append before that failure was known is not
// appended (it would follow the wrong state): counted as failed too.
//
// Threads: every method is thread-safe. Prepare reads the session, so it
// needs the session's lease (the engine thread at the end of a call, an
// importer before it installs).
#pragma once

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "core/model/transformer.h"
#include "core/session/session.h"
#include "core/session/session_journal.h"

namespace cortiq::session {

enum class PersistSync : uint8_t { kTurn, kInterval, kNone };
std::string_view PersistSyncName(PersistSync sync);  // "turn" | "interval" | "none"
std::optional<PersistSync> ParsePersistSync(std::string_view name);

struct PersisterOptions {
  std::string dir;  // created if missing (with quarantine/ inside)
  PersistSync sync = PersistSync::kTurn;
  std::chrono::milliseconds interval{1000};  // kInterval's period
  uint64_t fingerprint = 0;                  // the model's wire fingerprint
};

class SessionPersister {
 public:
  // Creates the directory and its quarantine/ when missing. INVALID_ARGUMENT
  // naming --state-dir when it cannot be created or written.
  static absl::StatusOr<std::unique_ptr<SessionPersister>> Open(const model::Transformer& model,
                                                                PersisterOptions options);
  // Runs every queued write (and its done), syncs, stops the thread.
  ~SessionPersister();
  SessionPersister(const SessionPersister&) = delete;
  SessionPersister& operator=(const SessionPersister&) = delete;

  struct RestoreReport {
    size_t restored = 0;     // sessions installed
    size_t quarantined = 0;  // files moved to quarantine/
    size_t refused = 0;      // restored but refused by `install` (left on disk)
    size_t torn = 0;         // files whose torn last record was cut off
    size_t in_doubt = 0;     // of the restored, moves to a peer a crash cut (MarkMoving)
    uint64_t bytes = 0;      // file bytes read
    double seconds = 0;
  };
  // Reads every session file in the directory back, hands each session to
  // `install` (the store), and quarantines each file that fails its checks
  // (a corrupt file, another model's, a name that is not its session's id):
  // the others still load. A torn last record is cut off the file (when
  // that fails, the session's next record rewrites the file). Left-over
  // temporary files of an interrupted rewrite are deleted (the file they
  // were to replace is whole). A session whose move to a peer was cut by a
  // crash (its MarkMoving mark is still there) is handed over with that
  // peer (`moving_to`, else empty): the peer may hold it now. A mark whose
  // session file is gone is deleted (the move had completed). A file whose
  // last two reads (here or in Load) ended with the process, a crash while
  // reading it, is quarantined unread: one bad file does not keep the node
  // in a crash loop. Call before serving.
  using Install =
      std::function<absl::Status(std::unique_ptr<Session> session, const std::string& moving_to)>;
  RestoreReport RestoreAll(const Install& install);
  // The last RestoreAll's report (zeros before one).
  RestoreReport last_restore() const;

  // A record ready to be written.
  struct Pending {
    std::string id;
    JournalRecord record;
  };
  // The record bringing `session`'s file up to date (BuildJournalRecord;
  // the whole file when it has none yet or its last write failed), with the
  // session's mark set. nullopt, logged and counted as unpersisted, when no
  // record can describe the state now (the file keeps its last turn; the
  // next call's record covers both). The lease holder.
  std::optional<Pending> Prepare(Session& session);
  // Queues `pending`; `done` (may be empty) runs on the writer thread once
  // it is written and synced per the mode, or failed.
  void Submit(Pending pending, std::function<void()> done);
  // Deletes `id`'s file after the writes queued for it, and syncs the
  // directory (except under kNone): the release is durable on return. A
  // session that never had a file returns at once.
  void Remove(const std::string& id);

  // ---- moving a session to a peer (MigrateOut) ----
  // Records, durably (written, synced, the directory synced), that `id` is
  // being moved to `peer`: DIR/<id>.moving holds the peer's address. From
  // the peer's answer until the session's file is deleted here, both nodes
  // have the session on disk; a crash in that window leaves the mark, and
  // the restart restores the session in doubt (RestoreAll) instead of
  // serving a second copy. UNAVAILABLE (the file's error) when it cannot be
  // written: the move must not start.
  absl::Status MarkMoving(const std::string& id, const std::string& peer);
  // Deletes `id`'s mark (after a failed move; a session that stays after
  // its doubt is settled) and syncs the directory. Remove deletes the mark
  // with the file.
  void ClearMoving(const std::string& id);

  // A call on `session` that ended in an error leaving its state
  // undescribed (a failed step: the engine writes no record): counted as
  // unpersisted, and logged, when the session has moved past its file's
  // mark. The lease holder.
  void CountUnpersisted(const Session& session, const absl::Status& why);

  // ---- spilling (SessionStore, under --state-dir) ----
  // True when `session`'s file holds exactly its state now: its mark is the
  // session's token count and positions (no call moved it past the file
  // without a record), the file is written whole up to that mark, nothing
  // is queued and its last write did not fail. Then the session's RAM may
  // be freed (spilled) and read back with Load. The lease holder, or the
  // store with the session unleased under its lock.
  bool IsCurrent(const Session& session) const;
  // Reads a spilled session back from its file, after the writes queued for
  // it: the session (installed nowhere); DATA_LOSS for a missing file, or a
  // corrupt one (its bytes fail the restore's checks, or cannot be read:
  // EIO), which is moved to quarantine/; UNAVAILABLE when the file cannot
  // be opened or mapped now (EMFILE, ENFILE, ENOMEM: nothing said about its
  // bytes), the file left as it is for a retry. Runs on the calling thread:
  // O(file).
  absl::StatusOr<std::unique_ptr<Session>> Load(const std::string& id);
  // Tests: called with the id on Load's thread before it reads (to see
  // which thread reads a session back, or to hold it there). Thread-safe.
  void set_load_hook(std::function<void(const std::string& id)> hook);
  // Tests: called with the id on the writer thread before each record is
  // written (to hold a write there). Thread-safe.
  void set_write_hook(std::function<void(const std::string& id)> hook);

  struct Stats {
    uint64_t records = 0;      // records written (appends and rewrites)
    uint64_t rewrites = 0;     // of which whole files (new sessions, compactions)
    uint64_t bytes = 0;        // bytes written
    uint64_t failures = 0;     // writes that failed (disk full, I/O error)
    uint64_t unpersisted = 0;  // calls whose state no record could describe
    uint64_t disk_bytes = 0;   // the session files' bytes now
    size_t files = 0;          // session files now
    double write_seconds = 0;  // time spent writing and syncing
    double prepare_seconds = 0;  // time Prepare spent on its callers' threads (the engine's)
    // Record buffers held in RAM (their capacity): queued for the writer
    // thread, being written, and spent ones kept for reuse (spare_buffers,
    // at most 4 of at most 64 MiB each). A record Prepare has handed out
    // and that is not yet submitted is its caller's, not counted.
    uint64_t buffer_bytes = 0;
    size_t spare_buffers = 0;
  };
  Stats stats() const;
  // `id`'s file size now (0 without one).
  uint64_t FileBytes(const std::string& id) const;
  const PersisterOptions& options() const { return options_; }
  std::string PathOf(const std::string& id) const;
  // DIR/<id>.moving: the mark of a move to a peer (MarkMoving).
  std::string MovingPathOf(const std::string& id) const;
  // DIR/<id>.reading: the mark of a read of the session's file under way
  // (RestoreAll, Load), holding how many reads of it in a row have begun.
  std::string ReadingPathOf(const std::string& id) const;

 private:
  SessionPersister(const model::Transformer& model, PersisterOptions options);
  struct Op {
    enum Kind { kWrite, kRemove } kind = kWrite;
    std::string id;
    JournalRecord record;
    std::function<void()> done;
  };
  void Loop();
  // On the writer thread. False on failure (logged, counted, marked broken).
  bool Write(const std::string& id, const JournalRecord& record);
  void Unlink(const std::string& id);
  void SyncDir();
  void SyncDirty();
  // Waits until no op is queued or running for `id`.
  void WaitIdle(const std::string& id);
  void Quarantine(const std::string& path, const std::string& why);

  const model::Transformer& model_;
  const PersisterOptions options_;

  mutable std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<Op> queue_;
  bool stop_ = false;
  size_t busy_ = 0;  // ops popped and not yet done
  std::map<std::string, uint64_t> sizes_;  // file bytes per session with a file (or one queued)
  std::map<std::string, size_t> queued_;   // ops queued or running per session
  // The mark (tokens, positions) of each session's last successful write.
  std::map<std::string, std::pair<size_t, size_t>> written_;
  std::set<std::string> broken_;           // last write failed: rewrite whole next time
  std::set<std::string> dirty_;            // written since the last interval sync
  Stats stats_;
  RestoreReport last_restore_;
  std::function<void(const std::string&)> load_hook_;
  std::function<void(const std::string&)> write_hook_;
  // Spent record buffers (turn-sized), reused by Prepare: the engine thread
  // then copies the new rows into pages already mapped.
  std::vector<std::string> spare_;
  uint64_t held_bytes_ = 0;  // capacity of the records queued or being written
  std::thread thread_;
};

namespace internal {
// RestoreAll cuts a torn last record off with this (tests make it fail).
inline std::atomic<int (*)(const char*, off_t)> truncate_file{&::truncate};
}  // namespace internal

}  // namespace cortiq::session
