// The main of every gtest binary here (in place of gtest_main): each test
// process writes its scratch files (random checkpoints, GGUF files, state
// dirs, sockets' logs) under a directory of its own, removed when it exits.
//
// CTest runs every test case as its own process, and the helpers write their
// files once per process (tests/common/model_test_util.h), so without this a
// run of scripts/test.sh left ~1,000 directories (~85 MB) in /tmp, and each
// later run as many again.
//
// The directory is made under $TEST_TMPDIR, else $TMPDIR, else /tmp, as
// cortiq-test-XXXXXX, and both variables point at it while the tests run:
// ::testing::TempDir(), std::filesystem::temp_directory_path() and the
// servers and Python clients a test starts all write there. A child that
// re-executes the binary (a death test) finds CORTIQ_TEST_SCRATCH set and
// uses its parent's directory as is. Set CORTIQ_KEEP_TEST_TMP=1 to keep it
// (its path goes to stderr); a process that dies leaves it behind.
#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <system_error>

#include "gtest/gtest.h"

namespace {

std::string ScratchBase() {
  for (const char* var : {"TEST_TMPDIR", "TMPDIR"}) {
    const char* v = getenv(var);
    if (v != nullptr && v[0] != '\0') return v;
  }
  return "/tmp";
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (getenv("CORTIQ_TEST_SCRATCH") != nullptr) return RUN_ALL_TESTS();

  std::string tmpl = ScratchBase() + "/cortiq-test-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) {
    std::perror(("test_main: mkdtemp " + tmpl).c_str());
    return 2;
  }
  const std::string dir = tmpl;
  setenv("CORTIQ_TEST_SCRATCH", dir.c_str(), 1);
  setenv("TEST_TMPDIR", dir.c_str(), 1);
  setenv("TMPDIR", dir.c_str(), 1);

  const int rc = RUN_ALL_TESTS();

  const char* keep = getenv("CORTIQ_KEEP_TEST_TMP");
  if (keep != nullptr && keep[0] != '\0' && keep[0] != '0') {
    std::fprintf(stderr, "test_main: kept %s\n", dir.c_str());
    return rc;
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (ec) std::fprintf(stderr, "test_main: removing %s: %s\n", dir.c_str(), ec.message().c_str());
  return rc;
}
