"""Writes tests/fixtures/kv_q8/reference.json: llama.cpp's q8_0 quantization (gguf-py's numpy
port of quantize_row_q8_0_ref) of a few blocks of 32 values, for the q8_0 KV cache test
(`kernels::kv_type::tests::q8_codes_match_llama_cpp`).

    .cache/venv/bin/python tools/ref_kv_q8.py
"""
import json
import pathlib

import numpy as np
from gguf.quants import quantize, GGMLQuantizationType

rng = np.random.default_rng(7)
blocks = [
    rng.uniform(-2, 2, 32),
    rng.normal(0, 0.05, 32),
    # Ties: with max 127 · 0.5 the step d is 0.5, so 0.25, 0.75, ... fall halfway.
    np.concatenate([[63.5, -63.5], np.arange(30) * 0.5 - 7.25]),
    np.concatenate([[1000.0], rng.uniform(-1, 1, 31)]),
    np.zeros(32),
    np.concatenate([[-3.0], np.zeros(31)]),
]
x = np.concatenate(blocks).astype(np.float32)
raw = quantize(x.reshape(1, -1), GGMLQuantizationType.Q8_0).reshape(-1, 34)
d = raw[:, :2].copy().view(np.float16).astype(np.float32).reshape(-1)
q = raw[:, 2:].copy().view(np.int8).reshape(-1)
out = pathlib.Path(__file__).resolve().parent.parent / "tests/fixtures/kv_q8/reference.json"
out.write_text(json.dumps({
    "generator": "tools/ref_kv_q8.py (gguf-py quants.Q8_0)",
    "x": [float(v) for v in x],
    "q": [int(v) for v in q],
    "d_f16": [float(v) for v in d],
}))
print(out, len(x), "values")
