// InFlight: a count of work in flight that a thread can wait on, on a
// condition variable, until it reaches zero (a drain, a shutdown) — never by
// polling.
//
// Enter() returns a Token: the work is in flight while its token is held and
// ends when the token is released (Release(), or its destruction). A token is
// move-only; when two owners may each end the work (whichever finishes last,
// or first), share it through a shared_ptr: the first release counts, later
// ones do nothing.
//
// Threads: every method is thread-safe. The InFlight must outlive its tokens
// (release them before it is destroyed). Cost: one uncontended mutex lock per
// Enter and per release; waiters are woken only when the count reaches zero.
//
// Example:
//   util::InFlight calls;
//   util::InFlight::Token t = calls.Enter();   // a call starts ...
//   t.Release();                               // ... and ends (any thread)
//   calls.WaitIdleUntil(Clock::now() + grace); // elsewhere: true once none is left
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <mutex>

namespace cortiq::util {

class InFlight {
 public:
  class Token {
   public:
    Token() = default;  // holds nothing
    Token(Token&& o) noexcept : owner_(o.owner_.exchange(nullptr)) {}
    Token& operator=(Token&& o) noexcept {
      if (this != &o) {
        Release();
        owner_.store(o.owner_.exchange(nullptr));
      }
      return *this;
    }
    Token(const Token&) = delete;
    Token& operator=(const Token&) = delete;
    ~Token() { Release(); }

    // Ends the work: the count drops by one (the first call only).
    void Release() {
      if (InFlight* owner = owner_.exchange(nullptr)) owner->Exit();
    }
    bool held() const { return owner_.load() != nullptr; }

   private:
    friend class InFlight;
    explicit Token(InFlight* owner) : owner_(owner) {}
    std::atomic<InFlight*> owner_{nullptr};
  };

  InFlight() = default;
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;

  // One more piece of work in flight until the token is released.
  Token Enter();
  size_t count() const;
  // Blocks until the count is zero (returns at once when it is).
  void WaitIdle();
  // As WaitIdle, giving up at `deadline`: true when the count is zero.
  bool WaitIdleUntil(std::chrono::steady_clock::time_point deadline);

 private:
  void Exit();

  mutable std::mutex mu_;
  std::condition_variable idle_;  // notified when count_ reaches zero
  size_t count_ = 0;
};

}  // namespace cortiq::util
