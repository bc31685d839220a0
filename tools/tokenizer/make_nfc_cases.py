#!/usr/bin/python3
"""Writes tests/tokenizer/data/nfc_cases.jsonl: NFC test vectors computed by
Python's unicodedata (the same Unicode version as our generated tables).

Each line is {"in": "...", "nfc": "..."}. Cases: every character with a
canonical decomposition, as itself and as its NFD; every character with a
non-zero combining class after a base letter; and random sequences of
starters, Hangul jamo and combining marks (fixed seed).

  /usr/bin/python3 tools/tokenizer/make_nfc_cases.py
"""

import json
import os
import random
import unicodedata

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "tokenizer", "data", "nfc_cases.jsonl")


def main():
    rng = random.Random(1234)
    decomposable = []
    marks = []
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        ch = chr(cp)
        d = unicodedata.decomposition(ch)
        if d and not d.startswith("<"):
            decomposable.append(ch)
        if unicodedata.combining(ch):
            marks.append(ch)
    inputs = []
    for ch in decomposable:
        inputs.append(ch)
        inputs.append(unicodedata.normalize("NFD", ch))
    for m in marks:
        inputs.append("a" + m)
    # A sample of Hangul syllables and jamo sequences.
    for _ in range(200):
        l = chr(0x1100 + rng.randrange(19))
        v = chr(0x1161 + rng.randrange(21))
        t = chr(0x11A7 + rng.randrange(28)) if rng.random() < 0.6 else ""
        inputs.append(l + v + t)
    starters = "aeiouAEIOUnNcCsSzZ" + "".join(decomposable[:200]) + "가각ᄀ"
    for _ in range(2000):
        s = []
        for _ in range(rng.randint(1, 8)):
            r = rng.random()
            if r < 0.45:
                s.append(rng.choice(starters))
            elif r < 0.9:
                s.append(rng.choice(marks))
            else:
                s.append(chr(rng.choice([0x1161, 0x1175, 0x11A8, 0x11C2, 0x0CD5, 0x0CC2])))
        inputs.append("".join(s))
    with open(OUT, "w", encoding="ascii", newline="\n") as f:
        for text in inputs:
            f.write(json.dumps({"in": text, "nfc": unicodedata.normalize("NFC", text)},
                               ensure_ascii=True) + "\n")
    print("wrote %d NFC cases to %s (Unicode %s)" %
          (len(inputs), os.path.relpath(OUT, ROOT), unicodedata.unidata_version))


if __name__ == "__main__":
    main()
