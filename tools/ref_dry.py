"""Writes tests/fixtures/sampling/dry.json: llama.cpp's DRY sampler (`llama_sampler_init_dry`,
llama-cpp-python 0.3.36's bindings) on the default model's vocabulary — for each case, the
sequence breakers (strings, processed by llama.cpp against the vocabulary), the parameters, the
token history it accepted, and the penalty it subtracted from each token's logit (the logits
all start at 0).

Needs tools/setup_peers.sh (.cache/venv with llama-cpp-python 0.3.36).
"""
import ctypes
import json
from pathlib import Path

import llama_cpp
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
MODEL = next((ROOT / "models" / "default").glob("*.gguf"))
DEFAULT = ["\n", ":", "\"", "*"]

TEXTS = [
    # plain repeats, no breaker inside them
    ("the cat sat on the mat and the cat sat on the mat and the cat sat on the", DEFAULT, 64, 2),
    # a breaker (newline) between the repeats bounds them
    ("one two three four five\none two three four five\none two three four", DEFAULT, 64, 2),
    # colons and quotes inside the repeated stretch
    ('name: "Ann" age: 5 name: "Ann" age: 5 name: "Ann" age:', DEFAULT, 64, 2),
    # a short window, a longer allowed length
    ("a b c d e f g a b c d e f g a b c d e f g a b c", DEFAULT, 12, 3),
    # multi-token breakers: "User says" and "###"
    ("User says hi there friend. User says hi there friend. ### hi there friend. hi there",
     ["User says", "###"], 128, 2),
    # several earlier continuations of the same stretch, each penalized
    ("red green blue one red green blue two red green blue three red green blue", DEFAULT, 64, 2),
    # the last breaker limits how far back a repeat may reach
    ('name "Ann" age 5 name "Ann" age 5 name: "Ann" age 5 name "Ann" age', DEFAULT, 64, 1),
    # a long repeat (the penalty grows as base^(length - allowed))
    ("it was the best of times it was the worst of times it was the best of times it was the",
     DEFAULT, 256, 2),
    # no breakers at all
    ("x y z x y z x y z x y z x y", [], 64, 1),
]


def dry_penalties(llm, breakers, last_n, allowed, history, mult=0.8, base=1.75):
    vocab = llama_cpp.llama_model_get_vocab(llm._model.model)
    arr = (ctypes.c_char_p * max(len(breakers), 1))(*[b.encode() for b in breakers])
    smpl = llama_cpp.llama_sampler_init_dry(vocab, mult, base, allowed, last_n, arr, len(breakers))
    for t in history:
        llama_cpp.llama_sampler_accept(smpl, t)
    n = llm.n_vocab()
    data = (llama_cpp.llama_token_data * n)(*[llama_cpp.llama_token_data(i, 0.0, 0.0) for i in range(n)])
    cur = llama_cpp.llama_token_data_array(data, n, -1, False)
    llama_cpp.llama_sampler_apply(smpl, ctypes.byref(cur))
    out = {}
    for i in range(cur.size):
        d = cur.data[i]
        if d.logit != 0.0:
            out[str(d.id)] = round(-float(d.logit), 6)
    llama_cpp.llama_sampler_free(smpl)
    return out


def main():
    llm = llama_cpp.Llama(model_path=str(MODEL), n_ctx=256, vocab_only=True, verbose=False)
    cases = []
    for text, breakers, last_n, allowed in TEXTS:
        history = llm.tokenize(text.encode(), add_bos=False, special=False)
        pen = dry_penalties(llm, breakers, last_n, allowed, history)
        cases.append({"text": text, "history": history, "breakers": breakers, "multiplier": 0.8,
                      "base": 1.75, "allowed_length": allowed, "last_n": last_n, "penalties": pen})
        print(f"{len(pen)} tokens penalized: {text[:40]!r}")
    out = {"generated_by": "tools/ref_dry.py", "model": "models/default/" + MODEL.name,
           "llama_cpp_build": "0c1e570 (llama-cpp-python 0.3.36)", "cases": cases}
    dst = ROOT / "tests" / "fixtures" / "sampling" / "dry.json"
    dst.write_text(json.dumps(out, indent=1) + "\n")
    print("wrote", dst)


if __name__ == "__main__":
    main()
