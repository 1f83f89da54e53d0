#!/usr/bin/env python3
"""mlx-lm reference for trit's random BitNet b1.58 model → tests/fixtures/bitnet/<preset>.*

The model is written by trit's generator (format::testgen::bitnet; a pure function of preset and
seed, so the Rust test regenerates the same files) in the Hugging Face layout of
microsoft/bitnet-b1.58-2B-4T (uint8 [out/4, in] projections, 4 output rows per byte, bf16
`weight_scale`, `quantization_config.linear_class: bitlinear`):
  cargo run --release -p trit --example gen_model -- --preset tiny-bitnet --seed 0 --formats hf --out DIR
and run through mlx-lm 0.32.2's own `bitnet` model (mlx 0.32.x, CPU, parameters cast to f32).

One substitution, because mlx-lm cannot run BitNet on this machine: its `BitLinear` computes
through a Metal-only kernel (`mx.fast.metal_kernel`: "No Metal back-end" on Linux). We replace
`BitLinear.__call__` with the same arithmetic in plain mlx ops (unpack byte row p, bits 2i..2i+2 →
output row p + i·out/4, value code − 1; matmul in f32; scale as the kernel applies it), and set
each layer's `invert_weight_scales` by mlx-lm's own rule in `bitnet_quantize` (divide unless
`linear_class == "autobitlinear"`). NB: mlx-lm's `bitnet.py` builds its BitLinear layers itself,
so `bitnet_quantize` never reaches them and they keep `invert_weight_scales=False` (multiply):
with the divide rule of transformers' `BitLinear` (which 2B4T's `bitlinear` class means) the
loaded model would be wrong. We follow the config, i.e. transformers' semantics. Everything else
(block, sub-norms, relu², RoPE, GQA attention, cache) is mlx-lm's code, unchanged.

Second, independent reader of the same folder: transformers' `BitNetForCausalLM` (its own
unpacking, `BitLinear` dividing by `weight_scale`, CPU, f32), run twice: as shipped, with its
per-token int8 activation quantization (W1.58A8: <preset>.<prompt>.transformers_a8.f32), and with
that quantization switched off (`activation_quant` returning the input and scale 1:
<preset>.<prompt>.transformers_f32.f32), which must equal mlx-lm's f32 logits.

For each prompt (a short one and one of 300 tokens, longer than trit's MLP chunk of 256) we record
the last-position logits (<preset>.<prompt>.f32, f32 LE, every 125th id; the 32 largest in the
JSON) and a 24-step greedy continuation with
the top-1/top-2 gap at every step (<preset>.json). Checks on the reference itself: cached decode
equals a full forward over prompt + generated ids, and logits are finite and not flat.

  python3 -m venv .cache/venv && .cache/venv/bin/pip install "mlx[cpu]==0.32.4" "mlx-lm==0.32.2" \
      numpy torch==2.15.0 transformers==5.24.0 accelerate
  .cache/venv/bin/python tools/ref_bitnet.py [--preset tiny-bitnet]
"""

import argparse
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 24
SAMPLE_STEP = 125  # logits stored at ids 0, 125, 250, … (1,027 of 128,256: keeps fixtures small)
TOP = 32  # plus the 32 largest logits, ids and values


def gap(logits):
    two = np.partition(logits.astype(np.float64), -2)[-2:]
    return float(two[1] - two[0])


def check_logits(name, logits):
    if not np.isfinite(logits).all():
        raise RuntimeError(f"{name}: non-finite logits")
    if float(np.std(logits)) < 1e-3:
        raise RuntimeError(f"{name}: logits are (nearly) constant")


def prompts(vocab):
    short = [128000, 9906, 11, 856, 5679, 374, 19369, 13, 578, 4062, 14198, 39935]
    long_ = [(17 + 389 * i) % vocab for i in range(300)]
    return {"short": short, "long": long_}


def generate(preset, seed, out):
    cmd = ["cargo", "run", "--release", "-p", "trit", "--example", "gen_model", "--",
           "--preset", preset, "--seed", str(seed), "--out", out, "--formats", "hf"]
    subprocess.run(cmd, check=True, cwd=REPO)


def cpu_bitlinear(self, x):
    """mlx-lm's bitlinear_matmul kernel, in mlx ops (see the module docstring)."""
    import mlx.core as mx
    w = self.weight  # uint8 [out/4, in]
    rows = [((w >> (2 * i)) & 3).astype(mx.float32) - 1.0 for i in range(4)]
    wf = mx.concatenate(rows, axis=0)[: self.out_features]  # [out, in]
    s = self.weight_scale.astype(mx.float32)[0]
    scale = 1.0 / s if self.invert_weight_scales else s
    y = (x.astype(mx.float32) @ wf.T) * scale
    if self.bias is not None:
        y = y + self.bias
    return y.astype(x.dtype)


def load(folder):
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.models import bitlinear_layers
    from mlx_lm.utils import load_model

    bitlinear_layers.BitLinear.__call__ = cpu_bitlinear
    model, config = load_model(Path(folder))
    model.set_dtype(mx.float32)
    qc = config.get("quantization_config", {})
    invert = qc.get("linear_class", "") != "autobitlinear"
    n = 0
    for _, m in model.named_modules():
        if isinstance(m, bitlinear_layers.BitLinear):
            m.invert_weight_scales = invert
            n += 1
    assert n > 0 and not any(isinstance(m, nn.QuantizedLinear) for _, m in model.named_modules())
    return model, n


def reference(model, ids):
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    def to_np(x):
        return np.array(x.astype(mx.float32), dtype=np.float32)

    cache = make_prompt_cache(model)
    logits = to_np(model(mx.array([ids]), cache=cache)[0, -1])
    check_logits("mlx-lm", logits)
    first = logits
    out, gaps = [], []
    for step in range(STEPS):
        nxt = int(np.argmax(logits))
        out.append(nxt)
        gaps.append(gap(logits))
        if step + 1 < STEPS:
            logits = to_np(model(mx.array([[nxt]]), cache=cache)[0, -1])
    full = to_np(model(mx.array([ids + out[:-1]]))[0, -1])
    drift = float(np.max(np.abs(full - logits)))
    if drift > 1e-3:
        raise RuntimeError(f"mlx-lm: cached decode differs from a full forward by {drift}")
    return first, out, gaps, drift


def transformers_reference(folder, prompts_, act_quant):
    """Last-position logits of transformers' BitNetForCausalLM for each prompt."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.integrations import bitnet as tf_bitnet

    original = tf_bitnet.BitLinear.activation_quant
    if not act_quant:
        tf_bitnet.BitLinear.activation_quant = lambda self, x, num_bits=8: (x, 1.0)
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        assert isinstance(model.model.layers[0].mlp.down_proj, tf_bitnet.BitLinear)
        out = {}
        with torch.no_grad():
            for name, ids in prompts_.items():
                logits = model(torch.tensor([ids])).logits[0, -1].float().numpy()
                check_logits("transformers", logits)
                out[name] = logits
        return out
    finally:
        tf_bitnet.BitLinear.activation_quant = original


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="tiny-bitnet")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    fixtures = os.path.join(REPO, "tests", "fixtures", "bitnet")
    os.makedirs(fixtures, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        generate(args.preset, args.seed, tmp)
        folder = os.path.join(tmp, "hf")
        with open(os.path.join(folder, "config.json")) as f:
            vocab = json.load(f)["vocab_size"]
        tf = {"a8": transformers_reference(folder, prompts(vocab), True),
              "f32": transformers_reference(folder, prompts(vocab), False)}
        model, n_bitlinear = load(folder)
        report = {
            "preset": args.preset, "seed": args.seed,
            "generator": f"cargo run --release -p trit --example gen_model -- --preset "
                         f"{args.preset} --seed {args.seed} --formats hf --out DIR (DIR/hf)",
            "reference": "mlx-lm bitnet (load_model, set_dtype float32, CPU); BitLinear's "
                         "Metal kernel replaced by the same arithmetic in mlx ops, "
                         "invert_weight_scales from quantization_config (divide for bitlinear)",
            "bitlinear_layers": n_bitlinear,
            "versions": {p: importlib.metadata.version(p)
                         for p in ("mlx", "mlx-lm", "numpy", "torch", "transformers")},
            "python": platform.python_version(),
            "prompts": {},
        }
        for name, ids in prompts(vocab).items():
            logits, greedy, gaps, drift = reference(model, ids)
            logits[::SAMPLE_STEP].astype("<f4").tofile(
                os.path.join(fixtures, f"{args.preset}.{name}.f32"))
            top = np.argsort(-logits)[:TOP]
            report["prompts"][name] = {
                "ids": ids, "greedy": greedy, "gap_top1_top2": [round(g, 6) for g in gaps],
                "sample_step": SAMPLE_STEP,
                "top_ids": [int(i) for i in top],
                "top_logits": [float(logits[i]) for i in top],
                "logits_mean": float(np.mean(logits)), "logits_std": float(np.std(logits)),
                "transformers_vs_mlx": {
                    kind: {"max_abs": float(np.max(np.abs(t - logits))),
                           "corr": float(np.corrcoef(t, logits)[0, 1]),
                           "argmax_equal": int(np.argmax(t)) == int(np.argmax(logits))}
                    for kind, t in ((k, tf[k][name]) for k in ("a8", "f32"))
                },
                "decode_vs_full_forward_max_abs": drift,
            }
            for kind in ("a8", "f32"):
                tf[kind][name][::SAMPLE_STEP].astype("<f4").tofile(os.path.join(
                    fixtures, f"{args.preset}.{name}.transformers_{kind}.f32"))
            print(report["prompts"][name]["transformers_vs_mlx"])
            print(f"{name}: {len(ids)} tokens, greedy {greedy[:8]}…, min gap {min(gaps):.4f}")
    with open(os.path.join(fixtures, f"{args.preset}.json"), "w") as f:
        json.dump(report, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
