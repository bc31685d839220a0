#!/usr/bin/env python3
"""The embedded model: the C++ engine's held-out perplexity equals PyTorch's
within 0.1%.

PyTorch's side is a reference number committed beside the model
(models/<name>/reference_ppl.json, written by tools/train/make_reference.sh
with tools/train/eval_ppl.py on models/<name>/heldout_sample.txt); this test
runs `cortiq-tool ppl` with the same protocol on the same text and compares.

  default_model_agreement_test.py --tool cortiq-tool --model models/cortiq-byte-4m
"""
import argparse
import json
import os
import re
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tolerance", type=float, default=1e-3)
    a = ap.parse_args()
    ref_path = os.path.join(a.model, "reference_ppl.json")
    with open(ref_path) as f:
        ref = json.load(f)
    text = os.path.join(a.model, ref["file"])
    cmd = [a.tool, "ppl", "--model", a.model, "--file", text, "--window", str(ref["window"]),
           "--prefill", str(ref["prefill"])]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    m = re.search(r"^exact\s+ppl ([0-9.]+)\s+nll/token ([0-9.]+).*\((\d+) tokens scored", out, re.M)
    if not m:
        print(out)
        print("FAIL: no exact ppl line in cortiq-tool's output")
        return 1
    ppl, tokens = float(m.group(1)), int(m.group(3))
    rel = abs(ppl - ref["ppl"]) / ref["ppl"]
    print("C++ engine ppl %.4f over %d tokens; PyTorch ppl %.6f over %d tokens; relative difference %.2e"
          % (ppl, tokens, ref["ppl"], ref["tokens"], rel))
    if tokens != ref["tokens"]:
        print("FAIL: scored token counts differ")
        return 1
    if rel > a.tolerance:
        print("FAIL: differs by more than %.1e" % a.tolerance)
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
