// cortiq-bench-math: throughput of the core/math kernels on this machine.
//
// At start it measures the two ceilings (bench_util.h): DRAM read bandwidth
// over a 2 GiB buffer and the FMA peak, on the same pool the kernels use
// (CORTIQ_THREADS threads, default 2). Every GEMV reports GB/s of weights
// streamed and pct_bw (of that bandwidth); every GEMM reports GFLOP/s and
// pct_peak. "Cold" GEMVs walk a 1 GiB arena so each call reads W from DRAM,
// as decode does with a model larger than the cache; "Hot" ones reuse one W.
//
// Usage: cortiq-bench-math [--bw_bytes=N] [google benchmark flags]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/math/bench_util.h"
#include "core/math/kernels.h"
#include "core/util/aligned_buffer.h"
#include "core/util/huge_buffer.h"
#include "core/util/thread_pool.h"

namespace cortiq::math {
namespace {

util::ThreadPool* g_pool = nullptr;
double g_bandwidth_gbs = 0;
double g_peak_gflops = 0;
constexpr size_t kArenaBytes = size_t{1} << 30;

// Random weights of every dtype in one arena (filled once, shared by all).
struct Arena {
  util::AlignedBuffer<uint8_t> bytes;
  explicit Arena(size_t n) : bytes(n) {
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float> f(1 << 16);
    for (auto& v : f) v = dist(rng);
    // Tile one 64K-float block of bf16/f16-safe values over the arena; the
    // exact values do not matter for speed, only that they are finite.
    std::vector<uint16_t> h(f.size());
    ConvertFromF32(f.data(), DType::kBF16, f.size(), h.data());
    for (size_t off = 0; off < n; off += h.size() * 2) {
      std::memcpy(bytes.data() + off, h.data(), std::min(h.size() * 2, n - off));
    }
  }
};

Arena& GetArena() {
  static Arena* arena = new Arena(kArenaBytes);
  return *arena;
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

std::vector<float> RandomX(size_t n) {
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = dist(rng);
  return x;
}

// Times MatMul of `batch` random x rows by `w`, whose data moves through
// `slices` copies `stride` bytes apart (1: hot), and sets GBps (of W's
// `wbytes`), pct_bw and GFLOPS.
void TimeMatMul(benchmark::State& state, WeightView w, size_t batch, size_t stride, size_t slices,
                size_t wbytes) {
  // Lane-order int8 views walk their copy; everything else its data.
  const bool lanes = w.q8_lanes != nullptr;
  const auto* base = lanes ? w.q8_lanes : static_cast<const uint8_t*>(w.data);
  auto x = RandomX(batch * w.cols);
  std::vector<float> y(batch * w.rows);
  size_t slice = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    (lanes ? reinterpret_cast<const void*&>(w.q8_lanes) : w.data) = base + slice * stride;
    MatMul(x.data(), batch, w, y.data(), g_pool);
    benchmark::DoNotOptimize(y.data());
    if (++slice == slices) slice = 0;
  }
  const double secs = Seconds(t0) / static_cast<double>(state.iterations());
  state.counters["GBps"] = static_cast<double>(wbytes) / secs / 1e9;
  state.counters["pct_bw"] = 100.0 * state.counters["GBps"] / g_bandwidth_gbs;
  state.counters["GFLOPS"] = 2.0 * w.rows * w.cols * batch / secs / 1e9;
}

// args: rows, cols, batch, dtype, cold, bf16 activations
void BM_Gemv(benchmark::State& state) {
  const size_t rows = state.range(0), cols = state.range(1), batch = state.range(2);
  const DType dtype = static_cast<DType>(state.range(3));
  const bool cold = state.range(4) != 0;
  const bool act = state.range(5) != 0;
  const size_t wbytes = rows * cols * DTypeSize(dtype);
  if (wbytes > kArenaBytes) {
    state.SkipWithError("weights larger than the arena");
    return;
  }
  uint8_t* base = GetArena().bytes.data();
  // Cold: successive calls use successive slices of the arena (page-aligned).
  const size_t stride = (wbytes + 4095) / 4096 * 4096;
  const size_t slices = cold ? kArenaBytes / stride : 1;
  TimeMatMul(state, WeightView{base, dtype, rows, cols, act}, batch, stride, slices, wbytes);
  state.SetLabel(std::string(DTypeName(dtype)) + (cold ? " cold" : " hot") +
                 (act ? " bf16-act" : ""));
}

// Times MatMul(x, m, w) per iteration; GFLOPS and the share of the FMA peak.
void TimeMatMul(benchmark::State& state, size_t m, const WeightView& w) {
  auto x = RandomX(m * w.cols);
  std::vector<float> y(m * w.rows);
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    MatMul(x.data(), m, w, y.data(), g_pool);
    benchmark::DoNotOptimize(y.data());
  }
  const double secs = Seconds(t0) / static_cast<double>(state.iterations());
  state.counters["GFLOPS"] = 2.0 * m * w.rows * w.cols / secs / 1e9;
  state.counters["pct_peak"] = 100.0 * state.counters["GFLOPS"] / g_peak_gflops;
}

// args: M (batch), N (rows of W), K (cols), dtype
// args: M, N, K, dtype, act (bf16 weights: 1 = bf16 activations, the
// engine's default: the VDPBF16PS GEMM where the CPU has AVX512_BF16, else x
// rounded to bf16 through the f32 GEMM).
void BM_Gemm(benchmark::State& state) {
  const size_t m = state.range(0), n = state.range(1), k = state.range(2);
  const DType dtype = static_cast<DType>(state.range(3));
  const bool act = state.range(4) != 0;
  TimeMatMul(state, m, WeightView{GetArena().bytes.data(), dtype, n, k, act});
  state.SetLabel(std::string(DTypeName(dtype)) + (act ? " bf16 act" : ""));
}

// args: M (batch), N (rows of W), K (cols). bf16 weights with bf16
// activations on their AMX tile-order copy (kAmx only): the one kernel that
// serves decode and prefill alike there. W is hot (the same N x K each call).
void BM_GemmAmxTiles(benchmark::State& state) {
  const size_t m = state.range(0), n = state.range(1), k = state.range(2);
  util::HugeBuffer<uint16_t> tiles(AmxTileElements(n, k));
  const auto* w16 = reinterpret_cast<const uint16_t*>(GetArena().bytes.data());
  PackAmxTiles(w16, n, k, tiles.data(), 0, n);
  TimeMatMul(state, m,
             WeightView{w16, DType::kBF16, n, k, /*bf16_activations=*/true, tiles.data()});
  state.SetLabel("bf16 tiles");
}

// int8 weights (Q8_0 blocks quantized from random values) in an arena of
// their own, for the same cold/hot walk as BM_Gemv.
uint8_t* Q8Arena() {
  static uint8_t* arena = [] {
    auto* a = new util::AlignedBuffer<uint8_t>(kArenaBytes);
    std::vector<float> f = RandomX(1 << 16);
    std::vector<uint8_t> q(RowBytes(DType::kQ8_0, f.size()));
    QuantizeQ8_0(f.data(), f.size(), q.data());
    for (size_t off = 0; off < kArenaBytes; off += q.size()) {
      std::memcpy(a->data() + off, q.data(), std::min(q.size(), kArenaBytes - off));
    }
    return a->data();
  }();
  return arena;
}

// The same blocks in lane order (PackQ8Lanes), copied across an arena of
// their own in slices of `stride` bytes (stride: a multiple of 64 holding
// one rows x cols matrix).
const uint8_t* Q8LanesArena(size_t rows, size_t cols, size_t stride) {
  static std::map<std::pair<size_t, size_t>, util::AlignedBuffer<uint8_t>> arenas;
  auto& a = arenas[{rows, cols}];
  if (a.size() == 0) {
    a.Resize(kArenaBytes);
    PackQ8Lanes(Q8Arena(), rows, cols, a.data(), 0, rows);
    for (size_t off = stride; off + stride <= kArenaBytes; off += stride) {
      std::memcpy(a.data() + off, a.data(), Q8LaneBytes(rows, cols));
    }
  }
  return a.data();
}

// args: rows, cols, batch, cold, lanes. Int8 weights, in rows (Q8_0 blocks)
// or in lane order (the copy the loaders make where Q8LanesUsed): decode
// (GB/s of W, pct_bw) and prefill (GFLOP/s, pct_peak of the fp32 FMA peak).
void BM_Q8(benchmark::State& state) {
  const size_t rows = state.range(0), cols = state.range(1), batch = state.range(2);
  const bool cold = state.range(3) != 0;
  const bool lanes = state.range(4) != 0;
  if (lanes) {
    const size_t wbytes = Q8LaneBytes(rows, cols);
    const size_t stride = (wbytes + 4095) / 4096 * 4096;
    const size_t slices = cold ? kArenaBytes / stride : 1;
    WeightView view{nullptr, DType::kQ8_0, rows, cols};
    view.q8_lanes = Q8LanesArena(rows, cols, stride);
    TimeMatMul(state, view, batch, stride, slices, wbytes);
    state.counters["pct_peak"] = 100.0 * state.counters["GFLOPS"] / g_peak_gflops;
    state.SetLabel(std::string(cold ? "q8 lanes cold" : "q8 lanes hot") +
                   (Q8AmxUsed(batch) ? " amx-int8" : ""));
    return;
  }
  const size_t wbytes = rows * RowBytes(DType::kQ8_0, cols);
  // Cold: successive calls use successive slices (each a whole number of 34-byte blocks).
  const size_t stride =
      (wbytes + 4095) / 4096 * 4096 / kQ8BlockBytes * kQ8BlockBytes + kQ8BlockBytes * 121;
  const size_t slices = cold ? kArenaBytes / stride - 1 : 1;
  if (slices == 0) {
    state.SkipWithError("weights larger than the arena");
    return;
  }
  TimeMatMul(state, WeightView{Q8Arena(), DType::kQ8_0, rows, cols}, batch, stride, slices, wbytes);
  state.counters["pct_peak"] = 100.0 * state.counters["GFLOPS"] / g_peak_gflops;
  state.SetLabel(cold ? "q8_0 cold" : "q8_0 hot");
}

// Cost of one ParallelFor with an empty body (the engine issues ~200 per token).
void BM_ParallelForEmpty(benchmark::State& state) {
  for (auto _ : state) {
    g_pool->ParallelFor(g_pool->num_threads(),
                        [](size_t b, size_t e) { benchmark::DoNotOptimize(b + e); });
  }
}

// args: rows (visible positions), tasks (sequence × KV head pairs per call),
// int8, cold. One layer of batched decode attention as AttendGroup runs it (kv/
// attend.cc): per task, the 2 query heads of a GQA group (Qwen3-0.6B: 16
// over 8) scored against the head's K rows (DotRowsI8 / DotRows), a softmax
// per head, then P · V (AxpyRowsI8 / AxpyRows), head_dim 128; tasks split
// over the pool. Cold: successive calls walk the arena, so K and V come from
// DRAM as in decode (hot: one call's rows, from the caches). GBps counts the
// K and V bytes (and int8 scales) read.
void BM_AttendRows(benchmark::State& state) {
  constexpr size_t kD = 128, kHeads = 2;
  const size_t n = state.range(0), tasks = state.range(1);
  const bool i8 = state.range(2) != 0, cold = state.range(3) != 0;
  const size_t row_bytes = kD * (i8 ? 1 : 4);
  // A task's K then V rows (then, int8, their scales), 4 KiB-aligned.
  const size_t task_bytes = (2 * n * row_bytes + (i8 ? 2 * n * 4 : 0) + 4095) / 4096 * 4096;
  const size_t call_bytes = tasks * task_bytes;
  if (call_bytes > kArenaBytes) {
    state.SkipWithError("rows larger than the arena");
    return;
  }
  uint8_t* base = GetArena().bytes.data();
  if (i8) {  // int8 rows: any bytes will do; the scales must be finite
    for (size_t off = 0; off + task_bytes <= kArenaBytes; off += task_bytes) {
      float* sc = reinterpret_cast<float*>(base + off + 2 * n * row_bytes);
      for (size_t t = 0; t < 2 * n; ++t) sc[t] = 0.01f;
    }
  }
  const size_t slices = cold ? kArenaBytes / call_bytes : 1;
  auto q = RandomX(tasks * kHeads * kD);
  std::vector<float> probs(tasks * kHeads * n), out(tasks * kHeads * kD);
  size_t slice = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    const uint8_t* call = base + slice * call_bytes;
    g_pool->ParallelFor(tasks, [&](size_t begin, size_t end) {
      for (size_t k = begin; k < end; ++k) {
        const uint8_t* t = call + k * task_bytes;
        const float* qk = q.data() + k * kHeads * kD;
        float* p = probs.data() + k * kHeads * n;
        float* o = out.data() + k * kHeads * kD;
        if (i8) {
          const auto* keys = reinterpret_cast<const int8_t*>(t);
          const auto* values = keys + n * kD;
          const auto* ks = reinterpret_cast<const float*>(values + n * kD);
          DotRowsI8(qk, kHeads, kD, keys, n, kD, kD, p, n);
          for (size_t j = 0; j < kHeads; ++j) {
            for (size_t r = 0; r < n; ++r) p[j * n + r] *= ks[r] * 0.088f;
            Softmax(p + j * n, n);
          }
          std::fill(o, o + kHeads * kD, 0.0f);
          AxpyRowsI8(p, kHeads, n, ks + n, values, n, kD, kD, o, kD);
        } else {
          const auto* keys = reinterpret_cast<const float*>(t);
          DotRows(qk, kHeads, kD, keys, n, kD, kD, p, n);
          for (size_t j = 0; j < kHeads; ++j) {
            for (size_t r = 0; r < n; ++r) p[j * n + r] *= 0.088f;
            Softmax(p + j * n, n);
          }
          std::fill(o, o + kHeads * kD, 0.0f);
          AxpyRows(p, kHeads, n, keys + n * kD, n, kD, kD, o, kD);
        }
      }
    });
    benchmark::DoNotOptimize(out.data());
    if (++slice == slices) slice = 0;
  }
  const double secs = Seconds(t0) / static_cast<double>(state.iterations());
  const double bytes = static_cast<double>(tasks) * (2.0 * n * row_bytes + (i8 ? 8.0 * n : 0.0));
  state.counters["GBps"] = bytes / secs / 1e9;
  state.counters["pct_bw"] = 100.0 * state.counters["GBps"] / g_bandwidth_gbs;
  state.SetLabel(std::string(i8 ? "int8 rows" : "f32 rows") + (cold ? " cold" : " hot"));
}

void BM_Dot(benchmark::State& state) {
  const size_t n = state.range(0);
  auto a = RandomX(n), b = RandomX(n);
  for (auto _ : state) benchmark::DoNotOptimize(Dot(a.data(), b.data(), n));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n * 8));
}

void BM_Softmax(benchmark::State& state) {
  const size_t n = state.range(0);
  auto a = RandomX(n);
  std::vector<float> x(n);
  for (auto _ : state) {
    std::memcpy(x.data(), a.data(), n * 4);
    Softmax(x.data(), n);
    benchmark::DoNotOptimize(x.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * n));
}

void BM_RmsNorm(benchmark::State& state) {
  const size_t n = state.range(0);
  auto a = RandomX(n), w = RandomX(n);
  std::vector<float> y(n);
  for (auto _ : state) {
    RmsNorm(a.data(), w.data(), 1e-6f, n, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * n));
}

void BM_SwiGlu(benchmark::State& state) {
  const size_t n = state.range(0);
  auto g = RandomX(n), u = RandomX(n);
  std::vector<float> y(n);
  for (auto _ : state) {
    SwiGlu(g.data(), u.data(), n, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * n));
}

void RegisterAll() {
  const int64_t bf16 = static_cast<int64_t>(DType::kBF16), f32 = static_cast<int64_t>(DType::kF32),
                f16 = static_cast<int64_t>(DType::kF16);
  // Decode: the Qwen3-0.6B projection shapes (rows = out, cols = in).
  for (int64_t dt : {bf16, f16, f32}) {
    for (auto shape :
         {std::pair<int64_t, int64_t>{1024, 1024}, {3072, 1024}, {1024, 3072}, {151936, 1024}}) {
      if (dt == f32 && shape.first == 151936) continue;  // 622 MB: still fits, but slow to sweep
      for (int64_t batch : {1, 8}) {
        if (dt != bf16 && batch != 1) continue;
        for (int64_t act : {0, 1}) {
          if (act && dt != bf16) continue;
          benchmark::RegisterBenchmark("Gemv", BM_Gemv)
              ->Args({shape.first, shape.second, batch, dt, 1, act})
              ->ArgNames({"rows", "cols", "batch", "dtype", "cold", "act"})
              ->UseRealTime();
        }
      }
    }
  }
  for (int64_t batch : {1, 4, 8, 12, 15, 16, 24, 32}) {
    for (int64_t act : {0, 1}) {
      benchmark::RegisterBenchmark("Gemv", BM_Gemv)
          ->Args({3072, 1024, batch, bf16, 1, act})
          ->ArgNames({"rows", "cols", "batch", "dtype", "cold", "act"})
          ->UseRealTime();
    }
  }
  for (int64_t batch : {1, 8}) {
    for (int64_t act : {0, 1}) {
      benchmark::RegisterBenchmark("Gemv", BM_Gemv)
          ->Args({1024, 1024, batch, bf16, 0, act})
          ->ArgNames({"rows", "cols", "batch", "dtype", "cold", "act"})
          ->UseRealTime();
    }
  }
  // Prefill: M = 512 tokens.
  for (int64_t dt : {f32, bf16, f16}) {
    for (int64_t act : {0, 1}) {
      if (act == 1 && dt != bf16) continue;
      for (auto nk : {std::pair<int64_t, int64_t>{1024, 1024}, {3072, 1024}, {1024, 3072}}) {
        benchmark::RegisterBenchmark("Gemm", BM_Gemm)
            ->Args({512, nk.first, nk.second, dt, act})
            ->ArgNames({"M", "N", "K", "dtype", "act"})
            ->UseRealTime();
      }
    }
  }
  for (int64_t m : {16, 32, 64, 128}) {
    for (int64_t act : {0, 1}) {
      benchmark::RegisterBenchmark("Gemm", BM_Gemm)
          ->Args({m, 3072, 1024, bf16, act})
          ->ArgNames({"M", "N", "K", "dtype", "act"})
          ->UseRealTime();
    }
  }
  if (AmxTilesUsed()) {
    for (int64_t m : {1, 8, 16, 64, 512}) {
      for (auto nk : {std::pair<int64_t, int64_t>{1024, 1024}, {3072, 1024}, {1024, 3072}}) {
        benchmark::RegisterBenchmark("GemmAmxTiles", BM_GemmAmxTiles)
            ->Args({m, nk.first, nk.second})
            ->ArgNames({"M", "N", "K"})
            ->UseRealTime();
      }
    }
  }
  // int8 weights: decode at the 0.6B shapes (cold), batched decode, prefill;
  // in rows and in lane order.
  for (int64_t lanes : {0, 1}) {
    for (auto shape :
         {std::pair<int64_t, int64_t>{1024, 1024}, {3072, 1024}, {1024, 3072}, {151936, 1024}}) {
      for (int64_t batch : {1, 8}) {
        benchmark::RegisterBenchmark("Q8", BM_Q8)
            ->Args({shape.first, shape.second, batch, 1, lanes})
            ->ArgNames({"rows", "cols", "batch", "cold", "lanes"})
            ->UseRealTime();
      }
      // Batches 1 and 8 with W in cache as well: the arithmetic's part of
      // the cold run.
      if (shape.first <= 3072) {
        for (int64_t batch : {1, 8}) {
          benchmark::RegisterBenchmark("Q8", BM_Q8)
              ->Args({shape.first, shape.second, batch, 0, lanes})
              ->ArgNames({"rows", "cols", "batch", "cold", "lanes"})
              ->UseRealTime();
        }
      }
    }
    for (int64_t batch : {2, 4, 16, 33, 64, 512}) {
      benchmark::RegisterBenchmark("Q8", BM_Q8)
          ->Args({3072, 1024, batch, batch < 64, lanes})
          ->ArgNames({"rows", "cols", "batch", "cold", "lanes"})
          ->UseRealTime();
    }
    for (auto nk : {std::pair<int64_t, int64_t>{1024, 1024}, {1024, 3072}}) {
      benchmark::RegisterBenchmark("Q8", BM_Q8)
          ->Args({nk.first, nk.second, 512, 0, lanes})
          ->ArgNames({"rows", "cols", "batch", "cold", "lanes"})
          ->UseRealTime();
    }
  }
  // Batched decode attention at the 0.6B shape: 8 sequences × 8 KV heads.
  for (int64_t i8 : {1, 0}) {
    for (int64_t n : {512, 2048}) {
      for (int64_t cold : {1, 0}) {
        if (n > 512 && cold == 0) continue;
        benchmark::RegisterBenchmark("AttendRows", BM_AttendRows)
            ->Args({n, 64, i8, cold})
            ->ArgNames({"rows", "tasks", "int8", "cold"})
            ->UseRealTime();
      }
    }
  }
  benchmark::RegisterBenchmark("ParallelForEmpty", BM_ParallelForEmpty)->UseRealTime();
  for (int64_t n : {128, 1024, 4096}) benchmark::RegisterBenchmark("Dot", BM_Dot)->Arg(n);
  for (int64_t n : {128, 4096, 32768}) benchmark::RegisterBenchmark("Softmax", BM_Softmax)->Arg(n);
  benchmark::RegisterBenchmark("RmsNorm", BM_RmsNorm)->Arg(1024);
  benchmark::RegisterBenchmark("SwiGlu", BM_SwiGlu)->Arg(3072);
}

}  // namespace
}  // namespace cortiq::math

int main(int argc, char** argv) {
  using namespace cortiq;  // NOLINT(google-build-using-namespace): a thin main
  size_t bw_bytes = size_t{2} << 30;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--bw_bytes=", 11) == 0) {
      bw_bytes = std::strtoull(argv[i] + 11, nullptr, 10);
    } else {
      args.push_back(argv[i]);
    }
  }
  int new_argc = static_cast<int>(args.size());
  benchmark::Initialize(&new_argc, args.data());
  size_t threads = 2;
  if (const char* env = std::getenv("CORTIQ_THREADS")) threads = std::strtoul(env, nullptr, 10);
  static util::ThreadPool pool(threads);
  math::g_pool = &pool;
  math::g_bandwidth_gbs = math::MeasureReadBandwidthGBs(bw_bytes, &pool);
  math::g_peak_gflops = math::MeasureFmaPeakGflops(&pool);
  std::printf(
      "isa=%s threads=%zu read_bandwidth=%.1f GB/s (%.2f GiB buffer) fma_peak=%.1f GFLOP/s\n",
      math::IsaName(math::ActiveIsa()), pool.num_threads(), math::g_bandwidth_gbs,
      static_cast<double>(bw_bytes) / (1 << 30), math::g_peak_gflops);
  benchmark::AddCustomContext("isa", math::IsaName(math::ActiveIsa()));
  benchmark::AddCustomContext("read_bandwidth_GBps", std::to_string(math::g_bandwidth_gbs));
  benchmark::AddCustomContext("fma_peak_GFLOPS", std::to_string(math::g_peak_gflops));
  math::RegisterAll();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
