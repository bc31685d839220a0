#!/usr/bin/env bash
# The `cortiq` command against a real cortiq-server on 127.0.0.1 (port 0),
# with a second one as its peer (the migration target): every command, its
# output, and its exit codes.
#   cli_e2e_test.sh SERVER_BIN CLI_BIN TOOL_BIN WORKDIR
set -euo pipefail
SERVER="$1" CLI="$2" TOOL="$3" WORK="$4"
rm -rf "$WORK" && mkdir -p "$WORK"
"$TOOL" mkmodel tiny "$WORK/model" --seed 1 >/dev/null
PIDS=()
# Stops the server under test before its peer (its drain may move sessions there).
trap 'for ((i=${#PIDS[@]}-1; i>=0; i--)); do kill -TERM "${PIDS[i]}" 2>/dev/null || true; wait "${PIDS[i]}" 2>/dev/null || true; done' EXIT
# start NAME FLAGS...: a server on a free port; its address in $ADDR.
start() {
  local name=$1
  shift
  "$SERVER" --model "$WORK/model" --listen 127.0.0.1:0 --metrics-listen off --http-listen off --threads 1 \
    --auth-token t0ken "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" &
  PIDS+=($!)
  for _ in $(seq 1 100); do grep -q '^listening on' "$WORK/$name.out" && break; sleep 0.1; done
  ADDR="$(sed -n 's/^listening on \([^ ]*\) .*/\1/p' "$WORK/$name.out")"
  [ -n "$ADDR" ] || { cat "$WORK/$name.err"; echo "FAIL: $name did not start"; exit 1; }
}
# The peer first (its port is chosen at start), then the server under test,
# which may migrate sessions to it.
start peer
PEER="$ADDR"
start server --peers "$PEER"
C=("$CLI" --server "$ADDR" --token t0ken)
fail() { echo "FAIL: $*"; exit 1; }

# health and model
[ "$("${C[@]}" health)" = SERVING ] || fail "health"
"${C[@]}" model | grep -q '"vocab_size": 259' || fail "model info"

# a one-shot generation streams text and a summary line
out="$("${C[@]}" generate --max-tokens 7 --temperature 0 --ignore-eos "Hello" 2>"$WORK/gen.err")"
[ -n "$out" ] || fail "generate printed nothing"
grep -q 'finish=length' "$WORK/gen.err" || fail "no summary: $(cat "$WORK/gen.err")"
grep -q 'completion_tokens=7' "$WORK/gen.err" || fail "wrong token count: $(cat "$WORK/gen.err")"
# greedy is deterministic
[ "$out" = "$("${C[@]}" generate --max-tokens 7 --temperature 0 --ignore-eos "Hello" 2>/dev/null)" ] \
  || fail "greedy differs"

# --keep prints the session id; sessions / session show / release
"${C[@]}" generate --keep --max-tokens 3 --temperature 0 "Hi" >/dev/null 2>"$WORK/keep.err"
ID="$(sed -n 's/^session: //p' "$WORK/keep.err")"
[ ${#ID} -eq 32 ] || fail "no session id: $(cat "$WORK/keep.err")"
"${C[@]}" sessions | grep -q "$ID" || fail "sessions does not list $ID"
"${C[@]}" session show "$ID" | grep -q '"tokens": "5"' || fail "session show: $("${C[@]}" session show "$ID")"
"${C[@]}" generate --session "$ID" --max-tokens 2 --temperature 0 " again" >/dev/null 2>&1 || fail "continue"
"${C[@]}" session release "$ID" | grep -q '^released [1-9][0-9]* bytes' || fail "release"
"${C[@]}" session release "$ID" | grep -q 'not found' || fail "second release"

# --json: one JSON object per message, the last one the summary
"${C[@]}" generate --json --max-tokens 3 --temperature 0 --ignore-eos "x" >"$WORK/gen.json"
[ "$(wc -l <"$WORK/gen.json")" -eq 4 ] || fail "json lines: $(cat "$WORK/gen.json")"
tail -1 "$WORK/gen.json" | grep -q '"summary"' || fail "json summary"

# tokenize
[ "$("${C[@]}" tokenize "hi")" = "104 105" ] || fail "tokenize: $("${C[@]}" tokenize "hi")"

# errors: the code and message on stderr, exit 1; usage errors exit 2
set +e
"${C[@]}" generate --temperature -1 "x" 2>"$WORK/err1"; rc=$?
[ $rc -eq 1 ] && grep -q 'INVALID_ARGUMENT: temperature' "$WORK/err1" || fail "bad temperature rc=$rc $(cat "$WORK/err1")"
"$CLI" --server "$ADDR" model 2>"$WORK/err2"; rc=$?
[ $rc -eq 1 ] && grep -q 'UNAUTHENTICATED' "$WORK/err2" || fail "no token rc=$rc $(cat "$WORK/err2")"
"${C[@]}" session show 0123456789abcdef0123456789abcdef 2>"$WORK/err3"; rc=$?
[ $rc -eq 1 ] && grep -q 'NOT_FOUND' "$WORK/err3" || fail "not found rc=$rc"
"${C[@]}" generate --max-tokens nope "x" 2>"$WORK/err4"; rc=$?
[ $rc -eq 2 ] && grep -q -- '--max-tokens' "$WORK/err4" || fail "usage rc=$rc"
"${C[@]}" export "$ID" -o "$WORK/x.wire" 2>"$WORK/err5"; rc=$?
[ $rc -eq 1 ] && grep -q 'NOT_FOUND' "$WORK/err5" || fail "export of a released session rc=$rc $(cat "$WORK/err5")"
set -e

# export / import / migrate (to the peer: it imports, then the source lets go)
"${C[@]}" generate --keep --max-tokens 3 --temperature 0 "Moby" >/dev/null 2>"$WORK/keep2.err"
ID2="$(sed -n 's/^session: //p' "$WORK/keep2.err")"
"${C[@]}" export "$ID2" -o "$WORK/s.wire" 2>/dev/null || fail "export"
[ -s "$WORK/s.wire" ] && [ "$(head -c4 "$WORK/s.wire")" = CQSW ] || fail "export file"
# The export carries the session's id (wire version 4): importing it while
# the session lives here is refused; released, it comes back under its id.
set +e
"${C[@]}" import "$WORK/s.wire" >/dev/null 2>"$WORK/err6"; rc=$?
set -e
[ $rc -eq 1 ] && grep -q 'ALREADY_EXISTS' "$WORK/err6" || fail "import of a live id rc=$rc $(cat "$WORK/err6")"
"${C[@]}" session release "$ID2" >/dev/null || fail "release before import"
ID3="$("${C[@]}" import "$WORK/s.wire")" || fail "import"
[ "$ID3" = "$ID2" ] || fail "import id '$ID3' is not the exported session's '$ID2'"
# Only a peer is a target: any other address is refused before it is dialled.
set +e
"${C[@]}" migrate "$ID2" --to 127.0.0.1:1 --peer-token t0ken 2>"$WORK/err7"; rc=$?
set -e
[ $rc -eq 1 ] && grep -q 'PERMISSION_DENIED' "$WORK/err7" && grep -q -- '--migrate-allow' "$WORK/err7" \
  || fail "migrate to a non-peer rc=$rc $(cat "$WORK/err7")"
"${C[@]}" session show "$ID2" >/dev/null || fail "a refused migration took the session"
"${C[@]}" migrate "$ID2" --to "$PEER" --peer-token t0ken >"$WORK/migrate.out" || fail "migrate"
grep -q "^migrated $ID2 to $PEER (node [^)]*) (" "$WORK/migrate.out" || fail "migrate: $(cat "$WORK/migrate.out")"
PEER_NODE="$(sed -n 's/^migrated [0-9a-f]* to [^ ]* (node \([^)]*\)).*/\1/p' "$WORK/migrate.out")"
# Gone from the source's own list...
"${C[@]}" sessions | grep -q "^$ID2 " && fail "the migrated session is still on the source"
# ...and still reachable through it: the source forwards to where it went.
"${C[@]}" session show "$ID2" >"$WORK/show.json" || fail "show through the source"
grep -q "\"node\": \"$PEER_NODE\"" "$WORK/show.json" || fail "show through the source: $(cat "$WORK/show.json")"
# It kept its id on the peer.
"$CLI" --server "$PEER" --token t0ken session show "$ID2" >/dev/null \
  || fail "the migrated session is not on the peer under its id"
echo "PASS: cortiq CLI end to end against $ADDR"
