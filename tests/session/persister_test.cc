// --state-dir through the store and the engine: each kept session's file
// follows its calls; a release deletes it before returning; a restart
// restores every session at its last call; the idle TTL and the memory
// budget spill sessions (RAM freed, file kept) and the next call reads them
// back and continues exactly; --session-max-age releases for good; a failed
// write (the file size limit) leaves the call successful and the next
// record rewrites the file; a session whose file is behind its RAM is
// written before it spills; a read-back that cannot open the file now
// leaves it spilled.
#include "core/session/session_persister.h"

#include <signal.h>
#include <sys/resource.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>

#include "core/session/engine.h"
#include "core/session/session_store.h"
#include "core/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "tests/common/engine_test_util.h"
#include "tests/common/model_test_util.h"

namespace cortiq::session {
namespace {

namespace fs = std::filesystem;
constexpr uint64_t kFingerprint = 0x42;

class PersisterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(testing::LoadTempModel("tiny", &model_, &tok_));
    dir_ = fs::temp_directory_path() /
           ("cortiq-persister-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override {
    ref_engine_.reset();
    ref_store_.reset();
    engine_.reset();
    store_.reset();
    persister_.reset();
    fs::remove_all(dir_);
  }

  // A node: a persister on dir_, a store and an engine writing through it.
  void Start(StoreOptions so = {}, PersistSync sync = PersistSync::kTurn) {
    engine_.reset();
    store_.reset();
    persister_.reset();
    auto p = SessionPersister::Open(*model_, {.dir = dir_.string(), .sync = sync,
                                              .fingerprint = kFingerprint});
    ASSERT_TRUE(p.ok()) << p.status();
    persister_ = *std::move(p);
    so.persister = persister_.get();
    store_ = std::make_unique<SessionStore>(so);
    EngineOptions eo;
    eo.persister = persister_.get();
    engine_ = std::make_unique<Engine>(*model_, *tok_, eo);
  }

  static GenerationRequest Req(std::vector<int32_t> prompt, size_t n, bool sampled = false) {
    return testing::FixedRequest(std::move(prompt), n, sampled, /*seed=*/5);
  }

  // As the server runs a call: Peek (a spilled session is read back), plan,
  // Acquire with the plan (its bytes reserved against the budget), Submit.
  std::vector<int32_t> Run(Engine& engine, SessionStore& store, const std::string& id,
                           GenerationRequest r) {
    auto existing = store.Peek(id);
    EXPECT_TRUE(existing.ok()) << existing.status();
    if (!existing.ok()) return {};
    const PlanLimits limits{.max_tokens = 4096, .max_context = 4096, .max_n = 8};
    auto plan = PlanRequest(r, limits, model_->config(), *existing);
    EXPECT_TRUE(plan.ok()) << plan.status();
    if (!plan.ok()) return {};
    auto lease = store.Acquire(id, *plan);
    EXPECT_TRUE(lease.ok()) << lease.status();
    if (!lease.ok()) return {};
    auto job = engine.Submit(*std::move(lease), std::move(r), *plan);
    EXPECT_TRUE(job.ok()) << job.status();
    std::vector<int32_t> ids;
    GenerationEvent ev;
    while ((*job)->WaitPop(&ev)) ids.push_back(ev.token_id);
    EXPECT_TRUE((*job)->result().status.ok()) << (*job)->result().status;
    return ids;
  }
  // RestoreAll into store_, as the server does.
  SessionPersister::RestoreReport Restore() {
    return persister_->RestoreAll([&](std::unique_ptr<Session> s, const std::string& moving_to) {
      return store_->InstallRestored(std::move(s), moving_to);
    });
  }
  std::vector<int32_t> Run(const std::string& id, GenerationRequest r) {
    return Run(*engine_, *store_, id, std::move(r));
  }

  std::string NewSession(SessionStore& store, SessionConfig config = {}) {
    auto lease = store.Create(*model_, config, 0, "t1");
    EXPECT_TRUE(lease.ok()) << lease.status();
    return lease.ok() ? (*lease)->id() : "";
  }

  fs::path FileOf(const std::string& id) const { return dir_ / (id + ".cqsj"); }

  // A node whose idle TTL spills at once (ttl 0) and, beside it, the
  // reference: a store and an engine without a state dir. A session on
  // each (*id here, *ref there) has taken the same sampled call.
  void StartSpillingBesideAReference(std::string* id, std::string* ref) {
    StoreOptions so;
    so.ttl = std::chrono::milliseconds(0);
    ASSERT_NO_FATAL_FAILURE(Start(so));
    ref_store_ = std::make_unique<SessionStore>(StoreOptions{});
    ref_engine_ = std::make_unique<Engine>(*model_, *tok_, EngineOptions{});
    *id = NewSession(*store_);
    *ref = NewSession(*ref_store_);
    const auto p1 = testing::TestIds(30, 259, 1);
    Run(*id, Req(p1, 6, true));
    Run(*ref_engine_, *ref_store_, *ref, Req(p1, 6, true));
  }

  std::unique_ptr<model::Transformer> model_;
  std::unique_ptr<tokenizer::Tokenizer> tok_;
  fs::path dir_;
  std::unique_ptr<SessionPersister> persister_;
  std::unique_ptr<SessionStore> store_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<SessionStore> ref_store_;  // StartSpillingBesideAReference
  std::unique_ptr<Engine> ref_engine_;
};

// Files follow the calls; a release deletes the file before it returns; a
// new node on the same directory restores every session at its last call,
// and it continues exactly as the session that never stopped.
TEST_F(PersisterTest, FilesFollowTheCallsAndARestartRestoresEverySession) {
  ASSERT_NO_FATAL_FAILURE(Start());
  // The reference: the same calls on a node without a state dir.
  SessionStore ref_store({});
  Engine ref_engine(*model_, *tok_, {});
  std::vector<std::string> ids, refs;
  for (int i = 0; i < 4; ++i) {
    SessionConfig c;
    if (i == 1) c.kv_mode = kv::KvMode::kInt8;
    ids.push_back(NewSession(*store_, c));
    refs.push_back(NewSession(ref_store, c));
    for (int turn = 0; turn < 2; ++turn) {
      const auto prompt = testing::TestIds(12 + turn, 259, 3 * i + turn);
      EXPECT_EQ(Run(ids[i], Req(prompt, 5, i == 2)),
                Run(ref_engine, ref_store, refs[i], Req(prompt, 5, i == 2)));
    }
    EXPECT_TRUE(fs::exists(FileOf(ids[i])));
    EXPECT_EQ(store_->Get(ids[i])->disk_bytes, fs::file_size(FileOf(ids[i])));
  }
  EXPECT_EQ(persister_->stats().files, 4u);
  // A release is durable once it returns.
  EXPECT_TRUE(store_->Release(ids[3]).released);
  EXPECT_FALSE(fs::exists(FileOf(ids[3])));
  EXPECT_EQ(persister_->stats().files, 3u);

  // "Restart": a new persister, store and engine on the same directory.
  ASSERT_NO_FATAL_FAILURE(Start());
  auto report = Restore();
  EXPECT_EQ(report.restored, 3u);
  EXPECT_EQ(report.quarantined, 0u);
  EXPECT_EQ(store_->num_sessions(), 3u);
  EXPECT_FALSE(store_->Get(ids[3]).has_value());
  for (int i = 0; i < 3; ++i) {
    auto snap = store_->Get(ids[i]);
    ASSERT_TRUE(snap.has_value());
    EXPECT_EQ(snap->tenant, "t1");
    EXPECT_EQ(snap->tokens, ref_store.Get(refs[i])->tokens);
    const auto prompt = testing::TestIds(7, 259, 50 + i);
    const auto got = Run(ids[i], Req(prompt, 6, i == 2));
    EXPECT_EQ(got.size(), 6u);
    EXPECT_EQ(got, Run(ref_engine, ref_store, refs[i], Req(prompt, 6, i == 2)));
  }
}

// The record buffers the persister holds in RAM are counted (the
// cortiq_persist_buffer_bytes gauge): a record from Submit until it is
// written, then its buffer as a spare kept for the next record; a spare that
// Prepare hands out is its caller's until submitted.
TEST_F(PersisterTest, RecordBuffersHeldInRamAreCounted) {
  ASSERT_NO_FATAL_FAILURE(Start());
  EXPECT_EQ(persister_->stats().buffer_bytes, 0u);
  const std::string id = NewSession(*store_);
  Run(id, Req(testing::TestIds(12, 259, 1), 4));
  const SessionPersister::Stats first = persister_->stats();
  EXPECT_EQ(first.spare_buffers, 1u);
  EXPECT_GE(first.buffer_bytes, first.bytes);  // the whole file's record, kept
  EXPECT_LE(first.buffer_bytes, 2 * first.bytes + 64);

  auto existing = store_->Peek(id);
  ASSERT_TRUE(existing.ok());
  GenerationRequest r = Req(testing::TestIds(4, 259, 2), 1);
  auto plan = PlanRequest(r, {.max_tokens = 64, .max_context = 4096, .max_n = 1}, model_->config(),
                          *existing);
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto lease = store_->Acquire(id, *plan);
  ASSERT_TRUE(lease.ok()) << lease.status();
  auto held = persister_->Prepare(**lease);
  ASSERT_TRUE(held.has_value());
  EXPECT_EQ(persister_->stats().buffer_bytes, 0u);  // the spare went to this record
  EXPECT_EQ(persister_->stats().spare_buffers, 0u);
  const size_t c1 = held->record.bytes.capacity();
  // The writer thread stays in this record's callback until `go`.
  std::promise<void> in_callback, go;
  std::shared_future<void> go_f = go.get_future().share();
  persister_->Submit(*std::move(held), [&, go_f] {
    in_callback.set_value();
    go_f.wait();
  });
  in_callback.get_future().wait();
  EXPECT_EQ(persister_->stats().buffer_bytes, c1);  // written: a spare again
  auto queued = persister_->Prepare(**lease);
  ASSERT_TRUE(queued.has_value());
  const size_t c2 = queued->record.bytes.capacity();
  auto third = persister_->Prepare(**lease);  // no spare left: a buffer of its own
  ASSERT_TRUE(third.has_value());
  third->record.bytes.reserve(size_t{3} << 20);
  const size_t c3 = third->record.bytes.capacity();
  persister_->Submit(*std::move(queued), {});
  std::promise<void> written;
  persister_->Submit(*std::move(third), [&] { written.set_value(); });
  EXPECT_EQ(persister_->stats().buffer_bytes, c2 + c3);  // both wait behind the callback
  go.set_value();
  written.get_future().wait();
  const SessionPersister::Stats last = persister_->stats();
  EXPECT_EQ(last.spare_buffers, 2u);
  EXPECT_EQ(last.buffer_bytes, c2 + c3);
}

// The idle TTL spills a session whose file is current: its RAM is freed,
// it stays listed as spilled, and the next call reads it back and
// continues exactly. --session-max-age releases for good.
TEST_F(PersisterTest, TheTtlSpillsAndTheNextCallReadsBack) {
  std::string id, ref;
  ASSERT_NO_FATAL_FAILURE(StartSpillingBesideAReference(&id, &ref));
  ASSERT_GT(store_->MemoryByKindTotal().total(), 0u);
  EXPECT_EQ(store_->ReapIdle(), 1u);
  auto snap = store_->Get(id);
  ASSERT_TRUE(snap.has_value());
  EXPECT_TRUE(snap->spilled);
  EXPECT_EQ(snap->memory.total(), 0u);
  EXPECT_EQ(snap->tokens, 36u);
  EXPECT_EQ(snap->cached_tokens, 35u);
  EXPECT_GT(snap->disk_bytes, 0u);
  EXPECT_EQ(store_->MemoryByKindTotal().total(), 0u);
  EXPECT_EQ(store_->num_spilled(), 1u);
  EXPECT_EQ(store_->ReapIdle(), 0u) << "a spilled session is not spilled again";
  // A caller that must not read it back on its thread is refused, and
  // nothing changes.
  absl::StatusOr<ExistingSession> refused =
      store_->Peek(id, Clock::time_point::max(), kAnyTenant, ReadBack::kRefuse);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(IsSpilledRefusal(refused.status())) << refused.status();
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(IsSpilledRefusal(absl::UnavailableError("session is spilled to disk")));
  EXPECT_TRUE(IsSpilledRefusal(
      store_->Acquire(id, Clock::time_point::max(), kAnyTenant, ReadBack::kRefuse).status()));
  EXPECT_TRUE(store_->Get(id)->spilled);
  EXPECT_EQ(store_->unspills(), 0u);
  // The next call reads it back (the sampler's RNG too).
  const auto p2 = testing::TestIds(4, 259, 2);
  EXPECT_EQ(Run(id, Req(p2, 6, true)), Run(*ref_engine_, *ref_store_, ref, Req(p2, 6, true)));
  EXPECT_FALSE(store_->Get(id)->spilled);
  EXPECT_EQ(store_->unspills(), 1u);
  EXPECT_EQ(store_->Get(id)->memory.total(), ref_store_->Get(ref)->memory.total());

  // max_age: released for good, the file deleted.
  StoreOptions aged;
  aged.max_age = std::chrono::milliseconds(1);
  ASSERT_NO_FATAL_FAILURE(Start(aged));
  Restore();
  ASSERT_EQ(store_->num_sessions(), 1u);
  EXPECT_EQ(store_->ReapIdle(Clock::now() + std::chrono::seconds(1)), 1u);
  EXPECT_EQ(store_->num_sessions(), 0u);
  EXPECT_FALSE(fs::exists(FileOf(id)));
  EXPECT_EQ(store_->releases()[static_cast<size_t>(ReleaseReason::kMaxAge)], 1u);
}

// Three times more sessions than the memory budget holds: admission spills
// the least recently used idle ones instead of refusing, and every session
// continues exactly as on a node with no budget. A restart under the same
// budget installs the sessions that do not fit as spilled.
TEST_F(PersisterTest, TheMemoryBudgetSpillsInsteadOfRefusing) {
  // Measure one session's peak to size the budget to about 3 sessions.
  size_t one = 0;
  {
    SessionStore probe({});
    Engine e(*model_, *tok_, {});
    auto lease = probe.Create(*model_, SessionConfig{}, 0);
    ASSERT_TRUE(lease.ok());
    const std::string id = (*lease)->id();
    lease->Return();
    Run(e, probe, id, Req(testing::TestIds(40, 259, 9), 8));
    Run(e, probe, id, Req(testing::TestIds(6, 259, 10), 8));
    one = probe.Get(id)->memory.total();
  }
  ASSERT_GT(one, 0u);
  StoreOptions so;
  so.memory_budget_bytes = 4 * one;
  ASSERT_NO_FATAL_FAILURE(Start(so));
  SessionStore ref_store({});
  Engine ref_engine(*model_, *tok_, {});
  constexpr int kSessions = 9;
  std::vector<std::string> ids, refs;
  for (int i = 0; i < kSessions; ++i) {
    ids.push_back(NewSession(*store_));
    refs.push_back(NewSession(ref_store));
  }
  for (int turn = 0; turn < 3; ++turn) {
    for (int i = 0; i < kSessions; ++i) {
      SCOPED_TRACE(::testing::Message() << "turn " << turn << " session " << i);
      const auto prompt = testing::TestIds(turn == 0 ? 40 : 6, 259, 100 * turn + i);
      const auto got = Run(ids[i], Req(prompt, 8));
      EXPECT_EQ(got.size(), 8u);
      EXPECT_EQ(got, Run(ref_engine, ref_store, refs[i], Req(prompt, 8)));
      EXPECT_LE(store_->MemoryByKindTotal().total(), so.memory_budget_bytes);
    }
  }
  EXPECT_GT(store_->spills(), static_cast<uint64_t>(kSessions));
  EXPECT_GT(store_->unspills(), static_cast<uint64_t>(kSessions));
  EXPECT_GE(store_->num_spilled(), static_cast<size_t>(kSessions - 4));

  // A restart: what does not fit is installed spilled; all continue.
  ASSERT_NO_FATAL_FAILURE(Start(so));
  auto report = Restore();
  EXPECT_EQ(report.restored, static_cast<size_t>(kSessions));
  EXPECT_GE(store_->num_spilled(), static_cast<size_t>(kSessions - 4));
  for (int i = 0; i < kSessions; ++i) {
    const auto prompt = testing::TestIds(5, 259, 1000 + i);
    EXPECT_EQ(Run(ids[i], Req(prompt, 4)), Run(ref_engine, ref_store, refs[i], Req(prompt, 4)));
  }
}

// An import streaming in is admitted like any other session: with a state
// dir the least recently used idle sessions spill to make room for its bytes
// before it is refused (the persist soak found a drain's imports refused by
// peers whose budget idle sessions filled). Without room even then, it is
// refused and nothing changes.
TEST_F(PersisterTest, AnImportSpillsIdleSessionsBeforeItIsRefused) {
  size_t one = 0;
  {
    SessionStore probe({});
    Engine e(*model_, *tok_, {});
    const std::string id = NewSession(probe);
    Run(e, probe, id, Req(testing::TestIds(40, 259, 9), 8));
    one = probe.Get(id)->memory.total();
  }
  ASSERT_GT(one, 0u);
  StoreOptions so;
  so.memory_budget_bytes = 3 * one + one / 2;
  ASSERT_NO_FATAL_FAILURE(Start(so));
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    ids.push_back(NewSession(*store_));
    Run(ids.back(), Req(testing::TestIds(40, 259, 20 + i), 8));
  }
  ASSERT_EQ(store_->spills(), 0u);
  ASSERT_GT(store_->MemoryByKindTotal().total() + one, so.memory_budget_bytes);

  auto held = store_->BeginImport();
  ASSERT_TRUE(held.ok()) << held.status();
  // In two steps, as a stream's bytes arrive: the first fits, the second
  // needs the least recently used session's room.
  ASSERT_TRUE(held->Update(one / 4).ok());
  EXPECT_EQ(store_->spills(), 0u);
  absl::Status st = held->Update(one);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(store_->spills(), 1u);
  EXPECT_TRUE(store_->Get(ids[0])->spilled);
  EXPECT_FALSE(store_->Get(ids[1])->spilled);
  EXPECT_FALSE(store_->Get(ids[2])->spilled);
  EXPECT_LE(store_->MemoryByKindTotal().total() + held->bytes(), so.memory_budget_bytes);

  // More than the budget: every idle session spills first, then the import is
  // still refused, naming the budget, and keeps its reservation.
  st = held->Update(4 * one);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_NE(st.message().find("--memory-budget"), std::string::npos) << st;
  EXPECT_EQ(held->bytes(), one);
  held->Release();
  // Every session reads back and continues.
  for (const std::string& id : ids) {
    EXPECT_EQ(Run(id, Req(testing::TestIds(4, 259, 7), 4)).size(), 4u);
  }
}

// Disk full (here the process's file size limit): the call succeeds, the
// failure is counted, the file keeps its last whole record, and the next
// record, once writes work again, rewrites the file whole.
TEST_F(PersisterTest, AFailedWriteKeepsTheCallAndTheNextRecordRewrites) {
  ASSERT_NO_FATAL_FAILURE(Start());
  const std::string id = NewSession(*store_);
  Run(id, Req(testing::TestIds(20, 259, 1), 4));
  const uint64_t size = fs::file_size(FileOf(id));
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  rlimit small = old;
  small.rlim_cur = size + 100;  // the next turn's record does not fit
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  const auto got = Run(id, Req(testing::TestIds(30, 259, 2), 4));
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old), 0);
  ::signal(SIGXFSZ, old_handler);
  EXPECT_EQ(got.size(), 4u) << "the call succeeded";
  EXPECT_EQ(persister_->stats().failures, 1u);
  EXPECT_EQ(fs::file_size(FileOf(id)), size) << "the partial record was cut off";
  EXPECT_FALSE(persister_->IsCurrent(*store_->Acquire(id).value()));
  // Writes work again: the next record is the whole file.
  const uint64_t rewrites = persister_->stats().rewrites;
  Run(id, Req(testing::TestIds(3, 259, 3), 4));
  EXPECT_EQ(persister_->stats().rewrites, rewrites + 1);
  auto lease = store_->Acquire(id);
  ASSERT_TRUE(lease.ok());
  EXPECT_TRUE(persister_->IsCurrent(**lease));
  lease->Return();
  // And it restores at that call.
  const size_t tokens = store_->Get(id)->tokens;
  ASSERT_NO_FATAL_FAILURE(Start());
  Restore();
  EXPECT_EQ(store_->Get(id)->tokens, tokens);
}

// A session whose RAM is ahead of its file (here a prompt appended with no
// record, as a call no record describes leaves it) is not spilled as if
// its file held it: the TTL writes the file up to date first, and the
// read-back continues exactly as the session that stayed in RAM. A file
// that cannot be brought up to date (the file size limit) is released, as
// without a state dir, never spilled behind.
TEST_F(PersisterTest, TheTtlWritesAFileBehindItsSessionBeforeItSpills) {
  std::string id, ref;
  ASSERT_NO_FATAL_FAILURE(StartSpillingBesideAReference(&id, &ref));
  const auto absorbed = testing::TestIds(9, 259, 2);
  for (SessionStore* store : {store_.get(), ref_store_.get()}) {
    auto lease = store->Acquire(store == ref_store_.get() ? ref : id);
    ASSERT_TRUE(lease.ok()) << lease.status();
    (*lease)->AppendPrompt(absorbed);
  }
  {
    auto lease = store_->Acquire(id);
    ASSERT_TRUE(lease.ok());
    EXPECT_FALSE(persister_->IsCurrent(**lease)) << "36 tokens in the file, 45 in RAM";
  }
  const uint64_t records = persister_->stats().records;
  EXPECT_EQ(store_->ReapIdle(), 1u);
  EXPECT_TRUE(store_->Get(id)->spilled);
  EXPECT_EQ(persister_->stats().records, records + 1) << "the file was written before the spill";
  const auto p2 = testing::TestIds(4, 259, 3);
  EXPECT_EQ(Run(id, Req(p2, 5, true)), Run(*ref_engine_, *ref_store_, ref, Req(p2, 5, true)));
  EXPECT_EQ(store_->Get(id)->tokens, ref_store_->Get(ref)->tokens);
  EXPECT_EQ(store_->unspills(), 1u);

  // Behind again, and the file cannot grow: released (ttl), file deleted.
  {
    auto lease = store_->Acquire(id);
    ASSERT_TRUE(lease.ok());
    (*lease)->AppendPrompt(absorbed);
  }
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  rlimit small = old;
  small.rlim_cur = fs::file_size(FileOf(id));
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  const size_t reaped = store_->ReapIdle();
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old), 0);
  ::signal(SIGXFSZ, old_handler);
  EXPECT_EQ(reaped, 1u);
  EXPECT_FALSE(store_->Get(id).has_value());
  EXPECT_EQ(store_->releases()[static_cast<size_t>(ReleaseReason::kTtl)], 1u);
  EXPECT_FALSE(fs::exists(FileOf(id)));
}

// A call that ends past its deadline ends between steps: its state (here
// its prompt, taken into the history before the deadline was seen) is
// written like a completed call's, and a restart restores it.
TEST_F(PersisterTest, ACallPastItsDeadlineIsWritten) {
  ASSERT_NO_FATAL_FAILURE(Start());
  const std::string id = NewSession(*store_);
  Run(id, Req(testing::TestIds(20, 259, 1), 4));
  // A deadline that passes during the call (one past before it began is
  // not admitted: the session stays as it was).
  GenerationRequest late = Req(testing::TestIds(9, 259, 2), 4000);
  late.deadline = Clock::now() + std::chrono::milliseconds(60);
  {
    auto lease = store_->Acquire(id);
    ASSERT_TRUE(lease.ok()) << lease.status();
    auto job = engine_->Submit(*std::move(lease), std::move(late));
    ASSERT_TRUE(job.ok()) << job.status();
    const testing::JobOutput out = testing::DrainJob(**job);
    EXPECT_TRUE(absl::IsDeadlineExceeded(out.result.status)) << out.result.status;
  }
  size_t tokens = 0;
  {
    auto lease = store_->Acquire(id);
    ASSERT_TRUE(lease.ok());
    tokens = (*lease)->tokens().size();
    EXPECT_GE(tokens, 24u + 9u);
    EXPECT_LT(tokens, 24u + 9u + 4000u);
    EXPECT_TRUE(persister_->IsCurrent(**lease));
  }
  EXPECT_EQ(persister_->stats().unpersisted, 0u);
  ASSERT_NO_FATAL_FAILURE(Start());
  EXPECT_EQ(Restore().restored, 1u);
  auto lease = store_->Acquire(id);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ((*lease)->tokens().size(), tokens);
}

// A read-back that cannot open the file now (out of descriptors: EMFILE)
// is UNAVAILABLE: the session stays spilled, its file where it was, and
// the retry reads it back and continues exactly.
TEST_F(PersisterTest, AReadBackThatCannotOpenTheFileLeavesTheSessionSpilled) {
  std::string id, ref;
  ASSERT_NO_FATAL_FAILURE(StartSpillingBesideAReference(&id, &ref));
  ASSERT_EQ(store_->ReapIdle(), 1u);
  ASSERT_TRUE(store_->Get(id)->spilled);
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &old), 0);
  persister_->set_load_hook([&](const std::string&) {
    rlimit none = old;
    none.rlim_cur = 0;  // the read-back's open fails with EMFILE
    ::setrlimit(RLIMIT_NOFILE, &none);
  });
  absl::StatusOr<SessionStore::Lease> failed = store_->Acquire(id);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &old), 0);
  persister_->set_load_hook({});
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable) << failed.status();
  EXPECT_TRUE(store_->Get(id)->spilled);
  EXPECT_TRUE(fs::exists(FileOf(id)));
  EXPECT_EQ(store_->releases()[static_cast<size_t>(ReleaseReason::kLost)], 0u);
  const auto p2 = testing::TestIds(4, 259, 2);
  EXPECT_EQ(Run(id, Req(p2, 6, true)), Run(*ref_engine_, *ref_store_, ref, Req(p2, 6, true)));
  EXPECT_EQ(store_->unspills(), 1u);
}

// A record prepared as an append before an earlier append failed (the
// engine prepares call N+1 while call N is still being written) is not
// appended after the cut: it continues N's state, which the file does not
// hold. It counts as failed; the file keeps its last whole turn and
// restores; the next record rewrites it.
TEST_F(PersisterTest, ARecordPreparedBeforeAFailedAppendIsNotAppended) {
  ASSERT_NO_FATAL_FAILURE(Start());
  const std::string id = NewSession(*store_);
  Run(id, Req(testing::TestIds(20, 259, 1), 4));
  const uint64_t size = fs::file_size(FileOf(id));
  auto lease = store_->Acquire(id);
  ASSERT_TRUE(lease.ok());
  Session& s = **lease;
  const size_t file_tokens = s.tokens().size();
  s.AppendPrompt(testing::TestIds(5, 259, 2));
  auto n = persister_->Prepare(s);
  s.AppendPrompt(testing::TestIds(6, 259, 3));
  auto n1 = persister_->Prepare(s);
  ASSERT_TRUE(n && n1);
  EXPECT_FALSE(n->record.rewrite);
  EXPECT_FALSE(n1->record.rewrite);
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  rlimit small = old;
  small.rlim_cur = size;  // N's append fails (EFBIG)
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::promise<void> written;
  // N's callback runs on the writer thread before N+1 is written: N+1's
  // append would fit.
  persister_->Submit(*std::move(n), [&] { ::setrlimit(RLIMIT_FSIZE, &old); });
  persister_->Submit(*std::move(n1), [&] { written.set_value(); });
  written.get_future().wait();
  ::signal(SIGXFSZ, old_handler);
  EXPECT_EQ(persister_->stats().failures, 2u);
  EXPECT_EQ(fs::file_size(FileOf(id)), size) << "N+1 was appended after the cut";
  EXPECT_FALSE(persister_->IsCurrent(s));
  {  // The file holds the first call, whole.
    std::ifstream f(FileOf(id), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    auto back = RestoreJournal(bytes, *model_, kFingerprint);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->session->tokens().size(), file_tokens);
  }
  // The next record rewrites it whole, and it restores the session as it is.
  auto whole = persister_->Prepare(s);
  ASSERT_TRUE(whole);
  EXPECT_TRUE(whole->record.rewrite);
  std::promise<void> rewritten;
  persister_->Submit(*std::move(whole), [&] { rewritten.set_value(); });
  rewritten.get_future().wait();
  EXPECT_TRUE(persister_->IsCurrent(s));
  const size_t tokens = s.tokens().size();
  EXPECT_EQ(tokens, file_tokens + 11);
  lease->Return();
  ASSERT_NO_FATAL_FAILURE(Start());
  auto report = Restore();
  EXPECT_EQ(report.quarantined, 0u);
  EXPECT_EQ(store_->Get(id)->tokens, tokens);
}

// A torn last record that RestoreAll cannot cut off (truncate fails) stays
// in the file: the session's next record rewrites the file whole instead of
// appending after the torn bytes, and the file restores.
TEST_F(PersisterTest, ATornTailThatCannotBeCutOffMakesTheNextRecordARewrite) {
  ASSERT_NO_FATAL_FAILURE(Start());
  const std::string id = NewSession(*store_);
  Run(id, Req(testing::TestIds(20, 259, 1), 4));
  Run(id, Req(testing::TestIds(5, 259, 2), 4));
  const uint64_t size = fs::file_size(FileOf(id));
  engine_.reset();
  store_.reset();
  persister_.reset();
  std::ofstream(FileOf(id), std::ios::app | std::ios::binary) << "torn!!!";  // < a frame
  ASSERT_NO_FATAL_FAILURE(Start());
  auto* cut = internal::truncate_file.exchange(+[](const char*, off_t) {
    errno = EIO;
    return -1;
  });
  auto report = Restore();
  internal::truncate_file = cut;
  EXPECT_EQ(report.restored, 1u);
  EXPECT_EQ(report.torn, 1u);
  EXPECT_EQ(fs::file_size(FileOf(id)), size + 7);
  EXPECT_EQ(persister_->FileBytes(id), size + 7);
  {
    auto lease = store_->Acquire(id);
    ASSERT_TRUE(lease.ok());
    EXPECT_FALSE(persister_->IsCurrent(**lease));
  }
  Run(id, Req(testing::TestIds(3, 259, 3), 4));
  EXPECT_EQ(persister_->stats().rewrites, 1u);
  const size_t tokens = store_->Get(id)->tokens;
  ASSERT_NO_FATAL_FAILURE(Start());
  report = Restore();
  EXPECT_EQ(report.quarantined, 0u);
  EXPECT_EQ(report.torn, 0u);
  ASSERT_TRUE(store_->Get(id).has_value());
  EXPECT_EQ(store_->Get(id)->tokens, tokens);
}

// A corrupt file is quarantined; the others load.
TEST_F(PersisterTest, ACorruptFileIsQuarantinedAndTheOthersLoad) {
  ASSERT_NO_FATAL_FAILURE(Start());
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    ids.push_back(NewSession(*store_));
    Run(ids[i], Req(testing::TestIds(10, 259, i), 3));
    Run(ids[i], Req(testing::TestIds(3, 259, 10 + i), 3));
  }
  engine_.reset();
  store_.reset();
  persister_.reset();
  {  // a byte flipped in the first (session) record: records follow it
    std::fstream f(FileOf(ids[1]), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(30);
    char c;
    f.read(&c, 1);
    c ^= 0x10;
    f.seekp(30);
    f.write(&c, 1);
  }
  std::ofstream(dir_ / "notes.cqsj") << "not a session";
  ASSERT_NO_FATAL_FAILURE(Start());
  auto report = Restore();
  EXPECT_EQ(report.restored, 2u);
  EXPECT_EQ(report.quarantined, 2u);
  EXPECT_TRUE(fs::exists(dir_ / "quarantine" / (ids[1] + ".cqsj")));
  EXPECT_TRUE(fs::exists(dir_ / "quarantine" / "notes.cqsj"));
  EXPECT_FALSE(store_->Get(ids[1]).has_value());
  EXPECT_TRUE(store_->Get(ids[0]).has_value());
  EXPECT_TRUE(store_->Get(ids[2]).has_value());
}

// A read of a session file that ended with the process (a crash while
// reading it: a SIGBUS from an I/O error under the mapping) leaves its
// mark, DIR/<id>.reading, behind. The next start reads the file again; after
// two such reads in a row it quarantines the file unread, so one bad file
// does not keep the node in a crash loop. A read that ends (restore or read
// back, whatever its outcome) leaves no mark; a mark without a file goes.
TEST_F(PersisterTest, AFileWhoseReadsCrashedTwiceIsQuarantinedUnread) {
  ASSERT_NO_FATAL_FAILURE(Start());
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    ids.push_back(NewSession(*store_));
    Run(ids[i], Req(testing::TestIds(10, 259, i), 3));
  }
  engine_.reset();
  store_.reset();
  persister_.reset();
  auto mark = [&](const std::string& id) { return dir_ / (id + ".reading"); };
  std::ofstream(mark(ids[0])) << "1";                              // one read crashed: read again
  std::ofstream(mark(ids[1])) << "2";                              // two in a row: quarantined
  std::ofstream(mark("0123456789abcdef0123456789abcdef")) << "1";  // no such file
  StoreOptions spill_at_once;
  spill_at_once.ttl = std::chrono::milliseconds(0);
  ASSERT_NO_FATAL_FAILURE(Start(spill_at_once));
  auto report = Restore();
  EXPECT_EQ(report.restored, 2u);
  EXPECT_EQ(report.quarantined, 1u);
  EXPECT_TRUE(store_->Get(ids[0]).has_value());
  EXPECT_FALSE(store_->Get(ids[1]).has_value());
  EXPECT_TRUE(fs::exists(dir_ / "quarantine" / (ids[1] + ".cqsj")));
  EXPECT_TRUE(store_->Get(ids[2]).has_value());
  for (const auto& e : fs::directory_iterator(dir_)) {
    EXPECT_NE(e.path().extension(), ".reading") << e.path();
  }
  // A read back (a spilled session's next call) leaves no mark either.
  store_->ReapIdle();
  ASSERT_TRUE(store_->Get(ids[2])->spilled);
  EXPECT_EQ(Run(ids[2], Req(testing::TestIds(3, 259, 7), 2)).size(), 2u);
  EXPECT_EQ(persister_->stats().files, 2u);
  EXPECT_FALSE(fs::exists(mark(ids[2])));
}

// A move to a peer cut by a crash (its mark left on disk): the restart
// holds the session in doubt (spilled, listed, every call UNAVAILABLE)
// until the peers answer. A peer that holds it: released here, its file
// deleted. None: it stays, and continues exactly where it was. A mark whose
// session file is gone (the move completed) is deleted; a move that ended
// (ClearMoving) leaves no mark.
TEST_F(PersisterTest, AMoveCutByACrashIsHeldInDoubtUntilSettled) {
  ASSERT_NO_FATAL_FAILURE(Start());
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    ids.push_back(NewSession(*store_));
    Run(ids[i], Req(testing::TestIds(10, 259, i), 3));
  }
  ASSERT_TRUE(persister_->MarkMoving(ids[0], "10.0.0.7:50051").ok());
  ASSERT_TRUE(persister_->MarkMoving(ids[1], "10.0.0.7:50051").ok());
  ASSERT_TRUE(persister_->MarkMoving("0123456789abcdef0123456789abcdef", "10.0.0.7:50051").ok());
  ASSERT_TRUE(persister_->MarkMoving(ids[2], "10.0.0.8:50051").ok());
  persister_->ClearMoving(ids[2]);  // a move that ended: no mark
  EXPECT_FALSE(fs::exists(dir_ / (ids[2] + ".moving")));
  const size_t tokens1 = store_->Get(ids[1])->tokens;
  engine_.reset();
  store_.reset();
  persister_.reset();

  ASSERT_NO_FATAL_FAILURE(Start());
  const auto report = Restore();
  EXPECT_EQ(report.restored, 3u);
  EXPECT_EQ(report.in_doubt, 2u);
  // The mark of a session with no file: the move had completed.
  EXPECT_FALSE(fs::exists(dir_ / "0123456789abcdef0123456789abcdef.moving"));
  const auto doubt = store_->InDoubt();
  ASSERT_EQ(doubt.size(), 2u);
  EXPECT_EQ(doubt[0].second, "10.0.0.7:50051");
  for (int i : {0, 1}) {
    auto snap = store_->Get(ids[i]);
    ASSERT_TRUE(snap.has_value());
    EXPECT_TRUE(snap->spilled);
    EXPECT_EQ(snap->moving_to, "10.0.0.7:50051");
    EXPECT_EQ(snap->memory.total(), 0u);
    auto peek = store_->Peek(ids[i]);
    EXPECT_EQ(peek.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_NE(peek.status().message().find("10.0.0.7:50051"), std::string::npos);
    EXPECT_EQ(store_->Acquire(ids[i]).status().code(), absl::StatusCode::kUnavailable);
  }
  EXPECT_TRUE(store_->Get(ids[2])->moving_to.empty());
  EXPECT_TRUE(store_->Peek(ids[2]).ok());

  // ids[0]: a peer holds it.
  store_->SettleMove(ids[0], std::string("10.0.0.7:50051"));
  EXPECT_FALSE(store_->Get(ids[0]).has_value());
  EXPECT_FALSE(fs::exists(FileOf(ids[0])));
  // ids[1]: no peer does; it stays and runs on.
  store_->SettleMove(ids[1], std::nullopt);
  ASSERT_TRUE(store_->Get(ids[1]).has_value());
  EXPECT_TRUE(store_->Get(ids[1])->moving_to.empty());
  EXPECT_TRUE(fs::exists(FileOf(ids[1])));
  EXPECT_EQ(store_->Get(ids[1])->tokens, tokens1);
  Run(ids[1], Req(testing::TestIds(3, 259, 40), 3));
  EXPECT_GT(store_->Get(ids[1])->tokens, tokens1);
  EXPECT_TRUE(store_->InDoubt().empty());
  // Settled, the marks are gone (a release deletes it with the file).
  for (int i : {0, 1}) EXPECT_FALSE(fs::exists(dir_ / (ids[i] + ".moving")));
}

}  // namespace
}  // namespace cortiq::session
