#!/usr/bin/env bash
# The container image, built and run for real: buildah builds the top-level
# Dockerfile, the server runs inside the image (buildah run, chroot isolation,
# host network) on a free loopback port, and a generation streams from it.
#
#   image_test.sh SOURCE_DIR CLIENT_BIN SERVER_BIN WORKDIR
#
# SERVER_BIN (the host build) serves the same model beside it: the image's
# greedy continuation must equal the host's token for token.
#
# Docker Hub is out of reach here, so the base image debian:bookworm is made
# when it is missing (once; buildah's image store keeps it): debootstrap
# --variant=minbase bookworm into a folder, the official image's apt sources,
# then imported with `buildah from scratch` + `buildah add` of its tar +
# `buildah commit docker.io/library/debian:bookworm`. The build itself is
# `buildah bud --isolation chroot --network host --format docker --layers`
# (docker format: OCI drops HEALTHCHECK; --layers caches each step, so a rerun
# with unchanged sources takes seconds, and one with changed sources rebuilds
# from the first COPY that changed).
#
# Exit 77 (CTest SKIP_RETURN_CODE) with a message when buildah is missing, the
# base image is missing and debootstrap too, or this is not root (debootstrap
# and buildah's chroot isolation as set up here need it). Label `slow`: a cold
# build takes minutes (deploy/README.md gives the figures).
# Environment: CORTIQ_IMAGE_TAG (cortiq-serve), CORTIQ_IMAGE_JOBS (parallel
# compile jobs inside the build; default ninja's), CORTIQ_DEBIAN_MIRROR
# (http://deb.debian.org/debian).
set -euo pipefail
ROOT="$(cd "$1" && pwd)" CLIENT="$2" SERVER="$3" WORK="$4"
TAG="${CORTIQ_IMAGE_TAG:-cortiq-serve}"
BASE=docker.io/library/debian:bookworm
MIRROR="${CORTIQ_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SKIP=77
fail() { echo "FAIL: $*"; exit 1; }
ok() { echo "ok    $*"; }
skip() { echo "SKIP: $*"; exit $SKIP; }
rm -rf "$WORK" && mkdir -p "$WORK"

command -v buildah >/dev/null 2>&1 ||
  skip "buildah is not installed (apt-get install -y buildah debootstrap); the image is not built here"
[ "$(id -u)" -eq 0 ] || skip "not root: debootstrap and buildah's chroot isolation need root here"

# --- the base image -----------------------------------------------------------
if buildah inspect --type image "$BASE" >/dev/null 2>&1; then
  ok "base image $BASE is present"
else
  command -v debootstrap >/dev/null 2>&1 ||
    skip "$BASE is missing and debootstrap is not installed (apt-get install -y debootstrap) to make it"
  echo "making $BASE with debootstrap --variant=minbase bookworm ($MIRROR)"
  rootfs="$WORK/rootfs"
  start=$SECONDS
  debootstrap --variant=minbase bookworm "$rootfs" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 ||
    { tail -n 20 "$WORK/debootstrap.log"; fail "debootstrap (log $WORK/debootstrap.log)"; }
  # What the official image has: bookworm, bookworm-updates and the security
  # suite in deb822 form; no package cache, no lists.
  rm -f "$rootfs/etc/apt/sources.list"
  cat >"$rootfs/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $MIRROR
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${MIRROR%/debian}/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -cf "$WORK/rootfs.tar" .
  rm -rf "$rootfs"
  ctr=$(buildah from scratch)
  buildah add "$ctr" "$WORK/rootfs.tar" / >/dev/null
  buildah config --cmd '["bash"]' "$ctr"
  buildah commit --quiet --rm "$ctr" "$BASE" >/dev/null
  rm -f "$WORK/rootfs.tar"
  ok "made $BASE in $((SECONDS - start)) s"
fi

# --- the build ----------------------------------------------------------------
jobs=()
[ -z "${CORTIQ_IMAGE_JOBS:-}" ] || jobs=(--build-arg "CORTIQ_BUILD_JOBS=$CORTIQ_IMAGE_JOBS")
echo "building $TAG from $ROOT/Dockerfile (log $WORK/build.log)"
start=$SECONDS
buildah bud --isolation chroot --network host --format docker --layers "${jobs[@]}" \
    -t "$TAG" "$ROOT" >"$WORK/build.log" 2>&1 ||
  { tail -n 40 "$WORK/build.log"; fail "buildah bud (log $WORK/build.log)"; }
ok "built $TAG in $((SECONDS - start)) s, $(buildah images --format '{{.Size}}' "$TAG" | head -n 1)"

# The image's configuration as the Dockerfile says (docker format keeps HEALTHCHECK).
buildah inspect --type image "$TAG" >"$WORK/inspect.json"
/usr/bin/python3 - "$WORK/inspect.json" >"$WORK/entrypoint" <<'EOF' || fail "image configuration"
import json, sys
d = json.load(open(sys.argv[1]))
c = d["Docker"]["config"]
def check(cond, what):
    print(("ok    " if cond else "FAIL: ") + what, file=sys.stderr)
    if not cond:
        sys.exit(1)
check(c.get("User") == "10001:10001", f"runs as 10001:10001 ({c.get('User')})")
check({"50051/tcp", "9464/tcp"} <= set(c.get("ExposedPorts") or {}), f"exposes 50051 and 9464 ({c.get('ExposedPorts')})")
hc = (c.get("Healthcheck") or {}).get("Test") or []
check("/usr/bin/cortiq" in hc and "health" in hc, f"HEALTHCHECK runs cortiq health ({hc})")
check(c.get("StopSignal") == "SIGTERM", f"STOPSIGNAL SIGTERM ({c.get('StopSignal')})")
ep = c.get("Entrypoint") or []
check(ep[:1] == ["/usr/bin/cortiq-server"], f"ENTRYPOINT starts cortiq-server ({ep})")
print("\n".join(ep))
EOF
mapfile -t ENTRYPOINT <"$WORK/entrypoint"

# --- run it -------------------------------------------------------------------
CTR=$(buildah from "$TAG")
RUN_PID="" HOST_PID=""
descendants() {  # descendants PID: every process below PID, children first
  local child
  for child in $(pgrep -P "$1" || true); do
    descendants "$child"
    echo "$child"
  done
}
stop_tree() {  # stop_tree PID: SIGTERM, 10 s, then SIGKILL to PID and what runs below it
  local pid=$1 tree deadline
  kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
  tree="$(descendants "$pid")"
  # `buildah run` answers SIGTERM by killing the process it runs (it does not
  # forward the signal), then exits; SIGKILL would orphan that process.
  kill -TERM "$pid" 2>/dev/null || true
  deadline=$((SECONDS + 10))
  while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.2; done
  # shellcheck disable=SC2086
  kill -KILL $tree "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}
cleanup() {
  local pid
  for pid in $RUN_PID $HOST_PID; do stop_tree "$pid"; done
  buildah rm "$CTR" >/dev/null 2>&1 || true
}
trap cleanup EXIT
run_in_image() { buildah run --isolation chroot --network host "$@"; }

# Secure by default: as shipped (0.0.0.0, no token) it refuses to start.
set +e
timeout 60 buildah run --isolation chroot --network host "$CTR" -- "${ENTRYPOINT[@]}" >"$WORK/refuse.log" 2>&1
rc=$?
set -e
if [ $rc -eq 0 ] || [ $rc -eq 124 ] || ! grep -q "without an auth token" "$WORK/refuse.log"; then
  fail "without a token on 0.0.0.0 the image should refuse to start (rc $rc): $(tail -n 3 "$WORK/refuse.log")"
fi
ok "the ENTRYPOINT as shipped refuses 0.0.0.0 without a token (exit $rc)"

# The ENTRYPOINT with flags appended, as compose `command` / Kubernetes `args`
# do: loopback on free ports (the last --listen wins), the token from the env.
TOKEN="$(head -c 24 /dev/urandom | od -An -tx1 -v | tr -d ' \n')"
# buildah itself in the background (not a function: $! must be buildah's pid).
buildah run --isolation chroot --network host --env "CORTIQ_AUTH_TOKEN=$TOKEN" "$CTR" -- "${ENTRYPOINT[@]}" \
    --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --http-listen 127.0.0.1:0 --threads 1 >"$WORK/server.out" 2>"$WORK/server.err" &
RUN_PID=$!
"$SERVER" --listen 127.0.0.1:0 --metrics-listen off --http-listen off --threads 1 >"$WORK/host.out" 2>"$WORK/host.err" &
HOST_PID=$!
wait_listening() {  # wait_listening OUT PID NAME: the "listening on" line, within 120 s
  local deadline=$((SECONDS + 120))
  while ! grep -q '^listening on' "$1"; do
    kill -0 "$2" 2>/dev/null || { cat "$1" "${1%.out}.err"; fail "$3 exited before listening"; }
    [ $SECONDS -lt $deadline ] || fail "$3 not listening after 120 s"
    sleep 0.2
  done
}
wait_listening "$WORK/server.out" "$RUN_PID" "the server in the image"
wait_listening "$WORK/host.out" "$HOST_PID" "the host server"
ADDR="$(sed -n 's/^listening on \([^ ]*\) .*/\1/p' "$WORK/server.out")"
METRICS_PORT="$(sed -n 's/^listening on [^ ]* metrics \([0-9]*\).*/\1/p' "$WORK/server.out")"
HOST_ADDR="$(sed -n 's/^listening on \([^ ]*\) .*/\1/p' "$WORK/host.out")"
grep -q "serving /usr/share/cortiq/model" "$WORK/server.out" "$WORK/server.err" ||
  fail "the server in the image does not serve the embedded model: $(head -n 5 "$WORK/server.out")"
ok "cortiq-server in the image listens on $ADDR (metrics :$METRICS_PORT), serving /usr/share/cortiq/model"

# The HEALTHCHECK's command, inside the image with the image's libraries.
health="$(run_in_image "$CTR" -- /usr/bin/cortiq --server "$ADDR" --timeout 10 health 2>&1)" ||
  fail "cortiq health in the image: $health"
[ "$health" = SERVING ] || fail "health: $health"
ok "cortiq health inside the image: SERVING"

# The token is enforced.
set +e
CORTIQ_TOKEN="" "$CLIENT" --server "$ADDR" --timeout 30 model >/dev/null 2>"$WORK/noauth.err"
rc=$?
set -e
if [ $rc -ne 1 ] || ! grep -q UNAUTHENTICATED "$WORK/noauth.err"; then
  fail "no token: rc $rc $(cat "$WORK/noauth.err")"
fi
ok "a call without the token is UNAUTHENTICATED"

# A generation streams: one message per token, then the summary.
N=24
CORTIQ_TOKEN="$TOKEN" "$CLIENT" --server "$ADDR" --timeout 120 generate --json --max-tokens $N \
    --temperature 0 --ignore-eos "It was a bright cold day" >"$WORK/gen.json" 2>"$WORK/gen.err" ||
  fail "generate: $(cat "$WORK/gen.err")"
/usr/bin/python3 - "$WORK/gen.json" "$N" <<'EOF' || fail "the stream from the image"
import json, sys
msgs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
n = int(sys.argv[2])
tokens = [m["token"] for m in msgs if "token" in m]
summary = msgs[-1].get("summary") if msgs else None
assert len(tokens) == n, f"{len(tokens)} token messages, expected {n}"
assert summary is not None and int(summary["usage"]["completion_tokens"]) == n, f"summary {summary}"
print(f"ok    {n} tokens streamed from the image, one message each: {''.join(t['text'] for t in tokens)!r}")
EOF
"$CLIENT" --server "$HOST_ADDR" --timeout 120 generate --json --max-tokens $N --temperature 0 --ignore-eos \
    "It was a bright cold day" >"$WORK/host.json" 2>"$WORK/host_gen.err" || fail "host generate: $(cat "$WORK/host_gen.err")"
ids() { /usr/bin/python3 -c 'import json,sys; print(" ".join(str(json.loads(l)["token"].get("token_id", 0)) for l in open(sys.argv[1]) if "\"token\"" in l))' "$1"; }
[ "$(ids "$WORK/gen.json")" = "$(ids "$WORK/host.json")" ] ||
  fail "greedy tokens differ: image $(ids "$WORK/gen.json") / host $(ids "$WORK/host.json")"
ok "the image's greedy continuation equals the host build's, token for token"

# /metrics counts the generation.
/usr/bin/python3 - "http://127.0.0.1:$METRICS_PORT/metrics" "$N" <<'EOF' || fail "/metrics"
import re, sys, urllib.request
body = urllib.request.urlopen(sys.argv[1], timeout=10).read().decode()
m = re.search(r"^cortiq_generated_tokens_total(?:\{[^}]*\})? ([0-9.e+]+)$", body, re.M)
assert m and float(m.group(1)) >= int(sys.argv[2]), f"cortiq_generated_tokens_total: {m and m.group(0)}"
print(f"ok    /metrics: {m.group(0)}")
EOF

# Stop as a deployment does: a drain (the preStop hook's command), after
# which the process exits 0.
CORTIQ_TOKEN="$TOKEN" "$CLIENT" --server "$ADDR" --timeout 60 drain >"$WORK/drain.out" 2>&1 ||
  fail "drain: $(cat "$WORK/drain.out")"
deadline=$((SECONDS + 60))
while kill -0 "$RUN_PID" 2>/dev/null; do
  [ $SECONDS -lt $deadline ] || fail "the server in the image still runs 60 s after its drain"
  sleep 0.2
done
set +e
wait "$RUN_PID"
rc=$?
set -e
RUN_PID=""
[ $rc -eq 0 ] || fail "the server in the image exited $rc after the drain: $(tail -n 5 "$WORK/server.out")"
ok "drained: $(cat "$WORK/drain.out"); the server in the image exited 0"
echo "PASS"
