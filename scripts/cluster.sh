#!/usr/bin/env bash
# The local stand-in for the cluster: three cortiq-server nodes on loopback,
# each with the other two as --peers (any node serves any session: calls for a
# session another node holds are forwarded to it), and Debian's prometheus
# with the deploy rules.
#
#   scripts/cluster.sh up       start node a (127.0.0.1:50051, metrics :9464),
#                               node b (127.0.0.1:50052, metrics :9465),
#                               node c (127.0.0.1:50053, metrics :9466) and
#                               prometheus (http://127.0.0.1:9090)
#   scripts/cluster.sh status   health of every node, Prometheus readiness and targets
#   scripts/cluster.sh down     drain the nodes one by one, a, b, then c (SIGTERM;
#                               each waits for the previous to exit: a's kept
#                               sessions move to b or c, b's to c, c's have
#                               nowhere to go and stay in c's state directory,
#                               restored by the next `up`), then stop Prometheus
#
# Every node keeps its sessions in its own --state-dir, build/cluster/state-a,
# state-b, state-c: a node killed with kill -9 and started again (`up` starts
# only the nodes that are not running) restores its kept sessions before it
# serves. Remove the folders to start empty.
# Pids, logs, state and Prometheus' data live in build/cluster/. Prometheus'
# config is generated from deploy/prometheus/prometheus.yml (the `cortiq` job,
# targets on loopback) and uses deploy/prometheus/rules.yml as it is.
# Environment: CORTIQ_SERVER_FLAGS (extra flags for every node),
# CLUSTER_GRPC_PORTS (default "50051 50052 50053"), CLUSTER_METRICS_PORTS
# ("9464 9465 9466"), CLUSTER_PROMETHEUS_PORT (9090; a taken 9090, e.g. by Debian's
# prometheus.service, moves it to the next free port up to 9099),
# CLUSTER_DRAIN_TIMEOUT (seconds `down` waits for a node, default 60).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BUILD="$ROOT/build"
DIR="$BUILD/cluster"
SERVER="$BUILD/server/cortiq-server"
CLIENT="$BUILD/client/cortiq"
TOOL="$BUILD/tools/cortiq/cortiq-tool"
GRPC_PORTS_SPEC="${CLUSTER_GRPC_PORTS:-50051 50052 50053}"
METRICS_PORTS_SPEC="${CLUSTER_METRICS_PORTS:-9464 9465 9466}"
# status and down use the ports `up` used.
if [ "${1:-}" != up ] && [ -f "$DIR/ports" ]; then
  { read -r GRPC_PORTS_SPEC; read -r METRICS_PORTS_SPEC; } <"$DIR/ports"
fi
read -r -a GRPC_PORTS <<<"$GRPC_PORTS_SPEC"
read -r -a METRICS_PORTS <<<"$METRICS_PORTS_SPEC"
NODES=(a b c)
if [ ${#GRPC_PORTS[@]} -ne ${#NODES[@]} ] || [ ${#METRICS_PORTS[@]} -ne ${#NODES[@]} ]; then
  echo "cluster: CLUSTER_GRPC_PORTS and CLUSTER_METRICS_PORTS need ${#NODES[@]} ports each" >&2
  exit 2
fi
DRAIN_TIMEOUT="${CLUSTER_DRAIN_TIMEOUT:-60}"

usage() { echo "usage: scripts/cluster.sh up|down|status" >&2; exit 2; }

alive() {  # alive PIDFILE: the process runs (and is not a zombie)
  [ -f "$1" ] || return 1
  local pid state
  pid=$(cat "$1")
  kill -0 "$pid" 2>/dev/null || return 1
  state=$(ps -o stat= -p "$pid" 2>/dev/null || true)
  [ "${state:0:1}" != Z ]
}
port_taken() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

build_binaries() {
  local targets=()
  [ -x "$SERVER" ] || targets+=(cortiq-server)
  [ -x "$CLIENT" ] || targets+=(cortiq)
  if [ ! -f models/cortiq-byte-4m/config.json ] && [ ! -x "$TOOL" ]; then targets+=(cortiq-tool); fi
  if [ ${#targets[@]} -gt 0 ]; then
    echo "cluster: building ${targets[*]}"
    [ -f "$BUILD/build.ninja" ] || cmake -S . -B "$BUILD" -G Ninja >/dev/null
    cmake --build "$BUILD" --target "${targets[@]}"
  fi
}

# The model every node serves (a migration needs the same one on both sides).
model_flags() {
  if [ -f models/cortiq-byte-4m/config.json ]; then
    MODEL_FLAG=()
  else
    # Only before the trained model is committed: random weights, noise output.
    [ -f "$DIR/model/config.json" ] || "$TOOL" mkmodel tiny "$DIR/model" --seed 1 >/dev/null 2>&1
    MODEL_FLAG=(--model "$DIR/model")
    echo "cluster: warning: models/cortiq-byte-4m is missing; serving random weights"
  fi
}

start_node() {  # start_node INDEX
  local i=$1 name=${NODES[$1]} j peers=""
  local pidf="$DIR/node-$name.pid" log="$DIR/node-$name.log" state="$DIR/state-$name"
  local grpc=${GRPC_PORTS[$i]} metrics=${METRICS_PORTS[$i]}
  for j in "${!NODES[@]}"; do
    [ "$j" -eq "$i" ] || peers+="${peers:+,}127.0.0.1:${GRPC_PORTS[$j]}"
  done
  if alive "$pidf"; then echo "node $name: already running (pid $(cat "$pidf"))"; return 0; fi
  for p in "$grpc" "$metrics"; do
    if port_taken "$p"; then echo "node $name: port $p is taken (set CLUSTER_GRPC_PORTS / CLUSTER_METRICS_PORTS)" >&2; return 1; fi
  done
  mkdir -p "$state"
  # shellcheck disable=SC2086
  # The nodes speak gRPC to each other; no HTTP front (several would share 8080).
  "$SERVER" "${MODEL_FLAG[@]}" --listen "127.0.0.1:$grpc" --metrics-listen "127.0.0.1:$metrics" \
      --http-listen off --peers "$peers" --state-dir "$state" ${CORTIQ_SERVER_FLAGS:-} >"$log" 2>&1 &
  echo $! >"$pidf"
}

wait_node() {  # wait_node INDEX
  local name=${NODES[$1]}
  local pidf="$DIR/node-$name.pid" log="$DIR/node-$name.log"
  for _ in $(seq 1 300); do
    if grep -q '^listening on' "$log" 2>/dev/null; then
      echo "node $name: $(sed -n 's/^listening on \([^ ]*\) metrics \([0-9]*\).*/grpc \1, metrics 127.0.0.1:\2/p' "$log") (pid $(cat "$pidf"), log $log)"
      return 0
    fi
    if ! alive "$pidf"; then
      echo "node $name: cortiq-server exited; its log ($log):" >&2
      tail -n 20 "$log" >&2
      rm -f "$pidf"
      return 1
    fi
    sleep 0.1
  done
  echo "node $name: not listening after 30 s (log $log)" >&2
  return 1
}

prometheus_port() {
  if [ -f "$DIR/prometheus.port" ]; then cat "$DIR/prometheus.port"; else echo "${CLUSTER_PROMETHEUS_PORT:-9090}"; fi
}

start_prometheus() {
  local pidf="$DIR/prometheus.pid" port
  if alive "$pidf"; then echo "prometheus: already running (pid $(cat "$pidf"))"; return 0; fi
  port="${CLUSTER_PROMETHEUS_PORT:-9090}"
  if port_taken "$port"; then
    if [ -n "${CLUSTER_PROMETHEUS_PORT:-}" ]; then echo "prometheus: port $port is taken" >&2; return 1; fi
    local p
    for p in $(seq 9091 9099); do if ! port_taken "$p"; then break; fi; done
    if port_taken "$p"; then echo "prometheus: ports 9090-9099 are taken" >&2; return 1; fi
    echo "prometheus: 127.0.0.1:$port is taken (Debian's prometheus.service?); using $p"
    port=$p
  fi
  echo "$port" >"$DIR/prometheus.port"
  # The deploy config's `cortiq` job, scraping the loopback metric ports, with
  # the deploy rules by absolute path.
  /usr/bin/python3 - "$ROOT/deploy/prometheus/prometheus.yml" "$DIR/prometheus.yml" "$port" \
      "${METRICS_PORTS[@]}" <<'EOF'
import os, sys, yaml
src, dst, port, metrics_ports = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
cfg = yaml.safe_load(open(src))
base = os.path.dirname(os.path.abspath(src))
cfg["rule_files"] = [r if os.path.isabs(r) else os.path.join(base, r) for r in cfg.get("rule_files") or []]
cfg.setdefault("global", {}).setdefault("external_labels", {})["cluster"] = "cortiq-local"
jobs = []
for job in cfg.get("scrape_configs") or []:
    if job.get("job_name") == "cortiq":
        job["static_configs"] = [{"targets": ["127.0.0.1:%s" % p for p in metrics_ports]}]
    elif job.get("job_name") == "prometheus":
        job["static_configs"] = [{"targets": ["127.0.0.1:%s" % port]}]
    jobs.append(job)
cfg["scrape_configs"] = jobs
with open(dst, "w") as f:
    f.write("# Generated by scripts/cluster.sh from deploy/prometheus/prometheus.yml\n")
    yaml.safe_dump(cfg, f, sort_keys=False)
EOF
  if command -v promtool >/dev/null 2>&1; then promtool check config "$DIR/prometheus.yml" >/dev/null; fi
  mkdir -p "$DIR/prometheus-data"
  prometheus --config.file="$DIR/prometheus.yml" --storage.tsdb.path="$DIR/prometheus-data" \
      --web.listen-address="127.0.0.1:$port" >"$DIR/prometheus.log" 2>&1 &
  echo $! >"$pidf"
  for _ in $(seq 1 150); do
    if prom_get "/-/ready" >/dev/null 2>&1; then
      echo "prometheus: http://127.0.0.1:$port (pid $(cat "$pidf"), config $DIR/prometheus.yml, log $DIR/prometheus.log)"
      return 0
    fi
    if ! alive "$pidf"; then
      echo "prometheus exited; its log:" >&2; tail -n 20 "$DIR/prometheus.log" >&2; rm -f "$pidf"; return 1
    fi
    sleep 0.2
  done
  echo "prometheus: not ready after 30 s (log $DIR/prometheus.log)" >&2
  return 1
}

prom_get() {  # prom_get PATH: the body, exit 1 unless HTTP 200
  /usr/bin/python3 - "http://127.0.0.1:$(prometheus_port)$1" <<'EOF'
import sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=3) as r:
        sys.stdout.write(r.read().decode())
except Exception as e:
    sys.stdout.write(str(e))
    sys.exit(1)
EOF
}

stop() {  # stop NAME PIDFILE [LOG]
  local name=$1 pidf=$2 log=${3:-} pid note
  if ! alive "$pidf"; then rm -f "$pidf"; echo "$name: not running"; return 0; fi
  pid=$(cat "$pidf")
  kill -TERM "$pid"
  for _ in $(seq 1 $((DRAIN_TIMEOUT * 10))); do
    if ! alive "$pidf"; then
      rm -f "$pidf"
      note=""
      if [ -n "$log" ]; then
        note=$(sed -n 's/.*drain: \([0-9]* session(s) migrated, .* failed\).*/ (drain: \1)/p' "$log" | tail -n 1)
      fi
      echo "$name: stopped$note"
      return 0
    fi
    sleep 0.1
  done
  echo "$name: still running after ${DRAIN_TIMEOUT} s; SIGKILL" >&2
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$pidf"
  return 1
}

cmd_up() {
  mkdir -p "$DIR"
  local name any=0
  for name in "${NODES[@]}"; do alive "$DIR/node-$name.pid" && any=1; done
  if [ $any -eq 0 ]; then
    printf '%s\n%s\n' "$GRPC_PORTS_SPEC" "$METRICS_PORTS_SPEC" >"$DIR/ports"
  elif [ -f "$DIR/ports" ]; then
    { read -r GRPC_PORTS_SPEC; read -r METRICS_PORTS_SPEC; } <"$DIR/ports"
    read -r -a GRPC_PORTS <<<"$GRPC_PORTS_SPEC"
    read -r -a METRICS_PORTS <<<"$METRICS_PORTS_SPEC"
  fi
  build_binaries
  model_flags
  local rc=0 i
  for i in "${!NODES[@]}"; do
    if [ $rc -eq 0 ]; then start_node "$i" || rc=1; fi
  done
  for i in "${!NODES[@]}"; do
    if [ $rc -eq 0 ]; then wait_node "$i" || rc=1; fi
  done
  if [ $rc -eq 0 ]; then start_prometheus || rc=1; fi
  if [ $rc -ne 0 ]; then
    echo "cluster: start-up failed; stopping what started" >&2
    cmd_down >/dev/null 2>&1 || true
    return 1
  fi
  echo "try: $CLIENT --server 127.0.0.1:${GRPC_PORTS[0]} generate --keep \"It was\"   # prints the session id"
  echo "     $CLIENT --server 127.0.0.1:${GRPC_PORTS[0]} drain     # node a's sessions move to b or c, same ids"
  echo "     $CLIENT --server 127.0.0.1:${GRPC_PORTS[1]} generate --session ID \" on\"   # any node finds it"
}

cmd_down() {
  local rc=0 name
  # One node at a time, each after the previous one exited: a's kept sessions
  # migrate to b or c, which are still up, b's to c; c's then have no peer
  # left (logged, exit status 3, nothing else).
  for name in "${NODES[@]}"; do
    stop "node $name" "$DIR/node-$name.pid" "$DIR/node-$name.log" || rc=1
  done
  stop "prometheus" "$DIR/prometheus.pid" || rc=1
  rm -f "$DIR/prometheus.port" "$DIR/ports"
  return $rc
}

cmd_status() {
  local rc=0 i name pidf health
  for i in "${!NODES[@]}"; do
    name=${NODES[$i]}
    pidf="$DIR/node-$name.pid"
    if alive "$pidf"; then
      health=$("$CLIENT" --server "127.0.0.1:${GRPC_PORTS[$i]}" --timeout 3 health 2>&1) || rc=1
      echo "node $name: pid $(cat "$pidf"), 127.0.0.1:${GRPC_PORTS[$i]} $health"
    else
      echo "node $name: not running"; rc=1
    fi
  done
  if alive "$DIR/prometheus.pid"; then
    local ready
    if ready=$(prom_get "/-/ready"); then
      echo "prometheus: pid $(cat "$DIR/prometheus.pid"), http://127.0.0.1:$(prometheus_port) $(echo "$ready" | tr -d '\n')"
      prom_get "/api/v1/targets?state=active" | /usr/bin/python3 -c '
import json, sys
for t in json.load(sys.stdin)["data"]["activeTargets"]:
    err = t.get("lastError") or ""
    print("  target %-10s %-16s %s%s" % (t["labels"].get("job"), t["labels"].get("instance"), t["health"],
                                           (" (" + err + ")") if err else ""))' || true
    else
      echo "prometheus: not ready: $ready"; rc=1
    fi
  else
    echo "prometheus: not running"; rc=1
  fi
  return $rc
}

case "${1:-}" in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  *) usage ;;
esac
