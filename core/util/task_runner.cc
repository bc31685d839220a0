#include "core/util/task_runner.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"

namespace cortiq::util {

TaskRunner::TaskRunner(size_t workers, size_t max_queued) : max_queued_(max_queued) {
  workers_.reserve(workers);
  for (size_t i = 0; i < std::max<size_t>(workers, 1); ++i) {
    workers_.emplace_back([this] { WorkerLoop(); });
    worker_ids_.push_back(workers_.back().get_id());
  }
}

TaskRunner::~TaskRunner() { Shutdown(); }

absl::Status TaskRunner::Submit(std::function<void()> task) {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return absl::UnavailableError("background tasks: shutting down");
    if (queue_.size() >= max_queued_) {
      return absl::ResourceExhaustedError(
          absl::StrCat("background tasks: ", queue_.size(), " already wait for ", workers_.size(),
                       " workers (at most ", max_queued_, " may wait)"));
    }
    queue_.push_back(Task{std::move(task), in_flight_.Enter()});
  }
  work_.notify_one();
  return absl::OkStatus();
}

void TaskRunner::WorkerLoop() {
  for (;;) {
    Task task;
    {
      std::unique_lock lock(mu_);
      work_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left to run
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task.run();
    task.run = nullptr;    // its captures go first ...
    task.token.Release();  // ... then it stops counting
  }
}

bool TaskRunner::OnWorkerThread() const {
  return std::find(worker_ids_.begin(), worker_ids_.end(), std::this_thread::get_id()) !=
         worker_ids_.end();
}

void TaskRunner::Shutdown() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  work_.notify_all();
  if (OnWorkerThread()) {
    std::fputs("TaskRunner::Shutdown called from one of its own tasks (it would join itself)\n",
               stderr);
    std::abort();
  }
  std::lock_guard join(join_mu_);
  for (std::thread& t : workers_) {
    if (t.joinable()) t.join();
  }
}

}  // namespace cortiq::util
