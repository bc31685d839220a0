// SessionStore: ids, leases, the wait for an ending holder's lease,
// idempotent release (also of a leased session), TTL, cap, budget admission
// and exact memory accounting.
#include "core/session/session_store.h"

#include <unistd.h>

#include <atomic>
#include <set>
#include <thread>

#include "core/model/transformer.h"
#include "gtest/gtest.h"
#include "tests/common/model_test_util.h"

namespace cortiq::session {
namespace {

using std::chrono::milliseconds;

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto m = model::Transformer::Load(testing::TempModel("tiny"));
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = *std::move(m);
  }
  // Absorbs n tokens into the leased session and publishes its bytes.
  void Fill(SessionStore::Lease& lease, size_t n) {
    auto ids = testing::TestIds(n, model_->config().vocab_size, 7);
    std::vector<float> logits(model_->config().vocab_size);
    ASSERT_TRUE(model_->Prefill(ids, lease.sequence(), scratch_, logits.data()).ok());
    lease->AppendPrompt(ids);
    lease->PublishMemory();
  }
  std::unique_ptr<model::Transformer> model_;
  model::ForwardScratch scratch_;
};

TEST_F(StoreTest, IdsAreUniqueHexAndLeasesExclusive) {
  SessionStore store({});
  std::set<std::string> ids;
  std::vector<std::string> keep;
  for (int i = 0; i < 200; ++i) {
    auto lease = store.Create(*model_, {}, 0);
    ASSERT_TRUE(lease.ok()) << lease.status();
    const std::string id = (*lease)->id();
    ASSERT_EQ(id.size(), 32u);
    ASSERT_EQ(id.find_first_not_of("0123456789abcdef"), std::string::npos) << id;
    ASSERT_TRUE(ids.insert(id).second) << "duplicate id " << id;
    if (i == 0) {
      // Leased by Create: a second lease is refused as busy.
      auto busy = store.Acquire(id);
      EXPECT_EQ(busy.status().code(), absl::StatusCode::kAborted);
      EXPECT_NE(busy.status().message().find("busy"), std::string_view::npos);
    }
    keep.push_back(id);
  }
  // Returned on scope exit: now it can be leased again.
  auto again = store.Acquire(keep[0]);
  EXPECT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(store.Acquire("0123").status().code(), absl::StatusCode::kNotFound);
}

// Milliseconds since `t0`.
double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

TEST_F(StoreTest, AnEndingHoldersLeaseIsWaitedForARunningOneIsNot) {
  SessionStore store({.lease_wait = milliseconds(2000)});
  auto held = store.Create(*model_, {}, 0);
  ASSERT_TRUE(held.ok()) << held.status();
  const std::string id = (*held)->id();

  // A holder that is still running: ABORTED at once, no wait.
  auto t0 = Clock::now();
  auto busy = store.Acquire(id);
  EXPECT_EQ(busy.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(busy.status().message().find("in use by another call"), std::string_view::npos);
  EXPECT_LT(MsSince(t0), 100.0);
  EXPECT_EQ(store.Peek(id).status().code(), absl::StatusCode::kAborted);

  // Marked ending (its job was cancelled): Peek and Acquire wait for the
  // lease, which comes back 50 ms later.
  held->ending().Mark();
  std::thread returner([&] {
    std::this_thread::sleep_for(milliseconds(50));
    held->Return();
  });
  t0 = Clock::now();
  auto peek = store.Peek(id);
  EXPECT_TRUE(peek.ok()) << peek.status();
  EXPECT_GE(MsSince(t0), 40.0);
  auto next = store.Acquire(id);
  returner.join();
  ASSERT_TRUE(next.ok()) << next.status();

  // The new holder is not ending: a new caller is refused at once again.
  t0 = Clock::now();
  EXPECT_EQ(store.Acquire(id).status().code(), absl::StatusCode::kAborted);
  EXPECT_LT(MsSince(t0), 100.0);

  // The call's own deadline bounds the wait; the message says why.
  next->ending().Mark();
  t0 = Clock::now();
  auto late = store.Acquire(id, Clock::now() + milliseconds(60));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(late.status().message().find("still ending its previous call"), std::string_view::npos)
      << late.status();
  EXPECT_NE(late.status().message().find("--lease-wait"), std::string_view::npos);
  EXPECT_GE(MsSince(t0), 50.0);
  EXPECT_LT(MsSince(t0), 1000.0);
}

TEST_F(StoreTest, LeaseWaitBoundsTheWaitAndPastDeadlinesCountAsEnding) {
  SessionStore store({.lease_wait = milliseconds(80)});
  auto held = store.Create(*model_, {}, 0);
  ASSERT_TRUE(held.ok()) << held.status();
  const std::string id = (*held)->id();
  // A holder whose call's deadline has passed ends at its next step.
  held->EndsBy(Clock::now() - milliseconds(1));
  auto t0 = Clock::now();
  EXPECT_EQ(store.Acquire(id).status().code(), absl::StatusCode::kAborted);
  EXPECT_GE(MsSince(t0), 70.0);    // waited --lease-wait ...
  EXPECT_LT(MsSince(t0), 1000.0);  // ... and no longer

  // A handle that outlived its lease marks nothing.
  SessionStore::LeaseEnding old = held->ending();
  held->Return();
  auto again = store.Acquire(id);
  ASSERT_TRUE(again.ok()) << again.status();
  old.Mark();
  t0 = Clock::now();
  EXPECT_EQ(store.Acquire(id).status().code(), absl::StatusCode::kAborted);
  EXPECT_LT(MsSince(t0), 50.0);
}

TEST_F(StoreTest, ReleaseIsIdempotentAndFreesEveryByte) {
  SessionStore store({});
  std::string id;
  size_t bytes = 0;
  {
    auto lease = store.Create(*model_, {}, 0);
    ASSERT_TRUE(lease.ok());
    Fill(*lease, 40);
    id = (*lease)->id();
    bytes = (*lease)->kv().MemoryBytes();
    ASSERT_GT(bytes, 0u);
    EXPECT_EQ(store.MemoryByKindTotal()[MemoryKind::kKvF32], bytes);
    EXPECT_EQ(store.MemoryByKindTotal().total(), bytes);
  }
  ReleaseResult r = store.Release(id);
  EXPECT_TRUE(r.released);
  EXPECT_EQ(r.freed_bytes, bytes);
  EXPECT_EQ(store.MemoryByKindTotal().total(), 0u);
  EXPECT_EQ(store.num_sessions(), 0u);
  ReleaseResult again = store.Release(id);
  EXPECT_FALSE(again.released);
  EXPECT_FALSE(store.Release("unknown").released);
  EXPECT_EQ(store.releases()[static_cast<size_t>(ReleaseReason::kExplicit)], 1u);
}

TEST_F(StoreTest, ReleasingALeasedSessionCancelsItsHolderAndWaits) {
  SessionStore store({});
  auto lease = store.Create(*model_, {}, 0);
  ASSERT_TRUE(lease.ok());
  Fill(*lease, 20);
  const std::string id = (*lease)->id();
  const size_t bytes = store.MemoryByKindTotal().total();
  std::atomic<bool> cancelled{false};
  lease->SetCanceller([&] { cancelled = true; });
  // The "engine": returns the lease once it sees the cancel.
  std::thread holder([&, l = std::move(*lease)]() mutable {
    while (!cancelled) std::this_thread::sleep_for(milliseconds(1));
    std::this_thread::sleep_for(milliseconds(30));
    l.Return();
  });
  ReleaseResult r = store.Release(id);
  holder.join();
  EXPECT_TRUE(cancelled);
  EXPECT_TRUE(r.released);
  EXPECT_EQ(r.freed_bytes, bytes);
  // Release returned only after the lease came back and the bytes were freed.
  EXPECT_EQ(store.num_sessions(), 0u);
  EXPECT_EQ(store.MemoryByKindTotal().total(), 0u);
}

// A holder that ignores the cancel: Release gives up after release_wait and
// says it freed nothing (the session is still there, and still counted),
// instead of reporting bytes the gauges still show.
TEST_F(StoreTest, ReleaseThatTimesOutReportsNothingFreed) {
  StoreOptions o;
  o.release_wait = milliseconds(50);
  SessionStore store(o);
  auto lease = store.Create(*model_, {}, 0);
  ASSERT_TRUE(lease.ok());
  Fill(*lease, 20);
  const std::string id = (*lease)->id();
  const size_t bytes = store.MemoryByKindTotal().total();
  ReleaseResult r = store.Release(id);
  EXPECT_TRUE(r.released);
  EXPECT_EQ(r.freed_bytes, 0u);
  EXPECT_EQ(store.num_sessions(), 1u);
  EXPECT_EQ(store.MemoryByKindTotal().total(), bytes);
  lease->Return();  // the release happens now
  EXPECT_EQ(store.num_sessions(), 0u);
  EXPECT_EQ(store.MemoryByKindTotal().total(), 0u);
}

TEST_F(StoreTest, IdleSessionsAreReapedAfterTheTtlButNotWhileLeased) {
  StoreOptions o;
  o.ttl = milliseconds(50);
  SessionStore store(o);
  std::string idle_id;
  {
    auto a = store.Create(*model_, {}, 0);
    ASSERT_TRUE(a.ok());
    idle_id = (*a)->id();
  }
  auto busy = store.Create(*model_, {}, 0);
  ASSERT_TRUE(busy.ok());
  EXPECT_EQ(store.ReapIdle(Clock::now()), 0u);  // not idle long enough
  EXPECT_EQ(store.ReapIdle(Clock::now() + milliseconds(60)), 1u);
  EXPECT_FALSE(store.Get(idle_id).has_value());
  EXPECT_TRUE(store.Get((*busy)->id()).has_value());
  EXPECT_EQ(store.releases()[static_cast<size_t>(ReleaseReason::kTtl)], 1u);
}

TEST_F(StoreTest, SessionCapRefusesWithTheNumbers) {
  StoreOptions o;
  o.max_sessions = 2;
  SessionStore store(o);
  auto a = store.Create(*model_, {}, 0);
  auto b = store.Create(*model_, {}, 0);
  ASSERT_TRUE(a.ok() && b.ok());
  auto c = store.Create(*model_, {}, 0);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(c.status().message().find("--max-sessions 2"), std::string_view::npos)
      << c.status();
  EXPECT_EQ(store.num_sessions(), 2u);
}

TEST_F(StoreTest, BudgetAdmissionCountsReservationsAndAllocatesNothingOnRefusal) {
  StoreOptions o;
  o.memory_budget_bytes = 1000;
  SessionStore store(o);
  auto a = store.Create(*model_, {}, 600);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(store.committed_bytes(), 600u);
  auto b = store.Create(*model_, {}, 600);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(b.status().message().find("600"), std::string_view::npos) << b.status();
  EXPECT_NE(b.status().message().find("1000"), std::string_view::npos) << b.status();
  EXPECT_EQ(store.num_sessions(), 1u);
  // Growing the running call's reservation beyond the budget is refused too.
  EXPECT_EQ(a->Reserve(1200).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(a->Reserve(900).ok());
  EXPECT_EQ(store.committed_bytes(), 900u);
  a->Return();  // reservation ends with the call; the session holds 0 bytes
  EXPECT_EQ(store.committed_bytes(), 0u);
  EXPECT_TRUE(store.Create(*model_, {}, 1000).ok());
}

// Imports in flight: counted against the budget as they grow, capped in
// number, given back when dropped, and moved to the session at Install with
// no double count and no gap.
// A draining node takes no session in: after CloseToNewSessions an import
// in flight is refused when it ends (nothing installed, its reservation left
// to its owner), no new one begins, and no session is created.
TEST_F(StoreTest, AClosedStoreTakesNoSessionIn) {
  SessionStore store({});
  auto kept = store.Create(*model_, {}, 0);
  ASSERT_TRUE(kept.ok());
  kept->Return();
  auto held = store.BeginImport();
  ASSERT_TRUE(held.ok());
  ASSERT_TRUE(held->Update(100).ok());
  store.CloseToNewSessions();
  auto made = Session::Create(SessionStore::RandomId(), *model_, {});
  ASSERT_TRUE(made.ok());
  const std::string id = (*made)->id();
  const auto refused = store.Install(*std::move(made), *held);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(refused.status().message().find("draining"), std::string_view::npos)
      << refused.status();
  EXPECT_FALSE(store.Get(id).has_value());
  EXPECT_EQ(held->bytes(), 100u);  // still the import's, until it is dropped
  EXPECT_EQ(store.import_bytes(), 100u);
  *held = SessionStore::ImportReservation();
  EXPECT_EQ(store.import_bytes(), 0u);
  EXPECT_EQ(store.num_imports(), 0u);
  EXPECT_EQ(store.BeginImport().status().code(), absl::StatusCode::kUnavailable);
  RequestPlan plan;
  for (const absl::Status& st :
       {store.Create(*model_, {}, 0).status(), store.Create(*model_, plan).status(),
        store.CreateMany(*model_, plan, 2).status(),
        store.CreateNamed(*model_, plan, SessionStore::RandomId()).status()}) {
    EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
    EXPECT_NE(st.message().find("draining"), std::string_view::npos) << st;
  }
  EXPECT_EQ(store.num_sessions(), 1u);  // the one made before; it stays
}

// Export snapshots share the budget with imports and sessions, under a cap
// of their own.
TEST_F(StoreTest, ExportReservationsAreBudgetedAndCappedApart) {
  StoreOptions o;
  o.memory_budget_bytes = 1000;
  o.max_imports = 1;
  o.max_exports = 1;
  SessionStore store(o);
  auto e = store.BeginExport();
  ASSERT_TRUE(e.ok());
  const absl::StatusOr<SessionStore::ImportReservation> e2 = store.BeginExport();
  EXPECT_EQ(e2.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(e2.status().message().find("--max-concurrent-exports 1"), std::string_view::npos)
      << e2.status();
  auto i = store.BeginImport();  // an import slot is still free
  ASSERT_TRUE(i.ok());
  EXPECT_TRUE(e->Update(700).ok());
  EXPECT_EQ(store.export_bytes(), 700u);
  EXPECT_EQ(store.import_bytes(), 0u);
  EXPECT_EQ(store.committed_bytes(), 700u);
  const absl::Status grown = i->Update(400);
  EXPECT_EQ(grown.code(), absl::StatusCode::kResourceExhausted) << grown;
  const absl::Status big = e->Update(1001);
  EXPECT_EQ(big.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(big.message().find("export: the session's snapshot would hold 1001 bytes"),
            std::string_view::npos)
      << big;
  EXPECT_EQ(store.export_bytes(), 700u);  // as it was
  EXPECT_TRUE(e->Update(100).ok());       // chunks sent
  EXPECT_TRUE(i->Update(400).ok());
  e->Release();
  EXPECT_EQ(store.export_bytes(), 0u);
  EXPECT_EQ(store.num_exports(), 0u);
  EXPECT_EQ(store.num_imports(), 1u);
  EXPECT_TRUE(store.BeginExport().ok());  // the slot is free again
}

TEST_F(StoreTest, ImportReservationsAreBudgetedCappedAndBecomeTheSessions) {
  StoreOptions o;
  o.memory_budget_bytes = 1000;
  o.max_imports = 2;
  SessionStore store(o);
  auto a = store.BeginImport();
  auto b = store.BeginImport();
  ASSERT_TRUE(a.ok() && b.ok());
  const absl::StatusOr<SessionStore::ImportReservation> c = store.BeginImport();
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(c.status().message().find("--max-concurrent-imports 2"), std::string_view::npos)
      << c.status();
  EXPECT_TRUE(a->Update(600).ok());
  EXPECT_EQ(store.import_bytes(), 600u);
  EXPECT_EQ(store.committed_bytes(), 600u);
  // A session's call cannot take what the imports hold...
  EXPECT_EQ(store.Create(*model_, {}, 500).status().code(), absl::StatusCode::kResourceExhausted);
  // ...nor can another import; the refused one keeps what it held.
  const absl::Status grown = b->Update(500);
  EXPECT_EQ(grown.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(grown.message().find("--memory-budget 1000"), std::string_view::npos) << grown;
  EXPECT_NE(grown.message().find("600"), std::string_view::npos) << grown;
  EXPECT_TRUE(b->Update(300).ok());
  EXPECT_TRUE(b->Update(100).ok());  // it may shrink
  EXPECT_EQ(store.import_bytes(), 700u);
  // Dropped: its bytes and its slot come back.
  *b = SessionStore::ImportReservation();
  EXPECT_EQ(store.import_bytes(), 600u);
  EXPECT_EQ(store.num_imports(), 1u);
  // Installed: the session is admitted as if a's 600 bytes were free, and
  // they become its lease's reservation in the same step.
  auto made = Session::Create(SessionStore::RandomId(), *model_, {});
  ASSERT_TRUE(made.ok());
  auto lease = store.Install(*std::move(made), *a);
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(a->bytes(), 0u);
  EXPECT_EQ(store.import_bytes(), 0u);
  EXPECT_EQ(store.num_imports(), 0u);
  EXPECT_EQ(store.committed_bytes(), 600u);
  lease->Return();
  EXPECT_EQ(store.committed_bytes(), 0u);
}

// A continuation: Peek (nothing changes) → plan → Acquire(id, plan), which
// leases and reserves the plan's bytes in one step, or changes nothing.
TEST_F(StoreTest, AcquireByPlanLeasesAndReservesInOneStep) {
  StoreOptions o;
  o.memory_budget_bytes = 1000;
  SessionStore store(o);
  EXPECT_EQ(store.Peek("0123").status().code(), absl::StatusCode::kNotFound);
  std::string id;
  {
    auto lease = store.Create(*model_, {}, 0);
    ASSERT_TRUE(lease.ok());
    id = (*lease)->id();
    (*lease)->AppendPrompt(std::vector<int32_t>{1, 2, 3});
    // Leased: Peek answers as Acquire would.
    absl::StatusOr<ExistingSession> busy = store.Peek(id);
    EXPECT_EQ(busy.status().code(), absl::StatusCode::kAborted);
    EXPECT_NE(busy.status().message().find("busy"), std::string_view::npos);
  }
  absl::StatusOr<ExistingSession> existing = store.Peek(id);
  ASSERT_TRUE(existing.ok()) << existing.status();
  EXPECT_EQ(existing->history, 3u);
  EXPECT_FALSE(store.Get(id)->busy);

  RequestPlan plan;
  plan.config = existing->config;
  plan.history = existing->history;
  plan.projected[MemoryKind::kKvF32] = 1200;  // over the budget
  auto refused = store.Acquire(id, plan);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(store.Get(id)->busy);
  EXPECT_EQ(store.committed_bytes(), 0u);

  plan.history = 2;  // another call ran since the plan was made
  plan.projected[MemoryKind::kKvF32] = 900;
  auto moved = store.Acquire(id, plan);
  EXPECT_EQ(moved.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(moved.status().message().find("busy"), std::string_view::npos);
  EXPECT_FALSE(store.Get(id)->busy);

  plan.history = 3;
  auto lease = store.Acquire(id, plan);
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(store.committed_bytes(), 900u);
  EXPECT_EQ(store.Acquire(id, plan).status().code(), absl::StatusCode::kAborted);
  lease->Return();
  EXPECT_EQ(store.committed_bytes(), 0u);
}

TEST_F(StoreTest, MemoryByKindSplitsExactlyAcrossModes) {
  SessionStore store({});
  SessionConfig int8;
  int8.kv_mode = kv::KvMode::kInt8;
  SessionConfig o1;
  o1.attention = AttentionMode::kO1;
  o1.o1.layers = {0, 1};
  o1.o1.m = 8;
  o1.o1.w = 16;
  o1.o1.sink = 2;
  size_t expect = 0;
  std::vector<std::string> ids;
  for (const SessionConfig& c : {SessionConfig{}, int8, o1}) {
    auto lease = store.Create(*model_, c, 0);
    ASSERT_TRUE(lease.ok()) << lease.status();
    Fill(*lease, 100);
    if (c.attention == AttentionMode::kO1) {
      ASSERT_GT(model_->SealO1(lease->sequence()), 0u);
      (*lease)->PublishMemory();
    }
    expect += (*lease)->kv().MemoryBytes();
    ids.push_back((*lease)->id());
  }
  const MemoryByKind m = store.MemoryByKindTotal();
  EXPECT_GT(m[MemoryKind::kKvF32], 0u);
  EXPECT_GT(m[MemoryKind::kKvInt8], 0u);
  EXPECT_GT(m[MemoryKind::kO1], 0u);
  EXPECT_EQ(m.total(), expect);
  for (const auto& id : ids) EXPECT_TRUE(store.Release(id).released);
  EXPECT_EQ(store.MemoryByKindTotal().total(), 0u);
}

TEST_F(StoreTest, ReleaseUnusedGivesBackTheTailAndReserveTakesItAgain) {
  for (kv::KvMode mode : {kv::KvMode::kF32, kv::KvMode::kInt8}) {
    SessionStore store({});
    SessionConfig c;
    c.kv_mode = mode;
    auto created = store.Create(*model_, c, 0);
    ASSERT_TRUE(created.ok()) << created.status();
    SessionStore::Lease& lease = *created;
    lease->ReservePositions(4000);
    ASSERT_NO_FATAL_FAILURE(Fill(lease, 45));
    const size_t reserved = lease->Memory().total();
    EXPECT_EQ(reserved, ProjectedSessionBytes(model_->config(), c, 4000, 45));
    lease->ReleaseUnusedPositions();
    // What 45 tokens need, plus at most a page either side of each head
    // block's rows (pages MADV_DONTNEED cannot split), per row buffer.
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t buffers = mode == kv::KvMode::kF32 ? 2 : 4;  // K, V (+ their scales)
    const size_t slack = 2 * page * buffers * model_->config().num_hidden_layers *
                         model_->config().num_key_value_heads;
    const size_t held = lease->Memory().total();
    EXPECT_LE(held, ProjectedSessionBytes(model_->config(), c, 45, 45) + slack);
    EXPECT_LT(held, reserved / 4);
    EXPECT_EQ(store.MemoryByKindTotal().total(), held);
    // The rows are intact: once Reserve commits the tail again, the session
    // decodes as one that never gave it back.
    model::SequenceKv twin = lease->kv().Copy();
    lease->ReservePositions(4000);
    EXPECT_EQ(lease->kv().MemoryBytes(), reserved);
    std::vector<float> a(model_->config().vocab_size), b(a.size());
    const std::vector<int32_t> next = {3};
    ASSERT_TRUE(model_->Prefill(next, lease.sequence(), scratch_, a.data()).ok());
    ASSERT_TRUE(model_->Prefill(next, twin, scratch_, b.data()).ok());
    EXPECT_EQ(a, b);
  }
}

TEST_F(StoreTest, ProjectionBoundsWhatTheCachesReserve) {
  for (kv::KvMode mode : {kv::KvMode::kF32, kv::KvMode::kInt8}) {
    SessionConfig c;
    c.kv_mode = mode;
    model::SequenceKv kv(model_->config(), mode);
    kv.Reserve(300);
    EXPECT_EQ(ProjectedSessionBytes(model_->config(), c, 300, 100), kv.MemoryBytes());
  }
}

// The tenant filter: another tenant's session answers exactly as an
// unknown id (same code, same message with the id in it), is released by
// nobody but its tenant or an unfiltered caller, and is never waited for.
TEST_F(StoreTest, ATenantSeesOnlyItsOwnSessions) {
  SessionStore store({.lease_wait = milliseconds(2000)});
  const TenantFilter alice = std::string("alice"), bob = std::string("bob");
  std::string a_id, b_id;
  {
    auto a = store.Create(*model_, {}, 0, "alice");
    ASSERT_TRUE(a.ok()) << a.status();
    Fill(*a, 5);
    a_id = (*a)->id();
    EXPECT_EQ((*a)->tenant(), "alice");
    auto b = store.Create(*model_, {}, 0, "bob");
    ASSERT_TRUE(b.ok()) << b.status();
    b_id = (*b)->id();
  }
  const std::string unknown = SessionStore::RandomId();
  // The message of `st` with `id` replaced: equal for a hidden and an unknown id.
  auto shape = [](const absl::Status& st, const std::string& id) {
    std::string m(st.message());
    const size_t at = m.find(id);
    EXPECT_NE(at, std::string::npos) << m;
    if (at != std::string::npos) m.replace(at, id.size(), "ID");
    return std::make_pair(st.code(), m);
  };
  const auto missing =
      shape(store.Acquire(unknown, Clock::time_point::max(), bob).status(), unknown);
  EXPECT_EQ(missing.first, absl::StatusCode::kNotFound);
  EXPECT_EQ(shape(store.Acquire(a_id, Clock::time_point::max(), bob).status(), a_id), missing);
  EXPECT_EQ(shape(store.Peek(a_id, Clock::time_point::max(), bob).status(), a_id), missing);
  EXPECT_FALSE(store.Get(a_id, bob).has_value());
  EXPECT_TRUE(store.Get(a_id, alice).has_value());
  EXPECT_EQ(store.Get(a_id, kAnyTenant)->tenant, "alice");

  // List: own sessions only; unfiltered: all.
  ASSERT_EQ(store.List(bob).size(), 1u);
  EXPECT_EQ(store.List(bob)[0].id, b_id);
  EXPECT_EQ(store.List(bob)[0].tenant, "bob");
  EXPECT_EQ(store.List().size(), 2u);

  // A leased session of another tenant: NOT_FOUND at once, not ABORTED after
  // the lease wait (a wait, or "busy", would say the id exists).
  {
    auto held = store.Acquire(a_id, Clock::time_point::max(), alice);
    ASSERT_TRUE(held.ok()) << held.status();
    held->ending().Mark();  // its owner would wait for this lease
    EXPECT_EQ(shape(store.Acquire(a_id, Clock::time_point::max(), bob).status(), a_id), missing);
    EXPECT_EQ(shape(store.Peek(a_id, Clock::time_point::max(), bob).status(), a_id), missing);
  }

  // Release by another tenant: as for an unknown id; the session stays.
  const ReleaseResult wrong = store.Release(a_id, ReleaseReason::kExplicit, bob);
  EXPECT_FALSE(wrong.released);
  EXPECT_EQ(wrong.freed_bytes, 0u);
  EXPECT_TRUE(store.Get(a_id).has_value());

  // Usage by tenant sums exactly to the totals.
  const auto usage = store.UsageByTenant();
  ASSERT_EQ(usage.size(), 2u);
  EXPECT_EQ(usage.at("alice").sessions + usage.at("bob").sessions, store.num_sessions());
  EXPECT_GT(usage.at("alice").memory_bytes, 0u);
  EXPECT_EQ(usage.at("alice").memory_bytes + usage.at("bob").memory_bytes,
            store.MemoryByKindTotal().total());

  const ReleaseResult own = store.Release(a_id, ReleaseReason::kExplicit, alice);
  EXPECT_TRUE(own.released);
  EXPECT_EQ(own.freed_bytes, usage.at("alice").memory_bytes);
  EXPECT_EQ(store.UsageByTenant().count("alice"), 0u);
}

}  // namespace
}  // namespace cortiq::session
