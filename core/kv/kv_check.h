// CORTIQ_KV_CHECK: the programmer-invariant check of core/kv's .cc files
// (private to the folder: include it from .cc files only). Always on: these
// guard caller-sized buffers (a wrong span size would corrupt memory
// silently) and cost one compare per call, never per row. Client input never
// reaches one: it gets a Status.
#pragma once

#include <cstdio>
#include <cstdlib>

namespace cortiq::kv::internal {

[[noreturn]] inline void KvCheckFailed(const char* cond, const char* file, int line) {
  std::fprintf(stderr, "%s:%d: kv check failed: %s\n", file, line, cond);
  std::abort();
}

}  // namespace cortiq::kv::internal

#define CORTIQ_KV_CHECK(cond)                                                      \
  do {                                                                             \
    if (!(cond)) ::cortiq::kv::internal::KvCheckFailed(#cond, __FILE__, __LINE__); \
  } while (0)
