#!/usr/bin/env bash
# Build and run every test: bootstrap (idempotent) + configure + build + CTest.
#   scripts/test.sh              all tests
#   scripts/test.sh --quick      skip tests labelled "slow"
#   scripts/test.sh --sanitize   ASan+UBSan build in build-asan/
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

BUILD_DIR=build
CMAKE_ARGS=()
CTEST_ARGS=()
for arg in "$@"; do
  case "$arg" in
    --quick) CTEST_ARGS+=(-LE slow) ;;
    --sanitize) BUILD_DIR=build-asan; CMAKE_ARGS+=(-DCORTIQ_SANITIZE=ON) ;;
    *) echo "usage: scripts/test.sh [--quick] [--sanitize]" >&2; exit 2 ;;
  esac
done

bash scripts/bootstrap.sh
JOBS="${JOBS:-$(nproc)}"
cmake -S . -B "$BUILD_DIR" -G Ninja "${CMAKE_ARGS[@]}" >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS"
# OpenBLAS is not used; math threads per test process stay at 1 so that CTest's
# parallel jobs don't oversubscribe the cores.
export CORTIQ_THREADS="${CORTIQ_THREADS:-1}"
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS" --timeout 600 "${CTEST_ARGS[@]}"
