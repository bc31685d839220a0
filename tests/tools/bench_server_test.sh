#!/usr/bin/env bash
# cortiq-bench-server's cluster modes run end to end on a small checkpoint:
# --hop (the proxied and the direct turns must stream the same tokens, be
# served by node b, and A must find the owner with one lookup) and
# --cluster 3 (every forwarded turn served by another node than the one
# called, none of the turns sent to the owner); --chat-turns (the same replies
# with reuse_prefix and without, the session holding the conversation from
# turn 2); the one-server mode still
# runs; usage errors exit 2. The figures themselves are not judged.
#   bench_server_test.sh PATH/TO/cortiq-bench-server MODEL_DIR
set -euo pipefail
BENCH="$1"
MODEL="$2"
fail() { echo "FAIL: $*" >&2; exit 1; }
SMALL=(--model "$MODEL" --max-tokens 8 --prompt-tokens 8)

OUT="$("$BENCH" "${SMALL[@]}" --hop --rounds 2)" || fail "--hop exited $?: $OUT"
grep -q '^same tokens on both paths: 3 of 3 turns$' <<<"$OUT" || fail "--hop tokens: $OUT"
grep -q 'lookups a made: 1 on the first turn' <<<"$OUT" || fail "--hop lookup: $OUT"
grep -Eq '^proxied \(a -> b\) +[0-9.]+ ' <<<"$OUT" || fail "--hop row: $OUT"
grep -q '^CPU .*; kernels [a-z0-9]*;' <<<"$OUT" || fail "--hop machine line: $OUT"

OUT="$("$BENCH" "${SMALL[@]}" --cluster 3 --streams 3,4 --rounds 1)" || fail "--cluster exited $?: $OUT"
for n in 3 4; do
  grep -Eq "^ +$n  one node .* 0/$n +\$" <<<"$OUT" || fail "--cluster one node, $n: $OUT"
  grep -Eq "^ +$n  3 nodes, forwarded .* $n/$n +\$" <<<"$OUT" || fail "--cluster forwarded, $n: $OUT"
  grep -Eq "^ +$n  3 nodes, to owner .* 0/$n +\$" <<<"$OUT" || fail "--cluster to owner, $n: $OUT"
done
grep -q 'the nodes share the cores\|in all on' <<<"$OUT" || fail "--cluster threads line: $OUT"

OUT="$("$BENCH" "${SMALL[@]}" --streams 1,2 --rounds 1)" || fail "one server exited $?: $OUT"
grep -q '^  through the server ' <<<"$OUT" || fail "one server: $OUT"
grep -Eq '^ +2 +[0-9.]+ ' <<<"$OUT" || fail "one server, 2 streams: $OUT"

# --chat-turns: every turn's reply the same with and without reuse_prefix, and
# from turn 2 on the session already holds most of the conversation.
OUT="$("$BENCH" "${SMALL[@]}" --chat-turns 3)" || fail "--chat-turns exited $?: $OUT"
grep -q '^same replies with and without reuse: 3 of 3 turns$' <<<"$OUT" || fail "--chat-turns replies: $OUT"
grep -Eq '^turn 3: time to first token [0-9.]+x shorter with reuse_prefix$' <<<"$OUT" ||
  fail "--chat-turns ratio line: $OUT"
CACHED="$(awk '$1 == 2 && NF == 6 { print $3 }' <<<"$OUT")"
PROMPT="$(awk '$1 == 2 && NF == 6 { print $2 }' <<<"$OUT")"
[ -n "$CACHED" ] && [ "$CACHED" -gt 0 ] && [ "$CACHED" -lt "$PROMPT" ] ||
  fail "--chat-turns turn 2 cached $CACHED of $PROMPT: $OUT"
grep -q '^CPU .*; kernels [a-z0-9]*;' <<<"$OUT" || fail "--chat-turns machine line: $OUT"

for args in "--hop --cluster 3" "--cluster 1" "--cluster 27" "--chat-turns 2 --hop"; do
  set +e
  ERR="$("$BENCH" $args 2>&1)"
  RC=$?
  set -e
  [ "$RC" -eq 2 ] || fail "'$args' exited $RC, not 2: $ERR"
  grep -q -- '--cluster\|--chat-turns' <<<"$ERR" || fail "'$args' message names no flag: $ERR"
done
# The kept sessions would outgrow the byte model's context: refused before a turn.
set +e
ERR="$("$BENCH" "${SMALL[@]}" --hop --rounds 100000 2>&1)"
RC=$?
set -e
[ "$RC" -eq 2 ] || fail "--rounds beyond the context exited $RC, not 2: $ERR"
grep -q -- "--rounds: .* beyond the model's context" <<<"$ERR" || fail "context message: $ERR"
echo PASS
