"""Check that the exported GGUF and MLX folder compute the same model.

An independent numpy forward pass reads the GGUF directly (Q2_0 decoded by gguf_io, Q/K rows in
GGUF order, adjacent-pair RoPE as llama.cpp applies it) and is compared with
  - llama.cpp through llama-cpp-python, if installed (it multiplies Q2_0 by Q8_0-quantized
    activations, so logits agree closely but not exactly),
  - mlx-lm loading the MLX folder, if installed,
  - optionally logits saved by the PyTorch model (--torch-logits, HF layout + rotate-half RoPE).
Also prints greedy continuations from llama.cpp for a few prompts.

  python3 tools/distill/verify_exports.py --gguf F.gguf [--mlx DIR] [--torch-logits L.npy]
"""

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import arch as A  # noqa: E402
import gguf_io as G  # noqa: E402

PROMPT_IDS = [504, 3575, 282, 4649, 314]  # "The capital of France is"


def numpy_logits(path, ids):
    g = G.GGUFFile(path)
    w = lambda n: g.tensor_f32(n)  # noqa: E731
    t = len(ids)
    x = w("token_embd.weight")[ids]
    inv = A.ROPE_THETA ** (-np.arange(0, A.HEAD_DIM, 2) / A.HEAD_DIM)
    ang = np.arange(t)[:, None] * inv[None, :]
    cos, sin = np.cos(ang), np.sin(ang)

    def norm(v, wt):
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + A.EPS) * wt

    def rope_pairs(v):  # v [t, heads, 64]; pairs (2i, 2i+1) rotate by angle i
        a, b = v[..., 0::2], v[..., 1::2]
        c, s = cos[:, None, :], sin[:, None, :]
        out = np.empty_like(v)
        out[..., 0::2] = a * c - b * s
        out[..., 1::2] = a * s + b * c
        return out

    mask = np.triu(np.full((t, t), -np.inf), 1)
    for i in range(A.N_LAYERS):
        p = f"blk.{i}."
        h = norm(x, w(p + "attn_norm.weight"))
        q = rope_pairs((h @ w(p + "attn_q.weight").T).reshape(t, A.N_HEAD, A.HEAD_DIM))
        k = rope_pairs((h @ w(p + "attn_k.weight").T).reshape(t, A.N_KV, A.HEAD_DIM))
        v = (h @ w(p + "attn_v.weight").T).reshape(t, A.N_KV, A.HEAD_DIM)
        rep = A.N_HEAD // A.N_KV
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
        sc = np.einsum("thd,shd->hts", q, k) / np.sqrt(A.HEAD_DIM) + mask
        sc = np.exp(sc - sc.max(-1, keepdims=True))
        sc /= sc.sum(-1, keepdims=True)
        a = np.einsum("hts,shd->thd", sc, v).reshape(t, A.DIM)
        x = x + a @ w(p + "attn_output.weight").T
        h = norm(x, w(p + "ffn_norm.weight"))
        gt, up = h @ w(p + "ffn_gate.weight").T, h @ w(p + "ffn_up.weight").T
        x = x + (gt / (1 + np.exp(-gt)) * up) @ w(p + "ffn_down.weight").T
    return norm(x, w("output_norm.weight")) @ w("token_embd.weight").T


def compare(name, ref, other):
    a, b = ref[-1], other[-1]
    corr = float(np.corrcoef(a, b)[0, 1])
    top_a, top_b = np.argsort(-a)[:5].tolist(), np.argsort(-b)[:5].tolist()
    print(f"{name}: max|diff| {np.abs(a - b).max():.4f}, corr {corr:.6f}, top5 {top_a} vs {top_b}")
    return {"max_abs_diff": float(np.abs(a - b).max()), "corr": corr, "top5_ref": top_a,
            "top5": top_b}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--mlx")
    ap.add_argument("--torch-logits")
    ap.add_argument("--json-out")
    args = ap.parse_args()
    ref = numpy_logits(args.gguf, PROMPT_IDS)
    report = {"numpy_top5": np.argsort(-ref[-1])[:5].tolist()}
    print("numpy reference top5", report["numpy_top5"])
    if args.torch_logits:
        report["torch"] = compare("pytorch", ref, np.load(args.torch_logits))
    try:
        from llama_cpp import Llama
    except ImportError:
        Llama = None
        print("llama-cpp-python not installed: skipped")
    if Llama is not None:
        llm = Llama(model_path=args.gguf, n_ctx=512, logits_all=True, verbose=False, seed=0)
        llm.eval(PROMPT_IDS)
        report["llama_cpp"] = compare("llama.cpp", ref, np.array(llm.scores[:len(PROMPT_IDS)]))
        report["llama_cpp_greedy"] = {}
        for p in ["The capital of France is", "Once upon a time"]:
            out = llm(p, max_tokens=32, temperature=0.0)["choices"][0]["text"]
            report["llama_cpp_greedy"][p] = out
            print(f"llama.cpp greedy {p!r} -> {out!r}")
        msgs = [{"role": "user", "content": "What is the capital of France?"}]
        out = llm.create_chat_completion(msgs, max_tokens=40, temperature=0.0)
        text = out["choices"][0]["message"]["content"]
        report["llama_cpp_greedy"]["chat: What is the capital of France?"] = text
        print(f"llama.cpp chat -> {text!r}")
    if args.mlx:
        try:
            import mlx.core as mx
            from mlx_lm import load
        except ImportError:
            mx = None
            print("mlx-lm not installed: skipped")
        if mx is not None:
            model, _ = load(args.mlx)
            out = model(mx.array([PROMPT_IDS])).astype(mx.float32)
            report["mlx"] = compare("mlx", ref, np.array(out[0]))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(report, f, indent=1, ensure_ascii=False)


if __name__ == "__main__":
    main()
