// SessionStore: the live sessions of this node — 128-bit random ids,
// exclusive leases, explicit idempotent release, the idle TTL, the session cap
// and the memory budget with admission by projected bytes.
//
// Threads: every method is thread-safe (one mutex; no method holds it while
// running model code). A Lease is used by one thread at a time and returns
// itself when destroyed.
//
// Memory accounting: each session publishes its exact bytes by kind
// (Session::PublishMemory); MemoryByKindTotal() sums them at call time, so a
// metrics scrape reads the live value. Admission counts, per session, the
// larger of its current bytes and its lease's reservation (the projected peak
// of the running call), so two admitted calls can never together exceed the
// budget. Imports in flight count too: each holds an ImportReservation that
// grows with the bytes its stream has allocated, from the first byte, and
// becomes the installed session's own reservation at Install.
//
// Waiting for a lease: a session leased by a call that is ending — its job
// was cancelled (LeaseEnding::Mark) or its deadline has passed
// (Lease::EndsBy), so the lease comes back at the engine's next step — is
// waited for by Peek / Acquire, up to options.lease_wait and the caller's
// own deadline, instead of answering ABORTED. A session whose holder is
// still running (a truly concurrent call) answers ABORTED once
// options.cancel_settle (20 ms) has passed without its cancel arriving.
//
// Tenants: every session belongs to one (Session::tenant(), set by Create
// or carried by an import). Every lookup by id — Get, Peek, Acquire,
// Release — and List take a TenantFilter: nullopt sees every tenant's
// sessions (an admin caller, and the node's own work: drain, migration);
// a name sees that tenant's only, and another tenant's session answers
// exactly as an unknown id does (NOT_FOUND with the same message, released
// = false, nullopt), without waiting for its lease: no oracle, not even a
// timing one. The check lives here, in the lookup, so no handler can skip it.
//
// Admission takes a RequestPlan's bytes (PlanRequest projects them once):
// Create(model, plan) for a new session; Peek → PlanRequest → Acquire(id,
// plan) for a continuation, so a request that fails its plan never leases.
//
// Example:
//   SessionStore store({.max_sessions = 64, .memory_budget_bytes = 8 << 30});
//   CORTIQ_ASSIGN_OR_RETURN(SessionStore::Lease lease, store.Create(model, plan));
//   lease.SetCanceller([job] { job->Cancel(); });  // ReleaseSession stops it
//   ...                                             // lease returns on scope exit
#pragma once

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/session/request_plan.h"
#include "core/session/session.h"

namespace cortiq::session {

// kMaxAge: --session-max-age; kLost: a spilled session whose file could not
// be read back; kDuplicate: a conversation's session created here while a
// peer could not be asked, found on that peer afterwards (this copy goes).
enum class ReleaseReason : uint8_t {
  kExplicit = 0,
  kTtl,
  kCancelled,
  kMigrated,
  kOneshot,
  kMaxAge,
  kLost,
  kDuplicate
};
inline constexpr size_t kNumReleaseReasons = 8;

class SessionPersister;
std::string_view ReleaseReasonName(ReleaseReason reason);  // "explicit", "ttl", ...

struct StoreOptions {
  size_t max_sessions = 256;
  size_t memory_budget_bytes = 0;  // 0 = unlimited
  std::chrono::milliseconds ttl{600'000};
  // How long ReleaseSession waits for a generating session's lease to return.
  std::chrono::milliseconds release_wait{10'000};
  // How long Peek / Acquire wait for the lease of an ending call (--lease-wait).
  std::chrono::milliseconds lease_wait{1'000};
  // How long Peek / Acquire give a running holder's cancel to arrive before
  // answering ABORTED. A client that cancels a call and retries at once
  // sends both on one connection, but the server learns of the cancel on
  // another thread, often after the retry (on loopback, about a millisecond
  // later); without this window that retry would be refused. Capped by
  // lease_wait (--lease-wait 0: no wait at all).
  std::chrono::milliseconds cancel_settle{20};
  // Imports in flight at once (--max-concurrent-imports); 0 = unlimited.
  size_t max_imports = 4;
  // ExportSession snapshots held at once (--max-concurrent-exports); 0 =
  // unlimited.
  size_t max_exports = 4;
  // --state-dir (not owned; may be null). With it:
  //   * a session the store lets go of has its file deleted (after it is
  //     erased, outside the lock, before the release is reported done: a
  //     release is durable once Release returns);
  //   * the idle TTL SPILLS a session whose file holds its whole state: its
  //     RAM is freed, the session stays listed (SessionSnapshot::spilled),
  //     and the next call that names it reads it back (Peek / Acquire, on
  //     the caller's thread, or refused with ReadBack::kRefuse so that the
  //     caller reads it back on another); a session whose file is behind
  //     its RAM (a call no record described, a failed write) has its file
  //     brought up to date first, and is released as without a state dir
  //     only when that fails;
  //   * admission under the memory budget spills the least recently used
  //     idle sessions whose files are current before it refuses;
  //   * a read-back that cannot open or map the file now (EMFILE, ENOMEM)
  //     is UNAVAILABLE and leaves the session spilled, its file intact.
  SessionPersister* persister = nullptr;
  // Releases for good (reason max_age) an unleased session this old,
  // spilled or not (--session-max-age); 0 = never.
  std::chrono::milliseconds max_age{0};
};

// Which sessions a caller may see (see the banner): nullopt = every
// tenant's; a name = that tenant's only.
using TenantFilter = std::optional<std::string>;
inline const TenantFilter kAnyTenant = std::nullopt;

// Whether Peek, PeekForReuse and Acquire may read a spilled session back on
// the calling thread, which takes O(its file): a thread that must not block
// that long (a gRPC callback) passes kRefuse, gets SpilledRefusal with
// nothing changed, and asks again from a thread that may.
enum class ReadBack {
  kInline,
  kRefuse,
};
// UNAVAILABLE "session '<id>' is spilled to disk", marked so that
// IsSpilledRefusal tells it from every other UNAVAILABLE.
absl::Status SpilledRefusal(const std::string& id);
bool IsSpilledRefusal(const absl::Status& status);

// A snapshot of one session for GetSession / ListSessions.
struct SessionSnapshot {
  std::string id;
  std::string tenant;
  SessionConfig config;
  size_t tokens = 0;
  size_t cached_tokens = 0;
  MemoryByKind memory;
  bool busy = false;
  double age_seconds = 0;
  double idle_seconds = 0;
  double ttl_remaining_seconds = 0;
  bool spilled = false;     // its state is on disk only (StoreOptions::persister)
  uint64_t disk_bytes = 0;  // its file's bytes (0 without a state dir)
  // Non-empty: restored in doubt, its move to this peer cut by a crash
  // (InstallRestored); refused with UNAVAILABLE until SettleMove.
  std::string moving_to;
};

// One tenant's share of the store (SessionStore::UsageByTenant).
struct TenantUsage {
  size_t sessions = 0;
  size_t memory_bytes = 0;  // Σ Session::Memory().total()
};

struct ReleaseResult {
  bool released = false;  // false: unknown or already released
  size_t freed_bytes = 0;
};

class SessionStore {
  // What the reservations of one kind in flight hold (imports, export
  // snapshots): their bytes and how many there are; under mu_.
  struct Transfers {
    size_t bytes = 0;
    size_t count = 0;
  };

 public:
  class Lease;
  class LeaseEnding;
  class ImportReservation;

  explicit SessionStore(StoreOptions options);
  ~SessionStore();  // releases every session
  SessionStore(const SessionStore&) = delete;
  SessionStore& operator=(const SessionStore&) = delete;

  // Creates a session of `tenant` and leases it. RESOURCE_EXHAUSTED
  // (nothing allocated, numbers in the message) when the cap is reached or
  // projected_bytes does not fit the budget; INVALID_ARGUMENT from
  // Session::Create.
  absl::StatusOr<Lease> Create(const model::Transformer& model, const SessionConfig& config,
                               size_t projected_bytes, std::string tenant = {});
  // Create(model, plan.config, plan.projected.total(), tenant): the session
  // a plan for a new session (PlanRequest with a SessionConfig) was made for.
  absl::StatusOr<Lease> Create(const model::Transformer& model, const RequestPlan& plan,
                               std::string tenant = {});
  // `count` new sessions for `plan` (a request with n = count choices, or
  // the count - 1 forks of a continued session), admitted together: the cap
  // counts them all and the budget count x plan.projected.total() bytes,
  // each session reserving its plan's bytes. All or nothing:
  // RESOURCE_EXHAUSTED (nothing created, nothing changed, numbers in the
  // message) when they do not fit; INVALID_ARGUMENT from Session::Create.
  // Requires count >= 1. O(count + sessions).
  absl::StatusOr<std::vector<Lease>> CreateMany(const model::Transformer& model,
                                                const RequestPlan& plan, size_t count,
                                                std::string tenant = {});
  // Create(model, plan, tenant) under the caller's id (GenerateRequest.
  // create_if_missing): `id` must have IsIdForm's form (INVALID_ARGUMENT
  // naming session_id otherwise). ALREADY_EXISTS when a session — of any
  // tenant — has that id (the caller continues it instead, and another
  // tenant's then answers NOT_FOUND as any unknown id); RESOURCE_EXHAUSTED
  // as Create. Nothing is allocated on an error.
  absl::StatusOr<Lease> CreateNamed(const model::Transformer& model, const RequestPlan& plan,
                                    const std::string& id, std::string tenant = {});
  // Installs a session built outside the store (an import) and leases it;
  // it keeps its own tenant (Session::set_tenant). RESOURCE_EXHAUSTED (the
  // session is destroyed, nothing installed) when the cap is reached or its
  // bytes do not fit the budget; ALREADY_EXISTS on an id collision.
  absl::StatusOr<Lease> Install(std::unique_ptr<Session> session);
  // Install for an import that held `held` while it arrived: the session is
  // admitted against the budget without `held`'s own bytes, and `held`
  // becomes the new lease's reservation in the same step (no double count,
  // no gap). On an error `held` is left as it was (the caller drops it).
  // UNAVAILABLE once CloseToNewSessions ran.
  absl::StatusOr<Lease> Install(std::unique_ptr<Session> session, ImportReservation& held);
  // Starts accounting one import (holding 0 bytes). RESOURCE_EXHAUSTED
  // naming --max-concurrent-imports when options.max_imports are in flight;
  // UNAVAILABLE once CloseToNewSessions ran.
  absl::StatusOr<ImportReservation> BeginImport();
  // Starts accounting one export's snapshot (ExportSession: a copy of the
  // session's stream, held until a possibly slow client has read it),
  // holding 0 bytes until Update: the same budget as an import's, its own
  // cap. RESOURCE_EXHAUSTED naming --max-concurrent-exports when
  // options.max_exports are held.
  absl::StatusOr<ImportReservation> BeginExport();
  // From now on no session comes in (UNAVAILABLE): BeginImport, Install
  // and Create / CreateMany / CreateNamed refuse. A draining node calls
  // this before it lists the sessions it moves, and each of those decides
  // under the same lock as List, so a session either exists before the list
  // (and moves with the rest) or is never made here: an import in flight is
  // refused when it ends (its source's migration fails and keeps the
  // session), a call that passed the front's draining check a moment before
  // gets UNAVAILABLE. Nothing is made after the list, on a node about to exit.
  void CloseToNewSessions();
  // The refusal of new sessions and generations on a draining node: the
  // store's, once closed, and the fronts' (server/call_util.h Unavailable).
  static absl::Status DrainingRefusal();
  // A fresh session id: 32 hex digits of 128 bits from the kernel CSPRNG.
  static std::string RandomId();
  // True for a string of RandomId's form (32 lowercase hex digits): an id
  // that can name a session at all (the wire import checks it; a node asks
  // its peers only for one of this form).
  static bool IsIdForm(std::string_view id);
  // Leases an existing session. NOT_FOUND for an unknown id (or one
  // `tenant` does not see); ABORTED when another call holds it ("session
  // busy"). When the holder is ending (see the banner) this blocks the
  // calling thread until its lease returns, at most options.lease_wait and
  // until `deadline`; ABORTED if it has not.
  absl::StatusOr<Lease> Acquire(const std::string& id,
                                Clock::time_point deadline = Clock::time_point::max(),
                                const TenantFilter& tenant = kAnyTenant,
                                ReadBack read_back = ReadBack::kInline);
  // What a continuation is planned against (PlanRequest): the session's
  // history length and config, without leasing it or touching it. NOT_FOUND
  // / ABORTED as Acquire would answer now, after the same wait for an ending
  // holder.
  // A spilled session is read back first (Peek, PeekForReuse and Acquire
  // alike): DATA_LOSS when its file cannot be (the session is then
  // released, reason lost), RESOURCE_EXHAUSTED when its state does not fit
  // the budget (it stays spilled); with ReadBack::kRefuse, SpilledRefusal
  // instead of the read.
  absl::StatusOr<ExistingSession> Peek(const std::string& id,
                                       Clock::time_point deadline = Clock::time_point::max(),
                                       const TenantFilter& tenant = kAnyTenant,
                                       ReadBack read_back = ReadBack::kInline);
  // Peek for a reuse_prefix call whose prompt is `conversation` (the whole
  // conversation, non-empty): also what the call keeps of the history
  // (ExistingSession::reuse, Session::PlanReuse computed under the store's
  // lock) and the session's lease serial, so that Acquire(id, plan) can
  // tell that no call ran in between. O(min(history, conversation) +
  // layers) under the lock. Errors as Peek.
  absl::StatusOr<ExistingSession> PeekForReuse(const std::string& id,
                                               std::span<const int32_t> conversation,
                                               Clock::time_point deadline = Clock::time_point::max(),
                                               const TenantFilter& tenant = kAnyTenant,
                                               ReadBack read_back = ReadBack::kInline);
  // A session restored from --state-dir at start: installed like Install,
  // or, when its state does not fit the memory budget, installed spilled
  // (its RAM freed at once; a persister is required). RESOURCE_EXHAUSTED
  // at the session cap. With `moving_to` (a peer): the session's move there
  // was cut by a crash, so the peer may hold it; it is installed spilled
  // and in doubt, and every call naming it is UNAVAILABLE (retry) until
  // SettleMove.
  absl::Status InstallRestored(std::unique_ptr<Session> session, const std::string& moving_to = {});
  // The sessions in doubt: (id, the peer of the cut move).
  std::vector<std::pair<std::string, std::string>> InDoubt() const;
  // Ends `id`'s doubt: held elsewhere (`elsewhere`, a peer that holds it),
  // it is released here (reason migrated: its file goes); else it stays
  // here (spilled, read back by the next call). No-op for a session not in
  // doubt.
  void SettleMove(const std::string& id, const std::optional<std::string>& elsewhere);
  // Leases the session `plan` was made for (from Peek) and reserves
  // plan.projected.total() bytes for the call, in one step: nothing changes
  // on an error. NOT_FOUND / ABORTED as Acquire; ABORTED ("session busy")
  // also when its history is no longer plan.history (another call ran since
  // the Peek: plan again) — for a reuse_prefix plan, when the session was
  // leased at all since PeekForReuse (plan.lease_serial);
  // RESOURCE_EXHAUSTED as Lease::Reserve.
  absl::StatusOr<Lease> Acquire(const std::string& id, const RequestPlan& plan,
                                Clock::time_point deadline = Clock::time_point::max(),
                                const TenantFilter& tenant = kAnyTenant,
                                ReadBack read_back = ReadBack::kInline);

  // Frees a session. Idempotent: unknown / already released / not seen by
  // `tenant` → released=false.
  // A leased session has its canceller called, is marked for release, and
  // this waits (up to options.release_wait) until the lease returns and its
  // state is freed: then freed_bytes is what was freed, and the store's
  // counts (num_sessions, MemoryByKindTotal) no longer include it. If the
  // holder does not return the lease within the wait, it reports
  // released=true with freed_bytes 0 (the release happens when it returns).
  ReleaseResult Release(const std::string& id, ReleaseReason reason = ReleaseReason::kExplicit,
                        const TenantFilter& tenant = kAnyTenant);
  // Releases the session only if no call holds it (nothing is cancelled):
  // true if it was released here; false if it is leased or unknown.
  bool ReleaseIfIdle(const std::string& id, ReleaseReason reason);

  // Every idle, unleased session whose last use is older than the TTL is
  // released (reason ttl), or with a persister spilled: at once when its
  // file is current, else once this has written its file up to date
  // (leased meanwhile; this waits for the writes), released when that
  // fails. Every unleased session older than max_age is released (reason
  // max_age). Returns how many were released or spilled. Called by the
  // server's reaper.
  size_t ReapIdle(Clock::time_point now = Clock::now());

  // Cancels every running call (their leases' cancellers) and marks every
  // lease as ending, so Acquire waits for it (up to lease_wait). For drain
  // and shutdown.
  void CancelAll();

  // nullopt for an unknown id or one `tenant` does not see.
  std::optional<SessionSnapshot> Get(const std::string& id,
                                     const TenantFilter& tenant = kAnyTenant) const;
  // The sessions `tenant` sees, by creation time.
  std::vector<SessionSnapshot> List(const TenantFilter& tenant = kAnyTenant) const;

  // ---- accounting (read at scrape time) ----
  MemoryByKind MemoryByKindTotal() const;
  // Sessions and bytes per tenant, read in one locked pass: the counts sum
  // to num_sessions() and the bytes to MemoryByKindTotal().total() as of
  // that pass. O(sessions).
  std::map<std::string, TenantUsage> UsageByTenant() const;
  size_t num_sessions() const;  // spilled ones included
  size_t num_leased() const;
  size_t num_spilled() const;
  uint64_t spills() const;    // sessions spilled so far (TTL and memory pressure)
  uint64_t unspills() const;  // spilled sessions read back so far
  // Bytes admission counts as committed: Σ max(current, reservation).
  size_t committed_bytes() const;
  // Bytes the imports in flight hold (their reservations' sum); 0 when none runs.
  size_t import_bytes() const;
  size_t num_imports() const;
  // Bytes the export snapshots being sent hold (BeginExport); 0 when none.
  size_t export_bytes() const;
  size_t num_exports() const;
  std::array<uint64_t, kNumReleaseReasons> releases() const;  // cumulative, by reason
  const StoreOptions& options() const { return options_; }

  // A lease: exclusive use of one session. Move-only; returns itself on
  // destruction (or Return()). While held, the session's operations and its
  // sequence() belong to the holder.
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& o) noexcept { *this = std::move(o); }
    Lease& operator=(Lease&& o) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() { Return(); }

    explicit operator bool() const { return session_ != nullptr; }
    Session& operator*() const { return *session_; }
    Session* operator->() const { return session_; }
    Session* get() const { return session_; }
    // The session's attention state, mutable: what Transformer::Prefill /
    // DecodeBatch / SealO1 extend. Only a lease reaches it (Session offers
    // const reads and named operations), so only the holder runs the model
    // on a session: the engine thread while a job runs, else the holder's
    // thread. Requires a held lease (operator bool). O(1).
    model::SequenceKv& sequence() { return session_->kv_; }

    // Grows this call's reservation to `projected_bytes` (the session's
    // projected peak after the call). RESOURCE_EXHAUSTED with the numbers
    // when it does not fit the budget; nothing changes then.
    absl::Status Reserve(size_t projected_bytes);
    // Called (once, from the releasing thread) when the session is released
    // while leased; it must make the holder return the lease promptly.
    void SetCanceller(std::function<void()> cancel);
    // When the lease returns, release the session with `reason` (one-shot
    // sessions, migrated ones).
    void ReleaseOnReturn(ReleaseReason reason);
    // True once Release() was asked for this session while leased.
    bool release_requested() const;
    // The call holding this lease ends by `deadline` at the latest: from
    // then on a waiting Peek / Acquire treats it as ending. O(log n).
    void EndsBy(Clock::time_point deadline);
    // A handle another thread uses to mark this lease ending (a job's
    // Cancel). Requires a held lease.
    LeaseEnding ending() const;
    // Returns the lease now (idempotent).
    void Return();

   private:
    friend class SessionStore;
    Lease(SessionStore* store, Session* session, uint64_t serial)
        : store_(store), session_(session), serial_(serial) {}
    SessionStore* store_ = nullptr;
    Session* session_ = nullptr;
    uint64_t serial_ = 0;  // which lease of the session this is (Entry::lease_serial)
  };

  // Marks one lease as ending: its holder has been told to stop and returns
  // it at its next step. Copyable; any thread; Mark() is a no-op once that
  // lease has returned (the session's next lease is not touched) or on a
  // default-constructed handle. The store must outlive it.
  class LeaseEnding {
   public:
    LeaseEnding() = default;
    void Mark() const;

   private:
    friend class SessionStore;
    SessionStore* store_ = nullptr;
    std::string session_id_;
    uint64_t serial_ = 0;
  };

  // The bytes one import in flight holds, counted against the budget from
  // its first byte (committed_bytes() includes them, so a Generate is
  // refused while imports fill the budget). Move-only; gives its bytes back
  // when destroyed, unless Install made them the session's. An export's
  // snapshot (BeginExport) is held the same way, counted apart.
  class ImportReservation {
   public:
    ImportReservation() = default;
    ImportReservation(ImportReservation&& o) noexcept { *this = std::move(o); }
    ImportReservation& operator=(ImportReservation&& o) noexcept;
    ImportReservation(const ImportReservation&) = delete;
    ImportReservation& operator=(const ImportReservation&) = delete;
    ~ImportReservation() { Release(); }

    // Sets the bytes held to `bytes` (the import's allocations now; it may
    // shrink). RESOURCE_EXHAUSTED naming --memory-budget with the numbers
    // when a growth does not fit the budget; the bytes held stay as they
    // were then, and the caller stops the import (and drops this).
    // Requires a reservation from BeginImport / BeginExport, not yet
    // released. O(sessions).
    absl::Status Update(size_t bytes);
    size_t bytes() const { return bytes_; }
    // Gives the bytes back and stops counting this import (idempotent).
    void Release();

   private:
    friend class SessionStore;
    ImportReservation(SessionStore* store, Transfers* counts) : store_(store), counts_(counts) {}
    SessionStore* store_ = nullptr;
    Transfers* counts_ = nullptr;  // the store's imports_ or exports_ (BeginExport)
    size_t bytes_ = 0;
  };

 private:
  struct PendingRelease {
    size_t freed_bytes = 0;
    bool done = false;  // under mu_
  };
  struct Entry {
    std::unique_ptr<Session> session;
    bool leased = false;
    uint64_t lease_serial = 0;  // the current (or last) lease's serial
    // While leased: from this time on the holder is ending (a cancel sets it
    // to the past; EndsBy to the call's deadline).
    Clock::time_point ending_at = Clock::time_point::max();
    size_t reservation = 0;
    std::function<void()> canceller;
    std::optional<ReleaseReason> release_on_return;
    bool release_requested = false;
    // Shared by Release calls waiting for the lease; ReturnLease fills it
    // and sets done once the state is freed.
    std::shared_ptr<PendingRelease> pending_release;
    Clock::time_point last_used;
    // Its state is on disk only (freed from RAM); cached positions then.
    bool spilled = false;
    size_t spilled_cached = 0;
    std::string moving_to;  // in doubt (InstallRestored)
  };

  std::string NewId();  // 32 hex digits from a CSPRNG-seeded 128-bit draw; mu_ held
  // Creates and leases session `id` (not in sessions_) after admission; mu_ held.
  absl::StatusOr<Lease> CreateLocked(const model::Transformer& model, const SessionConfig& config,
                                     size_t projected_bytes, std::string id, std::string tenant);
  size_t CommittedLocked() const;
  // RESOURCE_EXHAUSTED (with the numbers) unless `sessions` more sessions
  // holding `bytes` in all fit the cap and the budget; `what` names the
  // bytes in the message.
  absl::Status AdmitLocked(size_t bytes, std::string_view what, size_t sessions = 1) const;
  // The entry of `id` when `tenant` sees it, else end(): the one place the
  // tenant filter is applied.
  std::map<std::string, Entry>::iterator FindLocked(const std::string& id,
                                                    const TenantFilter& tenant);
  std::map<std::string, Entry>::const_iterator FindLocked(const std::string& id,
                                                          const TenantFilter& tenant) const;
  // NOT_FOUND / ABORTED ("session busy") unless `id` names an unleased
  // session `tenant` sees.
  absl::Status CheckLeasableLocked(const std::string& id, const TenantFilter& tenant) const;
  // Waits (releasing mu_ meanwhile) while `id` is leased by an ending
  // holder, until options_.lease_wait has passed or `deadline`; then
  // CheckLeasableLocked. A session `tenant` does not see is NOT_FOUND at
  // once (no wait).
  absl::Status WaitLeasableLocked(std::unique_lock<std::mutex>& lock, const std::string& id,
                                  Clock::time_point deadline, const TenantFilter& tenant) const;
  // Leases e's session (a new serial, not ending) and stamps its use.
  Lease LeaseLocked(Entry& e);
  // Lease::Reserve with mu_ held.
  absl::Status ReserveLocked(Entry& e, size_t projected_bytes);
  // Spilling (options_.persister). Frees an unleased session's state, which
  // its file holds; mu_ held.
  void SpillLocked(Entry& e);
  // ReapIdle's sessions past the TTL whose files are behind their RAM,
  // leased by it: each file written up to date (Prepare, Submit, waited
  // for, mu_ not held), then each session spilled, or released (reason ttl)
  // when its file is still not current; a release asked meanwhile is
  // carried out. Returns how many were spilled or released.
  size_t SpillBehind(const std::vector<Session*>& behind);
  // Ends the lease of *it (last_used untouched); when a release was asked
  // meanwhile, erases the entry and returns the session to forget outside
  // the lock (and *pending, the waiting Release's, to mark done). mu_ held.
  std::unique_ptr<Session> EndLeaseLocked(std::map<std::string, Entry>::iterator it,
                                          std::shared_ptr<PendingRelease>* pending);
  // Spills the least recently used idle sessions whose files are current
  // until `bytes` more fit the memory budget, or none is left; mu_ held.
  void MakeRoomLocked(size_t bytes, const Entry* except = nullptr);
  // WaitLeasableLocked, then a spilled session is read back (UnspillLocked;
  // SpilledRefusal with kRefuse) and the wait repeated; on OK `id` is
  // unleased and resident.
  absl::Status WaitResidentLocked(std::unique_lock<std::mutex>& lock, const std::string& id,
                                  Clock::time_point deadline, const TenantFilter& tenant,
                                  ReadBack read_back);
  // Reads spilled, unleased `id` back from its file, leased meanwhile (mu_
  // released during the read).
  absl::Status UnspillLocked(std::unique_lock<std::mutex>& lock, const std::string& id);
  // The store lets go of a session: its file goes (persister), then its state.
  void Forget(std::unique_ptr<Session> session);
  SessionSnapshot SnapshotLocked(const Entry& e, Clock::time_point now) const;
  // Erases the entry and returns the session to free outside the lock.
  std::unique_ptr<Session> EraseLocked(std::map<std::string, Entry>::iterator it,
                                       ReleaseReason reason, size_t* freed);
  void ReturnLease(Session* session);

  const StoreOptions options_;
  mutable std::mutex mu_;
  mutable std::condition_variable returned_cv_;  // a lease returned or was marked ending
  uint64_t next_serial_ = 0;
  std::map<std::string, Entry> sessions_;
  std::array<uint64_t, kNumReleaseReasons> releases_{};
  uint64_t spills_ = 0, unspills_ = 0;
  Transfers imports_;        // the import reservations (BeginImport)
  Transfers exports_;        // the export snapshots' reservations (BeginExport)
  bool closed_ = false;      // CloseToNewSessions ran: no session comes in
};

}  // namespace cortiq::session
