#!/usr/bin/env python3
"""mlx-lm reference for trit's random Qwen3.5 hybrid models → tests/fixtures/qwen35/<preset>.*

The model is written by trit's generator (format::testgen::hybrid; weights are a pure function of
preset and seed, so the Rust test regenerates the same files):
  cargo run --release -p trit --example gen_model -- --preset tiny-qwen35 --seed 0 --out DIR
then run through mlx-lm 0.32.2's own `qwen3_5` model (CPU, parameters cast to f32; lossless for
ternary weights with f16 scales). For each prompt (a short one and one of 300 tokens, longer than
mlx-lm's and trit's prefill chunks) we record the last-position logits (<name>.<prompt>.f32) and a
32-step greedy continuation with mlx-lm's top-1/top-2 gap at every step. For the unrotated preset,
llama.cpp (llama-cpp-python 0.3.36) also reads the Q2_0 GGUF export of the same weights
(<name>.<prompt>.llama_cpp_q2_0.f32): an independent check of trit's qwen35 GGUF layout.

Checks on the reference itself: cached decode equals a full forward over prompt + generated ids,
and the logits are finite and not flat.

  /work/main/.cache/venv/bin/python tools/ref_qwen35.py [--preset tiny-qwen35]
"""

import argparse
import importlib.metadata
import os
import platform
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ref_models import check_logits, gap  # noqa: E402
from ref_smollm2 import dump_json  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 32


def prompts(vocab):
    """A short prompt and a 300-token one; ids are a fixed arithmetic walk over the vocabulary."""
    short = [11, 500, 7, 1234, 99, 2048, 3, 77, 4000, 12, 640, 5]
    long_ = [(17 + 389 * i) % vocab for i in range(300)]
    return {"short": short, "long": long_}


def generate(preset, seed, out, formats):
    cmd = ["cargo", "run", "--release", "-p", "trit", "--example", "gen_model", "--",
           "--preset", preset, "--seed", str(seed), "--out", out, "--formats", formats]
    subprocess.run(cmd, check=True, cwd=REPO)


def reference(folder, ids):
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.utils import load_model

    from pathlib import Path

    model, _ = load_model(Path(folder))
    model.set_dtype(mx.float32)

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


def llama_cpp_reference(gguf, ids):
    """llama.cpp (llama-cpp-python) last-position logits: an independent reader of the GGUF
    layout (tiled value heads, ssm_a, conv shape, tensor names). Stock llama.cpp knows no
    prism.hadamard.* keys, so only unrotated files are compared."""
    from ref_smollm2 import load_llama

    llm = load_llama(gguf, 512)
    llm.reset()
    llm.eval(ids)
    logits = np.array(llm.scores[len(ids) - 1], dtype=np.float32)
    check_logits("llama.cpp", logits)
    return logits


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="tiny-qwen35")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    fixtures = os.path.join(REPO, "tests", "fixtures", "qwen35")
    os.makedirs(fixtures, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        rotated = args.preset == "tiny-prism"
        generate(args.preset, args.seed, tmp, "mlx" if rotated else "mlx,q2_0")
        folder = os.path.join(tmp, "mlx")
        import json
        with open(os.path.join(folder, "config.json")) as f:
            vocab = json.load(f)["text_config"]["vocab_size"]
        report = {
            "preset": args.preset, "seed": args.seed,
            "generator": f"cargo run --release -p trit --example gen_model -- --preset "
                         f"{args.preset} --seed {args.seed} --formats mlx --out DIR (DIR/mlx)",
            "reference": "mlx-lm qwen3_5 (load_model, set_dtype float32, CPU)",
            "versions": {p: importlib.metadata.version(p)
                         for p in ("mlx", "mlx-lm", "numpy", "llama_cpp_python")},
            "python": platform.python_version(),
            "prompts": {},
        }
        for name, ids in prompts(vocab).items():
            logits, greedy, gaps, drift = reference(folder, ids)
            logits.astype("<f4").tofile(os.path.join(fixtures, f"{args.preset}.{name}.f32"))
            report["prompts"][name] = {
                "ids": ids, "greedy32": greedy, "gap_top1_top2": [round(g, 6) for g in gaps],
                "decode_vs_full_forward_max_abs": drift,
            }
            if not rotated:
                ll = llama_cpp_reference(os.path.join(tmp, "model-q2_0.gguf"), ids)
                ll.astype("<f4").tofile(
                    os.path.join(fixtures, f"{args.preset}.{name}.llama_cpp_q2_0.f32"))
                corr = float(np.corrcoef(ll, logits)[0, 1])
                report["prompts"][name]["llama_cpp_q2_0_corr_with_mlx"] = corr
                print(f"{name}: llama.cpp Q2_0 vs mlx-lm correlation {corr:.5f}")
            print(f"{name}: {len(ids)} tokens, greedy {greedy[:8]}…, min gap {min(gaps):.4f}")
    dump_json(report, os.path.join(fixtures, f"{args.preset}.json"))


if __name__ == "__main__":
    main()
