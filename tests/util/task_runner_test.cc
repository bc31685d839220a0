// TaskRunner and InFlight: a task stops counting only after its
// continuation has run and its captures are gone; Shutdown runs what is
// queued and joins the workers; a task submitted after Shutdown (or beyond
// the queue's bound) is refused without running; waits are condition
// variables with deadlines.
#include "core/util/task_runner.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <latch>
#include <memory>
#include <thread>

#include "core/util/in_flight.h"

namespace cortiq::util {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

// "Forever" for a test: never reached when the code is correct.
constexpr auto kLong = std::chrono::seconds(30);

TEST(InFlightTest, CountsTokensAndWakesTheWaiterAtZero) {
  InFlight f;
  EXPECT_TRUE(f.WaitIdleUntil(steady_clock::now()));
  InFlight::Token a = f.Enter();
  InFlight::Token b = f.Enter();
  EXPECT_EQ(f.count(), 2u);
  EXPECT_FALSE(f.WaitIdleUntil(steady_clock::now() + milliseconds(10)));
  InFlight::Token moved = std::move(a);  // moving does not count twice
  EXPECT_FALSE(a.held());
  EXPECT_TRUE(moved.held());
  EXPECT_EQ(f.count(), 2u);
  auto waiter = std::async(std::launch::async, [&] { f.WaitIdle(); });
  moved.Release();
  moved.Release();  // idempotent
  EXPECT_EQ(f.count(), 1u);
  EXPECT_EQ(waiter.wait_for(milliseconds(10)), std::future_status::timeout);
  {
    InFlight::Token gone = std::move(b);  // released by its destructor
  }
  waiter.get();
  EXPECT_EQ(f.count(), 0u);
}

TEST(InFlightTest, ASharedTokenEndsTheWorkOnceWhoeverReleasesIt) {
  InFlight f;
  auto shared = std::make_shared<InFlight::Token>(f.Enter());
  auto copy = shared;
  std::thread other([copy] { copy->Release(); });
  other.join();
  shared->Release();
  EXPECT_EQ(f.count(), 0u);
}

TEST(TaskRunnerTest, TheCountDropsOnlyAfterTheContinuationHasRun) {
  TaskRunner runner(2, 8);
  std::promise<void> replied;
  std::latch go_on(1);
  std::atomic<bool> continuation_done{false};
  std::atomic<bool> captures_gone{false};
  std::shared_ptr<int> capture(new int(0), [&](int* p) {
    delete p;
    captures_gone = true;
  });
  ASSERT_TRUE(runner
                  .Submit([&, capture] {
                    replied.set_value();  // the visible result (a reply) ...
                    go_on.wait();
                    continuation_done = true;  // ... then the continuation
                  })
                  .ok());
  capture.reset();
  replied.get_future().get();
  // Replied, continuation still running: in flight, and a wait times out.
  EXPECT_EQ(runner.in_flight(), 1u);
  EXPECT_FALSE(runner.WaitIdleUntil(steady_clock::now() + milliseconds(20)));
  go_on.count_down();
  ASSERT_TRUE(runner.WaitIdleUntil(steady_clock::now() + kLong));
  EXPECT_TRUE(continuation_done);
  EXPECT_TRUE(captures_gone);
  EXPECT_EQ(runner.in_flight(), 0u);
}

// Set by the destructor of a worker's thread_local, i.e. when the thread exits.
std::atomic<int> g_threads_exited{0};
struct ExitMark {
  bool used = false;
  ~ExitMark() {
    if (used) g_threads_exited.fetch_add(1);
  }
};
thread_local ExitMark t_exit_mark;

TEST(TaskRunnerTest, ShutdownRunsWhatIsQueuedAndJoinsTheWorkers) {
  g_threads_exited = 0;
  TaskRunner runner(1, 16);
  std::latch release(1);
  std::atomic<int> ran{0};
  ASSERT_TRUE(runner
                  .Submit([&] {
                    t_exit_mark.used = true;
                    release.wait();
                  })
                  .ok());
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(runner.Submit([&] { ran.fetch_add(1); }).ok());
  EXPECT_EQ(runner.in_flight(), 6u);
  auto shutdown = std::async(std::launch::async, [&] { runner.Shutdown(); });
  // Shutdown waits for the running task and what is queued behind it.
  EXPECT_EQ(shutdown.wait_for(milliseconds(20)), std::future_status::timeout);
  EXPECT_EQ(ran.load(), 0);
  release.count_down();
  ASSERT_EQ(shutdown.wait_for(kLong), std::future_status::ready);
  EXPECT_EQ(ran.load(), 5);
  EXPECT_EQ(runner.in_flight(), 0u);
  EXPECT_EQ(g_threads_exited.load(), 1);  // joined: its thread has exited
  runner.Shutdown();                      // idempotent
}

TEST(TaskRunnerTest, ATaskSubmittedAfterShutdownIsRefusedWithoutRunning) {
  TaskRunner runner(2, 4);
  runner.Shutdown();
  std::atomic<bool> ran{false};
  const absl::Status st = runner.Submit([&] { ran = true; });
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_EQ(runner.in_flight(), 0u);
  EXPECT_FALSE(ran);
}

TEST(TaskRunnerTest, BeyondTheQueueBoundSubmitIsRefused) {
  TaskRunner runner(1, 2);
  std::latch release(1);
  std::promise<void> started;
  std::atomic<int> ran{0};
  ASSERT_TRUE(runner
                  .Submit([&] {
                    started.set_value();
                    release.wait();
                  })
                  .ok());
  started.get_future().get();  // the worker is busy; the queue is empty
  ASSERT_TRUE(runner.Submit([&] { ran.fetch_add(1); }).ok());
  ASSERT_TRUE(runner.Submit([&] { ran.fetch_add(1); }).ok());
  const absl::Status full = runner.Submit([&] { ran.fetch_add(100); });
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_NE(full.message().find("at most 2"), std::string_view::npos) << full;
  EXPECT_EQ(runner.in_flight(), 3u);
  release.count_down();
  ASSERT_TRUE(runner.WaitIdleUntil(steady_clock::now() + kLong));
  EXPECT_EQ(ran.load(), 2);
}

TEST(TaskRunnerTest, WorkersRunTasksConcurrently) {
  TaskRunner runner(3, 8);
  std::latch all_three(3);  // completes only if three tasks run at once
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(runner.Submit([&] { all_three.arrive_and_wait(); }).ok());
  }
  EXPECT_TRUE(runner.WaitIdleUntil(steady_clock::now() + kLong));
}

TEST(TaskRunnerTest, TheDestructorRunsWhatIsQueued) {
  std::atomic<int> ran{0};
  {
    TaskRunner runner(1, 16);
    for (int i = 0; i < 10; ++i) ASSERT_TRUE(runner.Submit([&] { ran.fetch_add(1); }).ok());
  }
  EXPECT_EQ(ran.load(), 10);
}

TEST(TaskRunnerDeathTest, ShutdownFromItsOwnTaskAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        TaskRunner runner(1, 4);
        std::latch done(1);
        (void)runner.Submit([&] {
          runner.Shutdown();
          done.count_down();
        });
        done.wait();
      },
      "would join itself");
}

}  // namespace
}  // namespace cortiq::util
