#include "core/util/in_flight.h"

namespace cortiq::util {

InFlight::Token InFlight::Enter() {
  std::lock_guard lock(mu_);
  ++count_;
  return Token(this);
}

size_t InFlight::count() const {
  std::lock_guard lock(mu_);
  return count_;
}

void InFlight::WaitIdle() {
  std::unique_lock lock(mu_);
  idle_.wait(lock, [&] { return count_ == 0; });
}

bool InFlight::WaitIdleUntil(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock lock(mu_);
  return idle_.wait_until(lock, deadline, [&] { return count_ == 0; });
}

void InFlight::Exit() {
  std::lock_guard lock(mu_);
  if (--count_ == 0) idle_.notify_all();
}

}  // namespace cortiq::util
