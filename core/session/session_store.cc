#include "core/session/session_store.h"

#include <algorithm>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/session/session_persister.h"
#include "core/util/log_escape.h"
#include "core/util/status_macros.h"
#include "core/util/strings.h"
#include "spdlog/spdlog.h"

namespace cortiq::session {

std::string_view ReleaseReasonName(ReleaseReason reason) {
  switch (reason) {
    case ReleaseReason::kExplicit: return "explicit";
    case ReleaseReason::kTtl: return "ttl";
    case ReleaseReason::kCancelled: return "cancelled";
    case ReleaseReason::kMigrated: return "migrated";
    case ReleaseReason::kOneshot: return "oneshot";
    case ReleaseReason::kMaxAge: return "max_age";
    case ReleaseReason::kLost: return "lost";
    case ReleaseReason::kDuplicate: return "duplicate";
  }
  return "unknown";
}

namespace {
constexpr std::string_view kSpilledPayload = "type.cortiq.dev/session.spilled";

absl::Status ImportsClosed() {
  return absl::UnavailableError(
      "import: this node is draining and takes no session in (the session stays on its source)");
}

}  // namespace

absl::Status SpilledRefusal(const std::string& id) {
  absl::Status st = absl::UnavailableError(
      absl::StrCat("session '", id, "' is spilled to disk: it is read back off this thread"));
  st.SetPayload(util::Sv(kSpilledPayload), absl::Cord("1"));
  return st;
}

bool IsSpilledRefusal(const absl::Status& status) {
  return status.GetPayload(util::Sv(kSpilledPayload)).has_value();
}

SessionStore::SessionStore(StoreOptions options) : options_(options) {}

SessionStore::~SessionStore() {
  // Leases must not outlive the store (the server destroys the engine first).
  std::unique_lock lock(mu_);
  sessions_.clear();
}

std::string SessionStore::RandomId() {
  // std::random_device reads the kernel CSPRNG (getrandom) on Linux: ids are
  // unguessable, so knowing one session's id says nothing about another's.
  std::random_device rd;
  uint64_t hi = (static_cast<uint64_t>(rd()) << 32) | rd();
  uint64_t lo = (static_cast<uint64_t>(rd()) << 32) | rd();
  return absl::StrFormat("%016x%016x", hi, lo);
}

bool SessionStore::IsIdForm(std::string_view id) {
  return id.size() == 32 && std::all_of(id.begin(), id.end(), [](char ch) {
           return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f');
         });
}

std::string SessionStore::NewId() {
  for (;;) {
    std::string id = RandomId();
    if (!sessions_.contains(id)) return id;
  }
}

absl::StatusOr<SessionStore::Lease> SessionStore::Install(std::unique_ptr<Session> session) {
  ImportReservation none;
  return Install(std::move(session), none);
}

absl::StatusOr<SessionStore::Lease> SessionStore::Install(std::unique_ptr<Session> session,
                                                          ImportReservation& held) {
  session->PublishMemory();
  const size_t bytes = session->Memory().total();
  std::unique_lock lock(mu_);
  if (closed_) return ImportsClosed();
  // The import's bytes are this session's: admit it as if they were free.
  imports_.bytes -= held.bytes_;
  MakeRoomLocked(bytes);
  absl::Status admitted = AdmitLocked(bytes, "the imported session holds");
  imports_.bytes += held.bytes_;
  CORTIQ_RETURN_IF_ERROR(admitted);
  if (sessions_.contains(session->id())) {
    return absl::AlreadyExistsError(absl::StrCat("session_id: '", session->id(), "' exists"));
  }
  Entry& e = sessions_[session->id()];
  e.session = std::move(session);
  // The reservation moves to the lease under the same lock.
  e.reservation = held.bytes_;
  if (held.store_ != nullptr) {
    imports_.bytes -= held.bytes_;
    --imports_.count;
    held.store_ = nullptr;
    held.bytes_ = 0;
  }
  return LeaseLocked(e);
}

SessionStore::Lease SessionStore::LeaseLocked(Entry& e) {
  e.leased = true;
  e.lease_serial = ++next_serial_;
  e.ending_at = Clock::time_point::max();
  e.last_used = Clock::now();
  return Lease(this, e.session.get(), e.lease_serial);
}

absl::StatusOr<SessionStore::ImportReservation> SessionStore::BeginImport() {
  std::unique_lock lock(mu_);
  if (closed_) return ImportsClosed();
  if (options_.max_imports > 0 && imports_.count >= options_.max_imports) {
    return absl::ResourceExhaustedError(
        absl::StrCat("import: ", imports_.count, " imports in flight, --max-concurrent-imports ",
                     options_.max_imports, "; retry later"));
  }
  ++imports_.count;
  return ImportReservation(this, &imports_);
}

absl::StatusOr<SessionStore::ImportReservation> SessionStore::BeginExport() {
  std::unique_lock lock(mu_);
  if (options_.max_exports > 0 && exports_.count >= options_.max_exports) {
    return absl::ResourceExhaustedError(
        absl::StrCat("export: ", exports_.count, " exports being sent, --max-concurrent-exports ",
                     options_.max_exports, "; retry later"));
  }
  ++exports_.count;
  return ImportReservation(this, &exports_);
}

absl::Status SessionStore::DrainingRefusal() {
  return absl::UnavailableError("server is draining: no new sessions or generations");
}

void SessionStore::CloseToNewSessions() {
  std::unique_lock lock(mu_);
  closed_ = true;
}

size_t SessionStore::CommittedLocked() const {
  size_t total = imports_.bytes + exports_.bytes;
  for (const auto& [id, e] : sessions_) {
    total += std::max(e.session->Memory().total(), e.reservation);
  }
  return total;
}

absl::Status SessionStore::AdmitLocked(size_t bytes, std::string_view what,
                                       size_t sessions) const {
  if (sessions_.size() + sessions > options_.max_sessions) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "session cap reached: ", sessions_.size(), " live sessions",
        sessions > 1 ? absl::StrCat(" (this request needs ", sessions, ")") : std::string(),
        ", --max-sessions ", options_.max_sessions, "; release sessions or retry later"));
  }
  const size_t budget = options_.memory_budget_bytes;
  if (budget > 0) {
    const size_t committed = CommittedLocked();
    if (committed + bytes > budget) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "memory budget: ", util::Sv(what), " ", bytes, " bytes, ", committed, " of the ", budget,
          " byte budget are committed (", budget - std::min(committed, budget), " free)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<SessionStore::Lease> SessionStore::Create(const model::Transformer& model,
                                                         const SessionConfig& config,
                                                         size_t projected_bytes,
                                                         std::string tenant) {
  std::unique_lock lock(mu_);
  if (closed_) return DrainingRefusal();
  MakeRoomLocked(projected_bytes);
  CORTIQ_RETURN_IF_ERROR(AdmitLocked(projected_bytes, "this request projects"));
  return CreateLocked(model, config, projected_bytes, NewId(), std::move(tenant));
}

absl::StatusOr<SessionStore::Lease> SessionStore::CreateLocked(const model::Transformer& model,
                                                               const SessionConfig& config,
                                                               size_t projected_bytes,
                                                               std::string id,
                                                               std::string tenant) {
  absl::StatusOr<std::unique_ptr<Session>> s = Session::Create(id, model, config);
  if (!s.ok()) return s.status();
  (*s)->set_tenant(std::move(tenant));
  Entry& e = sessions_[id];
  e.session = *std::move(s);
  e.reservation = projected_bytes;
  return LeaseLocked(e);
}

absl::StatusOr<SessionStore::Lease> SessionStore::Create(const model::Transformer& model,
                                                         const RequestPlan& plan,
                                                         std::string tenant) {
  return Create(model, plan.config, plan.projected.total(), std::move(tenant));
}

absl::StatusOr<std::vector<SessionStore::Lease>> SessionStore::CreateMany(
    const model::Transformer& model, const RequestPlan& plan, size_t count, std::string tenant) {
  const size_t each = plan.projected.total();
  std::unique_lock lock(mu_);
  if (closed_) return DrainingRefusal();
  MakeRoomLocked(each * count);
  CORTIQ_RETURN_IF_ERROR(AdmitLocked(
      each * count,
      count == 1 ? std::string("this request projects")
                 : absl::StrCat("this request's ", count, " sessions (n) of ", each,
                                " bytes each project"),
      count));
  // Every session is made before any is installed: an error leaves nothing.
  std::vector<std::unique_ptr<Session>> made;
  made.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    std::string id = NewId();
    while (std::any_of(made.begin(), made.end(), [&](const auto& m) { return m->id() == id; })) {
      id = NewId();
    }
    absl::StatusOr<std::unique_ptr<Session>> s = Session::Create(id, model, plan.config);
    if (!s.ok()) return s.status();
    (*s)->set_tenant(tenant);
    made.push_back(*std::move(s));
  }
  std::vector<Lease> leases;
  leases.reserve(count);
  for (auto& m : made) {
    Entry& e = sessions_[m->id()];
    e.session = std::move(m);
    e.reservation = each;
    leases.push_back(LeaseLocked(e));
  }
  return leases;
}

absl::StatusOr<SessionStore::Lease> SessionStore::CreateNamed(const model::Transformer& model,
                                                              const RequestPlan& plan,
                                                              const std::string& id,
                                                              std::string tenant) {
  if (!IsIdForm(id)) {
    return absl::InvalidArgumentError(
        "session_id: a session created under the caller's id (create_if_missing) needs the form "
        "of a session id: 32 lowercase hex digits");
  }
  std::unique_lock lock(mu_);
  if (closed_) return DrainingRefusal();
  // Before admission: a taken id is continued, not refused for memory.
  if (sessions_.contains(id)) {
    return absl::AlreadyExistsError(absl::StrCat("session_id: '", id, "' exists"));
  }
  MakeRoomLocked(plan.projected.total());
  CORTIQ_RETURN_IF_ERROR(AdmitLocked(plan.projected.total(), "this request projects"));
  return CreateLocked(model, plan.config, plan.projected.total(), id, std::move(tenant));
}

namespace {

bool Sees(const TenantFilter& tenant, const Session& s) { return !tenant || *tenant == s.tenant(); }

}  // namespace

std::map<std::string, SessionStore::Entry>::iterator SessionStore::FindLocked(
    const std::string& id, const TenantFilter& tenant) {
  auto it = sessions_.find(id);
  return it != sessions_.end() && Sees(tenant, *it->second.session) ? it : sessions_.end();
}

std::map<std::string, SessionStore::Entry>::const_iterator SessionStore::FindLocked(
    const std::string& id, const TenantFilter& tenant) const {
  auto it = sessions_.find(id);
  return it != sessions_.end() && Sees(tenant, *it->second.session) ? it : sessions_.end();
}

absl::Status SessionStore::CheckLeasableLocked(const std::string& id,
                                               const TenantFilter& tenant) const {
  auto it = FindLocked(id, tenant);
  if (it == sessions_.end()) {
    return absl::NotFoundError(absl::StrCat("session_id: no session '", id, "' on this node"));
  }
  const Entry& e = it->second;
  if (e.leased && Clock::now() >= e.ending_at) {
    return absl::AbortedError(absl::StrCat(
        "session busy: '", id, "' is still ending its previous call after the wait (at most ",
        options_.lease_wait.count(), " ms, --lease-wait, and this call's deadline); retry"));
  }
  if (e.leased) {
    return absl::AbortedError(
        absl::StrCat("session busy: '", id, "' is in use by another call"));
  }
  return absl::OkStatus();
}

absl::Status SessionStore::WaitLeasableLocked(std::unique_lock<std::mutex>& lock,
                                              const std::string& id, Clock::time_point deadline,
                                              const TenantFilter& tenant) const {
  // Another tenant's session is not there: answered before any wait, so how
  // long the answer takes says nothing about its lease.
  if (FindLocked(id, tenant) == sessions_.end()) return CheckLeasableLocked(id, tenant);
  // The waits are on a condition variable (ReturnLease and LeaseEnding::Mark
  // notify), bounded: a cancelled job returns its lease at the engine's next
  // step (milliseconds), so the caller's thread is held about that long,
  // never longer than lease_wait (the settle window is part of it).
  const Clock::time_point start = Clock::now();
  const auto settle = std::min(options_.cancel_settle, options_.lease_wait);
  auto gone = [&](const Entry*& e) {
    auto it = sessions_.find(id);
    e = it == sessions_.end() ? nullptr : &it->second;
    return e == nullptr || !e->leased;
  };
  const Entry* e = nullptr;
  // A running holder: give its cancel, maybe in flight, cancel_settle to
  // arrive; a truly concurrent call is refused after that.
  returned_cv_.wait_until(lock, std::min(deadline, start + settle), [&] {
    return gone(e) || Clock::now() >= e->ending_at;
  });
  // An ending holder: wait for its lease, up to lease_wait.
  returned_cv_.wait_until(lock, std::min(deadline, start + options_.lease_wait), [&] {
    return gone(e) || Clock::now() < e->ending_at;
  });
  return CheckLeasableLocked(id, tenant);
}

absl::StatusOr<SessionStore::Lease> SessionStore::Acquire(const std::string& id,
                                                          Clock::time_point deadline,
                                                          const TenantFilter& tenant,
                                                          ReadBack read_back) {
  std::unique_lock lock(mu_);
  CORTIQ_RETURN_IF_ERROR(WaitResidentLocked(lock, id, deadline, tenant, read_back));
  return LeaseLocked(sessions_.at(id));
}

absl::StatusOr<ExistingSession> SessionStore::Peek(const std::string& id,
                                                   Clock::time_point deadline,
                                                   const TenantFilter& tenant,
                                                   ReadBack read_back) {
  std::unique_lock lock(mu_);
  CORTIQ_RETURN_IF_ERROR(WaitResidentLocked(lock, id, deadline, tenant, read_back));
  // Unleased: no call mutates the history while mu_ is held.
  const Session& s = *sessions_.at(id).session;
  return ExistingSession{s.tokens().size(), s.config()};
}

absl::StatusOr<ExistingSession> SessionStore::PeekForReuse(const std::string& id,
                                                           std::span<const int32_t> conversation,
                                                           Clock::time_point deadline,
                                                           const TenantFilter& tenant,
                                                           ReadBack read_back) {
  std::unique_lock lock(mu_);
  CORTIQ_RETURN_IF_ERROR(WaitResidentLocked(lock, id, deadline, tenant, read_back));
  // Unleased: no call touches the session while mu_ is held.
  const Entry& e = sessions_.at(id);
  const Session& s = *e.session;
  return ExistingSession{.history = s.tokens().size(),
                         .config = s.config(),
                         .reuse = s.PlanReuse(conversation),
                         .lease_serial = e.lease_serial};
}

absl::StatusOr<SessionStore::Lease> SessionStore::Acquire(const std::string& id,
                                                          const RequestPlan& plan,
                                                          Clock::time_point deadline,
                                                          const TenantFilter& tenant,
                                                          ReadBack read_back) {
  std::unique_lock lock(mu_);
  CORTIQ_RETURN_IF_ERROR(WaitResidentLocked(lock, id, deadline, tenant, read_back));
  Entry& e = sessions_.at(id);
  if (plan.reuse.has_value() && plan.lease_serial != e.lease_serial) {
    return absl::AbortedError(absl::StrCat(
        "session busy: '", id, "' ran another call while this one was planned; retry"));
  }
  // A reuse_prefix plan keeps part of the history: the session's length is
  // what it was planned against (reuse->history).
  const size_t planned = plan.reuse.has_value() ? plan.reuse->history : plan.history;
  const size_t history = e.session->tokens().size();
  if (history != planned) {
    return absl::AbortedError(
        absl::StrCat("session busy: '", id, "' ran another call while this one was planned (",
                     planned, " tokens then, ", history, " now); retry"));
  }
  CORTIQ_RETURN_IF_ERROR(ReserveLocked(e, plan.projected.total()));
  return LeaseLocked(e);
}

std::unique_ptr<Session> SessionStore::EraseLocked(std::map<std::string, Entry>::iterator it,
                                                   ReleaseReason reason, size_t* freed) {
  std::unique_ptr<Session> s = std::move(it->second.session);
  if (freed) *freed = s->Memory().total();
  ++releases_[static_cast<size_t>(reason)];
  sessions_.erase(it);
  return s;
}

ReleaseResult SessionStore::Release(const std::string& id, ReleaseReason reason,
                                    const TenantFilter& tenant) {
  std::unique_lock lock(mu_);
  auto it = FindLocked(id, tenant);
  if (it == sessions_.end()) return {};
  ReleaseResult r;
  r.released = true;
  if (!it->second.leased) {
    std::unique_ptr<Session> s = EraseLocked(it, reason, &r.freed_bytes);
    lock.unlock();
    Forget(std::move(s));  // frees outside the lock
    return r;
  }
  // Leased: stop the call, then wait for the lease to come back; ReturnLease
  // frees it with this reason.
  Entry& e = it->second;
  const bool first = !e.release_requested;
  e.release_requested = true;
  e.release_on_return = reason;
  if (!e.pending_release) e.pending_release = std::make_shared<PendingRelease>();
  const std::shared_ptr<PendingRelease> pending = e.pending_release;
  std::function<void()> cancel = first ? e.canceller : nullptr;
  lock.unlock();
  if (cancel) cancel();
  lock.lock();
  // Done only after ReturnLease has erased the entry and freed the state, so
  // freed_bytes, the counts and the memory agree when this answers.
  returned_cv_.wait_for(lock, options_.release_wait, [&] { return pending->done; });
  r.freed_bytes = pending->done ? pending->freed_bytes : 0;
  return r;
}

bool SessionStore::ReleaseIfIdle(const std::string& id, ReleaseReason reason) {
  std::unique_lock lock(mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end() || it->second.leased) return false;
  std::unique_ptr<Session> s = EraseLocked(it, reason, nullptr);
  lock.unlock();
  Forget(std::move(s));  // frees outside the lock
  return true;
}

void SessionStore::Forget(std::unique_ptr<Session> session) {
  // The state first: the entry is out of the count already, and Remove may
  // wait behind the writer's queue (a slow disk's fsyncs), while admission
  // would see room that the state still held. A queued record is a copy.
  session->ReleaseState();
  if (options_.persister != nullptr) options_.persister->Remove(session->id());
}

size_t SessionStore::ReapIdle(Clock::time_point now) {
  std::vector<std::unique_ptr<Session>> dead;
  std::vector<Session*> behind;  // leased here until their files are written
  size_t spilled = 0;
  {
    std::unique_lock lock(mu_);
    for (auto it = sessions_.begin(); it != sessions_.end();) {
      auto next = std::next(it);
      Entry& e = it->second;
      if (e.leased) {
        it = next;
        continue;
      }
      if (options_.max_age.count() > 0 && now - e.session->created() >= options_.max_age) {
        spdlog::info("session {} is {:.0f} s old: released (max_age)", it->first,
                     Seconds(now - e.session->created()));
        dead.push_back(EraseLocked(it, ReleaseReason::kMaxAge, nullptr));
      } else if (!e.spilled && now - e.last_used >= options_.ttl) {
        if (options_.persister != nullptr && options_.persister->IsCurrent(*e.session)) {
          spdlog::info("session {} idle for {:.0f} s: spilled to disk (ttl)", it->first,
                       Seconds(now - e.last_used));
          SpillLocked(e);
          ++spilled;
        } else if (options_.persister != nullptr) {
          // Its RAM is ahead of its file (a call no record described, a
          // failed write): spilled as it is, it would come back at its file's
          // turn. Its file is brought up to date first (SpillBehind).
          e.leased = true;
          e.lease_serial = ++next_serial_;
          e.ending_at = Clock::time_point::min();  // a call waits (lease_wait) for the write
          behind.push_back(e.session.get());
        } else {
          spdlog::info("session {} idle for {:.0f} s: released (ttl)", it->first,
                       Seconds(now - e.last_used));
          dead.push_back(EraseLocked(it, ReleaseReason::kTtl, nullptr));
        }
      }
      it = next;
    }
  }
  const size_t n = dead.size() + spilled;
  for (auto& s : dead) Forget(std::move(s));
  return n + (behind.empty() ? 0 : SpillBehind(behind));
}

size_t SessionStore::SpillBehind(const std::vector<Session*>& behind) {
  // Each file gets the record a call's end would have written (the whole
  // file after a failed write), with the store's lease; this waits for the
  // writes (the reaper's thread, not a call's).
  std::mutex m;
  std::condition_variable cv;
  size_t writing = 0;
  for (Session* s : behind) {
    std::optional<SessionPersister::Pending> record = options_.persister->Prepare(*s);
    if (!record) continue;
    {
      std::lock_guard l(m);
      ++writing;
    }
    options_.persister->Submit(*std::move(record), [&] {
      std::lock_guard l(m);
      --writing;
      cv.notify_all();
    });
  }
  {
    std::unique_lock l(m);
    cv.wait(l, [&] { return writing == 0; });
  }
  std::vector<std::unique_ptr<Session>> dead;
  std::vector<std::shared_ptr<PendingRelease>> pendings;
  size_t n = 0;
  {
    std::unique_lock lock(mu_);
    for (Session* s : behind) {
      auto it = sessions_.find(s->id());  // leased: never erased meanwhile
      if (it == sessions_.end()) continue;
      Entry& e = it->second;
      std::shared_ptr<PendingRelease> pending;
      // Still idle since its last call: last_used is left as it was.
      if (std::unique_ptr<Session> released = EndLeaseLocked(it, &pending)) {
        dead.push_back(std::move(released));  // a Release arrived meanwhile
        if (pending) pendings.push_back(std::move(pending));
        continue;
      }
      if (options_.persister->IsCurrent(*e.session)) {
        spdlog::info(
            "session {} idle for {:.0f} s: its file brought up to date, spilled to "
            "disk (ttl)",
            it->first, Seconds(Clock::now() - e.last_used));
        SpillLocked(e);
      } else {
        // No record describes its state, or the write failed: as without
        // a state dir (and the file goes with it).
        spdlog::warn(
            "session {} idle for {:.0f} s: its file cannot be brought up to date; "
            "released (ttl)",
            it->first, Seconds(Clock::now() - e.last_used));
        dead.push_back(EraseLocked(it, ReleaseReason::kTtl, nullptr));
      }
      ++n;
    }
  }
  for (auto& s : dead) Forget(std::move(s));
  if (!pendings.empty()) {
    std::unique_lock lock(mu_);
    for (auto& p : pendings) p->done = true;
  }
  returned_cv_.notify_all();
  return n;
}

void SessionStore::CancelAll() {
  std::vector<std::function<void()>> cancels;
  {
    std::unique_lock lock(mu_);
    for (auto& [id, e] : sessions_) {
      if (!e.leased) continue;
      // Every holder is on its way out now: a drain's Acquire of the
      // session waits for the lease (up to lease_wait) instead of giving
      // the session up as busy.
      e.ending_at = Clock::time_point::min();
      if (e.canceller) cancels.push_back(e.canceller);
    }
  }
  returned_cv_.notify_all();
  for (auto& c : cancels) c();
}

SessionSnapshot SessionStore::SnapshotLocked(const Entry& e, Clock::time_point now) const {
  SessionSnapshot s;
  s.id = e.session->id();
  s.tenant = e.session->tenant();
  s.config = e.session->config();
  s.tokens = e.session->published_tokens();
  s.cached_tokens = e.session->published_cached();
  s.memory = e.session->Memory();
  s.busy = e.leased;
  s.age_seconds = Seconds(now - e.session->created());
  s.idle_seconds = e.leased ? 0.0 : Seconds(now - e.last_used);
  s.ttl_remaining_seconds =
      e.leased ? Seconds(options_.ttl) : std::max(0.0, Seconds(options_.ttl) - s.idle_seconds);
  s.spilled = e.spilled;
  s.moving_to = e.moving_to;
  if (e.spilled) s.cached_tokens = e.spilled_cached;
  if (options_.persister != nullptr) s.disk_bytes = options_.persister->FileBytes(s.id);
  return s;
}

std::optional<SessionSnapshot> SessionStore::Get(const std::string& id,
                                                 const TenantFilter& tenant) const {
  std::unique_lock lock(mu_);
  auto it = FindLocked(id, tenant);
  if (it == sessions_.end()) return std::nullopt;
  return SnapshotLocked(it->second, Clock::now());
}

std::vector<SessionSnapshot> SessionStore::List(const TenantFilter& tenant) const {
  std::vector<std::pair<Clock::time_point, SessionSnapshot>> v;
  {
    std::unique_lock lock(mu_);
    const auto now = Clock::now();
    for (const auto& [id, e] : sessions_) {
      if (Sees(tenant, *e.session)) v.emplace_back(e.session->created(), SnapshotLocked(e, now));
    }
  }
  std::stable_sort(v.begin(), v.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<SessionSnapshot> out;
  out.reserve(v.size());
  for (auto& p : v) out.push_back(std::move(p.second));
  return out;
}

MemoryByKind SessionStore::MemoryByKindTotal() const {
  std::unique_lock lock(mu_);
  MemoryByKind m;
  for (const auto& [id, e] : sessions_) m += e.session->Memory();
  return m;
}

std::map<std::string, TenantUsage> SessionStore::UsageByTenant() const {
  std::unique_lock lock(mu_);
  std::map<std::string, TenantUsage> usage;
  for (const auto& [id, e] : sessions_) {
    TenantUsage& u = usage[e.session->tenant()];
    ++u.sessions;
    u.memory_bytes += e.session->Memory().total();
  }
  return usage;
}

size_t SessionStore::num_sessions() const {
  std::unique_lock lock(mu_);
  return sessions_.size();
}

size_t SessionStore::num_spilled() const {
  std::unique_lock lock(mu_);
  size_t n = 0;
  for (const auto& [id, e] : sessions_) n += e.spilled ? 1 : 0;
  return n;
}

uint64_t SessionStore::spills() const {
  std::unique_lock lock(mu_);
  return spills_;
}

uint64_t SessionStore::unspills() const {
  std::unique_lock lock(mu_);
  return unspills_;
}

void SessionStore::SpillLocked(Entry& e) {
  e.spilled_cached = e.session->published_cached();
  e.session->ReleaseState();
  e.spilled = true;
  ++spills_;
}

void SessionStore::MakeRoomLocked(size_t bytes, const Entry* except) {
  const size_t budget = options_.memory_budget_bytes;
  if (options_.persister == nullptr || budget == 0) return;
  size_t committed = CommittedLocked();
  if (committed + bytes <= budget) return;
  std::vector<std::pair<Clock::time_point, Entry*>> idle;
  for (auto& [id, e] : sessions_) {
    // A session whose file is behind its RAM stays (the TTL writes it).
    if (&e != except && !e.leased && !e.spilled && e.session->Memory().total() > 0 &&
        options_.persister->IsCurrent(*e.session)) {
      idle.emplace_back(e.last_used, &e);
    }
  }
  std::sort(idle.begin(), idle.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [used, e] : idle) {
    if (committed + bytes <= budget) break;
    const size_t freed = e->session->Memory().total();
    spdlog::info("session {}: spilled to disk (memory budget: {} bytes wanted, {} of {} committed)",
                 e->session->id(), bytes, committed, budget);
    SpillLocked(*e);
    committed -= std::min(committed, freed);
  }
}

absl::Status SessionStore::WaitResidentLocked(std::unique_lock<std::mutex>& lock,
                                              const std::string& id, Clock::time_point deadline,
                                              const TenantFilter& tenant, ReadBack read_back) {
  for (;;) {
    CORTIQ_RETURN_IF_ERROR(WaitLeasableLocked(lock, id, deadline, tenant));
    if (const std::string& peer = sessions_.at(id).moving_to; !peer.empty()) {
      return absl::UnavailableError(absl::StrCat(
          "session '", id, "': its move to ", util::EscapeForLog(peer),
          " was cut by a restart of this node; it is served once the peers say whether one of "
          "them holds it (retry)"));
    }
    if (!sessions_.at(id).spilled) return absl::OkStatus();
    if (read_back == ReadBack::kRefuse) return SpilledRefusal(id);
    CORTIQ_RETURN_IF_ERROR(UnspillLocked(lock, id));
  }
}

absl::Status SessionStore::UnspillLocked(std::unique_lock<std::mutex>& lock,
                                         const std::string& id) {
  // Leased while it is read back, ending: another call for it waits (up to
  // lease_wait) instead of racing this one; a Release waits for it.
  Entry& e = sessions_.at(id);
  e.leased = true;
  e.lease_serial = ++next_serial_;
  e.ending_at = Clock::time_point::min();
  Session* held = e.session.get();
  lock.unlock();
  absl::StatusOr<std::unique_ptr<Session>> back = options_.persister->Load(id);
  lock.lock();
  Entry& f = sessions_.at(id);  // a leased entry is never erased
  absl::Status st;
  if (absl::IsUnavailable(back.status())) {
    // The file could not be opened or mapped now (out of descriptors or
    // memory): it is intact, and the session stays spilled for a retry.
    st = back.status();
    spdlog::warn("{}", util::EscapeForLog(std::string(st.message())));
  } else if (!back.ok()) {
    st = back.status();
    spdlog::error("{}: released", util::EscapeForLog(std::string(st.message())));
    if (!f.release_on_return) f.release_on_return = ReleaseReason::kLost;
  } else {
    const size_t bytes = (*back)->Memory().total();
    MakeRoomLocked(bytes);
    const size_t budget = options_.memory_budget_bytes;
    const size_t committed = CommittedLocked();
    if (budget > 0 && committed + bytes > budget) {
      st = absl::ResourceExhaustedError(absl::StrCat(
          "memory budget: reading spilled session '", id, "' back needs ", bytes, " bytes, ",
          committed, " of the ", budget, " byte budget are committed (",
          budget - std::min(committed, budget), " free)"));
    } else {
      (*back)->set_created(held->created());
      f.session = *std::move(back);
      f.spilled = false;
      f.spilled_cached = 0;
      held = f.session.get();
      ++unspills_;
    }
  }
  lock.unlock();
  ReturnLease(held);  // ends the lease (and carries out a release asked meanwhile)
  lock.lock();
  return st;
}

absl::Status SessionStore::InstallRestored(std::unique_ptr<Session> session,
                                           const std::string& moving_to) {
  session->PublishMemory();
  const size_t bytes = session->Memory().total();
  std::unique_lock lock(mu_);
  if (sessions_.contains(session->id())) {
    return absl::AlreadyExistsError(absl::StrCat("session_id: '", session->id(), "' exists"));
  }
  const bool in_doubt = !moving_to.empty() && options_.persister != nullptr;
  absl::Status fits = absl::OkStatus();
  if (!in_doubt) {
    MakeRoomLocked(bytes);
    fits = AdmitLocked(bytes, "the restored session holds");
  }
  const bool spill = (in_doubt || !fits.ok()) && options_.persister != nullptr &&
                     sessions_.size() < options_.max_sessions;
  if (!fits.ok() && !spill) return fits;
  if (in_doubt && !spill) {
    return absl::ResourceExhaustedError(
        absl::StrCat("session cap: ", options_.max_sessions, " sessions"));
  }
  Entry& e = sessions_[session->id()];
  e.session = std::move(session);
  e.last_used = Clock::now();
  if (spill) SpillLocked(e);
  if (in_doubt) e.moving_to = moving_to;
  return absl::OkStatus();
}

std::vector<std::pair<std::string, std::string>> SessionStore::InDoubt() const {
  std::unique_lock lock(mu_);
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [id, e] : sessions_) {
    if (!e.moving_to.empty()) out.emplace_back(id, e.moving_to);
  }
  return out;
}

void SessionStore::SettleMove(const std::string& id, const std::optional<std::string>& elsewhere) {
  {
    std::unique_lock lock(mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end() || it->second.moving_to.empty()) return;
    if (!elsewhere) {
      spdlog::info("session {}: no peer holds it: it stays on this node (its move to {} had not "
                   "completed)",
                   id, util::EscapeForLog(it->second.moving_to));
      it->second.moving_to.clear();
      lock.unlock();
      options_.persister->ClearMoving(id);
      return;
    }
    spdlog::info("session {}: {} holds it (its move had completed before the crash): the copy "
                 "here is released",
                 id, util::EscapeForLog(*elsewhere));
  }
  // Still in doubt until released: no call reads it back meanwhile.
  Release(id, ReleaseReason::kMigrated);
}

size_t SessionStore::num_leased() const {
  std::unique_lock lock(mu_);
  size_t n = 0;
  for (const auto& [id, e] : sessions_) n += e.leased ? 1 : 0;
  return n;
}

size_t SessionStore::committed_bytes() const {
  std::unique_lock lock(mu_);
  return CommittedLocked();
}

size_t SessionStore::import_bytes() const {
  std::unique_lock lock(mu_);
  return imports_.bytes;
}

size_t SessionStore::num_imports() const {
  std::unique_lock lock(mu_);
  return imports_.count;
}

size_t SessionStore::export_bytes() const {
  std::unique_lock lock(mu_);
  return exports_.bytes;
}

size_t SessionStore::num_exports() const {
  std::unique_lock lock(mu_);
  return exports_.count;
}

std::array<uint64_t, kNumReleaseReasons> SessionStore::releases() const {
  std::unique_lock lock(mu_);
  return releases_;
}

std::unique_ptr<Session> SessionStore::EndLeaseLocked(std::map<std::string, Entry>::iterator it,
                                                      std::shared_ptr<PendingRelease>* pending) {
  Entry& e = it->second;
  e.leased = false;
  e.ending_at = Clock::time_point::max();
  e.reservation = 0;
  e.canceller = nullptr;
  if (!e.release_on_return) return nullptr;
  *pending = std::move(e.pending_release);
  return EraseLocked(it, *e.release_on_return, *pending ? &(*pending)->freed_bytes : nullptr);
}

void SessionStore::ReturnLease(Session* session) {
  std::unique_ptr<Session> dead;
  std::shared_ptr<PendingRelease> pending;
  {
    std::unique_lock lock(mu_);
    auto it = sessions_.find(session->id());
    if (it == sessions_.end()) return;  // cannot happen: leased sessions are never erased
    it->second.last_used = Clock::now();
    dead = EndLeaseLocked(it, &pending);
  }
  if (dead) Forget(std::move(dead));
  if (pending) {
    std::unique_lock lock(mu_);
    pending->done = true;
  }
  returned_cv_.notify_all();
}

// ---- Lease ----

SessionStore::Lease& SessionStore::Lease::operator=(Lease&& o) noexcept {
  if (this != &o) {
    Return();
    store_ = std::exchange(o.store_, nullptr);
    session_ = std::exchange(o.session_, nullptr);
    serial_ = std::exchange(o.serial_, 0);
  }
  return *this;
}

absl::Status SessionStore::ReserveLocked(Entry& e, size_t projected_bytes) {
  const size_t budget = options_.memory_budget_bytes;
  if (budget > 0 && projected_bytes > e.reservation) {
    const size_t current = std::max(e.session->Memory().total(), e.reservation);
    MakeRoomLocked(projected_bytes - std::min(projected_bytes, current), &e);
    const size_t mine = std::max(e.session->Memory().total(), e.reservation);
    const size_t others = CommittedLocked() - mine;
    if (others + std::max(mine, projected_bytes) > budget) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "memory budget: this request projects the session to ", projected_bytes, " bytes, ",
          others, " of the ", budget, " byte budget are committed to other sessions and imports (",
          budget - std::min(others, budget), " free)"));
    }
  }
  e.reservation = std::max(e.reservation, projected_bytes);
  return absl::OkStatus();
}

absl::Status SessionStore::Lease::Reserve(size_t projected_bytes) {
  std::unique_lock lock(store_->mu_);
  return store_->ReserveLocked(store_->sessions_.at(session_->id()), projected_bytes);
}

void SessionStore::Lease::SetCanceller(std::function<void()> cancel) {
  std::function<void()> run_now;
  {
    std::unique_lock lock(store_->mu_);
    Entry& e = store_->sessions_.at(session_->id());
    if (e.release_requested) {
      run_now = cancel;  // released while we were setting up: stop at once
    }
    e.canceller = std::move(cancel);
  }
  if (run_now) run_now();
}

void SessionStore::Lease::ReleaseOnReturn(ReleaseReason reason) {
  std::unique_lock lock(store_->mu_);
  Entry& e = store_->sessions_.at(session_->id());
  if (!e.release_requested) e.release_on_return = reason;
}

void SessionStore::Lease::EndsBy(Clock::time_point deadline) {
  std::unique_lock lock(store_->mu_);
  Entry& e = store_->sessions_.at(session_->id());
  e.ending_at = std::min(e.ending_at, deadline);
}

SessionStore::LeaseEnding SessionStore::Lease::ending() const {
  LeaseEnding h;
  h.store_ = store_;
  h.session_id_ = session_->id();
  h.serial_ = serial_;
  return h;
}

void SessionStore::LeaseEnding::Mark() const {
  if (store_ == nullptr) return;
  std::unique_lock lock(store_->mu_);
  auto it = store_->sessions_.find(session_id_);
  if (it == store_->sessions_.end()) return;
  Entry& e = it->second;
  if (e.leased && e.lease_serial == serial_) e.ending_at = Clock::time_point::min();
  lock.unlock();
  store_->returned_cv_.notify_all();  // a caller in its settle window waits on for the lease
}

bool SessionStore::Lease::release_requested() const {
  std::unique_lock lock(store_->mu_);
  return store_->sessions_.at(session_->id()).release_requested;
}

void SessionStore::Lease::Return() {
  if (session_ == nullptr) return;
  Session* s = std::exchange(session_, nullptr);
  std::exchange(store_, nullptr)->ReturnLease(s);
}

// ---- ImportReservation ----

SessionStore::ImportReservation& SessionStore::ImportReservation::operator=(
    ImportReservation&& o) noexcept {
  if (this != &o) {
    Release();
    store_ = std::exchange(o.store_, nullptr);
    counts_ = std::exchange(o.counts_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

absl::Status SessionStore::ImportReservation::Update(size_t bytes) {
  std::unique_lock lock(store_->mu_);
  const size_t budget = store_->options_.memory_budget_bytes;
  if (budget > 0 && bytes > bytes_) {
    // With a state dir, idle sessions spill to make room, as for any other
    // admission; the stream's own bytes so far are already committed.
    store_->MakeRoomLocked(bytes - bytes_);
    const size_t others = store_->CommittedLocked() - bytes_;
    if (others + bytes > budget) {
      return absl::ResourceExhaustedError(
          absl::StrCat(counts_ == &store_->exports_ ? "export: the session's snapshot would hold "
                                                    : "import: the stream would hold ",
                       bytes, " bytes, ", others, " of the --memory-budget ", budget,
                       " bytes are committed to sessions and other imports and exports (",
                       budget - std::min(others, budget), " free); refused"));
    }
  }
  counts_->bytes = counts_->bytes - bytes_ + bytes;
  bytes_ = bytes;
  return absl::OkStatus();
}

void SessionStore::ImportReservation::Release() {
  if (store_ == nullptr) return;
  std::unique_lock lock(store_->mu_);
  counts_->bytes -= bytes_;
  --counts_->count;
  store_ = nullptr;
  bytes_ = 0;
}

}  // namespace cortiq::session
