#!/usr/bin/python3
"""PyTorch perplexity of a tools/train artefact on a text file, with the same
protocol as `cortiq-tool ppl`: the text is NFC-normalised and byte-tokenised,
cut into non-overlapping --window windows from the start; in each window the
positions [--prefill, n) are scored by full-window teacher forcing.

  /usr/bin/python3 tools/train/eval_ppl.py --model DIR --file TEXT --window 512 --prefill 1 [--max-windows 4]
"""
import argparse
import math
import os
import sys
import unicodedata

# Debian's OpenBLAS 0.3.21 does not recognise this CPU family and falls back
# to generic kernels; on AVX-512 machines the SkylakeX kernels are ~3x faster.
# Must be set before torch (and with it OpenBLAS) loads.
import os as _os
try:
    with open("/proc/cpuinfo") as _f:
        if " avx512f" in _f.read():
            _os.environ.setdefault("OPENBLAS_CORETYPE", "SkylakeX")
except OSError:
    pass

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--file", required=True)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--prefill", type=int, default=None, help="default window/2, like cortiq-tool ppl")
    ap.add_argument("--max-windows", type=int, default=None)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    prefill = a.prefill if a.prefill is not None else a.window // 2
    with open(a.file, "rb") as f:
        text = unicodedata.normalize("NFC", f.read().decode("utf-8"))
    ids = train.encode(text)
    model = train.load_model(a.model)
    nll, n = train.eval_windows(model, ids, a.window, prefill=prefill, max_windows=a.max_windows)
    print("text: %s, %d bytes; window %d, prefill %d; %d tokens scored" %
          (a.file, len(ids), a.window, prefill, n))
    print("ppl %.6f\nnll/token %.6f\nbits_per_byte %.6f" % (math.exp(nll / n), nll / n, nll / n / math.log(2)))


if __name__ == "__main__":
    main()
