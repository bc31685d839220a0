// The session journal (--state-dir): a file grown turn by turn restores the
// session exactly — every row, the QSA indexer keys, the whole O(1) and
// sink + window states, the sampler's RNG, the history — in every attention
// mode, across reuse_prefix rollbacks and start-overs; a turn costs its new
// rows only; compaction bounds the file; a torn last record is dropped and
// the session comes back at its last complete turn; corruption anywhere
// else is DATA_LOSS, another model's file FAILED_PRECONDITION; so is a read
// of the file that fails (never a read of the mapping instead).
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/session/engine.h"
#include "core/session/session_journal.h"
#include "core/session/session_store.h"
#include "core/session/session_wire.h"
#include "core/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "tests/common/engine_test_util.h"
#include "tests/common/model_test_util.h"

namespace cortiq::session {
namespace {

constexpr uint64_t kFingerprint = 0x1234abcd5678ef01ull;

class JournalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(testing::LoadTempModel("tiny", &model_, &tok_));
    engine_ = std::make_unique<Engine>(*model_, *tok_, EngineOptions{});
  }

  static SessionConfig Mode(int mode) { return testing::ModeConfig(mode); }

  static GenerationRequest Req(std::vector<int32_t> prompt, size_t n, bool sampled) {
    GenerationRequest r = testing::FixedRequest(std::move(prompt), n, sampled);
    r.seed_given = false;  // a continuation keeps the session's RNG
    return r;
  }

  std::vector<int32_t> Run(SessionStore& store, const std::string& id, GenerationRequest r) {
    return testing::RunKept(*engine_, store, id, std::move(r));
  }

  // A new kept session of `mode` in `store`, unleased: its id ("" on failure).
  std::string NewSession(SessionStore& store, int mode, std::string tenant = "") {
    auto lease = store.Create(*model_, Mode(mode), 0, std::move(tenant));
    EXPECT_TRUE(lease.ok()) << lease.status();
    if (!lease.ok()) return "";
    std::string id = (*lease)->id();
    lease->Return();
    return id;
  }

  // Appends (or rewrites) `id`'s record to `file`, as the persister would,
  // and returns the record's size.
  size_t Journal(SessionStore& store, const std::string& id, std::string& file,
                 bool* rewrote = nullptr) {
    auto lease = store.Acquire(id);
    EXPECT_TRUE(lease.ok()) << lease.status();
    auto rec = BuildJournalRecord(**lease, model_->config(), kFingerprint);
    EXPECT_TRUE(rec.ok()) << rec.status();
    if (!rec.ok()) return 0;
    if (rec->rewrite) {
      file = rec->bytes;
    } else {
      file += rec->bytes;
    }
    EXPECT_EQ(rec->mark.file_bytes, file.size());
    (*lease)->set_journal_mark(rec->mark);
    if (rewrote) *rewrote = rec->rewrite;
    return rec->bytes.size();
  }

  // The restored session holds exactly the live one's state.
  void ExpectSameState(const Session& live, const Session& back) {
    EXPECT_EQ(back.id(), live.id());
    EXPECT_EQ(back.tenant(), live.tenant());
    EXPECT_EQ(back.tokens(), live.tokens());
    EXPECT_EQ(back.detok_pending(), live.detok_pending());
    ASSERT_EQ(back.sampler().has_value(), live.sampler().has_value());
    if (live.sampler()) {
      EXPECT_EQ(back.sampler()->SerializeState(), live.sampler()->SerializeState());
    }
    ASSERT_EQ(back.kv().position(), live.kv().position());
    for (size_t l = 0; l < live.kv().num_layers(); ++l) {
      SCOPED_TRACE(::testing::Message() << "layer " << l);
      const auto& a = live.kv().layer(l);
      const auto& b = back.kv().layer(l);
      ASSERT_EQ(a.journal_rows() != nullptr, b.journal_rows() != nullptr);
      if (const kv::LayerKvCache* ra = a.journal_rows()) {
        const kv::LayerKvCache* rb = b.journal_rows();
        ASSERT_EQ(ra->seq_len(), rb->seq_len());
        for (size_t h = 0; h < ra->num_kv_heads(); ++h) {
          const kv::HeadRowsView va = ra->HeadRows(h), vb = rb->HeadRows(h);
          auto same = [](auto x, auto y) {
            return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size_bytes()) == 0;
          };
          EXPECT_TRUE(same(va.keys, vb.keys) && same(va.values, vb.values));
          EXPECT_TRUE(same(va.keys_i8, vb.keys_i8) && same(va.values_i8, vb.values_i8));
          EXPECT_TRUE(same(va.key_scales, vb.key_scales) && same(va.value_scales, vb.value_scales));
        }
      } else if (a.cache() != nullptr) {
        EXPECT_EQ(*a.cache()->ExportWire({}), *b.cache()->ExportWire({}));
      } else {
        EXPECT_EQ(*a.ExportRows()->ExportWire({}), *b.ExportRows()->ExportWire({}));
      }
      ASSERT_EQ(a.HasAux(), b.HasAux());
      if (a.HasAux()) {
        EXPECT_EQ(*a.SnapshotAux(), *b.SnapshotAux());
      }
    }
  }

  // RestoreJournal over `view`, with the descriptor of a file on disk that
  // holds `disk` and every copy and checksum read from it with pread.
  absl::StatusOr<RestoredJournal> RestoreViaFile(const std::string& view, const std::string& disk) {
    const std::string path = ::testing::TempDir() + "/journal_pread_test.bin";
    {
      std::FILE* f = std::fopen(path.c_str(), "wb");
      EXPECT_NE(f, nullptr);
      if (f == nullptr) return absl::InternalError("temp file");
      EXPECT_EQ(std::fwrite(disk.data(), 1, disk.size(), f), disk.size());
      std::fclose(f);
    }
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    EXPECT_GE(fd, 0);
    auto back = RestoreJournal(view, *model_, kFingerprint, {}, fd);
    ::close(fd);
    std::remove(path.c_str());
    return back;
  }

  // Restores `file` into a second store and checks it against `id` in `store`
  // (via_fd: every copy and checksum read from a file with pread).
  std::string RestoreAndCompare(SessionStore& store, const std::string& id, const std::string& file,
                                SessionStore& other, bool via_fd = false) {
    auto back = via_fd ? RestoreViaFile(file, file) : RestoreJournal(file, *model_, kFingerprint);
    EXPECT_TRUE(back.ok()) << back.status();
    if (!back.ok()) return "";
    EXPECT_EQ(back->torn_bytes, 0u);
    EXPECT_EQ(back->valid_bytes, file.size());
    {
      auto lease = store.Acquire(id);
      EXPECT_TRUE(lease.ok());
      ExpectSameState(**lease, *back->session);
      EXPECT_EQ(back->session->journal_mark().file_bytes, file.size());
    }
    auto installed = other.Install(std::move(back->session));
    EXPECT_TRUE(installed.ok()) << installed.status();
    return id;
  }

  std::unique_ptr<model::Transformer> model_;
  std::unique_ptr<tokenizer::Tokenizer> tok_;
  std::unique_ptr<Engine> engine_;
};

// Turn by turn, every mode: after each turn the file restores the session
// exactly, and the restored session continues with the same tokens (greedy
// and sampled: the RNG travels).
TEST_F(JournalTest, EveryTurnRestoresExactlyInEveryMode) {
  // Three times: the copies on this thread alone, (every record counting
  // as large) behind a second thread that reserves the layers ahead of
  // them, and that again with every copy and checksum read from the file
  // with pread.
  for (int variant = 0; variant < 3; ++variant) {
    const size_t parallel_bytes = variant == 0 ? size_t{8} << 20 : size_t{0};
    const bool via_fd = variant == 2;
    SCOPED_TRACE(::testing::Message()
                 << "parallel from " << parallel_bytes << " bytes, pread " << via_fd);
    internal::restore_parallel_bytes = parallel_bytes;
    for (int mode = 0; mode < 5; ++mode) {
      for (bool sampled : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "mode " << mode << " sampled " << sampled);
        SessionStore store({});
        const std::string id = NewSession(store, mode, "team-a");
        ASSERT_FALSE(id.empty());
        std::string file;
        GenerationRequest first = Req(testing::TestIds(70, 259, 5), 9, sampled);
        first.seed_given = true;
        Run(store, id, first);
        bool rewrote = false;
        Journal(store, id, file, &rewrote);
        EXPECT_TRUE(rewrote) << "a session's first record is the whole file";
        for (int turn = 0; turn < 3; ++turn) {
          Run(store, id, Req(testing::TestIds(5 + turn, 259, 10 + turn), 6, sampled));
          const size_t before = file.size();
          Journal(store, id, file, &rewrote);
          EXPECT_FALSE(rewrote);
          EXPECT_GT(file.size(), before);
          SessionStore other({});
          RestoreAndCompare(store, id, file, other, via_fd);
          const auto next = testing::TestIds(4, 259, 40 + turn);
          GenerationRequest a = Req(next, 5, sampled), b = Req(next, 5, sampled);
          EXPECT_EQ(Run(other, id, a), Run(store, id, b));
          Journal(store, id, file);  // the continuation too
        }
      }
    }
  }
  internal::restore_parallel_bytes = size_t{8} << 20;
}

// A turn record holds the new rows only: its size grows with the turn's
// tokens, not with the session.
TEST_F(JournalTest, ATurnCostsItsNewRowsOnly) {
  SessionStore store({});
  const std::string id = NewSession(store, 0);
  ASSERT_FALSE(id.empty());
  std::string file;
  Run(store, id, Req(testing::TestIds(200, 259, 5), 4, false));
  const size_t whole = Journal(store, id, file);
  const auto& cfg = model_->config();
  const size_t row =
      static_cast<size_t>(cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim) * 2 *
      sizeof(float);
  std::vector<size_t> sizes;
  for (int turn = 0; turn < 4; ++turn) {
    Run(store, id, Req(testing::TestIds(3, 259, 20 + turn), 4, false));
    sizes.push_back(Journal(store, id, file));
  }
  for (size_t s : sizes) {
    // The same new positions; the held-back UTF-8 bytes (at most 3) vary.
    EXPECT_NEAR(double(s), double(sizes[0]), 3) << "every turn of the same length costs the same";
    EXPECT_LT(s, 8 * row + 1024) << "7 new positions and the small sections";
  }
  EXPECT_GT(whole, 200 * row);
}

// reuse_prefix rollbacks keep a prefix and append the rest; a start over
// keeps nothing. Dead bytes pile up until they would pass the live ones:
// then the file is written anew, so it stays within twice the state.
TEST_F(JournalTest, RollbacksRestoreExactlyAndCompactionBoundsTheFile) {
  for (int mode : {0, 1, 3, 4}) {
    SCOPED_TRACE(::testing::Message() << "mode " << mode);
    SessionStore store({});
    const std::string id = NewSession(store, mode);
    ASSERT_FALSE(id.empty());
    std::string file;
    std::vector<int32_t> conversation = testing::TestIds(60, 259, 5);
    Run(store, id, Req(conversation, 4, false));
    Journal(store, id, file);
    size_t rewrites = 0;
    for (int turn = 0; turn < 8; ++turn) {
      // Keep the first 30 tokens, then a new tail: 30+ positions are dead.
      std::vector<int32_t> conv(conversation.begin(), conversation.begin() + 30);
      const auto tail = testing::TestIds(35, 259, 100 + turn);
      conv.insert(conv.end(), tail.begin(), tail.end());
      GenerationRequest r = Req(conv, 3, false);
      r.reuse_prefix = true;
      Run(store, id, r);
      bool rewrote = false;
      Journal(store, id, file, &rewrote);
      rewrites += rewrote;
      auto back = RestoreJournal(file, *model_, kFingerprint);
      ASSERT_TRUE(back.ok()) << back.status();
      auto l2 = store.Acquire(id);
      ASSERT_TRUE(l2.ok());
      ExpectSameState(**l2, *back->session);
      auto rec = BuildJournalRecord(**l2, model_->config(), kFingerprint, /*rewrite=*/true);
      ASSERT_TRUE(rec.ok());
      EXPECT_LE(file.size(), 2 * rec->bytes.size() + rec->bytes.size() / 2)
          << "the file stays within about twice the state";
    }
    if (mode != 4) {
      EXPECT_GE(rewrites, 1u) << "the dead rows forced a compaction";
    }
    // A start over: the history diverges at the first token.
    std::vector<int32_t> fresh = testing::TestIds(20, 259, 999);
    GenerationRequest r = Req(fresh, 3, false);
    r.reuse_prefix = true;
    Run(store, id, r);
    Journal(store, id, file);
    SessionStore other({});
    RestoreAndCompare(store, id, file, other);
  }
}

// A crash mid-write leaves a torn last record: every cut inside it restores
// the previous turn. A flipped byte with complete records after it is
// DATA_LOSS naming the record; another model's file FAILED_PRECONDITION.
TEST_F(JournalTest, TornTailsAreDroppedAndCorruptionIsRefused) {
  SessionStore store({});
  const std::string id = NewSession(store, 1);
  ASSERT_FALSE(id.empty());
  std::string file;
  Run(store, id, Req(testing::TestIds(20, 259, 5), 3, true));
  Journal(store, id, file);
  const size_t first_end = file.size();
  const size_t tokens_first = store.Get(id)->tokens;
  Run(store, id, Req(testing::TestIds(4, 259, 6), 3, true));
  Journal(store, id, file);
  const size_t tokens_second = store.Get(id)->tokens;
  ASSERT_GT(tokens_second, tokens_first);

  for (size_t cut = first_end; cut < file.size();
       cut += std::max<size_t>(1, (file.size() - first_end) / 97)) {
    auto back = RestoreJournal(std::string_view(file).substr(0, cut), *model_, kFingerprint);
    ASSERT_TRUE(back.ok()) << "cut at " << cut << ": " << back.status();
    EXPECT_EQ(back->session->tokens().size(), tokens_first);
    EXPECT_EQ(back->valid_bytes, first_end);
    EXPECT_EQ(back->torn_bytes, cut - first_end);
  }
  // A flipped byte in the last record: torn as well (the previous turn).
  std::string flipped = file;
  flipped[file.size() - 10] ^= 0x40;
  auto back = RestoreJournal(flipped, *model_, kFingerprint);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->session->tokens().size(), tokens_first);
  // A flipped bit in the last record's length (its frame) is corruption,
  // not a torn write: the frame check catches it, so no turn is silently cut.
  for (int bit : {0, 20, 40, 62}) {
    std::string bad = file;
    bad[first_end + 8 + bit / 8] ^= static_cast<char>(1 << (bit % 8));
    EXPECT_EQ(RestoreJournal(bad, *model_, kFingerprint).status().code(),
              absl::StatusCode::kDataLoss)
        << "bit " << bit;
  }
  // A crash that extended the file with zeros after the last record: torn.
  EXPECT_TRUE(RestoreJournal(file + std::string(64, '\0'), *model_, kFingerprint).ok());
  // A flipped byte anywhere before the last record: DATA_LOSS. Read with
  // pread, the checksums see the file's bytes: a flip on disk is caught
  // even where the mapping's view is whole.
  for (size_t at = 0; at < first_end; at += 1 + first_end / 61) {
    std::string bad = file;
    bad[at] ^= 0x01;
    // (The file's header is checked by value, from the mapping.)
    if (at >= kJournalHeaderBytes) {
      EXPECT_FALSE(RestoreViaFile(file, bad).ok()) << "flip on disk at " << at;
    }
    auto r = RestoreJournal(bad, *model_, kFingerprint);
    EXPECT_FALSE(r.ok()) << "flip at " << at;
    if (!r.ok() && at >= 24) {
      EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << at;
    }
  }
  // Nothing but the header, or a cut inside the first record: nothing to restore.
  EXPECT_EQ(
      RestoreJournal(std::string_view(file).substr(0, 24), *model_, kFingerprint).status().code(),
      absl::StatusCode::kDataLoss);
  EXPECT_EQ(RestoreJournal(file, *model_, kFingerprint ^ 1).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// A start over appended to a file (it keeps no position) is where the
// restore's state starts: the records before it carry the history only, and
// their rows are never copied. Torn, it is dropped like any last record: the
// state comes back from the records before it, as if it had never been
// written.
TEST_F(JournalTest, AStartOverSupersedesTheRowsBeforeItUnlessItIsTorn) {
  for (int mode : {0, 1, 3}) {
    SCOPED_TRACE(::testing::Message() << "mode " << mode);
    SessionStore store({});
    const std::string id = NewSession(store, mode);
    ASSERT_FALSE(id.empty());
    std::string file;
    Run(store, id, Req(testing::TestIds(8, 259, 5), 2, false));
    Journal(store, id, file);
    Run(store, id, Req(testing::TestIds(4, 259, 6), 2, false));
    Journal(store, id, file);
    const size_t before_end = file.size();
    auto before = RestoreJournal(file, *model_, kFingerprint);
    ASSERT_TRUE(before.ok()) << before.status();
    // A longer new history (so the file is appended to, not rewritten).
    GenerationRequest r = Req(testing::TestIds(40, 259, 999), 2, false);
    r.reuse_prefix = true;
    Run(store, id, r);
    bool rewrote = true;
    Journal(store, id, file, &rewrote);
    ASSERT_FALSE(rewrote) << "the start over must be appended for this test";
    {
      auto l = store.Acquire(id);
      ASSERT_TRUE(l.ok());
      auto back = RestoreJournal(file, *model_, kFingerprint);
      ASSERT_TRUE(back.ok()) << back.status();
      EXPECT_EQ(back->turns, 3u);
      ExpectSameState(**l, *back->session);
    }
    // Every cut inside the start over restores the two turns before it.
    for (size_t cut = before_end + 1; cut < file.size();
         cut += std::max<size_t>(1, (file.size() - before_end) / 23)) {
      auto back = RestoreJournal(std::string_view(file).substr(0, cut), *model_, kFingerprint);
      ASSERT_TRUE(back.ok()) << "cut at " << cut << ": " << back.status();
      EXPECT_EQ(back->valid_bytes, before_end);
      ExpectSameState(*before->session, *back->session);
    }
    // A turn after it: the state is the start over's plus that turn.
    Run(store, id, Req(testing::TestIds(3, 259, 7), 2, false));
    Journal(store, id, file, &rewrote);
    ASSERT_FALSE(rewrote);
    auto l = store.Acquire(id);
    ASSERT_TRUE(l.ok());
    auto back = RestoreJournal(file, *model_, kFingerprint);
    ASSERT_TRUE(back.ok()) << back.status();
    ExpectSameState(**l, *back->session);
  }
}

// A restore reads its layout (frames, the session header, the layer headers
// of the record its state starts at) before it asks for the file to be
// streamed, once; a file it refuses early is never streamed.
TEST_F(JournalTest, TheFileIsStreamedOnceAfterItsLayoutIsRead) {
  SessionStore store({});
  const std::string id = NewSession(store, 0);
  ASSERT_FALSE(id.empty());
  std::string file;
  Run(store, id, Req(testing::TestIds(12, 259, 5), 2, false));
  Journal(store, id, file);
  int calls = 0;
  auto back = RestoreJournal(file, *model_, kFingerprint, [&] { ++calls; });
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(calls, 1);
  calls = 0;
  std::string bad = file;
  bad[0] ^= 1;
  EXPECT_FALSE(RestoreJournal(bad, *model_, kFingerprint, [&] { ++calls; }).ok());
  EXPECT_EQ(calls, 0);
}

// A file the restore cannot read is DATA_LOSS naming the read (the
// persister quarantines it), never read through the mapping instead, where
// an I/O error is a SIGBUS: a descriptor pread refuses (a pipe: ESPIPE),
// and a file on disk shorter than its mapping (its last checksum missing
// too: not mistaken for a torn tail).
TEST_F(JournalTest, AReadThatFailsIsDataLossNeverAReadOfTheMapping) {
  SessionStore store({});
  const std::string id = NewSession(store, 0);
  ASSERT_FALSE(id.empty());
  std::string file;
  Run(store, id, Req(testing::TestIds(40, 259, 5), 4, false));
  Journal(store, id, file);
  Run(store, id, Req(testing::TestIds(6, 259, 6), 4, false));
  Journal(store, id, file);
  ASSERT_TRUE(RestoreJournal(file, *model_, kFingerprint).ok());
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  auto piped = RestoreJournal(file, *model_, kFingerprint, {}, pipe_fds[0]);
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);
  ASSERT_FALSE(piped.ok());
  EXPECT_EQ(piped.status().code(), absl::StatusCode::kDataLoss) << piped.status();
  EXPECT_NE(piped.status().message().find(std::strerror(ESPIPE)), std::string_view::npos)
      << piped.status();
  for (size_t cut : {file.size() - 4, file.size() / 2, size_t{100}}) {
    SCOPED_TRACE(::testing::Message() << "the file on disk cut at " << cut);
    auto shorter = RestoreViaFile(file, file.substr(0, cut));
    ASSERT_FALSE(shorter.ok());
    EXPECT_EQ(shorter.status().code(), absl::StatusCode::kDataLoss) << shorter.status();
    EXPECT_NE(shorter.status().message().find("the file ends before them"), std::string_view::npos)
        << shorter.status();
  }
}

}  // namespace
}  // namespace cortiq::session
