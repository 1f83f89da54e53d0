#!/usr/bin/env python3
"""llama.cpp's reading of trit's BitNet GGUF export → tests/fixtures/bitnet/<preset>.<prompt>.llama_cpp_tq2_0.f32

An independent check of the GGUF side of trit's BitNet support (tensor names, the per-tensor
`.scale` tensors, NeoX RoPE, the sub-norms, the tokenizer-free metadata): llama.cpp (llama-cpp-python
0.3.36, vendoring llama.cpp 0c1e570) runs the tiny-bitnet TQ2_0 file that trit's generator writes
  cargo run --release -p trit --example gen_model -- --preset tiny-bitnet --seed 0 --formats tq2_0 --out DIR
on the prompts of tests/fixtures/bitnet/<preset>.json (the mlx-lm reference's). llama.cpp's `bitnet`
graph applies SiLU in the MLP where BitNet b1.58 uses relu² (reported upstream: llama.cpp PR #25885,
microsoft/BitNet #588), so trit's test compares these logits with trit running the same file
marked `bitnet.hidden_activation = "silu"` (llama.cpp's key, which trit honours), and checks that
the unmarked file (relu², trit's default for BitNet) differs from them.

Stored like the mlx-lm fixtures: every `sample_step`-th logit (f32 LE) and the 32 largest
(ids and values in <preset>.llama_cpp.json). llama.cpp's TQ2_0 dot products take int8
activations, so the Rust side compares with a cosine bound.

  tools/setup_peers.sh   # .cache/venv with llama-cpp-python
  .cache/venv/bin/python tools/ref_bitnet_llamacpp.py [--preset tiny-bitnet]
"""

import argparse
import json
import os
import subprocess
import tempfile

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOP = 32


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="tiny-bitnet")
    args = ap.parse_args()
    import llama_cpp

    fx_dir = os.path.join(REPO, "tests/fixtures/bitnet")
    ref = json.load(open(os.path.join(fx_dir, f"{args.preset}.json")))
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            ["cargo", "run", "--release", "-q", "-p", "trit", "--example", "gen_model", "--",
             "--preset", args.preset, "--seed", str(ref["seed"]), "--formats", "tq2_0",
             "--out", tmp],
            cwd=REPO, check=True)
        path = os.path.join(tmp, "model-tq2_0.gguf")
        out = {"preset": args.preset, "seed": ref["seed"], "file": "model-tq2_0.gguf",
               "llama_cpp_python": llama_cpp.__version__, "prompts": {}}
        for name, p in ref["prompts"].items():
            ids = p["ids"]
            llm = llama_cpp.Llama(model_path=path, n_ctx=len(ids) + 8, n_threads=2,
                                  n_batch=512, logits_all=True, verbose=False)
            llm.eval(ids)
            logits = np.array(llm.scores[len(ids) - 1], dtype=np.float32)
            del llm
            assert np.isfinite(logits).all() and logits.std() > 1e-3, "flat or non-finite logits"
            step = p["sample_step"]
            logits[::step].astype("<f4").tofile(
                os.path.join(fx_dir, f"{args.preset}.{name}.llama_cpp_tq2_0.f32"))
            top = np.argsort(-logits)[:TOP]
            out["prompts"][name] = {
                "sample_step": step,
                "top_ids": [int(i) for i in top],
                "top_logits": [float(logits[i]) for i in top],
            }
            print(f"{name}: {len(ids)} tokens, argmax {int(top[0])}, std {logits.std():.3f}")
        with open(os.path.join(fx_dir, f"{args.preset}.llama_cpp.json"), "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
