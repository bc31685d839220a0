#!/usr/bin/env bash
# End-to-end: Debian's prometheus scrapes cortiq-server's /metrics.
#
#   prometheus_scrape_test.sh SERVER_BIN TOOL_BIN WORKDIR PROTO_PY
#
# Makes a random tiny model, starts cortiq-server (ports 0) and prometheus
# (scrape_interval 1s, job "cortiq"), keeps one session through a Generate
# call (Python grpcio client with the generated stubs), then asks prometheus's
# HTTP API until sum(cortiq_session_memory_bytes) equals the session's
# memory.total_bytes from the Generate summary, and checks up{job="cortiq"} == 1,
# the finished-request counter (grpc, length) and the memory utilisation ratio.
# Also lints a /metrics scrape with `promtool check metrics`. Exit 0 on success;
# every process started here is stopped on exit.
set -u

SERVER_BIN=${1:?usage: prometheus_scrape_test.sh SERVER_BIN TOOL_BIN WORKDIR PROTO_PY}
TOOL_BIN=${2:?missing TOOL_BIN}
WORK=${3:?missing WORKDIR}
PROTO_PY=${4:?missing PROTO_PY}
PY=/usr/bin/python3
PROMETHEUS=${PROMETHEUS:-/usr/bin/prometheus}
PROMTOOL=${PROMTOOL:-/usr/bin/promtool}

SERVER_PID=""
PROM_PID=""

# shellcheck disable=SC2317  # invoked by the EXIT trap
cleanup() {
  for pid in $PROM_PID $SERVER_PID; do
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid" 2>/dev/null
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -KILL "$pid" 2>/dev/null
      wait "$pid" 2>/dev/null
    fi
  done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

fail() {
  echo "FAIL: $*"
  for log in "$WORK/server.log" "$WORK/prometheus.log"; do
    [ -f "$log" ] && { echo "--- $(basename "$log") (tail) ---"; tail -n 25 "$log"; }
  done
  exit 1
}
pass() { echo "PASS: $*"; }

for tool in "$PY" "$PROMETHEUS" "$PROMTOOL" curl; do
  command -v "$tool" >/dev/null || fail "$tool is not installed"
done

rm -rf "$WORK"
mkdir -p "$WORK"

# ---- model and server --------------------------------------------------------
"$TOOL_BIN" mkmodel tiny "$WORK/model" --seed 1 >"$WORK/mkmodel.log" 2>&1 ||
  fail "cortiq-tool mkmodel tiny: $(tail -n 5 "$WORK/mkmodel.log")"

# stdout carries the listening line and the logs: into a file, so that a full
# pipe can never block the server.
env -u CORTIQ_AUTH_TOKEN "$SERVER_BIN" --model "$WORK/model" --listen 127.0.0.1:0 \
  --metrics-listen 127.0.0.1:0 --http-listen off --threads 2 >"$WORK/server.log" 2>&1 </dev/null &
SERVER_PID=$!

GRPC_PORT="" METRICS_PORT=""
for _ in $(seq 1 300); do  # 30 s
  line=$(grep -m1 -E '^listening on [^ ]+:[0-9]+ metrics [0-9]+' "$WORK/server.log" 2>/dev/null)
  if [ -n "$line" ]; then
    GRPC_PORT=$(sed -E 's/^listening on [^ ]+:([0-9]+) metrics ([0-9]+).*/\1/' <<<"$line")
    METRICS_PORT=$(sed -E 's/^listening on [^ ]+:([0-9]+) metrics ([0-9]+).*/\2/' <<<"$line")
    break
  fi
  kill -0 "$SERVER_PID" 2>/dev/null || fail "cortiq-server exited before listening"
  sleep 0.1
done
[ -n "$GRPC_PORT" ] || fail "no 'listening on' line from cortiq-server within 30 s"
[ "$METRICS_PORT" != 0 ] || fail "metrics are off (port 0)"
pass "cortiq-server on 127.0.0.1:$GRPC_PORT, metrics on 127.0.0.1:$METRICS_PORT"

# ---- promtool lint of a scrape (fresh here, again after a request) -------------
lint_metrics() {  # $1: file name suffix / label
  local out="$WORK/metrics-$1.txt" lint lint_rc
  curl -sSf --max-time 10 "http://127.0.0.1:$METRICS_PORT/metrics" >"$out" ||
    fail "GET /metrics failed"
  lint=$("$PROMTOOL" check metrics <"$out" 2>&1)
  lint_rc=$?
  if [ $lint_rc -ne 0 ] || [ -n "$lint" ]; then
    fail "promtool check metrics ($1, exit $lint_rc): $lint"
  fi
  pass "promtool check metrics ($1): clean, $(grep -c '^# TYPE' "$out") families, $(grep -vc '^#' "$out") samples"
}
lint_metrics fresh

# ---- prometheus ------------------------------------------------------------------
free_port() {
  "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

cat >"$WORK/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: cortiq
    static_configs:
      - targets: ['127.0.0.1:$METRICS_PORT']
EOF
"$PROMTOOL" check config "$WORK/prometheus.yml" >"$WORK/promtool-config.log" 2>&1 ||
  fail "promtool check config: $(cat "$WORK/promtool-config.log")"

PROM_PORT=""
for attempt in 1 2 3 4 5; do
  port=$(free_port) || fail "cannot pick a free port"
  rm -rf "$WORK/tsdb"
  "$PROMETHEUS" --config.file="$WORK/prometheus.yml" --storage.tsdb.path="$WORK/tsdb" \
    --web.listen-address="127.0.0.1:$port" --log.level=warn >"$WORK/prometheus.log" 2>&1 </dev/null &
  PROM_PID=$!
  for _ in $(seq 1 300); do  # 30 s
    if ! kill -0 "$PROM_PID" 2>/dev/null; then
      wait "$PROM_PID" 2>/dev/null
      PROM_PID=""
      break
    fi
    if curl -sf --max-time 2 "http://127.0.0.1:$port/-/ready" >/dev/null 2>&1; then
      PROM_PORT=$port
      break
    fi
    sleep 0.1
  done
  [ -n "$PROM_PORT" ] && break
  if [ -n "$PROM_PID" ]; then  # running but never ready: give up
    fail "prometheus on 127.0.0.1:$port not ready within 30 s"
  fi
  if grep -q "address already in use" "$WORK/prometheus.log"; then
    echo "port $port was taken, retrying ($attempt)"
    continue
  fi
  fail "prometheus exited: $(tail -n 5 "$WORK/prometheus.log")"
done
[ -n "$PROM_PORT" ] || fail "prometheus could not get a free port in 5 tries"
pass "prometheus ready on 127.0.0.1:$PROM_PORT"

# Runs an instant query; prints the single sample's value ("" when the result
# is empty).
prom_query() {
  curl -sf --max-time 5 -G "http://127.0.0.1:$PROM_PORT/api/v1/query" --data-urlencode "query=$1" |
    "$PY" -c '
import json, sys
try:
    d = json.load(sys.stdin)
except ValueError:
    sys.exit(0)
r = d.get("data", {}).get("result", []) if d.get("status") == "success" else []
if len(r) == 1:
    print(r[0]["value"][1])
'
}

# ---- a kept session --------------------------------------------------------------
TOTAL=$(CORTIQ_PROTO_PY="$PROTO_PY" "$PY" - "127.0.0.1:$GRPC_PORT" <<'EOF'
import os, sys
sys.path.insert(0, os.environ["CORTIQ_PROTO_PY"])
import grpc
from cortiq.v1 import inference_pb2 as pb2, inference_pb2_grpc as pb2_grpc
ch = grpc.insecure_channel(sys.argv[1])
stub = pb2_grpc.InferenceStub(ch)
req = pb2.GenerateRequest(prompt="Hello from prometheus", max_tokens=8, keep_session=True,
                          ignore_eos=True, sampling=pb2.SamplingParams(temperature=0.0))
msgs = list(stub.Generate(req, timeout=30))
s = msgs[-1].summary
assert msgs[-1].WhichOneof("event") == "summary", msgs[-1]
assert s.session_kept and s.memory.total_bytes > 0, s
info = stub.GetSession(pb2.GetSessionRequest(session_id=s.session_id), timeout=30)
assert info.memory.total_bytes == s.memory.total_bytes, (info.memory, s.memory)
print(s.memory.total_bytes)
EOF
) || fail "Generate with keep_session failed"
if ! [[ "$TOTAL" =~ ^[0-9]+$ ]] || [ "$TOTAL" -eq 0 ]; then
  fail "bad memory.total_bytes '$TOTAL'"
fi
pass "kept session holds $TOTAL bytes (Generate summary)"
lint_metrics after-generate

# ---- prometheus sees the bytes ----------------------------------------------------
start=$SECONDS
value=""
while [ $((SECONDS - start)) -lt 60 ]; do
  value=$(prom_query 'sum(cortiq_session_memory_bytes)')
  if [ -n "$value" ] && "$PY" -c 'import sys; sys.exit(0 if float(sys.argv[1]) == float(sys.argv[2]) else 1)' \
       "$value" "$TOTAL"; then
    break
  fi
  value="mismatch:${value:-empty}"
  sleep 0.5
done
[[ "$value" != mismatch:* ]] ||
  fail "sum(cortiq_session_memory_bytes) is ${value#mismatch:} after 60 s, want $TOTAL"
pass "prometheus: sum(cortiq_session_memory_bytes) = $value after $((SECONDS - start)) s"

up=$(prom_query 'up{job="cortiq"}')
[ "$up" = 1 ] || fail "up{job=\"cortiq\"} is '${up:-empty}', want 1"
pass "prometheus: up{job=\"cortiq\"} = 1"

active=$(prom_query 'cortiq_sessions_active{job="cortiq"}')
[ "$active" = 1 ] || fail "cortiq_sessions_active is '${active:-empty}', want 1"
pass "prometheus: cortiq_sessions_active = 1"

# The per-request series, as prometheus stores them: the Generate above ran to
# max_tokens on the gRPC front (counted once, with frontend="grpc"), and a
# node with no --memory-budget divides committed bytes by the machine's memory.
start=$SECONDS
finished=""
while [ $((SECONDS - start)) -lt 30 ]; do
  finished=$(prom_query 'cortiq_requests_finished_total{job="cortiq",frontend="grpc",finished_reason="length"}')
  [ "$finished" = 1 ] && break
  sleep 0.5
done
[ "$finished" = 1 ] || fail "cortiq_requests_finished_total{frontend=\"grpc\",finished_reason=\"length\"} is '${finished:-empty}', want 1"
others=$(prom_query 'sum(cortiq_requests_finished_total{job="cortiq"})')
[ "$others" = 1 ] || fail "sum(cortiq_requests_finished_total) is '${others:-empty}', want 1"
count=$(prom_query 'sum(cortiq_request_generation_tokens_sum{job="cortiq",frontend="grpc"})')
[ "$count" = 8 ] || fail "cortiq_request_generation_tokens_sum{frontend=\"grpc\"} is '${count:-empty}', want 8"
pass "prometheus: one finished request (grpc, length) of 8 generated tokens"
ratio=$(prom_query 'cortiq_memory_utilization_ratio{job="cortiq"}')
"$PY" -c 'import sys; v = float(sys.argv[1] or "nan"); sys.exit(0 if 0 < v < 1 else 1)' "$ratio" ||
  fail "cortiq_memory_utilization_ratio is '${ratio:-empty}', want in (0, 1) (committed / MemTotal)"
pass "prometheus: cortiq_memory_utilization_ratio = $ratio"

echo "OK"
exit 0
