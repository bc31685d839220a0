// cortiq-bench-persist: what --state-dir costs and what it buys, against the
// disk's own sequential speed measured in the same run (issue 18, item 6).
//
//   cortiq-bench-persist [--shape qwen3-0.6b] [--dtype bf16] [--positions 2180]
//                        [--kv f32|int8] [--turns 5] [--restore-runs 5]
//                        [--dir /tmp/cortiq-bench-state]
//
// One cortiq server runs in this process with --state-dir DIR (--persist-sync
// turn). A kept session is filled with `positions` random K/V rows per layer
// (about 500 MB at the 0.6B shape in f32), then:
//   1. the disk: a plain file of the session file's size written with
//      fdatasync, its pages evicted, read back cold: MB/s both ways;
//   2. a turn's append: `turns` calls of a 16-token prompt and 16 tokens on
//      the big session; per turn the record's bytes, the engine thread's
//      part (BuildJournalRecord of the turn's 32 positions: the copy of the
//      new rows) and the writer's (write + fdatasync, off the engine
//      thread), each against one decode step of the same calls;
//   3. restore: the session file's pages evicted, read back into a session
//      (SessionPersister::Load: map + RestoreJournal) against a cold read of
//      the probe just before it, `restore-runs` times (the median ratio);
//   4. time to first token of a spilled session's next turn (the file's
//      pages evicted: read back from disk, then the turn's prompt) against
//      re-prefilling the same history in a fresh session.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "core/model/random_checkpoint.h"
#include "core/session/session_persister.h"
#include "server/server.h"
#include "spdlog/spdlog.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;
namespace session = cortiq::session;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "cortiq-bench-persist: %s\n", what.c_str());
  std::exit(1);
}

// Drops a file's pages from the page cache (they are clean once synced), so
// the next read comes from the disk.
void Evict(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) Die("open " + path);
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

// The disk's sequential speed for `bytes`: a probe file written with
// fdatasync (MB/s), kept for ColdRead.
double WriteProbe(const std::string& path, size_t bytes) {
  std::vector<char> block(8 << 20);
  for (size_t i = 0; i < block.size(); ++i) block[i] = char(i * 2654435761u >> 13);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) Die("open " + path);
  const auto t0 = Clock::now();
  for (size_t done = 0; done < bytes; done += block.size()) {
    if (::write(fd, block.data(), std::min(block.size(), bytes - done)) < 0) Die("write probe");
  }
  ::fdatasync(fd);
  const double w = Seconds(Clock::now() - t0);
  ::close(fd);
  return double(bytes) / w / 1e6;
}

// A plain sequential read of a file from the disk (its pages evicted first)
// into an 8 MB buffer: MB/s.
double ColdRead(const std::string& path) {
  Evict(path);
  std::vector<char> block(8 << 20);
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) Die("open " + path);
  const auto t0 = Clock::now();
  size_t got = 0;
  for (ssize_t n; (n = ::read(fd, block.data(), block.size())) > 0;) got += size_t(n);
  const double r = Seconds(Clock::now() - t0);
  ::close(fd);
  return double(got) / r / 1e6;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Turn {
  double ttft = 0, decode_tps = 0;
  size_t tokens = 0;
};

// One call on a kept session (or a new one-shot session when id is empty) as
// the server runs it: Peek (a spilled session is read back), plan, Acquire,
// Submit; the time to the first token from the call's start.
Turn Call(cortiq::server::Server& s, const std::string& id, std::vector<int32_t> prompt,
          size_t max_tokens) {
  session::GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  r.sampling.temperature = 0;
  r.release_at_end = id.empty();
  const session::PlanLimits limits{.max_tokens = 1 << 16, .max_context = 1 << 16, .max_n = 8};
  const auto t0 = Clock::now();
  session::SessionStore& store = s.store();
  absl::StatusOr<session::SessionStore::Lease> lease;
  absl::StatusOr<session::RequestPlan> plan;
  if (id.empty()) {
    plan = session::PlanRequest(r, limits, s.model().config(), session::SessionConfig{});
    if (!plan.ok()) Die(std::string(plan.status().message()));
    lease = store.Create(s.model(), *plan);
  } else {
    auto existing = store.Peek(id);
    if (!existing.ok()) Die(std::string(existing.status().message()));
    plan = session::PlanRequest(r, limits, s.model().config(), *existing);
    if (!plan.ok()) Die(std::string(plan.status().message()));
    lease = store.Acquire(id, *plan);
  }
  if (!lease.ok()) Die(std::string(lease.status().message()));
  auto job = s.engine().Submit(*std::move(lease), std::move(r), *plan);
  if (!job.ok()) Die(std::string(job.status().message()));
  Turn t;
  session::GenerationEvent ev;
  while ((*job)->WaitPop(&ev)) {
    if (t.tokens++ == 0) t.ttft = Seconds(Clock::now() - t0);
  }
  if (!(*job)->result().status.ok()) Die(std::string((*job)->result().status.message()));
  t.decode_tps = (*job)->result().decode_tokens_per_second;
  return t;
}

// A kept session with `positions` random K/V rows in every layer after one
// real turn (cortiq-bench-migrate's recipe: the benchmark is about the
// bytes, not the prefill), and a second turn so its file holds them.
std::string MakeBigSession(cortiq::server::Server& s, size_t positions, bool int8) {
  session::SessionConfig config;
  if (int8) config.kv_mode = cortiq::kv::KvMode::kInt8;
  auto created = s.store().Create(s.model(), config, 0);
  if (!created.ok()) Die(std::string(created.status().message()));
  const std::string id = (*created)->id();
  created->Return();
  Call(s, id, std::vector<int32_t>(16, 33), 4);
  auto lease = s.store().Acquire(id);
  cortiq::model::SequenceKv& kv = lease->sequence();
  const size_t start = kv.position();
  std::vector<int32_t> tokens = (*lease)->tokens();
  const int32_t last = tokens.back();
  tokens.pop_back();
  tokens.insert(tokens.end(), positions, 32);
  tokens.push_back(last);
  if (auto st = (*lease)->RestoreHistory(std::move(tokens), start + positions, ""); !st.ok()) {
    Die(std::string(st.message()));
  }
  uint64_t state = 1;
  auto next = [&state] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return float(int32_t(state >> 32)) * (2.0f / 2147483648.0f);
  };
  for (size_t l = 0; l < kv.num_layers(); ++l) {
    cortiq::kv::LayerKvCache layer = kv.layer(l).cache()->Copy();
    layer.Reserve(start + positions + 64);
    std::vector<float> k(layer.num_kv_heads() * layer.head_dim()), v(k.size());
    for (size_t p = 0; p < positions; ++p) {
      for (auto& x : k) x = next();
      for (auto& x : v) x = next();
      layer.Append(k, v);
    }
    if (auto st = kv.layer(l).InstallCache(std::move(layer), start + positions); !st.ok()) {
      Die(std::string(st.message()));
    }
  }
  (*lease)->PublishMemory();
  lease->Return();
  Call(s, id, std::vector<int32_t>(16, 34), 4);  // the file now holds the rows
  return id;
}

}  // namespace

int main(int argc, char** argv) {
  std::string shape = "qwen3-0.6b", dtype = "bf16", dir = "/tmp/cortiq-bench-state";
  size_t positions = 2180, turns = 5, restore_loops = 0, restore_runs = 5;
  bool int8 = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--shape") {
      shape = next();
    } else if (a == "--dtype") {
      dtype = next();
    } else if (a == "--positions") {
      (void)absl::SimpleAtoi(next(), &positions);
    } else if (a == "--turns") {
      (void)absl::SimpleAtoi(next(), &turns);
    } else if (a == "--kv") {
      int8 = next() == "int8";
    } else if (a == "--dir") {
      dir = next();
    } else if (a == "--restore-runs") {
      (void)absl::SimpleAtoi(next(), &restore_runs);
    } else if (a == "--restore-loops") {  // profiling: only hot restores, this many
      (void)absl::SimpleAtoi(next(), &restore_loops);
    } else {
      std::fprintf(stderr,
                   "usage: cortiq-bench-persist [--shape S] [--dtype D] [--positions N] "
                   "[--kv f32|int8] [--turns T] [--restore-runs R] [--dir DIR]\n");
      return 2;
    }
  }
  spdlog::set_level(spdlog::level::warn);
  const std::string model_dir = "/tmp/cortiq-bench-" + shape + "-" + dtype;
  if (!fs::exists(model_dir + "/model.safetensors")) {
    cortiq::model::RandomCheckpointOptions o;
    o.dtype = dtype == "f32" ? cortiq::math::DType::kF32 : cortiq::math::DType::kBF16;
    auto cfg = cortiq::model::NamedShape(shape);
    if (!cfg.ok() || !cortiq::model::WriteRandomCheckpoint(*cfg, model_dir, o).ok()) return 1;
  }
  fs::remove_all(dir);
  cortiq::server::ServerConfig c;
  c.model_dir = model_dir;
  c.listen = "127.0.0.1:0";
  c.metrics_listen = "off";
  c.state_dir = dir;
  c.persist_sync = "turn";
  auto started = cortiq::server::Server::Start(c);
  if (!started.ok()) Die(std::string(started.status().message()));
  cortiq::server::Server& s = **started;
  session::SessionPersister& p = *s.persister();

  const std::string id = MakeBigSession(s, positions, int8);
  const std::string file = p.PathOf(id);
  const size_t file_bytes = fs::file_size(file);
  const size_t mem = s.store().Get(id)->memory.total();
  std::printf("shape %s (%s weights), kv %s, %zu positions: session %.1f MB in RAM, file %.1f MB\n",
              shape.c_str(), dtype.c_str(), int8 ? "int8" : "f32", positions + 20, mem / 1e6,
              file_bytes / 1e6);
  if (restore_loops > 0) {
    for (size_t i = 0; i < restore_loops; ++i) {
      const auto t0 = Clock::now();
      auto back = p.Load(id);
      std::printf("hot restore %.3f s\n", Seconds(Clock::now() - t0));
      if (!back.ok()) Die("restore");
    }
    return 0;
  }
  const std::string probe = dir + "/disk-probe";
  const double disk_w = WriteProbe(probe, file_bytes);
  std::printf("disk (%s): write+fdatasync %.0f MB/s\n", dir.c_str(), disk_w);

  // 2. A turn's append.
  double step_s = 0, write_s = 0, prepare_s = 0, ttft_s = 0;
  // The first turn's record goes into a fresh buffer (its pages faulted in
  // on the engine thread); later ones reuse a spare one, as a running node's do.
  double first_prepare_s = 0, later_prepare_s = 0;
  size_t record_bytes = 0;
  for (size_t t = 0; t < turns; ++t) {
    const auto before = p.stats();
    const Turn turn = Call(s, id, std::vector<int32_t>(16, 35 + int(t)), 16);
    const auto after = p.stats();
    step_s += 1.0 / turn.decode_tps;
    ttft_s += turn.ttft;
    write_s += after.write_seconds - before.write_seconds;
    record_bytes += after.bytes - before.bytes;
    // The engine thread's part: SessionPersister::Prepare at the call's end.
    const double prepared = after.prepare_seconds - before.prepare_seconds;
    prepare_s += prepared;
    (t == 0 ? first_prepare_s : later_prepare_s) += prepared;
    if (after.rewrites != before.rewrites) Die("a turn rewrote the file");
  }
  step_s /= turns;
  write_s /= turns;
  prepare_s /= turns;
  ttft_s /= turns;
  std::printf(
      "turn of 32 positions (16 prompt + 16 generated): record %.2f MB; first token %.1f ms, "
      "decode step %.1f ms\n"
      "  engine thread (copy of the new rows): %.2f ms = %.2f %% of a decode step\n",
      record_bytes / 1e6 / turns, ttft_s * 1e3, step_s * 1e3, prepare_s * 1e3,
      100 * prepare_s / step_s);
  if (turns > 1) {
    later_prepare_s /= static_cast<double>(turns - 1);
    std::printf(
        "    the first turn (a fresh buffer) %.2f ms = %.2f %%; the %zu later turns (a reused "
        "buffer) %.2f ms = %.2f %%\n",
        first_prepare_s * 1e3, 100 * first_prepare_s / step_s, turns - 1, later_prepare_s * 1e3,
        100 * later_prepare_s / step_s);
  }
  std::printf(
      "  writer thread (write + fdatasync):     %.2f ms = %.1f %% of a decode step, %.2f %% of "
      "the turn's 16 steps\n",
      write_s * 1e3, 100 * write_s / step_s, 100 * write_s / (16 * step_s));

  // 3. Restore from a cold file, against a plain cold read of the probe
  // (same size) just before it; the disk's speed drifts from run to run.
  const size_t restored_bytes = fs::file_size(file);
  std::vector<double> ratios, reads;
  for (size_t run = 0; run < restore_runs; ++run) {
    const double disk_r = ColdRead(probe);
    Evict(file);
    const auto r0 = Clock::now();
    auto loaded = p.Load(id);
    const double restore_s = Seconds(Clock::now() - r0);
    if (!loaded.ok()) Die(std::string(loaded.status().message()));
    loaded->reset();
    const double restore_mbs = restored_bytes / restore_s / 1e6;
    std::printf(
        "restore of %.1f MB from a cold file: %.3f s, %.0f MB/s; cold read %.0f MB/s: %.0f %%\n",
        restored_bytes / 1e6, restore_s, restore_mbs, disk_r, 100 * restore_mbs / disk_r);
    ratios.push_back(restore_mbs / disk_r);
    reads.push_back(disk_r);
  }
  fs::remove(probe);
  const auto h0 = Clock::now();  // the file's pages now cached: the CPU's part alone
  auto hot = p.Load(id);
  const double hot_s = Seconds(Clock::now() - h0);
  if (!hot.ok()) Die("hot restore");
  hot->reset();
  std::printf("restore from the page cache (the CPU's part): %.3f s, %.0f MB/s\n", hot_s,
              restored_bytes / hot_s / 1e6);
  std::printf("restore, median of %zu cold runs: %.0f %% of the cold read (%.0f MB/s)\n",
              ratios.size(), 100 * Median(ratios), Median(reads));

  // 4. A spilled session's next turn against re-prefilling its history.
  const size_t history = s.store().Get(id)->tokens;
  s.store().ReapIdle(Clock::now() + std::chrono::hours(24));
  if (!s.store().Get(id)->spilled) Die("the session did not spill");
  Evict(file);
  const Turn spilled = Call(s, id, std::vector<int32_t>(8, 40), 1);
  const Turn fresh = Call(s, "", std::vector<int32_t>(history + 8, 41), 1);
  std::printf(
      "time to first token, %zu-token history + 8: spilled (read back cold) %.3f s, re-prefill "
      "%.3f s: %.1f %% (1/%.0f)\n",
      history, spilled.ttft, fresh.ttft, 100 * spilled.ttft / fresh.ttft,
      fresh.ttft / spilled.ttft);
  s.store().Release(id);
  (*started).reset();
  fs::remove_all(dir);
  return 0;
}
