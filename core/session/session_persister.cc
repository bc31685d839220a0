#include "core/session/session_persister.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/session/session_store.h"
#include "core/util/log_escape.h"
#include "spdlog/spdlog.h"

namespace cortiq::session {

namespace {

namespace fs = std::filesystem;
using SteadyClock = std::chrono::steady_clock;

constexpr std::string_view kTmpSuffix = ".tmp";
// Record buffers kept for reuse, and the largest kept (a whole file is not).
constexpr size_t kSpares = 4;
constexpr size_t kSpareMaxBytes = size_t{64} << 20;
constexpr std::string_view kQuarantine = "quarantine";

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
    if (fd < 0) return absl::UnavailableError(absl::StrCat("open: ", Errno(errno)));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      return absl::UnavailableError(absl::StrCat("stat: ", Errno(err)));
    }
    MappedFile f;
    f.size_ = static_cast<size_t>(st.st_size);
    if (f.size_ > 0) {
      // Not populated up front: the kernel reads ahead (WILLNEED) while the
      // restore's checksum thread and its applier consume the pages.
      void* p = ::mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        const int err = errno;
        ::close(fd);
        return absl::UnavailableError(absl::StrCat("mmap: ", Errno(err)));
      }
      ::madvise(p, f.size_, MADV_SEQUENTIAL);
      ::madvise(p, f.size_, MADV_WILLNEED);
      f.data_ = static_cast<const char*>(p);
    }
    ::close(fd);
    return f;
  }
  MappedFile() = default;
  MappedFile(MappedFile&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  ~MappedFile() {
    if (data_ != nullptr) ::munmap(const_cast<char*>(data_), size_);
  }
  std::string_view view() const { return {data_, size_}; }
  void Reset() {
    if (data_ != nullptr) ::munmap(const_cast<char*>(data_), size_);
    data_ = nullptr;
    size_ = 0;
  }

 private:
  const char* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace

std::string_view PersistSyncName(PersistSync sync) {
  switch (sync) {
    case PersistSync::kTurn: return "turn";
    case PersistSync::kInterval: return "interval";
    case PersistSync::kNone: return "none";
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

std::string SessionPersister::PathOf(const std::string& id) const {
  return (fs::path(options_.dir) / (id + std::string(kJournalSuffix))).string();
}

SessionPersister::RestoreReport SessionPersister::RestoreAll(
    const std::function<absl::Status(std::unique_ptr<Session>)>& install) {
  const auto t0 = SteadyClock::now();
  RestoreReport report;
  std::vector<fs::path> files;
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
    absl::StatusOr<MappedFile> file = MappedFile::Open(path.string());
    if (!file.ok()) {
      quarantine(path, std::string(file.status().message()));
      continue;
    }
    report.bytes += file->view().size();
    absl::StatusOr<RestoredJournal> back =
        RestoreJournal(file->view(), model_, options_.fingerprint);
    if (!back.ok()) {
      quarantine(path, std::string(back.status().message()));
      continue;
    }
    if (back->session->id() != stem) {
      quarantine(path, "the file holds another session");
      continue;
    }
    file->Reset();
    if (back->torn_bytes > 0) {
      // The next append lands right after the last complete record.
      ::truncate(path.c_str(), static_cast<off_t>(back->valid_bytes));
      spdlog::warn("state: session {}: a torn last record ({} bytes) dropped; restored at its "
                   "last complete turn",
                   stem, back->torn_bytes);
      ++report.torn;
    }
    const uint64_t size = back->valid_bytes;
    const std::pair<size_t, size_t> restored_mark = {back->session->journal_mark().tokens,
                                                     back->session->journal_mark().cached};
    absl::Status st = install(std::move(back->session));
    if (!st.ok()) {
      spdlog::warn("state: session {} restored but not installed: {}", stem,
                   util::EscapeForLog(std::string(st.message())));
      ++report.refused;
      continue;
    }
    std::unique_lock lock(mu_);
    sizes_[stem] = size;
    written_[stem] = restored_mark;
    ++report.restored;
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
    lock.unlock();
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
    {
      std::unique_lock lock(mu_);
      before = sizes_[id];
    }
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
  const double seconds = std::chrono::duration<double>(SteadyClock::now() - t0).count();
  std::unique_lock lock(mu_);
  stats_.write_seconds += seconds;
  if (!failure.empty()) {
    ++stats_.failures;
    broken_.insert(id);
    lock.unlock();
    spdlog::error("state: session {}: {}; the session runs on, its next call rewrites the file",
                  id, util::EscapeForLog(failure));
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

void SessionPersister::Unlink(const std::string& id) {
  const std::string path = PathOf(id);
  ::unlink(path.c_str());
  ::unlink((path + std::string(kTmpSuffix)).c_str());
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

bool SessionPersister::IsCurrent(const std::string& id, const Session::JournalMark& mark) const {
  std::unique_lock lock(mu_);
  auto it = written_.find(id);
  return mark.written && it != written_.end() && queued_.count(id) == 0 &&
         broken_.count(id) == 0 && it->second == std::make_pair(mark.tokens, mark.cached);
}

void SessionPersister::Quarantine(const std::string& path, const std::string& why) {
  const fs::path from(path);
  const fs::path to = fs::path(options_.dir) / std::string(kQuarantine) / from.filename();
  std::error_code ec;
  fs::rename(from, to, ec);
  spdlog::error("state: {} quarantined ({}){}", util::EscapeForLog(from.filename().string()),
                util::EscapeForLog(why), ec ? absl::StrCat("; moving it failed: ", ec.message()) : "");
}

absl::StatusOr<std::unique_ptr<Session>> SessionPersister::Load(const std::string& id) {
  WaitIdle(id);
  const std::string path = PathOf(id);
  absl::StatusOr<RestoredJournal> back;
  {
    absl::StatusOr<MappedFile> file = MappedFile::Open(path);
    if (!file.ok()) {
      return absl::DataLossError(absl::StrCat("session ", id,
                                              ": its spilled state cannot be read back: its file: ",
                                              file.status().message()));
    }
    // A reader streams the file into the page cache ahead of the restore,
    // with large sequential reads (as fast as the disk's own read), so the
    // mapping's faults find their pages there.
    std::atomic<bool> done{false};
    std::thread reader([&] {
      const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) return;
      std::vector<char> scratch(4 << 20);
      while (!done.load(std::memory_order_relaxed) &&
             ::read(fd, scratch.data(), scratch.size()) > 0) {
      }
      ::close(fd);
    });
    back = RestoreJournal(file->view(), model_, options_.fingerprint);
    done.store(true);
    reader.join();
  }
  if (back.ok() && (back->torn_bytes > 0 || back->session->id() != id)) {
    back = absl::DataLossError("the file does not end with the session's last record");
  }
  if (!back.ok()) {
    Quarantine(path, std::string(back.status().message()));
    std::unique_lock lock(mu_);
    sizes_.erase(id);
    written_.erase(id);
    return absl::DataLossError(
        absl::StrCat("session ", id, ": its spilled state cannot be read back: ",
                     back.status().message()));
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
