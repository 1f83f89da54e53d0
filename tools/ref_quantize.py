#!/usr/bin/env python3
"""numpy reference for `trit convert --quantize` → tests/fixtures/quantize/reference.json

The rule (BitNet b1.58's absmean, per group of G consecutive inputs of a row):
    s = f16(mean |w|)            (round to nearest; the scale every ternary format stores)
    t = clip(rint(w / s), -1, 1) (round half to even; t = 0 where s == 0)

The weights are a pure function of (tensor index, element index) that Rust recomputes bit for
bit (see `weight` below and crates/trit/tests/quantize_reference.rs), so no model is committed:
    u = splitmix64_mix(tensor << 32 | i) + golden (wrapping);  m = (u >> 40) - 2^23
    e = 30 + row % 4, minus 3 when (u & 255) < 3 (outliers);  w = m · 2^-e   (exact in f32)
For each projection and G in {128, 256}: the scales (f16 bits), the number of each code and the
CRC-32 of the codes (one byte t + 1 per weight, row-major), plus ‖W − W_q‖ / ‖W‖.

  python3 tools/ref_quantize.py        (numpy only)
"""

import json
import os
import sys
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ref_smollm2 import dump_json  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(REPO, "tests", "fixtures", "quantize", "reference.json")
M64 = np.uint64(0xFFFFFFFFFFFFFFFF)
GOLDEN = np.uint64(0x9E3779B97F4A7C15)
# The tiny full-precision model of the test: qwen3, hidden 256, 1 layer, 4 heads of 64, one
# KV head, ffn 256, vocab 512. Index = tensor id of the generator.
TENSORS = [
    ("model.embed_tokens.weight", (512, 256)),
    ("model.layers.0.self_attn.q_proj.weight", (256, 256)),
    ("model.layers.0.self_attn.k_proj.weight", (64, 256)),
    ("model.layers.0.self_attn.v_proj.weight", (64, 256)),
    ("model.layers.0.self_attn.o_proj.weight", (256, 256)),
    ("model.layers.0.mlp.gate_proj.weight", (256, 256)),
    ("model.layers.0.mlp.up_proj.weight", (256, 256)),
    ("model.layers.0.mlp.down_proj.weight", (256, 256)),
]


def mix64(z):
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def weight(tensor, shape):
    rows, cols = shape
    i = np.arange(rows * cols, dtype=np.uint64)
    with np.errstate(over="ignore"):
        u = mix64((np.uint64(tensor) << np.uint64(32)) | i) + GOLDEN
    m = (u >> np.uint64(40)).astype(np.int64) - (1 << 23)
    row = (np.arange(rows * cols) // cols).astype(np.int64)
    e = 30 + row % 4 - 3 * ((u & np.uint64(255)) < np.uint64(3)).astype(np.int64)
    return (m.astype(np.float64) * np.exp2(-e.astype(np.float64))).astype(np.float32) \
        .reshape(rows, cols)


def absmean(w, group):
    rows, cols = w.shape
    g = w.astype(np.float64).reshape(rows, cols // group, group)
    s = np.abs(g).mean(axis=2).astype(np.float16)
    s64 = s.astype(np.float64)[:, :, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(s64 == 0, 0.0, np.clip(np.rint(g / s64), -1, 1))
    codes = (t + 1).astype(np.uint8).reshape(rows, cols)
    deq = (t * s64).reshape(rows, cols)
    rel = float(np.linalg.norm(deq - w) / np.linalg.norm(w.astype(np.float64)))
    return s, codes, rel


def main():
    out = {"rule": "s = f16(mean|w|) per group; t = clip(rint(w/s), -1, 1)",
           "numpy": np.__version__, "tensors": {}}
    for k, (name, shape) in enumerate(TENSORS):
        w = weight(k, shape)
        entry = {"shape": list(shape), "w_first4": [float(x) for x in w.reshape(-1)[:4]],
                 "w_sum_abs": float(np.abs(w.astype(np.float64)).sum())}
        if "layers" in name:
            for group in (128, 256):
                s, codes, rel = absmean(w, group)
                entry[f"g{group}"] = {
                    "scales_f16_bits": s.view(np.uint16).reshape(-1).tolist(),
                    "code_counts": [int((codes == c).sum()) for c in range(3)],
                    "codes_crc32": zlib.crc32(codes.tobytes()),
                    "rel_fro": rel,
                }
        out["tensors"][name] = entry
    dump_json(out, OUT)
    print("wrote", OUT)


if __name__ == "__main__":
    main()
