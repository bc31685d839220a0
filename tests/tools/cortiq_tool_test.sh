#!/usr/bin/env bash
# End-to-end check of cortiq-tool's stable usage: every sub-command on a tiny
# checkpoint the test writes, outputs checked, usage errors exit 2.
#   cortiq_tool_test.sh PATH/TO/cortiq-tool
set -euo pipefail
TOOL="$1"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$TOOL" mkmodel tiny "$WORK/m" --seed 3 2>/dev/null
for f in config.json model.safetensors tokenizer.json; do
  [ -s "$WORK/m/$f" ] || fail "mkmodel did not write $f"
done
"$TOOL" mkmodel tiny "$WORK/b" --dtype bf16 --seed 3 2>/dev/null
grep -q '"torch_dtype": "bfloat16"' "$WORK/b/config.json" || fail "bf16 config"
# Same seed, same bytes.
"$TOOL" mkmodel tiny "$WORK/m2" --seed 3 2>/dev/null
cmp -s "$WORK/m/model.safetensors" "$WORK/m2/model.safetensors" || fail "mkmodel is not deterministic"

# tokenize / detokenize round trip (byte-level tokenizer: one id per byte).
TEXT=$'Call me Ishmael. Ünïcödé 🐳 and <|im_end|>'
IDS="$(printf '%s' "$TEXT" | "$TOOL" tokenize --tokenizer "$WORK/m/tokenizer.json")"
[[ "$IDS" =~ ^[0-9]+( [0-9]+)*$ ]] || fail "tokenize output '$IDS'"
[[ " $IDS " == *" 258 "* ]] || fail "special token <|im_end|> not matched: $IDS"
BACK="$(printf '%s' "$IDS" | "$TOOL" detokenize --tokenizer "$WORK/m/tokenizer.json")"
[ "$BACK" == "$TEXT" ] || fail "detokenize gave '$BACK'"

# logits: vocab (259) little-endian f32 values; --ids and --prompt agree.
"$TOOL" logits --model "$WORK/m" --ids 67,97,108,108 --out "$WORK/a.bin"
[ "$(stat -c %s "$WORK/a.bin")" -eq $((259 * 4)) ] || fail "logits size"
"$TOOL" logits --model "$WORK/m" --prompt "Call" --out "$WORK/b.bin"
cmp -s "$WORK/a.bin" "$WORK/b.bin" || fail "--ids and --prompt logits differ"
"$TOOL" logits --model "$WORK/m" --ids 67,97,108,108 --kv int8 --out "$WORK/c.bin"

# ppl prints its figures.
printf 'It was the best of times, it was the worst of times. %.0s' {1..20} > "$WORK/text.txt"
OUT="$("$TOOL" ppl --model "$WORK/m" --file "$WORK/text.txt" --window 64)"
grep -Eq '^ppl [0-9.]+$' <<<"$OUT" || fail "ppl output: $OUT"
grep -Eq '^bits_per_byte [0-9.]+$' <<<"$OUT" || fail "ppl bits per byte: $OUT"
# ppl with QSA (blocks of 4, budget 4: inert bound 16 < the 32-token prefill):
# prints its config, the exact baseline and the ratio.
OUT="$("$TOOL" ppl --model "$WORK/m" --file "$WORK/text.txt" --window 64 --qsa all --qsa-ratio 4 --qsa-budget 4)"
grep -q '^qsa: layers=\[0,1\] ratio=4 budget=4' <<<"$OUT" || fail "ppl --qsa config: $OUT"
grep -Eq '^qsa +ppl [0-9.]+' <<<"$OUT" || fail "ppl --qsa score: $OUT"
grep -Eq '^ratio [0-9.]+$' <<<"$OUT" || fail "ppl --qsa ratio: $OUT"
set +e
"$TOOL" ppl --model "$WORK/m" --file "$WORK/text.txt" --qsa all --qsa-budget 1 >/dev/null 2>&1
[ $? -eq 2 ] || fail "--qsa-budget 1 should be a usage error"
"$TOOL" ppl --model "$WORK/m" --file "$WORK/text.txt" --qsa all --o1 all >/dev/null 2>&1
[ $? -eq 1 ] || fail "--qsa with --o1 should be refused"
set -e

# generate: prompt echoed, then tokens; seeded runs repeat exactly.
G1="$("$TOOL" generate --model "$WORK/m" --prompt "Hello" --max-tokens 12 --temperature 0.9 --seed 5)"
G2="$("$TOOL" generate --model "$WORK/m" --prompt "Hello" --max-tokens 12 --temperature 0.9 --seed 5)"
[[ "$G1" == Hello* ]] || fail "generate output '$G1'"
[ "$G1" == "$G2" ] || fail "seeded generation differs"

# Errors: usage → 2, runtime (bad model dir, bad token id) → 1 with a message.
set +e
"$TOOL" >/dev/null 2>&1; [ $? -eq 2 ] || fail "no command should exit 2"
"$TOOL" frobnicate >/dev/null 2>&1; [ $? -eq 2 ] || fail "unknown command should exit 2"
"$TOOL" logits --model "$WORK/m" --out "$WORK/x" >/dev/null 2>&1; [ $? -eq 2 ] || fail "missing --ids"
"$TOOL" generate --model "$WORK/m" --prompt hi --bogus 1 >/dev/null 2>&1; [ $? -eq 2 ] || fail "unknown flag"
ERR="$("$TOOL" logits --model "$WORK/nope" --ids 1 --out "$WORK/x" 2>&1)"; RC=$?
[ $RC -eq 1 ] || fail "missing model should exit 1 (got $RC)"
grep -q "config.json" <<<"$ERR" || fail "error should name config.json: $ERR"
ERR="$("$TOOL" logits --model "$WORK/m" --ids 1,999 --out "$WORK/x" 2>&1)"; RC=$?
[ $RC -eq 1 ] || fail "bad token id should exit 1"
grep -q "tokens\[1\]" <<<"$ERR" || fail "error should name tokens[1]: $ERR"
set -e
echo "cortiq-tool: all checks passed"
