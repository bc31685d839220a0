#!/usr/bin/env bash
# cortiq-bench-server's cluster modes run end to end on a small checkpoint:
# --hop (the proxied and the direct turns must stream the same tokens, be
# served by node b, and A must find the owner with one lookup) and
# --cluster 3 (every forwarded turn served by another node than the one
# called, none of the turns sent to the owner); --chat-turns (the same replies
# with reuse_prefix and without, the session holding the conversation from
# turn 2); the one-server mode still
# runs, with its steady-load table (--sustained) and int8 weights; --long-prompt and --tenants (the scheduler's scenarios, engine in
# process) print their tables; usage errors exit 2. The figures themselves are not judged.
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

# --sustained 6: the clients' starts are spread over one request's time as
# the 2-stream burst estimates it, and one slow burst (a 34 ms first token
# once, against 5 ms requests) put client 1's first measured request after
# client 0's last of 2; six leave a common window through such a hiccup.
OUT="$("$BENCH" "${SMALL[@]}" --streams 1,2 --rounds 1 --sustained 6 --weights int8)" ||
  fail "one server exited $?: $OUT"
grep -q '^  through the server ' <<<"$OUT" || fail "one server: $OUT"
grep -Eq '^ +2 +[0-9.]+ ' <<<"$OUT" || fail "one server, 2 streams: $OUT"
# --sustained: one row per client count above 1, over all 2 x 6 measured
# requests, none failed, with a window every client was in.
SUST="$(sed -n '/^sustained load/,$p' <<<"$OUT")"
grep -Eq '^ +2 +[0-9.]+ +[0-9.]+x +[0-9.]+ +[0-9.]+ +[0-9.]+x +12$' <<<"$SUST" ||
  fail "--sustained row: $OUT"
! grep -q 'failed\|no common window' <<<"$SUST" || fail "--sustained: $OUT"

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

# --long-prompt: one row per step budget; every budget's window held steps
# that mixed decode rows with the long prompt's chunks, none beyond the
# engine's bound on a step.
OUT="$("$BENCH" "${SMALL[@]}" --long-prompt 300 --streams 3 --step-tokens 24,64 --prefill-chunk 16 --rounds 1)" ||
  fail "--long-prompt exited $?: $OUT"
for b in 24 64; do
  grep -Eq "^\| $b \| [0-9.]+ \| [0-9.]+ / [0-9.]+ \| [0-9.]+ / [0-9.]+ \| [0-9.]+ \([0-9]+, [0-9]+\) \| [0-9.]+x \|\$" <<<"$OUT" ||
    fail "--long-prompt row $b: $OUT"
  grep -Eq "^step tokens $b: ITL p99 during the long prefill [0-9.]+ ms = [0-9.]+x the mean mixed step .* within max" <<<"$OUT" ||
    fail "--long-prompt line $b: $OUT"
done

# --tenants: the three phases, and both tenants served when both are backlogged.
OUT="$("$BENCH" "${SMALL[@]}" --tenants --streams 2 --max-batch 2 --tenant-weights flood=3,light=1 --rounds 1)" ||
  fail "--tenants exited $?: $OUT"
for phase in "light alone" "flood \\+ light now and then" "both backlogged"; do
  grep -Eq "^\| $phase \| [0-9.]+ \| [0-9.]+x \| [0-9.]+ / [0-9.]+ \| [0-9.]+ / [0-9.]+ \|\$" <<<"$OUT" ||
    fail "--tenants row '$phase': $OUT"
done
grep -Eq "^light's TTFT p50 under the flood: [0-9.]+x alone" <<<"$OUT" || fail "--tenants ttft line: $OUT"
grep -Eq '^both backlogged: light got [1-9][0-9.]* % of the generated tokens and [1-9][0-9.]* % of the prompt tokens absorbed; its weight share is 25.0 %' <<<"$OUT" ||
  fail "--tenants shares line: $OUT"

for args in "--hop --cluster 3" "--cluster 1" "--cluster 27" "--chat-turns 2 --hop" \
  "--tenants --long-prompt 10"; do
  set +e
  ERR="$("$BENCH" $args 2>&1)"
  RC=$?
  set -e
  [ "$RC" -eq 2 ] || fail "'$args' exited $RC, not 2: $ERR"
  grep -q -- '--cluster\|--chat-turns' <<<"$ERR" || fail "'$args' message names no flag: $ERR"
done
# Several step budgets are one engine each: only --long-prompt runs them.
set +e
ERR="$("$BENCH" "${SMALL[@]}" --step-tokens 32,64 2>&1)"
RC=$?
set -e
[ "$RC" -eq 2 ] && grep -q -- '--step-tokens: one value' <<<"$ERR" || fail "--step-tokens list: $RC $ERR"
set +e
ERR="$("$BENCH" --tenants --tenant-weights flood=0 2>&1)"
RC=$?
set -e
[ "$RC" -eq 2 ] && grep -q -- '--tenant-weights' <<<"$ERR" || fail "--tenant-weights 0: $RC $ERR"
# The kept sessions would outgrow the byte model's context: refused before a turn.
set +e
ERR="$("$BENCH" "${SMALL[@]}" --hop --rounds 100000 2>&1)"
RC=$?
set -e
[ "$RC" -eq 2 ] || fail "--rounds beyond the context exited $RC, not 2: $ERR"
grep -q -- "--rounds: .* beyond the model's context" <<<"$ERR" || fail "context message: $ERR"
echo PASS
