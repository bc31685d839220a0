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

# mkmodel script: generate writes the text back (C escapes decoded), then stops.
"$TOOL" mkmodel script "$WORK/s" --text 'One, two.\nThree, four.' --after 'Count:' 2>/dev/null
OUT="$("$TOOL" generate --model "$WORK/s" --prompt 'Count:' --temperature 0 --max-tokens 50)"
[ "$OUT" == $'Count:One, two.\nThree, four.' ] || fail "mkmodel script generated '$OUT'"

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
# ppl with sink + window (sink 2, window 8: rows are dropped within the 64-token windows).
OUT="$("$TOOL" ppl --model "$WORK/m" --file "$WORK/text.txt" --window 64 --sink-window all --sw-sink 2 --sw-window 8)"
grep -q '^window: layers=\[0,1\] sink=2 window=8' <<<"$OUT" || fail "ppl --sink-window config: $OUT"
grep -Eq '^window +ppl [0-9.]+' <<<"$OUT" || fail "ppl --sink-window score: $OUT"
grep -Eq '^ratio [0-9.]+$' <<<"$OUT" || fail "ppl --sink-window ratio: $OUT"
set +e
"$TOOL" ppl --model "$WORK/m" --file "$WORK/text.txt" --qsa all --qsa-budget 1 >/dev/null 2>&1
[ $? -eq 2 ] || fail "--qsa-budget 1 should be a usage error"
"$TOOL" ppl --model "$WORK/m" --file "$WORK/text.txt" --qsa all --o1 all >/dev/null 2>&1
[ $? -eq 1 ] || fail "--qsa with --o1 should be refused"
set -e

# gguf: the model as one GGUF file, which every --model takes and which
# generates exactly what the directory does (f32); q8_0 is smaller.
"$TOOL" gguf --model "$WORK/m" --out "$WORK/m.gguf" 2>/dev/null || fail "gguf export"
"$TOOL" gguf --model "$WORK/m" --out "$WORK/m8.gguf" --type q8_0 2>/dev/null || fail "gguf q8_0 export"
[ "$(stat -c %s "$WORK/m8.gguf")" -lt "$(stat -c %s "$WORK/m.gguf")" ] || fail "q8_0 GGUF not smaller"
GD="$("$TOOL" generate --model "$WORK/m" --prompt "Hello" --max-tokens 12 --temperature 0)"
GF="$("$TOOL" generate --model "$WORK/m.gguf" --prompt "Hello" --max-tokens 12 --temperature 0)"
[ "$GD" == "$GF" ] || fail "GGUF generated '$GF', the directory '$GD'"

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

# The shared flag syntax (core/util/flags.h): --name=value is --name value;
# --help (anywhere, any command) prints the usage and exits 0; a usage error
# prints the message naming the flag and a hint on stderr and exits 2.
"$TOOL" mkmodel tiny "$WORK/m3" --seed=3 2>/dev/null
cmp -s "$WORK/m/model.safetensors" "$WORK/m3/model.safetensors" || fail "--seed=3 differs from --seed 3"
"$TOOL" --help | grep -q '^usage:' || fail "--help"
"$TOOL" ppl --help | grep -q '^usage:' || fail "ppl --help"
"$TOOL" help | grep -q '^usage:' || fail "help"
usage_error() {  # usage_error NEEDLE ARGS...: exit 2, NEEDLE and the hint on stderr
  local needle="$1" err rc
  shift
  set +e
  err="$("$TOOL" "$@" 2>&1 >/dev/null)"; rc=$?
  set -e
  [ $rc -eq 2 ] || fail "$* should exit 2 (got $rc)"
  grep -qF -- "$needle" <<<"$err" || fail "$* should say '$needle': $err"
  grep -qF "run 'cortiq-tool --help' for usage" <<<"$err" || fail "$* should print the hint: $err"
}
usage_error "unknown flag --port" --port abc
usage_error "unknown command 'frobnicate'" frobnicate
usage_error "--window: expected a non-negative integer" ppl --model "$WORK/m" --file "$WORK/text.txt" --window abc
usage_error "--window: must not be negative" ppl --model "$WORK/m" --file "$WORK/text.txt" --window=-1
usage_error "--qsa-budget: must be at least 2" ppl --model "$WORK/m" --file "$WORK/text.txt" --qsa-budget 1
usage_error "--kv: expected f32 or int8" logits --model "$WORK/m" --ids 1 --out "$WORK/x" --kv f16
usage_error "--activations: expected bf16 or f32" generate --model "$WORK/m" --prompt hi --activations f16
usage_error "--max-tokens: must be at least 1" generate --model "$WORK/m" --prompt hi --max-tokens 0
usage_error "--ids: must not be negative" logits --model "$WORK/m" --ids 1,-2 --out "$WORK/x"
usage_error "--file is required" ppl --model "$WORK/m"
usage_error "--seed needs a value" mkmodel tiny "$WORK/m4" --seed
usage_error "--dtype: expected f32, bf16 or f16" mkmodel tiny "$WORK/m4" --dtype f8
usage_error "mkmodel script needs --text" mkmodel script "$WORK/m4"
usage_error "--type: expected f32, f16, bf16 or q8_0" gguf --model "$WORK/m" --out "$WORK/x.gguf" --type q4_0
usage_error "--text, --after and --tokenizer-from are for mkmodel script only" mkmodel tiny "$WORK/m4" --text x
usage_error "--batches: must be at least 1" bench --batches 1,0
usage_error "--modes: each mode is one of exact, int8, o1, qsa" bench-context --modes exact,fast
usage_error "unexpected argument 'extra'" tokenize --tokenizer "$WORK/m/tokenizer.json" extra
usage_error "unknown flag --o1-rect for bench-context" bench-context --o1-rect fm
echo "cortiq-tool: all checks passed"
