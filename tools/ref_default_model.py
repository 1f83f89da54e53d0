#!/usr/bin/env python3
"""llama.cpp reference numbers for the default model (models/default/*.gguf) and its teacher.

Writes tests/fixtures/default_model/reference.json: llama.cpp's perplexity of the first 512
tokens of Pride and Prejudice (held out from training; one window, no BOS, positions 1..511
scored) for the ternary student and for the SmolLM2-135M-Instruct teacher, with greedy
continuations. Run with the venv from tools/setup_peers.sh:

    .cache/venv/bin/python tools/ref_default_model.py
"""
import glob
import json
import os
import sys

import numpy as np
from llama_cpp import Llama

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.environ.get("TRIT_CACHE", os.path.join(ROOT, ".cache"))
STUDENT = sorted(glob.glob(os.path.join(ROOT, "models/default/*.gguf")))[0]
TEACHER = os.path.join(CACHE, "smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
TEXT = os.path.join(CACHE, "texts/prideprejudice.txt")
PROMPTS = ["The capital of France is", "Once upon a time"]


def measure(path):
    llm = Llama(model_path=path, n_ctx=512, n_batch=512, n_ubatch=512, logits_all=True,
                n_threads=2, verbose=False)
    text = open(TEXT, encoding="utf-8").read()
    ids = llm.tokenize(text.encode(), add_bos=False, special=False)[:512]
    llm.reset()
    llm.eval(ids)
    logits = np.array(llm.scores[:512], dtype=np.float64)
    logits -= logits.max(-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    nll = -logp[np.arange(511), ids[1:]]
    out = {"file": os.path.relpath(path, ROOT) if path.startswith(ROOT) else os.path.basename(path),
           "ppl_first512_one_window": float(np.exp(nll.mean())), "window_ids_head": ids[:16],
           "greedy": {}}
    for p in PROMPTS:
        r = llm(p, max_tokens=16, temperature=0.0, echo=False)
        out["greedy"][p] = r["choices"][0]["text"]
    return out


def main():
    import llama_cpp
    student, teacher = measure(STUDENT), measure(TEACHER)
    ref = {
        "generated_by": "tools/ref_default_model.py",
        "llama_cpp_python": llama_cpp.__version__,
        "convention": "first 512 tokens of prideprejudice.txt tokenized by llama.cpp, no BOS, one "
                      "window from an empty cache, positions 1..511 scored, natural log",
        "student": student,
        "teacher": teacher,
        "ratio": student["ppl_first512_one_window"] / teacher["ppl_first512_one_window"],
    }
    os.makedirs(os.path.join(ROOT, "tests/fixtures/default_model"), exist_ok=True)
    with open(os.path.join(ROOT, "tests/fixtures/default_model/reference.json"), "w") as f:
        json.dump(ref, f, indent=1, ensure_ascii=False)
    json.dump(ref, sys.stdout, indent=1, ensure_ascii=False)


if __name__ == "__main__":
    main()
