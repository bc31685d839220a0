#!/usr/bin/env bash
# Build and run every test: bootstrap (idempotent) + configure + build + CTest.
#   scripts/test.sh              all tests
#   scripts/test.sh --quick      skip tests labelled "slow"
#   scripts/test.sh --sanitize   ASan+UBSan build in build-asan/
#   scripts/test.sh --tsan       ThreadSanitizer build in build-tsan/: the engine,
#                                session and server tests (CTest labels session,
#                                server); suppressions in scripts/tsan.supp
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

BUILD_DIR=build
CMAKE_ARGS=()
CTEST_ARGS=()
TSAN=0
for arg in "$@"; do
  case "$arg" in
    --quick) CTEST_ARGS+=(-LE slow) ;;
    --sanitize) BUILD_DIR=build-asan; CMAKE_ARGS+=(-DCORTIQ_SANITIZE=ON) ;;
    --tsan) BUILD_DIR=build-tsan; CMAKE_ARGS+=(-DCORTIQ_TSAN=ON); TSAN=1 ;;
    *) echo "usage: scripts/test.sh [--quick] [--sanitize | --tsan]" >&2; exit 2 ;;
  esac
done

bash scripts/bootstrap.sh
JOBS="${JOBS:-$(nproc)}"
cmake -S . -B "$BUILD_DIR" -G Ninja "${CMAKE_ARGS[@]}" >/dev/null
if [[ $TSAN == 1 ]]; then
  # Only what the labelled tests run: their test binaries and the binaries
  # they start.
  mapfile -t TARGETS < <(ninja -C "$BUILD_DIR" -t targets all |
    sed -n -E 's/^((session|server)_[a-z0-9_]+_test): .*/\1/p')
  cmake --build "$BUILD_DIR" -j "$JOBS" --target cortiq-server cortiq-tool "${TARGETS[@]}"
  CTEST_ARGS+=(-L '^(session|server)$')
  export TSAN_OPTIONS="suppressions=$ROOT/scripts/tsan.supp ignore_noninstrumented_modules=1 halt_on_error=1 second_deadlock_stack=1 ${TSAN_OPTIONS:-}"
else
  cmake --build "$BUILD_DIR" -j "$JOBS"
fi
# OpenBLAS is not used; math threads per test process stay at 1 so that CTest's
# parallel jobs don't oversubscribe the cores.
export CORTIQ_THREADS="${CORTIQ_THREADS:-1}"
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS" --timeout 600 "${CTEST_ARGS[@]}"
