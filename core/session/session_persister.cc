#include "core/session/session_persister.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/session/session_store.h"
#include "core/util/failpoint.h"
#include "core/util/log_escape.h"
#include "spdlog/spdlog.h"

namespace cortiq::session {

namespace {

namespace fs = std::filesystem;
using SteadyClock = std::chrono::steady_clock;

constexpr std::string_view kTmpSuffix = ".tmp";
constexpr std::string_view kMovingSuffix = ".moving";
// A peer address a mark may hold (a configured peer's host:port).
constexpr size_t kMaxPeerBytes = 1024;
// Record buffers kept for reuse, and the largest kept (a whole file is not).
constexpr size_t kSpares = 4;
constexpr size_t kSpareMaxBytes = size_t{64} << 20;
constexpr std::string_view kQuarantine = "quarantine";
// DIR/<id>.reading: a read of the session's file is under way (ReadMark).
constexpr std::string_view kReadingSuffix = ".reading";
// Reads of one file in a row that ended with the process (a crash while it
// was read) before the next start quarantines the file unread.
constexpr int kMaxCrashedReads = 2;

std::string Errno(int err) { return std::string(std::strerror(err)); }

// Writes all of `bytes` to fd; errno on failure.
int WriteAll(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return 0;
}

// A whole file, mapped read-only (empty on an empty file).
class MappedFile {
 public:
  static absl::StatusOr<MappedFile> Open(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      // A missing file is gone for good; any other failure here (EMFILE,
      // ENFILE, ENOMEM, ...) says nothing about the file's bytes.
      return err == ENOENT ? absl::NotFoundError(absl::StrCat("open: ", Errno(err)))
                           : absl::UnavailableError(absl::StrCat("open: ", Errno(err)));
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      return absl::UnavailableError(absl::StrCat("stat: ", Errno(err)));
    }
    MappedFile f;
    f.size_ = static_cast<size_t>(st.st_size);
    if (f.size_ > 0) {
      // Not populated up front: the restore reads the file's layout, then
      // StreamAhead reads the file in while the restore consumes it.
      void* p = ::mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        const int err = errno;
        ::close(fd);
        return absl::UnavailableError(absl::StrCat("mmap: ", Errno(err)));
      }
      // The layout's reads first, each of a page or two: no readahead
      // around them (the default reads a window around each fault, and a
      // few dozen layer headers cost 0.2 s that way). StreamAhead turns
      // readahead on for the stream.
      ::madvise(p, f.size_, MADV_RANDOM);
      // The same for the descriptor: the file header and the records'
      // frames are read with pread (an I/O error a status, not a SIGBUS).
      ::posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
      f.data_ = static_cast<const char*>(p);
    }
    f.fd_ = fd;  // kept open for the restore's preads
    return f;
  }
  MappedFile() = default;
  MappedFile(MappedFile&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)),
        size_(std::exchange(o.size_, 0)),
        fd_(std::exchange(o.fd_, -1)) {}
  ~MappedFile() { Reset(); }
  std::string_view view() const { return {data_, size_}; }
  int fd() const { return fd_; }

  // Reads the file into the page cache and maps it, in large chunks from the
  // start, on a thread of its own until the file is in or the guard goes:
  // the restore's checksums and copies then find their pages mapped (no
  // fault per page) and the disk streams at its sequential speed.
  // MADV_POPULATE_READ (Linux 5.14) reads and maps without copying; on an
  // older kernel readahead(2) reads the chunks into the page cache instead.
  // Never a touch of the mapping: an I/O error under a touched page is a
  // SIGBUS, where MADV_POPULATE_READ and readahead return it (the stream
  // stops there, and the restore's own pread reports the error).
  class StreamAhead {
   public:
    explicit StreamAhead(const MappedFile& file) {
      if (file.size_ == 0) return;
      ::madvise(const_cast<char*>(file.data_), file.size_, MADV_SEQUENTIAL);
      ::posix_fadvise(file.fd_, 0, 0, POSIX_FADV_SEQUENTIAL);
      thread_ = std::thread([this, data = file.data_, size = file.size_, fd = file.fd_] {
        constexpr size_t kChunk = size_t{8} << 20;
        bool populate = true;
        for (size_t at = 0; at < size && !stop_.load(std::memory_order_relaxed); at += kChunk) {
          const size_t n = std::min(kChunk, size - at);
#ifdef MADV_POPULATE_READ
          if (populate) {
            if (::madvise(const_cast<char*>(data) + at, n, MADV_POPULATE_READ) == 0) continue;
            if (errno != EINVAL) return;  // EFAULT (an I/O error), ENOMEM, ...
          }
#else
          (void)data;
#endif
          populate = false;  // not supported: an older kernel
          if (::readahead(fd, static_cast<off64_t>(at), n) != 0) return;
        }
      });
    }
    ~StreamAhead() {
      stop_.store(true);
      if (thread_.joinable()) thread_.join();
    }
    StreamAhead(const StreamAhead&) = delete;
    StreamAhead& operator=(const StreamAhead&) = delete;

   private:
    std::atomic<bool> stop_{false};
    std::thread thread_;
  };

  void Reset() {
    if (data_ != nullptr) ::munmap(const_cast<char*>(data_), size_);
    if (fd_ >= 0) ::close(fd_);
    data_ = nullptr;
    size_ = 0;
    fd_ = -1;
  }

 private:
  const char* data_ = nullptr;
  size_t size_ = 0;
  int fd_ = -1;
};

// How many reads of a file a mark (ReadMark) says began and never ended:
// 0 without a mark; an unreadable or empty mark counts as one.
int CrashedReads(const std::string& mark) {
  std::FILE* f = std::fopen(mark.c_str(), "rb");
  if (f == nullptr) return 0;
  char buf[16] = {};
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  int count = 0;
  for (size_t i = 0; i < n && buf[i] >= '0' && buf[i] <= '9' && count < 1000; ++i) {
    count = 10 * count + (buf[i] - '0');
  }
  return std::max(count, 1);
}

// Marks a read of a session file while it runs: DIR/<id>.reading holds
// the number of reads of that file begun since it last read whole, this
// one included, and goes when the read ends, whatever its outcome. A mark
// that outlives its process says the process ended while reading the file:
// a crash there (a SIGBUS from an I/O error under the mapping, a parser
// bug), or a kill that had nothing to do with it. RestoreAll reads such a
// file again, and quarantines it unread once kMaxCrashedReads reads in a
// row ended that way: one bad file does not keep a node in a crash loop.
// Not synced: a process crash keeps the page cache; a machine crash may lose
// the mark, and costs one more try.
class ReadMark {
 public:
  ReadMark(std::string path, int crashed) : path_(std::move(path)) {
    const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return;  // unmarked: a crash here is then retried for ever, as before
    (void)WriteAll(fd, std::to_string(crashed + 1));
    ::close(fd);
  }
  ~ReadMark() { ::unlink(path_.c_str()); }
  ReadMark(const ReadMark&) = delete;
  ReadMark& operator=(const ReadMark&) = delete;

 private:
  std::string path_;
};

// RestoreJournal over a mapped file, streamed in once its layout is read.
absl::StatusOr<RestoredJournal> RestoreMapped(const MappedFile& file,
                                              const model::Transformer& model,
                                              uint64_t fingerprint) {
  std::optional<MappedFile::StreamAhead> ahead;
  return RestoreJournal(
      file.view(), model, fingerprint, [&] { ahead.emplace(file); }, file.fd());
}

}  // namespace

std::string_view PersistSyncName(PersistSync sync) {
  switch (sync) {
    case PersistSync::kTurn:
      return "turn";
    case PersistSync::kInterval:
      return "interval";
    case PersistSync::kNone:
      return "none";
  }
  return "turn";
}

std::optional<PersistSync> ParsePersistSync(std::string_view name) {
  if (name == "turn") return PersistSync::kTurn;
  if (name == "interval") return PersistSync::kInterval;
  if (name == "none") return PersistSync::kNone;
  return std::nullopt;
}

absl::StatusOr<std::unique_ptr<SessionPersister>> SessionPersister::Open(
    const model::Transformer& model, PersisterOptions options) {
  if (options.dir.empty()) return absl::InvalidArgumentError("--state-dir: empty path");
  std::error_code ec;
  fs::create_directories(fs::path(options.dir) / std::string(kQuarantine), ec);
  if (ec) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--state-dir: cannot create '", util::EscapeForLog(options.dir), "': ", ec.message()));
  }
  const std::string probe = (fs::path(options.dir) / ".write-probe").string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--state-dir: '", util::EscapeForLog(options.dir), "' is not writable: ", Errno(errno)));
  }
  ::close(fd);
  ::unlink(probe.c_str());
  return std::unique_ptr<SessionPersister>(new SessionPersister(model, std::move(options)));
}

SessionPersister::SessionPersister(const model::Transformer& model, PersisterOptions options)
    : model_(model), options_(std::move(options)) {
  thread_ = std::thread([this] { Loop(); });
}

SessionPersister::~SessionPersister() {
  {
    std::unique_lock lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::string SessionPersister::MovingPathOf(const std::string& id) const {
  return (fs::path(options_.dir) / (id + std::string(kMovingSuffix))).string();
}

std::string SessionPersister::ReadingPathOf(const std::string& id) const {
  return (fs::path(options_.dir) / (id + std::string(kReadingSuffix))).string();
}

std::string SessionPersister::PathOf(const std::string& id) const {
  return (fs::path(options_.dir) / (id + std::string(kJournalSuffix))).string();
}

SessionPersister::RestoreReport SessionPersister::RestoreAll(const Install& install) {
  const auto t0 = SteadyClock::now();
  RestoreReport report;
  std::vector<fs::path> files;
  std::map<std::string, std::string> moving;  // session id -> the peer of its cut move
  std::map<std::string, int> reading;         // session id -> reads its mark says crashed
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(options_.dir, ec)) {
    if (!e.is_regular_file()) continue;
    const std::string name = e.path().filename().string();
    if (name.ends_with(kTmpSuffix)) {
      // An interrupted rewrite: the file it was to replace is whole.
      spdlog::warn("state: removing {} (a rewrite interrupted by a crash)",
                   util::EscapeForLog(name));
      fs::remove(e.path(), ec);
      continue;
    }
    if (name.ends_with(kJournalSuffix)) files.push_back(e.path());
    if (name.ends_with(kReadingSuffix)) {
      reading[name.substr(0, name.size() - kReadingSuffix.size())] =
          CrashedReads(e.path().string());
    }
    if (name.ends_with(kMovingSuffix)) {
      const std::string stem = name.substr(0, name.size() - kMovingSuffix.size());
      std::string peer;
      if (std::FILE* f = std::fopen(e.path().c_str(), "rb")) {
        char buf[kMaxPeerBytes];
        peer.assign(buf, std::fread(buf, 1, sizeof(buf), f));
        std::fclose(f);
      }
      // An unreadable mark still says the move was under way.
      moving[stem] = peer.empty() ? std::string("(unreadable mark)") : peer;
    }
  }
  std::sort(files.begin(), files.end());
  auto quarantine = [&](const fs::path& path, const std::string& why) {
    Quarantine(path.string(), why);
    ++report.quarantined;
  };
  for (const fs::path& path : files) {
    const std::string name = path.filename().string();
    const std::string stem = name.substr(0, name.size() - kJournalSuffix.size());
    if (!SessionStore::IsIdForm(stem)) {
      quarantine(path, "the name is not a session id");
      continue;
    }
    const auto crashed = reading.find(stem);
    const int crashed_reads = crashed == reading.end() ? 0 : crashed->second;
    if (crashed != reading.end()) reading.erase(crashed);
    if (crashed_reads >= kMaxCrashedReads) {
      quarantine(path, absl::StrCat("the last ", crashed_reads,
                                    " reads of it ended with the process (a crash while "
                                    "reading it: an I/O error under its mapping?)"));
      ::unlink(ReadingPathOf(stem).c_str());
      continue;
    }
    if (crashed_reads > 0) {
      spdlog::warn(
          "state: session {}: the last read of its file ended with the process; reading it "
          "again (quarantined if this read ends the same way)",
          stem);
    }
    absl::StatusOr<RestoredJournal> back;
    {
      ReadMark mark(ReadingPathOf(stem), crashed_reads);
      util::Failpoint("restore-read");
      absl::StatusOr<MappedFile> file = MappedFile::Open(path.string());
      if (!file.ok()) {
        quarantine(path, std::string(file.status().message()));
        continue;
      }
      report.bytes += file->view().size();
      back = RestoreMapped(*file, model_, options_.fingerprint);
    }
    if (!back.ok()) {
      quarantine(path, std::string(back.status().message()));
      continue;
    }
    if (back->session->id() != stem) {
      quarantine(path, "the file holds another session");
      continue;
    }
    uint64_t size = back->valid_bytes;
    bool cut = true;
    if (back->torn_bytes > 0) {
      // The next append lands right after the last complete record.
      if (internal::truncate_file.load()(path.c_str(), static_cast<off_t>(back->valid_bytes)) !=
          0) {
        // The torn bytes stay: an append would follow them, and the file
        // would be corrupt after them. The session's next record rewrites
        // the file whole instead.
        spdlog::error("state: session {}: cutting its torn last record off failed: {}", stem,
                      Errno(errno));
        size += back->torn_bytes;
        cut = false;
      }
      spdlog::warn(
          "state: session {}: a torn last record ({} bytes) dropped; restored at its "
          "last complete turn",
          stem, back->torn_bytes);
      ++report.torn;
    }
    const std::pair<size_t, size_t> restored_mark = {back->session->journal_mark().tokens,
                                                     back->session->journal_mark().cached};
    const auto mark = moving.find(stem);
    const std::string moving_to = mark == moving.end() ? std::string() : mark->second;
    if (!moving_to.empty()) {
      spdlog::warn(
          "state: session {}: its move to {} was cut by a crash; held in doubt until the peers "
          "say whether one of them holds it",
          stem, util::EscapeForLog(moving_to));
    }
    absl::Status st = install(std::move(back->session), moving_to);
    if (!st.ok()) {
      spdlog::warn("state: session {} restored but not installed: {}", stem,
                   util::EscapeForLog(std::string(st.message())));
      ++report.refused;
      continue;
    }
    std::unique_lock lock(mu_);
    sizes_[stem] = size;
    written_[stem] = restored_mark;
    if (!cut) broken_.insert(stem);
    ++report.restored;
    if (!moving_to.empty()) {
      ++report.in_doubt;
      moving.erase(stem);
    }
  }
  // Read marks without a session file (its release came after the crash's
  // read, or the file was moved away by hand).
  for (const auto& [id, crashed_reads] : reading) ::unlink(ReadingPathOf(id).c_str());
  // The marks left: their sessions' files are gone (the move had completed
  // and the file was deleted, or the file was quarantined): nothing to doubt.
  for (const auto& [id, peer] : moving) {
    if (!fs::exists(PathOf(id), ec)) ClearMoving(id);
  }
  report.seconds = std::chrono::duration<double>(SteadyClock::now() - t0).count();
  std::unique_lock lock(mu_);
  last_restore_ = report;
  return report;
}

std::optional<SessionPersister::Pending> SessionPersister::Prepare(Session& session) {
  const auto t0 = SteadyClock::now();
  bool rewrite;
  std::string buffer;
  {
    std::unique_lock lock(mu_);
    rewrite = broken_.erase(session.id()) > 0;
    if (!spare_.empty()) {
      buffer = std::move(spare_.back());
      spare_.pop_back();
    }
  }
  absl::StatusOr<JournalRecord> rec = BuildJournalRecord(
      session, model_.config(), options_.fingerprint, rewrite, std::move(buffer));
  if (!rec.ok()) {
    spdlog::warn("state: session {}: this call's state is not persisted: {}", session.id(),
                 util::EscapeForLog(std::string(rec.status().message())));
    std::unique_lock lock(mu_);
    ++stats_.unpersisted;
    if (rewrite) broken_.insert(session.id());
    return std::nullopt;
  }
  session.set_journal_mark(rec->mark);
  const double seconds = std::chrono::duration<double>(SteadyClock::now() - t0).count();
  {
    std::unique_lock lock(mu_);
    stats_.prepare_seconds += seconds;
  }
  return Pending{session.id(), *std::move(rec)};
}

void SessionPersister::Submit(Pending pending, std::function<void()> done) {
  {
    std::unique_lock lock(mu_);
    Op op;
    op.kind = Op::kWrite;
    op.id = std::move(pending.id);
    op.record = std::move(pending.record);
    op.done = std::move(done);
    sizes_.try_emplace(op.id, 0);  // a file exists or is on its way (Remove waits for it)
    held_bytes_ += op.record.bytes.capacity();
    ++queued_[op.id];
    queue_.push_back(std::move(op));
  }
  cv_.notify_all();
}

void SessionPersister::Remove(const std::string& id) {
  std::mutex m;
  std::condition_variable cv;
  bool finished = false;
  {
    std::unique_lock lock(mu_);
    if (sizes_.count(id) == 0) return;  // never had a file, none queued
    Op op;
    op.kind = Op::kRemove;
    op.id = id;
    op.done = [&] {
      std::unique_lock l(m);
      finished = true;
      cv.notify_all();
    };
    ++queued_[op.id];
    queue_.push_back(std::move(op));
  }
  cv_.notify_all();
  std::unique_lock lock(m);
  cv.wait(lock, [&] { return finished; });
}

SessionPersister::RestoreReport SessionPersister::last_restore() const {
  std::unique_lock lock(mu_);
  return last_restore_;
}

SessionPersister::Stats SessionPersister::stats() const {
  std::unique_lock lock(mu_);
  Stats s = stats_;
  s.files = sizes_.size();
  s.disk_bytes = 0;
  for (const auto& [id, bytes] : sizes_) s.disk_bytes += bytes;
  s.buffer_bytes = held_bytes_;
  for (const std::string& b : spare_) s.buffer_bytes += b.capacity();
  s.spare_buffers = spare_.size();
  return s;
}

uint64_t SessionPersister::FileBytes(const std::string& id) const {
  std::unique_lock lock(mu_);
  auto it = sizes_.find(id);
  return it == sizes_.end() ? 0 : it->second;
}

void SessionPersister::Loop() {
  auto next_sync = SteadyClock::now() + options_.interval;
  std::unique_lock lock(mu_);
  while (true) {
    if (options_.sync == PersistSync::kInterval) {
      cv_.wait_until(lock, next_sync, [&] { return stop_ || !queue_.empty(); });
    } else {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    }
    if (options_.sync == PersistSync::kInterval &&
        (SteadyClock::now() >= next_sync || (stop_ && queue_.empty()))) {
      lock.unlock();
      SyncDirty();
      lock.lock();
      next_sync = SteadyClock::now() + options_.interval;
    }
    if (queue_.empty()) {
      if (stop_) break;
      continue;
    }
    Op op = std::move(queue_.front());
    queue_.pop_front();
    const std::function<void(const std::string&)> hook =
        op.kind == Op::kWrite ? write_hook_ : nullptr;
    lock.unlock();
    if (hook) hook(op.id);
    if (op.kind == Op::kWrite) {
      Write(op.id, op.record);
    } else {
      Unlink(op.id);
    }
    // A turn-sized buffer is recycled: the next record reuses its pages.
    std::string spent = std::move(op.record.bytes);
    // The op counts as done before its callback runs: whoever the callback
    // wakes (a call's consumer) finds the file current (IsCurrent).
    lock.lock();
    held_bytes_ -= spent.capacity();
    if (spent.capacity() > 0 && spent.capacity() <= kSpareMaxBytes && spare_.size() < kSpares) {
      spare_.push_back(std::move(spent));
    }
    if (auto it = queued_.find(op.id); it != queued_.end() && --it->second == 0) queued_.erase(it);
    idle_cv_.notify_all();
    lock.unlock();
    if (op.done) op.done();
    lock.lock();
  }
}

bool SessionPersister::Write(const std::string& id, const JournalRecord& record) {
  const auto t0 = SteadyClock::now();
  const std::string path = PathOf(id);
  const bool sync = options_.sync == PersistSync::kTurn;
  std::string failure;
  uint64_t size = 0;
  if (record.rewrite) {
    // Whole, beside the old file, then renamed over it.
    const std::string tmp = path + std::string(kTmpSuffix);
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    int err = fd < 0 ? errno : WriteAll(fd, record.bytes);
    if (err == 0 && options_.sync != PersistSync::kNone && ::fdatasync(fd) != 0) err = errno;
    if (fd >= 0) ::close(fd);
    if (err == 0 && ::rename(tmp.c_str(), path.c_str()) != 0) err = errno;
    if (err != 0) {
      ::unlink(tmp.c_str());
      failure = absl::StrCat("writing ", tmp, ": ", Errno(err));
    } else {
      if (options_.sync != PersistSync::kNone) SyncDir();
      size = record.bytes.size();
    }
  } else {
    uint64_t before = 0;
    bool stale = false;
    {
      std::unique_lock lock(mu_);
      before = sizes_[id];
      // The record continues the file as it was when the record was
      // prepared. An earlier write that failed after that (its append cut
      // back off) or a torn tail left in place (RestoreAll) means the file
      // is not there: appended, the record would follow the wrong state.
      stale = broken_.count(id) > 0 || before + record.bytes.size() != record.mark.file_bytes;
    }
    if (stale) {
      failure = "a record prepared before a failed write is not appended";
    } else {
      const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
      int err = fd < 0 ? errno : WriteAll(fd, record.bytes);
      if (err == 0 && sync && ::fdatasync(fd) != 0) err = errno;
      if (err != 0) {
        // Cut the partial record off: the file ends at its last whole turn.
        if (fd >= 0 && ::ftruncate(fd, static_cast<off_t>(before)) != 0) {
          spdlog::error("state: session {}: cutting a failed append off failed: {}", id,
                        Errno(errno));
        }
        failure = absl::StrCat("appending to ", path, ": ", Errno(err));
      } else {
        size = before + record.bytes.size();
      }
      if (fd >= 0) ::close(fd);
    }
  }
  const double seconds = std::chrono::duration<double>(SteadyClock::now() - t0).count();
  std::unique_lock lock(mu_);
  stats_.write_seconds += seconds;
  if (!failure.empty()) {
    ++stats_.failures;
    broken_.insert(id);
    lock.unlock();
    spdlog::error("state: session {}: {}; the session runs on, its next call rewrites the file", id,
                  util::EscapeForLog(failure));
    return false;
  }
  ++stats_.records;
  written_[id] = {record.mark.tokens, record.mark.cached};
  if (record.rewrite) ++stats_.rewrites;
  stats_.bytes += record.bytes.size();
  sizes_[id] = size;
  if (options_.sync == PersistSync::kInterval) dirty_.insert(id);
  return true;
}

absl::Status SessionPersister::MarkMoving(const std::string& id, const std::string& peer) {
  const std::string path = MovingPathOf(id);
  const std::string tmp = path + std::string(kTmpSuffix);
  const std::string body = peer.substr(0, kMaxPeerBytes);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  int err = fd < 0 ? errno : WriteAll(fd, body);
  if (err == 0 && ::fdatasync(fd) != 0) err = errno;
  if (fd >= 0) ::close(fd);
  if (err == 0 && ::rename(tmp.c_str(), path.c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlink(tmp.c_str());
    return absl::UnavailableError(absl::StrCat("--state-dir: cannot record the move of session ",
                                               id, " (", path, "): ", Errno(err)));
  }
  SyncDir();
  return absl::OkStatus();
}

void SessionPersister::ClearMoving(const std::string& id) {
  const std::string path = MovingPathOf(id);
  if (::unlink(path.c_str()) == 0) SyncDir();
}

void SessionPersister::Unlink(const std::string& id) {
  const std::string path = PathOf(id);
  ::unlink(path.c_str());
  ::unlink((path + std::string(kTmpSuffix)).c_str());
  // A move's mark after the file it guards (a crash in between leaves a
  // mark without a file, which the restore deletes).
  ::unlink(MovingPathOf(id).c_str());
  if (options_.sync != PersistSync::kNone) SyncDir();
  std::unique_lock lock(mu_);
  sizes_.erase(id);
  broken_.erase(id);
  dirty_.erase(id);
  written_.erase(id);
}

void SessionPersister::WaitIdle(const std::string& id) {
  std::unique_lock lock(mu_);
  idle_cv_.wait(lock, [&] { return queued_.count(id) == 0; });
}

bool SessionPersister::IsCurrent(const Session& session) const {
  const Session::JournalMark& mark = session.journal_mark();
  // The mark says what the file holds; the session may have moved past it
  // since without a record (a call no record could describe, a failed
  // step): then its file is behind its RAM.
  if (!mark.written || mark.tokens != session.tokens().size() ||
      mark.cached != session.kv().position()) {
    return false;
  }
  std::unique_lock lock(mu_);
  auto it = written_.find(session.id());
  return it != written_.end() && queued_.count(session.id()) == 0 &&
         broken_.count(session.id()) == 0 && it->second == std::make_pair(mark.tokens, mark.cached);
}

void SessionPersister::CountUnpersisted(const Session& session, const absl::Status& why) {
  const Session::JournalMark& mark = session.journal_mark();
  if (mark.tokens == session.tokens().size() && mark.cached == session.kv().position()) return;
  spdlog::warn("state: session {}: this call's state is not persisted (the call failed: {})",
               session.id(), util::EscapeForLog(std::string(why.message())));
  std::unique_lock lock(mu_);
  ++stats_.unpersisted;
}

void SessionPersister::Quarantine(const std::string& path, const std::string& why) {
  const fs::path from(path);
  const fs::path to = fs::path(options_.dir) / std::string(kQuarantine) / from.filename();
  std::error_code ec;
  fs::rename(from, to, ec);
  spdlog::error("state: {} quarantined ({}){}", util::EscapeForLog(from.filename().string()),
                util::EscapeForLog(why),
                ec ? absl::StrCat("; moving it failed: ", ec.message()) : "");
}

void SessionPersister::set_load_hook(std::function<void(const std::string& id)> hook) {
  std::lock_guard lock(mu_);
  load_hook_ = std::move(hook);
}

void SessionPersister::set_write_hook(std::function<void(const std::string& id)> hook) {
  std::lock_guard lock(mu_);
  write_hook_ = std::move(hook);
}

absl::StatusOr<std::unique_ptr<Session>> SessionPersister::Load(const std::string& id) {
  std::function<void(const std::string&)> hook;
  {
    std::lock_guard lock(mu_);
    hook = load_hook_;
  }
  if (hook) hook(id);
  WaitIdle(id);
  const std::string path = PathOf(id);
  absl::StatusOr<RestoredJournal> back;
  {
    ReadMark mark(ReadingPathOf(id), CrashedReads(ReadingPathOf(id)));
    util::Failpoint("restore-read");
    absl::StatusOr<MappedFile> file = MappedFile::Open(path);
    if (absl::IsNotFound(file.status())) {
      std::unique_lock lock(mu_);
      sizes_.erase(id);
      written_.erase(id);
      return absl::DataLossError(absl::StrCat(
          "session ", id,
          ": its spilled state cannot be read back: its file is gone: ", file.status().message()));
    }
    if (!file.ok()) {
      // Out of descriptors or memory, for now: the file is left as it is,
      // and the session spilled, for the caller to retry.
      return absl::UnavailableError(
          absl::StrCat("session ", id, ": its spilled state cannot be read back now (its file: ",
                       file.status().message(), "); it stays on disk: retry"));
    }
    back = RestoreMapped(*file, model_, options_.fingerprint);
  }
  if (back.ok() && (back->torn_bytes > 0 || back->session->id() != id)) {
    back = absl::DataLossError("the file does not end with the session's last record");
  }
  if (!back.ok()) {
    Quarantine(path, std::string(back.status().message()));
    std::unique_lock lock(mu_);
    sizes_.erase(id);
    written_.erase(id);
    return absl::DataLossError(absl::StrCat(
        "session ", id, ": its spilled state cannot be read back: ", back.status().message()));
  }
  return std::move(back->session);
}

void SessionPersister::SyncDir() {
  const int fd = ::open(options_.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

void SessionPersister::SyncDirty() {
  std::set<std::string> dirty;
  {
    std::unique_lock lock(mu_);
    dirty.swap(dirty_);
  }
  for (const std::string& id : dirty) {
    const int fd = ::open(PathOf(id).c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::close(fd);
  }
  if (!dirty.empty()) SyncDir();
}

}  // namespace cortiq::session
