// libFuzzer target for the GGUF reader and the GGUF model mapping: every
// input goes through fuzz::RunGgufInput (gguf_fuzz_util.h, which also says
// what counts as a finding); a finding aborts with the reason on stderr.
// Build, corpus and campaign: tests/fuzz/README.md.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>

#include "tests/fuzz/gguf_fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string tmp_path = [] {
    setenv("CORTIQ_THREADS", "1", /*overwrite=*/0);
    return (std::filesystem::temp_directory_path() /
            ("cortiq_gguf_fuzz_" + std::to_string(getpid()) + ".gguf"))
        .string();
  }();
  const absl::Status s = cortiq::fuzz::RunGgufInput(
      std::string_view(reinterpret_cast<const char*>(data), size), tmp_path);
  if (!s.ok()) {
    std::fprintf(stderr, "gguf_fuzz FINDING: %s\n", s.ToString().c_str());
    std::abort();
  }
  return 0;
}
