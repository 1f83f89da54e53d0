#!/usr/bin/env python3
"""llama.cpp's embeddings of the default model → tests/fixtures/embeddings/default_model.json

The reference for `trit serve`'s `/v1/embeddings` and `Model::hidden_states`: llama.cpp
(llama-cpp-python 0.3.36) runs models/default/smollm2-135m-ternary-q2_0.gguf with
`embedding=True` and each pooling type trit offers (mean, last, cls: the final-normed hidden
state — llama.cpp's `result_norm`, the LM head's input — averaged over the prompt's tokens, or
its last or first token's), L2-normalized as its OpenAI endpoint returns them. The token ids
llama.cpp read (its tokenizer, BOS as the file says) are stored beside each vector, so trit's
test runs the same tokens; the server test sends the texts and checks trit tokenizes them the
same way.

  tools/setup_peers.sh   # .cache/venv with llama-cpp-python
  .cache/venv/bin/python tools/ref_embeddings.py
"""

import json
import os

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXTS = [
    "The capital of France is Paris.",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
    "Ternary weights take one of three values: minus one, zero or one.",
]


def main():
    import llama_cpp

    path = os.path.join(REPO, "models/default/smollm2-135m-ternary-q2_0.gguf")
    kinds = {
        "mean": llama_cpp.LLAMA_POOLING_TYPE_MEAN,
        "last": llama_cpp.LLAMA_POOLING_TYPE_LAST,
        "cls": llama_cpp.LLAMA_POOLING_TYPE_CLS,
    }
    out = {"model": "models/default/smollm2-135m-ternary-q2_0.gguf",
           "llama_cpp_python": llama_cpp.__version__, "texts": []}
    vectors = {}
    for name, kind in kinds.items():
        llm = llama_cpp.Llama(model_path=path, embedding=True, pooling_type=kind, n_ctx=256,
                              n_threads=2, n_batch=256, verbose=False)
        vectors[name] = [np.asarray(llm.embed(t, normalize=True), dtype=np.float64) for t in TEXTS]
        ids = [llm.tokenize(t.encode(), add_bos=True, special=False) for t in TEXTS]
        del llm
    for i, t in enumerate(TEXTS):
        entry = {"text": t, "ids": ids[i]}
        for name in kinds:
            v = vectors[name][i]
            assert np.isfinite(v).all() and abs(np.linalg.norm(v) - 1) < 1e-4, name
            entry[name] = [round(float(x), 7) for x in v]
        out["texts"].append(entry)
    dst = os.path.join(REPO, "tests/fixtures/embeddings/default_model.json")
    with open(dst, "w") as f:
        json.dump(out, f)
    print("wrote", dst, [len(e["ids"]) for e in out["texts"]])
    # How far apart the pooling kinds are (so the test's bound means something).
    for name in kinds:
        sims = [float(vectors[name][i] @ vectors["mean"][i]) for i in range(len(TEXTS))]
        print(name, "cosine to mean:", [round(s, 4) for s in sims])
    print("mean cosine between texts:",
          [round(float(vectors["mean"][0] @ vectors["mean"][j]), 4) for j in range(len(TEXTS))])


if __name__ == "__main__":
    main()
