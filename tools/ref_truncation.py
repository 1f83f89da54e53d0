"""Writes tests/fixtures/sampling/truncation.json: the tokens llama.cpp's sampler chain keeps
(llama-cpp-python 0.3.36's `llama_sampler_*` bindings) from logits rows, for its top-n-sigma,
locally typical and XTC samplers alone and in llama.cpp's default order with top-k, top-p and
min-p (XTC at probability 1, so that it always acts); and the probabilities its dynamic
temperature (`temp_ext`) gives the tokens top-k (and top-p) keep; and two steps of mirostat 1
and 2 (the kept tokens of each and the first step's draw, which moves the target). No model is needed: the rows are seeded
random logits of 2,000 tokens, scaled to give peaked and flat distributions.

Needs tools/setup_peers.sh (.cache/venv with llama-cpp-python 0.3.36).
"""
import ctypes
import json
from pathlib import Path

import llama_cpp as L
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
N = 2000

CHAINS = [
    {"top_n_sigma": 1.0},
    {"top_n_sigma": 2.5},
    {"typical_p": 0.5},
    {"typical_p": 0.9},
    {"xtc_probability": 1.0, "xtc_threshold": 0.1},
    {"xtc_probability": 1.0, "xtc_threshold": 0.02},
    {"top_n_sigma": 3.0, "top_k": 40, "typical_p": 0.9, "top_p": 0.95, "min_p": 0.05,
     "xtc_probability": 1.0, "xtc_threshold": 0.05},
    {"top_k": 100, "typical_p": 0.7, "top_p": 0.8},
]


def kept(row, c):
    chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
    add = lambda s: L.llama_sampler_chain_add(chain, s)
    # llama.cpp's default order: top_n_sigma, top_k, typical, top_p, min_p, xtc.
    if "top_n_sigma" in c:
        add(L.llama_sampler_init_top_n_sigma(c["top_n_sigma"]))
    if "top_k" in c:
        add(L.llama_sampler_init_top_k(c["top_k"]))
    if "typical_p" in c:
        add(L.llama_sampler_init_typical(c["typical_p"], 0))
    if "top_p" in c:
        add(L.llama_sampler_init_top_p(c["top_p"], 0))
    if "min_p" in c:
        add(L.llama_sampler_init_min_p(c["min_p"], 0))
    if "xtc_probability" in c:
        add(L.llama_sampler_init_xtc(c["xtc_probability"], c["xtc_threshold"], 0, 1))
    data = (L.llama_token_data * N)(*[L.llama_token_data(i, float(row[i]), 0.0) for i in range(N)])
    cur = L.llama_token_data_array(data, N, -1, False)
    L.llama_sampler_apply(chain, ctypes.byref(cur))
    ids = sorted(int(cur.data[i].id) for i in range(cur.size) if cur.data[i].logit != -np.inf)
    L.llama_sampler_free(chain)
    return ids


DYNATEMP = [
    {"top_k": 50, "temp": 0.8, "range": 0.5, "exponent": 1.0},
    {"top_k": 200, "top_p": 0.9, "temp": 1.0, "range": 0.7, "exponent": 2.0},
]


def dynatemp_probs(row, c):
    """The probabilities llama.cpp's temp_ext leaves on the tokens top-k (and top-p) keep."""
    chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
    L.llama_sampler_chain_add(chain, L.llama_sampler_init_top_k(c["top_k"]))
    if "top_p" in c:
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_top_p(c["top_p"], 0))
    L.llama_sampler_chain_add(chain, L.llama_sampler_init_temp_ext(c["temp"], c["range"], c["exponent"]))
    data = (L.llama_token_data * N)(*[L.llama_token_data(i, float(row[i]), 0.0) for i in range(N)])
    cur = L.llama_token_data_array(data, N, -1, False)
    L.llama_sampler_apply(chain, ctypes.byref(cur))
    probs = {str(int(cur.data[i].id)): float(cur.data[i].p) for i in range(cur.size)}
    L.llama_sampler_free(chain)
    return probs


MIROSTAT = [
    {"version": 2, "temp": 1.0, "tau": 5.0, "eta": 0.1},
    {"version": 2, "temp": 0.7, "tau": 3.0, "eta": 0.5},
    {"version": 1, "temp": 1.0, "tau": 5.0, "eta": 0.1},
    {"version": 1, "temp": 0.8, "tau": 2.0, "eta": 0.3},
]


def mirostat_steps(rows, c):
    """Two steps of llama.cpp's mirostat on rows[0] then rows[1]: the kept ids of each step and
    the token it drew at the first (which moves its target)."""
    chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
    L.llama_sampler_chain_add(chain, L.llama_sampler_init_temp(c["temp"]))
    if c["version"] == 2:
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_mirostat_v2(1, c["tau"], c["eta"]))
    else:
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_mirostat(N, 1, c["tau"], c["eta"], 100))
    steps = []
    for row in rows:
        data = (L.llama_token_data * N)(*[L.llama_token_data(i, float(row[i]), 0.0) for i in range(N)])
        cur = L.llama_token_data_array(data, N, -1, False)
        L.llama_sampler_apply(chain, ctypes.byref(cur))
        kept = sorted(int(cur.data[i].id) for i in range(cur.size))
        steps.append({"kept": kept, "drawn": int(cur.data[cur.selected].id)})
    L.llama_sampler_free(chain)
    return steps


def main():
    rng = np.random.default_rng(7)
    rows = []
    for scale in [0.5, 2.0, 4.0, 8.0]:
        # Rounded as the fixture stores them, so both sides read the same floats.
        rows.append(np.round(rng.standard_normal(N) * scale, 4).astype(np.float32))
    cases = []
    for r, row in enumerate(rows):
        for c in CHAINS:
            ids = kept(row, c)
            cases.append({"row": r, "chain": c, "kept": ids})
    dyn = [{"row": r, "chain": c, "probs": dynatemp_probs(row, c)}
           for r, row in enumerate(rows) for c in DYNATEMP]
    miro = [{"rows": [a, b], "params": c, "steps": mirostat_steps([rows[a], rows[b]], c)}
            for c in MIROSTAT for a, b in [(1, 2), (2, 0), (3, 1)]]
    out = {"generated_by": "tools/ref_truncation.py", "dynatemp": dyn, "mirostat": miro, "llama_cpp_build": "0c1e570 (llama-cpp-python 0.3.36)",
           "rows": [[round(float(x), 4) for x in row] for row in rows], "cases": cases}
    dst = ROOT / "tests" / "fixtures" / "sampling" / "truncation.json"
    dst.write_text(json.dumps(out, separators=(",", ":")) + "\n")
    print("wrote", dst, [len(c["kept"]) for c in cases])


if __name__ == "__main__":
    main()
