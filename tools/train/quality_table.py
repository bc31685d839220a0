#!/usr/bin/env python3
"""Measures every attention mode on the held-out text with `cortiq-tool ppl`
(seed-002 protocol: 512-token windows, landmarks frozen at a 256-token
prefill, the rest teacher-forced decode) and prints the docs/QUALITY.md table
rows: perplexity and the ratio to exact attention over the same tokens.

  tools/train/quality_table.py --tool build/tools/cortiq/cortiq-tool \
      --model models/cortiq-byte-4m --file /tmp/heldout.txt --max-windows 64
"""
import argparse
import re
import subprocess
import sys
import time


def run(tool, model, text, windows, extra):
    cmd = [tool, "ppl", "--model", model, "--file", text, "--window", "512", "--prefill", "256",
           "--max-windows", str(windows)] + extra
    t0 = time.time()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    rows = re.findall(r"^(\S+)\s+ppl ([0-9.]+)\s+nll/token ([0-9.]+)\s+bits/byte ([0-9.]+)\s+\((\d+) tokens",
                      out, re.M)
    ratio = re.search(r"^ratio ([0-9.]+)", out, re.M)
    return rows, float(ratio.group(1)) if ratio else 1.0, time.time() - t0, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--file", required=True)
    ap.add_argument("--max-windows", type=int, default=64)
    ap.add_argument("--layers", type=int, default=6, help="model layers (for the deepest half)")
    a = ap.parse_args()
    deep = "deep%d" % (a.layers // 2)
    configs = [("exact f32", []), ("int8 KV", ["--kv", "int8"])]
    for layers in ["all", deep]:
        for m in [8, 16, 32]:
            for rect in ["agg", "fm"]:
                for sink in [0, 4]:
                    configs.append(("O(1) %s m=%d %s sink=%d" % (layers, m, rect, sink),
                                    ["--o1", layers, "--o1-m", str(m), "--o1-rect", rect,
                                     "--o1-sink", str(sink)]))
    # Sink + window (StreamingLLM) at the O(1) rows' W = 128: the near field
    # alone, without the Nystrom far field.
    for layers in ["all", deep]:
        for sink in [0, 4]:
            configs.append(("window %s W=128 sink=%d" % (layers, sink),
                            ["--sink-window", layers, "--sw-window", "128", "--sw-sink", str(sink)]))
    for budget in [4, 8, 16]:
        configs.append(("QSA all ratio=16 budget=%d" % budget,
                        ["--qsa", "all", "--qsa-ratio", "16", "--qsa-budget", str(budget)]))
    print("| mode | ppl | × exact | bits/byte | tokens |")
    print("|---|---|---|---|---|")
    for name, extra in configs:
        rows, ratio, secs, out = run(a.tool, a.model, a.file, a.max_windows, extra)
        mode_row = rows[-1] if rows else None
        if mode_row is None:
            print("| %s | (no result) | | | |" % name)
            sys.stderr.write(out)
            continue
        print("| %s | %.4f | ×%.4f | %.4f | %s |" % (name, float(mode_row[1]), ratio,
                                                    float(mode_row[3]), mode_row[4]))
        sys.stdout.flush()
        sys.stderr.write("%s: %.1f s\n" % (name, secs))


if __name__ == "__main__":
    main()
