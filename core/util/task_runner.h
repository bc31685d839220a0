// TaskRunner: a fixed set of worker threads, owned and joined, for blocking
// background tasks — in the server, the client side of a migration (a call
// to a peer that may last minutes) and a drain — so that they never hold the
// thread that submitted them (a gRPC callback thread must not block) and
// never run on a detached thread.
//
// Why a fixed set and not a thread per task: gRPC's callback model never
// starts a thread per call, and a burst of calls must not become a burst of
// threads (each a stack, each a channel to a peer). The set is small and
// fixed; tasks beyond it wait in FIFO order, and beyond `max_queued` waiting
// tasks Submit refuses (RESOURCE_EXHAUSTED) instead of piling work up. The
// price is head-of-line waiting when more than `workers` long tasks run at
// once, which background work (an operator's migrations, one drain) can
// afford.
//
// In flight: a task counts from Submit until it has returned and its
// captures are destroyed — including whatever it runs after its visible
// result (a continuation) — so in_flight() == 0 means nothing of it is left.
//
// Lifetime: Shutdown() refuses new tasks (UNAVAILABLE), lets the workers run
// every task already submitted, and joins them; the destructor calls it.
// Calling it from one of the runner's own tasks would join that task's
// thread: a programming error that aborts with a message.
//
// Threads: every method is thread-safe. A task must not throw (as on a
// std::thread: std::terminate). Cost: one std::function and a mutex
// round-trip per task; idle workers sleep on a condition variable.
//
// Example:
//   util::TaskRunner background(/*workers=*/4, /*max_queued=*/64);
//   absl::Status queued = background.Submit([] { MoveSessionToPeer(); });
//   if (!queued.ok()) ...;  // refused: answer the caller now
//   background.Shutdown();  // runs what is queued, joins
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "core/util/in_flight.h"

namespace cortiq::util {

class TaskRunner {
 public:
  // Starts `workers` (>= 1) threads at once; at most `max_queued` tasks wait
  // for a free worker.
  TaskRunner(size_t workers, size_t max_queued);
  ~TaskRunner();  // Shutdown()
  TaskRunner(const TaskRunner&) = delete;
  TaskRunner& operator=(const TaskRunner&) = delete;

  // Queues `task` for a worker. UNAVAILABLE once Shutdown has begun,
  // RESOURCE_EXHAUSTED (with the numbers) when max_queued tasks already
  // wait; a refused task is dropped without running.
  absl::Status Submit(std::function<void()> task);

  // True on one of this runner's worker threads (a task asking where it runs).
  bool OnWorkerThread() const;
  // Tasks submitted and not yet returned (waiting or running).
  size_t in_flight() const { return in_flight_.count(); }
  // Blocks until no task is in flight or `deadline`: true when none is.
  bool WaitIdleUntil(std::chrono::steady_clock::time_point deadline) {
    return in_flight_.WaitIdleUntil(deadline);
  }

  // Refuses new tasks, runs the queued ones, joins the workers. Idempotent;
  // a concurrent second call returns once the first has joined.
  void Shutdown();

 private:
  struct Task {
    std::function<void()> run;
    InFlight::Token token;  // released after `run` has returned and is destroyed
  };
  void WorkerLoop();

  InFlight in_flight_;  // declared first: outlives the tokens below
  const size_t max_queued_;
  std::mutex mu_;
  std::condition_variable work_;  // a task was queued, or stopping_
  std::deque<Task> queue_;
  bool stopping_ = false;
  std::mutex join_mu_;  // serialises Shutdown's joins
  std::vector<std::thread> workers_;
  std::vector<std::thread::id> worker_ids_;  // set by the constructor, then read-only
};

}  // namespace cortiq::util
