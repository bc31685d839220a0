// Happens-before edges for ThreadSanitizer that it cannot see on its own.
//
// Debian builds gRPC without TSan, so TSan does not see how gRPC orders a
// reactor's reactions: OnReadDone on one thread after the StartRead another
// thread issued, OnDone after every other reaction. Without help, every field
// a reactor keeps between reactions reads as a race. A reactor marks the
// edges gRPC guarantees: TsanRelease(this) before each Start*/Finish it
// issues (and at the end of its constructor), TsanAcquire(this) at the top of
// each reaction. In a build without TSan both are empty inline functions.
#pragma once

#if defined(__SANITIZE_THREAD__)
#define CORTIQ_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CORTIQ_TSAN 1
#endif
#endif

#ifdef CORTIQ_TSAN
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
#endif

namespace cortiq::util {

inline void TsanAcquire([[maybe_unused]] const void* addr) {
#ifdef CORTIQ_TSAN
  __tsan_acquire(const_cast<void*>(addr));
#endif
}

inline void TsanRelease([[maybe_unused]] const void* addr) {
#ifdef CORTIQ_TSAN
  __tsan_release(const_cast<void*>(addr));
#endif
}

}  // namespace cortiq::util
