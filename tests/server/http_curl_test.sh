#!/usr/bin/env bash
# The HTTP front's SSE framing as curl sees it: a real cortiq-server on free
# ports with the embedded model; streamed chat and completions answers are
# text/event-stream, chunked, and exactly a sequence of "data: <json>\n\n"
# events ending in "data: [DONE]\n\n" (each payload parses as JSON); errors
# are JSON with the right status.
#
# Usage: http_curl_test.sh SERVER_BIN WORKDIR
set -euo pipefail
SERVER="$1"
WORK="$2"
rm -rf "$WORK" && mkdir -p "$WORK"
command -v curl >/dev/null || { echo "SKIP: curl is missing"; exit 77; }

"$SERVER" --listen 127.0.0.1:0 --metrics-listen off --http-listen 127.0.0.1:0 --threads 1 \
  --grace 0 >"$WORK/server.out" 2>"$WORK/server.err" </dev/null &
PID=$!
trap 'kill -TERM $PID 2>/dev/null || true; wait $PID 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do
  grep -q '^http listening on' "$WORK/server.out" && break
  kill -0 $PID 2>/dev/null || { cat "$WORK/server.err"; echo "cortiq-server died" >&2; exit 1; }
  sleep 0.1
done
ADDR="$(sed -n 's/^http listening on \(.*\)$/\1/p' "$WORK/server.out")"
[ -n "$ADDR" ] || { echo "no 'http listening on' line" >&2; exit 1; }
BASE="http://$ADDR/v1"

fail() { echo "FAIL: $*" >&2; exit 1; }

# Checks one SSE body (file $1): the framing byte for byte, every payload
# JSON of `object` $2, the last event [DONE].
check_sse() {
  /usr/bin/python3 - "$1" "$2" <<'EOF'
import json, sys
body = open(sys.argv[1], "rb").read().decode("utf-8")
assert body.endswith("data: [DONE]\n\n"), repr(body[-40:])
events = body.split("\n\n")
assert events[-1] == "", "the body ends with an event's blank line"
events = events[:-1]
assert len(events) >= 3, events
for e in events:
    assert e.startswith("data: ") and "\n" not in e, repr(e)
for e in events[:-1]:
    j = json.loads(e[len("data: "):])
    assert j["object"] == sys.argv[2], j
print(f"{len(events)} events ok")
EOF
}

# Completions, streamed.
curl -sS -N -D "$WORK/c.headers" -o "$WORK/c.sse" "$BASE/completions" \
  -H 'Content-Type: application/json' \
  -d '{"model":"cortiq-byte-4m","prompt":"Call me Ishmael.","max_tokens":8,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}'
grep -qi '^content-type: text/event-stream' "$WORK/c.headers" || fail "completions: not text/event-stream"
grep -qi '^transfer-encoding: chunked' "$WORK/c.headers" || fail "completions: not chunked"
check_sse "$WORK/c.sse" text_completion || fail "completions SSE framing"

# Chat, streamed.
curl -sS -N -D "$WORK/chat.headers" -o "$WORK/chat.sse" "$BASE/chat/completions" \
  -H 'Content-Type: application/json' \
  -d '{"model":"cortiq-byte-4m","messages":[{"role":"user","content":"Where is the whale?"}],"max_tokens":8,"temperature":0,"stream":true}'
grep -qi '^content-type: text/event-stream' "$WORK/chat.headers" || fail "chat: not text/event-stream"
check_sse "$WORK/chat.sse" chat.completion.chunk || fail "chat SSE framing"

# An error is JSON with its status, even for a streamed request.
code="$(curl -sS -o "$WORK/err.json" -w '%{http_code}' "$BASE/chat/completions" \
  -H 'Content-Type: application/json' -d '{"messages":[],"stream":true}')"
[ "$code" = 400 ] || fail "empty messages: HTTP $code"
/usr/bin/python3 -c 'import json,sys; e=json.load(open(sys.argv[1]))["error"]; assert e["param"]=="messages", e' \
  "$WORK/err.json" || fail "error body"
code="$(curl -sS -o /dev/null -w '%{http_code}' "http://$ADDR/health")"
[ "$code" = 200 ] || fail "/health: HTTP $code"
echo "http curl test: ok"
