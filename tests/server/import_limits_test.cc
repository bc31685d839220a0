// ImportSession under attack (issue 17, requirement 1): streams that send
// all of a real session's stream but its last bytes and then stall. Each
// holds what it received, counted against --memory-budget and shown by the
// import gauge (SessionStore::import_bytes(), what cortiq_import_bytes_in_
// flight reads); --max-concurrent-imports refuses the next one; the budget
// refuses imports and Generate calls while they fill it; a quiet stream ends
// with DEADLINE_EXCEEDED after --import-idle-timeout; afterwards the gauge
// is 0 and the process's resident memory is back near its baseline.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/util/page_pool.h"
#include "cortiq/v1/inference.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "tests/common/model_test_util.h"
#include "tests/common/rss.h"
#include "tests/common/server_test_util.h"

namespace cortiq::server {
namespace {

using std::chrono::milliseconds;
namespace v1 = ::cortiq::v1;
using Node = testing::TestNode;

constexpr milliseconds kIdleTimeout{1500};

constexpr size_t kWithheld = 40;  // the stream's last bytes, never sent

Node StartNode(const std::string& model, size_t budget, size_t max_imports) {
  ServerConfig c;
  c.model_dir = model;
  c.grace = milliseconds(0);
  c.memory_budget_bytes = budget;
  c.max_concurrent_imports = max_imports;
  c.import_idle_timeout = kIdleTimeout;
  return testing::StartTestNode(c);
}

v1::GenerateRequest Prompt(size_t chars, size_t max_tokens, bool keep) {
  v1::GenerateRequest r;
  r.set_prompt(std::string(chars, 'a') + " Call me Ishmael.");
  r.set_max_tokens(max_tokens);
  r.set_ignore_eos(true);
  r.set_keep_session(keep);
  return r;
}

// A real session's exported stream (made on a node of its own, then
// released there).
std::string ExportedSession(const std::string& model, size_t prompt_chars) {
  Node src = StartNode(model, 0, 4);
  testing::StreamOut o = testing::RunGenerate(*src.stub, Prompt(prompt_chars, 20, true));
  EXPECT_TRUE(o.status.ok()) << o.status.error_message();
  testing::Exported e = testing::ExportWire(*src.stub, o.session);
  EXPECT_TRUE(e.status.ok()) << e.status.error_message();
  return std::move(e.wire);
}

// One stalled import: sends all of `wire` but its last kWithheld bytes (or
// only its first `prefix` bytes), never half-closes, and waits for the
// server to end the call.
class StalledImport {
 public:
  StalledImport(Node& n, const std::string& wire, size_t prefix = SIZE_MAX) {
    thread_ = std::thread([this, &n, &wire, prefix] {
      v1::ImportSessionResponse resp;
      auto writer = n.stub->ImportSession(&ctx_, &resp);
      const std::string_view sent(wire.data(), std::min(prefix, wire.size() - kWithheld));
      v1::WireChunk chunk;
      for (size_t off = 0; off < sent.size(); off += 256 << 10) {
        chunk.set_data(std::string(sent.substr(off, 256 << 10)));
        if (!writer->Write(chunk)) break;
      }
      status_ = writer->Finish();
    });
  }
  ~StalledImport() { Join(); }
  grpc::Status Join() {
    if (thread_.joinable()) thread_.join();
    return status_;
  }

 private:
  grpc::ClientContext ctx_;
  grpc::Status status_;
  std::thread thread_;
};

grpc::Status ImportWhole(Node& n, const std::string& wire) {
  grpc::ClientContext ctx;
  v1::ImportSessionResponse resp;
  auto writer = n.stub->ImportSession(&ctx, &resp);
  v1::WireChunk chunk;
  for (size_t off = 0; off < wire.size(); off += 256 << 10) {
    chunk.set_data(wire.substr(off, 256 << 10));
    if (!writer->Write(chunk)) break;
  }
  writer->WritesDone();
  return writer->Finish();
}

// Waits (up to 10 s) until `pred` holds.
template <typename Pred>
bool WaitFor(Pred pred) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(milliseconds(5));
  }
  return true;
}

class ImportLimitsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = new std::string(testing::TempModel("tiny"));
    wire_ = new std::string(ExportedSession(*model_, 1500));
    // 4017 positions: 2.1 MB, a stalled stream of it holds 2.3 MB.
    long_wire_ = new std::string(ExportedSession(*model_, 4000));
  }
  static void TearDownTestSuite() {
    delete wire_;
    delete long_wire_;
    delete model_;
  }
  static std::string* model_;
  static std::string* wire_;
  static std::string* long_wire_;
};
std::string* ImportLimitsTest::model_ = nullptr;
std::string* ImportLimitsTest::wire_ = nullptr;
std::string* ImportLimitsTest::long_wire_ = nullptr;

// The client has its status a moment before the reactor's OnDone frees
// what the stream held: wait for that.
bool WaitForNoImport(Node& n) {
  return WaitFor([&] { return n.server->store().num_imports() == 0; }) &&
         n.server->store().import_bytes() == 0;
}

// The bytes one complete-but-unfinished stream holds, measured on a node of
// its own: the gauge once the stream's bytes are all in.
size_t HeldPerStream(const std::string& model, const std::string& wire) {
  Node n = StartNode(model, 0, 1);
  StalledImport s(n, wire);
  size_t held = 0;
  // The sink holds every layer once the bytes are in; the gauge then stays put.
  EXPECT_TRUE(WaitFor([&] {
    const size_t now = n.server->store().import_bytes();
    const bool settled = now > wire.size() / 2 && now == held;
    held = now;
    if (!settled) std::this_thread::sleep_for(milliseconds(50));
    return settled;
  }));
  EXPECT_EQ(s.Join().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_TRUE(WaitForNoImport(n));
  return held;
}

TEST_F(ImportLimitsTest, StalledStreamsAreCountedCappedTimedOutAndFreed) {
  const std::string& wire = *long_wire_;
  const size_t held = HeldPerStream(*model_, wire);
  // What a stream holds is at least what it sent (every row is in the new
  // session's caches), and not much more (the session's bookkeeping, the
  // last message's slices).
  ASSERT_GE(held, wire.size() - kWithheld - (64 << 10));
  ASSERT_LE(held, 2 * wire.size());

  constexpr size_t kCap = 16;
  Node n = StartNode(*model_, 0, kCap);
  // `count` stalled streams at once; with a `prefix`, each sends only that
  // many bytes (the connection, threads and calls of an attack, not its rows).
  auto attack = [&](size_t count, bool check, size_t prefix = SIZE_MAX) {
    std::vector<std::unique_ptr<StalledImport>> streams;
    for (size_t i = 0; i < count; ++i)
      streams.push_back(std::make_unique<StalledImport>(n, wire, prefix));
    if (prefix == SIZE_MAX) {
      ASSERT_TRUE(WaitFor([&] { return n.server->store().import_bytes() == count * held; }))
          << n.server->store().import_bytes() << " bytes held, want " << count * held;
    } else {
      ASSERT_TRUE(WaitFor([&] { return n.server->store().num_imports() == count; }));
    }
    if (check) {
      // The gauge is what they hold, and the budget counts it.
      EXPECT_EQ(n.server->store().num_imports(), kCap);
      EXPECT_EQ(n.server->store().committed_bytes(), kCap * held);
      // One more is refused, naming the flag.
      StalledImport extra(n, wire);
      const grpc::Status st = extra.Join();
      EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
      EXPECT_NE(st.error_message().find("--max-concurrent-imports"), std::string::npos)
          << st.error_message();
    }
    for (auto& s : streams) {
      const grpc::Status st = s->Join();
      EXPECT_EQ(st.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << st.error_message();
      EXPECT_NE(st.error_message().find("--import-idle-timeout"), std::string::npos);
    }
    EXPECT_TRUE(WaitForNoImport(n));
    EXPECT_EQ(n.server->store().num_sessions(), 0u);
  };
  // Warm up before the baseline: one whole stream (the allocator's arenas,
  // gRPC's buffers: what any first import costs), then kCap streams of a few
  // bytes each (the threads, stacks and calls kCap concurrent streams start
  // on both sides of this one process; a fresh-clone CI run once counted
  // 3.6 MB of them against the attack). Warming with the whole attack would
  // hide what it leaves (its freed-but-resident bytes would be in the
  // baseline).
  attack(1, false);
  attack(kCap, false, 64);
  const size_t baseline = testing::RssBytes();
  attack(kCap, true);
  if (!testing::kRssIsMeaningful) return;
  // The server's reaper trims the allocator within about a second of the
  // last failed import (Server::TrimFreedMemory). What may stay is a quarter
  // of what the attack held (37 MB here): the issue measured 682 MB left of
  // a 100-stream attack before the trim, nearly all of it. With the trim,
  // 0.8-5.6 MB stayed (2026-12-07, the test run beside others on 2 cores:
  // the threads gRPC starts under load keep arenas and stacks), so an
  // eighth (4.7 MB) failed now and then.
  // The attack's large buffers (its layers' rows) went back to the page
  // pool (--page-pool, default 256 MiB), which keeps them resident for the
  // next sessions, shows them in cortiq_page_pool_bytes and hands them back
  // when idle: allowed on top, then handed back here, after which the
  // quarter alone must hold.
  util::PagePool& pool = util::PagePool::Global();
  const size_t allowed = kCap * held / 4;
  size_t after = 0, pooled = 0;
  EXPECT_TRUE(WaitFor([&] {
    pooled = pool.held_bytes();
    return (after = testing::RssBytes()) <= baseline + allowed + pooled;
  })) << "resident " << after << " bytes after the attack, " << baseline << " before, " << allowed
      << " allowed, " << pooled << " in the page pool";
  EXPECT_LE(pooled, pool.capacity());
  pool.ReleaseAll();
  EXPECT_TRUE(WaitFor([&] { return (after = testing::RssBytes()) <= baseline + allowed; }))
      << "resident " << after << " bytes after the attack and the pool's release, " << baseline
      << " before, " << allowed << " allowed";
  std::printf("RSS: %zu bytes before the attack, %zu after (%zu streams holding %zu bytes each)\n",
              baseline, after, kCap, held);
}

TEST_F(ImportLimitsTest, BudgetRefusesImportsAndGenerateWhileStreamsHoldIt) {
  const size_t held = HeldPerStream(*model_, *wire_);
  // Room for two stalled streams, not three. A stream holds a little more
  // while a message is in (its slices, up to 256 KiB here) than once it
  // stalls, so the room left for the third is most of one stream.
  const size_t budget = 3 * held - held / 8;
  Node n = StartNode(*model_, budget, 8);
  StalledImport a(n, *wire_), b(n, *wire_);
  ASSERT_TRUE(WaitFor([&] { return n.server->store().import_bytes() == 2 * held; }))
      << n.server->store().import_bytes() << " held, want " << 2 * held;
  // A third import is refused once it would pass the budget, and holds nothing after.
  StalledImport c(n, *wire_);
  const grpc::Status st = c.Join();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(st.error_message().find("--memory-budget"), std::string::npos) << st.error_message();
  EXPECT_TRUE(WaitFor([&] { return n.server->store().num_imports() == 2; }));
  EXPECT_EQ(n.server->store().import_bytes(), 2 * held);
  // A Generate that projects more than is left is refused too.
  testing::StreamOut o = testing::RunGenerate(*n.stub, Prompt(1500, 20, false));
  EXPECT_EQ(o.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << o.status.error_message();
  EXPECT_EQ(a.Join().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(b.Join().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_TRUE(WaitForNoImport(n));
  // With the streams gone the same Generate runs.
  o = testing::RunGenerate(*n.stub, Prompt(1500, 20, false));
  EXPECT_TRUE(o.status.ok()) << o.status.error_message();
}

// A client that cancels mid-stream: the import ends and holds nothing.
TEST_F(ImportLimitsTest, ACancelledImportGivesBackWhatItHeld) {
  Node n = StartNode(*model_, 0, 1);
  grpc::ClientContext ctx;
  v1::ImportSessionResponse resp;
  auto writer = n.stub->ImportSession(&ctx, &resp);
  v1::WireChunk chunk;
  chunk.set_data(wire_->substr(0, wire_->size() / 2));
  ASSERT_TRUE(writer->Write(chunk));
  ASSERT_TRUE(WaitFor([&] { return n.server->store().import_bytes() > wire_->size() / 4; }));
  ctx.TryCancel();
  EXPECT_EQ(writer->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(WaitForNoImport(n));
  EXPECT_EQ(n.server->store().num_sessions(), 0u);
  EXPECT_TRUE(ImportWhole(n, *wire_).ok());  // the slot is free again
}

// An export's snapshot is memory a client makes the node hold until it has
// read it: reserved against --memory-budget before a byte is copied out of
// the session (RESOURCE_EXHAUSTED when it does not fit beside the session),
// given back once sent. It used to be held uncounted, one whole copy per
// call.
TEST_F(ImportLimitsTest, AnExportSnapshotCountsAgainstTheBudget) {
  const size_t held = HeldPerStream(*model_, *long_wire_);
  size_t committed = 0;
  {
    Node probe = StartNode(*model_, 0, 1);
    ASSERT_TRUE(ImportWhole(probe, *long_wire_).ok());
    committed = probe.server->store().committed_bytes();
  }
  const size_t room = std::max(held, committed) + (768 << 10);
  ASSERT_LT(room, committed + long_wire_->size());  // no room for a copy beside the session
  Node n = StartNode(*model_, room, 1);
  ASSERT_TRUE(ImportWhole(n, *long_wire_).ok());
  const std::string id = n.server->store().List().at(0).id;
  auto [none, refused] = testing::ExportWire(*n.stub, id);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  EXPECT_NE(refused.error_message().find("export: the session's snapshot would hold"),
            std::string::npos)
      << refused.error_message();
  EXPECT_NE(refused.error_message().find("--memory-budget"), std::string::npos);
  EXPECT_TRUE(none.empty());
  EXPECT_TRUE(WaitFor([&] { return n.server->store().num_exports() == 0; }));
  EXPECT_EQ(n.server->store().export_bytes(), 0u);
  EXPECT_EQ(n.server->store().num_sessions(), 1u);  // the session stays, untouched

  // With room for the copy the same session exports whole, and gives it back.
  Node m = StartNode(*model_, committed + long_wire_->size() + (768 << 10), 1);
  ASSERT_TRUE(ImportWhole(m, *long_wire_).ok());
  auto [wire, ok] = testing::ExportWire(*m.stub, id);
  ASSERT_TRUE(ok.ok()) << ok.error_message();
  EXPECT_EQ(wire, *long_wire_);
  EXPECT_TRUE(WaitFor([&] { return m.server->store().num_exports() == 0; }));
  EXPECT_EQ(m.server->store().export_bytes(), 0u);
  EXPECT_EQ(m.server->store().committed_bytes(), m.server->store().MemoryByKindTotal().total());
}

TEST_F(ImportLimitsTest, ACompleteImportMovesItsReservationToTheSession) {
  Node n = StartNode(*model_, 0, 1);
  for (int i = 0; i < 2; ++i) {  // the second one runs: the only slot is free again
    const grpc::Status st = ImportWhole(n, *wire_);
    ASSERT_TRUE(st.ok()) << st.error_message();
    EXPECT_EQ(n.server->store().import_bytes(), 0u);
    EXPECT_EQ(n.server->store().num_imports(), 0u);
    EXPECT_EQ(n.server->store().num_sessions(), 1u);
    // The lease returned: the session's reservation went with it.
    EXPECT_EQ(n.server->store().committed_bytes(), n.server->store().MemoryByKindTotal().total());
    // The stream carries its session's id: release it before the next import
    // of the same stream.
    const auto sessions = n.server->store().List();
    ASSERT_EQ(sessions.size(), 1u);
    EXPECT_TRUE(n.server->store().Release(sessions[0].id).released);
  }
}

}  // namespace
}  // namespace cortiq::server
