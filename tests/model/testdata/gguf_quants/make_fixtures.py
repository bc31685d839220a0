#!/usr/bin/python3
"""Writes the dequantization fixtures of tests/model/gguf_test.cc.

For each of Q4_0, Q4_K and Q6_K: <type>.blocks (random blocks: every byte
uniform, except the f16 scales, drawn finite) and <type>.f32 (their values,
little-endian f32, as llama.cpp's gguf-py dequantizes them). Deterministic.
Run with llama.cpp's gguf-py on the path (reference only; the test reads the
committed files):
  PYTHONPATH=/work/llama/src/gguf-py /usr/bin/python3 make_fixtures.py
"""
import os
import numpy as np
from gguf import quants
from gguf.constants import GGMLQuantizationType as T, GGML_QUANT_SIZES

HERE = os.path.dirname(os.path.abspath(__file__))


def f16_bytes(rng, n, scale):
    # Finite scales of both signs, some tiny (subnormal f16), some zero.
    v = (rng.standard_normal(n) * scale).astype(np.float16)
    v[::7] = np.float16(0)
    v[3::11] = np.float16(3e-6)  # subnormal
    return v.view(np.uint8).reshape(n, 2)


def make(qtype, n_blocks, scale_fields, seed):
    rng = np.random.default_rng(seed)
    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for off in scale_fields:
        raw[:, off:off + 2] = f16_bytes(rng, n_blocks, 0.05)
    values = quants.dequantize(raw.reshape(-1), qtype).astype('<f4')
    assert values.size == n_blocks * block
    name = qtype.name.lower()
    raw.tofile(os.path.join(HERE, name + '.blocks'))
    values.tofile(os.path.join(HERE, name + '.f32'))


make(T.Q4_0, 24, [0], 1)          # d
make(T.Q4_K, 6, [0, 2], 2)        # d, dmin
make(T.Q6_K, 6, [208], 3)         # d (last)
