#!/usr/bin/env python3
"""Does llama.cpp read what `trit convert` writes? → tests/fixtures/convert/llama_cpp_check.json

Converts trit's random `tiny` model (MLX 2-bit folder, made by the gen_model example) into every
GGUF type stock llama.cpp knows (TQ2_0, TQ1_0, Q2_0) with `trit convert`, then evaluates the
ChatML prompt of tools/ref_models.py with llama.cpp (llama-cpp-python 0.3.36) and with trit on
the same converted file, and compares the last-position logits. llama.cpp quantizes activations
(Q8_K for TQ*, Q8_0 for Q2_0), so expect max |Δ| of a few tenths, not 1e-4 (tools/README.md).
PQ2_0/PTQ1_0 are PrismML-fork types that stock llama.cpp refuses; they are not checked here.
Also: the TQ1_0 file converted back to an MLX folder must load in mlx-lm 0.32.2 with logits,
tokenization and chat template equal to the original MLX folder's (`mlx_lm_reload`).

  CARGO_TARGET_DIR=target /work/main/.cache/venv/bin/python tools/check_convert_llamacpp.py
"""

import json
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ref_smollm2 import default_cache, dump_json, load_llama  # noqa: E402
from ref_models import PROMPT_IDS, gen_command  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGETS = ["gguf-tq2", "gguf-tq1", "gguf-q2"]


def cargo(*args):
    subprocess.run(["cargo", *args], cwd=REPO, check=True)


def trit_bin():
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(REPO, "target"))
    return os.path.join(target, "release", "trit")


def trit_logits(model, out):
    cargo("run", "--release", "-q", "-p", "trit", "--example", "dump_logits", "--", model, out,
          *map(str, PROMPT_IDS))
    return np.fromfile(out, dtype="<f4")


def mlx_reload(src, folder):
    import mlx.core as mx
    from mlx_lm import load

    text = "Hello wörld 12345 <think>x</think>"
    out = {}
    for name, path in [("original", src), ("converted", folder)]:
        model, tok = load(path)
        model.set_dtype(mx.float32)
        logits = np.array(model(mx.array([PROMPT_IDS]))[0, -1].astype(mx.float32))
        chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                       add_generation_prompt=True)
        out[name] = (logits, tok.encode(text), chat)
    (a, ta, ca), (b, tb, cb) = out["original"], out["converted"]
    return {"max_abs_diff": float(np.abs(a - b).max()), "tokens_equal": ta == tb,
            "chat_template_equal": ca == cb}


def main():
    cache = default_cache()
    src = os.path.join(cache, "refmodels", "tiny", "mlx")
    if not os.path.isdir(src):
        subprocess.run(gen_command(cache, "tiny"), cwd=REPO, check=True)
    cargo("build", "--release", "-q", "-p", "trit-cli")
    results = {"source": "refmodels/tiny/mlx (gen_model --preset tiny --seed 0)",
               "prompt_ids": PROMPT_IDS, "targets": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for t in TARGETS:
            path = os.path.join(tmp, f"tiny-{t}.gguf")
            subprocess.run([trit_bin(), "convert", src, path, "--to", t, "--quiet"], check=True)
            llm = load_llama(path, n_ctx=64)
            llm.reset()
            llm.eval(PROMPT_IDS)
            ours = trit_logits(path, os.path.join(tmp, "l.f32"))
            theirs = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
            del llm
            diff = np.abs(ours.astype(np.float64) - theirs)
            top10 = lambda x: set(np.argsort(-x)[:10].tolist())  # noqa: E731
            r = {
                "max_abs_diff": float(diff.max()),
                "mean_abs_diff": float(diff.mean()),
                "correlation": float(np.corrcoef(ours, theirs)[0, 1]),
                "argmax_equal": int(np.argmax(ours)) == int(np.argmax(theirs)),
                "top10_overlap": len(top10(ours) & top10(theirs)),
                "logit_std": float(np.std(theirs)),
            }
            results["targets"][t] = r
            print(t, json.dumps(r))
        back = os.path.join(tmp, "back-mlx")
        subprocess.run([trit_bin(), "convert", os.path.join(tmp, "tiny-gguf-tq1.gguf"), back,
                        "--to", "mlx", "--quiet"], check=True)
        results["mlx_lm_reload"] = mlx_reload(src, back)
        print("mlx_lm_reload", json.dumps(results["mlx_lm_reload"]))
    out = os.path.join(REPO, "tests", "fixtures", "convert", "llama_cpp_check.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    dump_json(results, out)
    bad = [t for t, r in results["targets"].items()
           if not (r["argmax_equal"] and r["correlation"] > 0.99)]
    reload = results["mlx_lm_reload"]
    if reload["max_abs_diff"] != 0.0 or not reload["tokens_equal"]:
        bad.append("mlx_lm_reload")
    if bad:
        sys.exit(f"llama.cpp disagrees with trit on {bad}")


if __name__ == "__main__":
    main()
