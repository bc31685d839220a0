// The process's resident memory, for tests that check memory goes back to
// the OS (not only to the gauges).
#pragma once

#include <cstddef>
#include <fstream>
#include <string>

namespace cortiq::testing {

// Under a sanitizer the heap is the sanitizer's (ASan's freed blocks wait in
// its quarantine; mallopt and malloc_trim reach neither, and TSan's shadow
// memory dwarfs what a test measures): resident memory says nothing about
// the allocator then, and tests check only their counts.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kRssIsMeaningful = false;
#else
inline constexpr bool kRssIsMeaningful = true;
#endif

// VmRSS of this process in bytes (0 if /proc cannot be read).
inline size_t RssBytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoul(line.substr(6)) * 1024;
  }
  return 0;
}

}  // namespace cortiq::testing
