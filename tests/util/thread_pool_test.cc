#include "core/util/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

namespace cortiq::util {
namespace {

// Every index in [0, n) is visited exactly once and chunk edges respect grain.
void CheckCoverage(ThreadPool& pool, size_t n, size_t grain) {
  std::vector<std::atomic<int>> hits(n);
  std::atomic<bool> bad_edge{false};
  pool.ParallelFor(
      n,
      [&](size_t b, size_t e) {
        if (b % grain != 0 || (e % grain != 0 && e != n) || b >= e) bad_edge = true;
        for (size_t i = b; i < e; ++i) hits[i].fetch_add(1);
      },
      grain);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
  EXPECT_FALSE(bad_edge) << "n=" << n << " grain=" << grain;
}

TEST(ThreadPoolTest, CoversRangeExactlyOnce) {
  for (size_t threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.num_threads(), threads);
    for (size_t n : {0, 1, 2, 3, 7, 64, 1000, 4097}) {
      for (size_t grain : {1, 4, 8, 33}) CheckCoverage(pool, n, grain);
    }
  }
}

TEST(ThreadPoolTest, SplitsWorkAcrossThreads) {
  ThreadPool pool(3);
  std::vector<std::thread::id> ids(3);
  pool.RunOnAll([&](size_t i) { ids[i] = std::this_thread::get_id(); });
  EXPECT_EQ(ids[0], std::this_thread::get_id());  // the caller takes chunk 0
  EXPECT_NE(ids[1], ids[0]);
  EXPECT_NE(ids[2], ids[0]);
  EXPECT_NE(ids[1], ids[2]);
}

// Many back-to-back tiny jobs: a lost wake-up or a stale job would hang or
// miscount here.
TEST(ThreadPoolTest, ManySmallJobsWhileSpinning) {
  ThreadPool pool(3);
  std::atomic<size_t> total{0};
  constexpr size_t kJobs = 20000;
  for (size_t j = 0; j < kJobs; ++j) {
    pool.ParallelFor(3, [&](size_t b, size_t e) { total.fetch_add(e - b); });
  }
  EXPECT_EQ(total.load(), 3 * kJobs);
}

// With no spin every job goes through the sleep / notify path on both sides.
TEST(ThreadPoolTest, ManySmallJobsWithSleepingWorkers) {
  ThreadPool pool(3, std::chrono::microseconds(0));
  std::atomic<size_t> total{0};
  constexpr size_t kJobs = 3000;
  for (size_t j = 0; j < kJobs; ++j) {
    pool.ParallelFor(30, [&](size_t b, size_t e) { total.fetch_add(e - b); });
  }
  EXPECT_EQ(total.load(), 30 * kJobs);
}

TEST(ThreadPoolTest, WakesAfterWorkersWentToSleep) {
  ThreadPool pool(2, std::chrono::microseconds(50));
  for (int round = 0; round < 5; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // past the spin
    std::atomic<int> sum{0};
    pool.ParallelFor(100, [&](size_t b, size_t e) { sum.fetch_add(static_cast<int>(e - b)); });
    EXPECT_EQ(sum.load(), 100);
  }
}

// The caller's chunk is short, a worker's is long: the caller must sleep and
// be woken, not return early.
TEST(ThreadPoolTest, CallerWaitsForSlowWorker) {
  ThreadPool pool(2, std::chrono::microseconds(10));
  std::atomic<bool> worker_done{false};
  pool.ParallelFor(2, [&](size_t b, size_t) {
    if (b == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      worker_done = true;
    }
  });
  EXPECT_TRUE(worker_done.load());
}

TEST(ThreadPoolTest, NestedCallRunsInline) {
  ThreadPool pool(2);
  std::atomic<size_t> total{0};
  pool.ParallelFor(4, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) {
      pool.ParallelFor(10, [&](size_t b2, size_t e2) { total.fetch_add(e2 - b2); });
    }
  });
  EXPECT_EQ(total.load(), 40u);
}

TEST(ThreadPoolTest, ConcurrentCallersDoNotCorruptEachOther) {
  ThreadPool pool(2);
  std::atomic<size_t> total{0};
  auto client = [&] {
    for (int j = 0; j < 2000; ++j) {
      pool.ParallelFor(16, [&](size_t b, size_t e) { total.fetch_add(e - b); });
    }
  };
  std::thread t1(client), t2(client);
  t1.join();
  t2.join();
  EXPECT_EQ(total.load(), 2u * 2000u * 16u);
}

TEST(ThreadPoolTest, CallerExceptionPropagatesAfterWorkersFinish) {
  ThreadPool pool(2);
  std::atomic<bool> worker_ran{false};
  EXPECT_THROW(pool.ParallelFor(2,
                                [&](size_t b, size_t) {
                                  if (b == 0) throw std::runtime_error("boom");
                                  std::this_thread::sleep_for(std::chrono::milliseconds(5));
                                  worker_ran = true;
                                }),
               std::runtime_error);
  EXPECT_TRUE(worker_ran.load());
  // The pool is still usable.
  CheckCoverage(pool, 100, 1);
}

TEST(ThreadPoolTest, ConstructDestroyQuickly) {
  for (int i = 0; i < 50; ++i) {
    ThreadPool pool(4);
    if (i % 2) CheckCoverage(pool, 10, 1);
  }
  for (int i = 0; i < 10; ++i) {
    ThreadPool pool(3, std::chrono::microseconds(0));  // workers asleep at destruction
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

TEST(ThreadPoolTest, DefaultPoolWorks) {
  ThreadPool& pool = ThreadPool::Default();
  EXPECT_GE(pool.num_threads(), 1u);
  CheckCoverage(pool, 1000, 7);
}

// Start latency with spinning workers: a sanity bound, generous enough for a
// loaded CI machine (typically ~1 us here).
// Many back-to-back calls (the decode step's pattern) all complete. The time
// per call is recorded, not asserted: a shared CI machine makes any bound
// flaky, and speed is the benchmarks' business.
TEST(ThreadPoolTest, ManyBackToBackCallsComplete) {
  ThreadPool pool(2);
  std::atomic<size_t> total{0};
  pool.ParallelFor(2, [&](size_t b, size_t e) { total.fetch_add(e - b); });  // warm up
  constexpr int kJobs = 2000;
  auto t0 = std::chrono::steady_clock::now();
  for (int j = 0; j < kJobs; ++j) {
    pool.ParallelFor(2, [&](size_t b, size_t e) { total.fetch_add(e - b); });
  }
  double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  RecordProperty("us_per_call", std::to_string(us / kJobs));
  EXPECT_EQ(total.load(), size_t{2} * (kJobs + 1));
}

}  // namespace
}  // namespace cortiq::util
