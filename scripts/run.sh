#!/usr/bin/env bash
# Build, serve the embedded default model on localhost, and show a streamed
# generation through the gRPC API with the `cortiq` client, then one chat
# completion through the OpenAI-compatible HTTP API with curl.
#
#   scripts/run.sh [--once] [PROMPT]
#
# The server (cortiq-server) listens on 127.0.0.1:50051 (metrics on
# 127.0.0.1:9464/metrics, HTTP on 127.0.0.1:8080) and keeps serving until Ctrl-C; --once stops it
# after the demonstration. Extra server flags: CORTIQ_SERVER_FLAGS.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
ONCE=0
if [ "${1:-}" = "--once" ]; then ONCE=1; shift; fi
PROMPT="${1:-Call me Ishmael. Some years ago, never mind how long precisely, having little money in my purse,}"

bash scripts/bootstrap.sh
cmake -S . -B build -G Ninja >/dev/null
cmake --build build -j "$(nproc)" --target cortiq-server cortiq cortiq-tool

MODEL_FLAG=()
if [ ! -f models/cortiq-byte-4m/config.json ]; then
  # Only before the trained model is committed: random weights, noise output.
  build/tools/cortiq/cortiq-tool mkmodel tiny build/models/tiny --seed 1 >/dev/null
  MODEL_FLAG=(--model build/models/tiny)
  echo "warning: models/cortiq-byte-4m is missing; serving random weights (expect noise)"
fi

LOG="$(mktemp -t cortiq-server.XXXXXX.log)"
# shellcheck disable=SC2086
build/server/cortiq-server "${MODEL_FLAG[@]}" ${CORTIQ_SERVER_FLAGS:-} >"$LOG" 2>&1 &
SERVER_PID=$!
cleanup() { kill -TERM "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; }
trap cleanup EXIT INT TERM

for _ in $(seq 1 300); do
  if grep -q '^listening on' "$LOG"; then break; fi
  if ! kill -0 "$SERVER_PID" 2>/dev/null; then cat "$LOG"; echo "cortiq-server failed to start" >&2; exit 1; fi
  sleep 0.1
done
ADDR="$(sed -n 's/^listening on \([^ ]*\) .*/\1/p' "$LOG")"
echo "== cortiq-server on $ADDR (log: $LOG) =="
build/client/cortiq --server "$ADDR" model | head -12
echo "== streamed generation: cortiq generate =="
echo "$PROMPT"
build/client/cortiq --server "$ADDR" generate --max-tokens 120 --temperature 0.8 --top-p 0.95 --seed 7 "$PROMPT"

HTTP="$(sed -n 's/^http listening on \(.*\)$/\1/p' "$LOG")"
if [ -n "$HTTP" ] && command -v curl >/dev/null; then
  echo
  echo "== a chat completion over HTTP (OpenAI API): curl http://$HTTP/v1/chat/completions =="
  curl -sS "http://$HTTP/v1/chat/completions" -H 'Content-Type: application/json' -d '{
    "model": "cortiq-byte-4m", "max_tokens": 60, "temperature": 0.8, "seed": 7,
    "messages": [{"role": "user", "content": "Where is the white whale?"}]}'
  echo
fi

if [ "$ONCE" = 1 ]; then exit 0; fi
echo "== serving on $ADDR (metrics: http://127.0.0.1:9464/metrics); Ctrl-C to stop =="
echo "   try: build/client/cortiq --server $ADDR generate \"It was the best of times\""
wait "$SERVER_PID"
