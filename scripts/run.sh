#!/usr/bin/env bash
# Build, then show a streamed generation from the engine.
#
# Until the gRPC service and the embedded trained model land (their issues are
# open), this runs the engine locally (`cortiq-tool generate`) on a random-
# weight checkpoint of the `tiny` shape that it writes under build/models/.
# Its output is therefore noise in English letters; the pipeline is real.
#   scripts/run.sh [PROMPT]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/bootstrap.sh
cmake -S . -B build -G Ninja >/dev/null
cmake --build build -j "$(nproc)" --target cortiq-tool
TOOL=build/tools/cortiq/cortiq-tool
MODEL=build/models/tiny
if [ ! -f "$MODEL/config.json" ]; then
  "$TOOL" mkmodel tiny "$MODEL" --seed 1
fi
PROMPT="${1:-Call me Ishmael. Some years ago, never mind how long precisely,}"
echo "== streamed generation from $MODEL (random weights until the trained model lands: expect noise) =="
"$TOOL" generate --model "$MODEL" --prompt "$PROMPT" --max-tokens 64 --temperature 0.8 --seed 7
