#!/usr/bin/env bash
# Writes the PyTorch side of the agreement test beside a trained model:
# models/<name>/heldout_sample.txt (the first WINDOWS × 512 bytes of the
# held-out split: public-domain text, never trained on) and
# models/<name>/reference_ppl.json (eval_ppl.py's perplexity on it, window
# 512, prefill 1: every position after the first of each window is scored).
#   tools/train/make_reference.sh models/cortiq-byte-4m [WINDOWS]
set -euo pipefail
MODEL="$1"
WINDOWS="${2:-24}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TMP="$(mktemp)"
/usr/bin/python3 "$ROOT/tools/train/train.py" --dump-heldout "$TMP" >/dev/null
head -c $((WINDOWS * 512)) "$TMP" | iconv -f utf-8 -t utf-8 -c > "$MODEL/heldout_sample.txt"
rm -f "$TMP"
OUT="$(/usr/bin/python3 "$ROOT/tools/train/eval_ppl.py" --model "$MODEL" --file "$MODEL/heldout_sample.txt" \
  --window 512 --prefill 1)"
echo "$OUT"
PPL="$(echo "$OUT" | sed -n 's/^ppl \([0-9.]*\)$/\1/p')"
TOKENS="$(echo "$OUT" | sed -n 's/.* \([0-9]*\) tokens scored$/\1/p')"
cat > "$MODEL/reference_ppl.json" <<JSON
{
  "file": "heldout_sample.txt",
  "window": 512,
  "prefill": 1,
  "ppl": $PPL,
  "tokens": $TOKENS,
  "by": "tools/train/eval_ppl.py (PyTorch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)'), float32)"
}
JSON
cat "$MODEL/reference_ppl.json"
