"""Writes tests/fixtures/completions/echo_logprobs.json: llama.cpp's log-probability of every
prompt token given those before it (what `/v1/completions` with `echo` and `logprobs` reports)
on the default model, for three prompts: llama-cpp-python's logits of every position
(`logits_all=True`, token ids from its own tokenizer), log-softmax in float64 here, and the two
most likely ids at each position.

(llama-cpp-python's own `echo` output is not used: at 0.3.36 it pairs each prompt token with
the distribution that follows it, one position late.)

Needs tools/setup_peers.sh (.cache/venv with llama-cpp-python 0.3.36).
"""
import json
from pathlib import Path

import llama_cpp
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
MODEL = next((ROOT / "models" / "default").glob("*.gguf"))
PROMPTS = [
    "The capital of France is Paris, and the capital of Italy is Rome.",
    "Question: What do bees make?\nAnswer: Honey",
    "It is a truth universally acknowledged, that a single man in possession of a good fortune",
]


def main():
    llm = llama_cpp.Llama(model_path=str(MODEL), n_ctx=256, logits_all=True, verbose=False)
    out = {"generated_by": "tools/ref_echo.py", "model": "models/default/" + MODEL.name,
           "llama_cpp_build": "0c1e570 (llama-cpp-python 0.3.36)", "prompts": []}
    for text in PROMPTS:
        ids = llm.tokenize(text.encode(), add_bos=False, special=False)
        llm.reset()
        llm.eval(ids)
        logits = np.array(llm.scores[: len(ids)], dtype=np.float64)
        lse = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + logits.max(1)
        logp = logits - lse[:, None]
        out["prompts"].append({
            "text": text, "ids": ids,
            # entry i: log p(ids[i + 1] | ids[: i + 1])
            "log_probs": [round(float(logp[i, ids[i + 1]]), 5) for i in range(len(ids) - 1)],
            "top2": [np.argsort(-logp[i])[:2].tolist() for i in range(len(ids) - 1)],
        })
    dst = ROOT / "tests" / "fixtures" / "completions" / "echo_logprobs.json"
    dst.write_text(json.dumps(out, indent=1) + "\n")
    print("wrote", dst)


if __name__ == "__main__":
    main()
