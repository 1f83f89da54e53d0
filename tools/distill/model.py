"""SmolLM2-135M (llama) in plain PyTorch, the ternary fake-quantizer and the 2-bit packing.

Weights are held as a flat dict name -> tensor in Hugging Face layout: the GGUF's Q/K rows are
un-permuted at load so that the standard rotate-half RoPE applies (the GGUF export permutes them
back). Names: embed, norm, layers.{i}.{attn_norm,ffn_norm,q,k,v,o,gate,up,down}.
"""

import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# Shapes, tensor names and the Q/K row permutation live in arch.py (usable without torch);
# re-exported so callers need only `import model`.
from arch import (DIM, EPS, FFN, GROUP, HEAD_DIM, N_HEAD, N_KV, N_LAYERS,  # noqa: E402,F401
                  ROPE_THETA, VOCAB, gguf_name, gguf_to_hf_rows, hf_to_gguf_rows, norm_names,
                  ternary_names)


def load_gguf_weights(gguf):
    """Dequantized teacher weights (float32 numpy, HF layout)."""
    w = {}
    for name in ternary_names() + norm_names():
        a = gguf.tensor_f32(gguf_name(name))
        if name.endswith(".q"):
            a = gguf_to_hf_rows(a, N_HEAD)
        elif name.endswith(".k"):
            a = gguf_to_hf_rows(a, N_KV)
        w[name] = np.ascontiguousarray(a)
    return w


# ---------------------------------------------------------------------------------------------
# Ternary quantizer
# ---------------------------------------------------------------------------------------------

def ternarize(w, threshold=0.7):
    """Per row and group of 64 input weights: t = sign(w) where |w| > threshold * mean|w|, else 0;
    the scale is the least-squares one for that t (mean |w| over the non-zero positions), so
    s * t is the closest ternary group to w for the chosen pattern. Returns (s [out, in/64], t).
    round(w / s') with s' = 2 * threshold * mean|w| gives the same t: this is absmean rounding with
    a tuned multiplier, plus a refit scale."""
    out, n = w.shape
    g = w.float().reshape(out, n // GROUP, GROUP)
    a = g.abs()
    m = a.mean(-1, keepdim=True)
    nz = (a > threshold * m).float()
    s = (a * nz).sum(-1) / nz.sum(-1).clamp_min(1.0)
    t = torch.sign(g) * nz
    return s, t.reshape(out, n)


def dequant(s, t):
    out, n = t.shape
    return (s.unsqueeze(-1) * t.reshape(out, n // GROUP, GROUP)).reshape(out, n)


def pack_codes(t):
    """Ternary int tensor [out, in] -> uint8 [out, in/4]: code = t + 1, 4 codes per byte LSB-first
    (the byte order of both Q2_0's qs and MLX's uint32 words)."""
    c = (t + 1).to(torch.uint8).reshape(t.shape[0], -1, 4)
    return c[..., 0] | (c[..., 1] << 2) | (c[..., 2] << 4) | (c[..., 3] << 6)


def unpack_codes(p):
    p = p.to(torch.int16)
    c = torch.stack([(p >> (2 * j)) & 3 for j in range(4)], dim=-1)
    return (c.reshape(p.shape[0], -1) - 1).to(torch.float32)


# ---------------------------------------------------------------------------------------------
# Forward pass
# ---------------------------------------------------------------------------------------------

def rope_tables(n_pos, device, dtype=torch.float32):
    inv = 1.0 / ROPE_THETA ** (torch.arange(0, HEAD_DIM, 2, device=device, dtype=torch.float64)
                               / HEAD_DIM)
    ang = torch.arange(n_pos, device=device, dtype=torch.float64)[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos().to(dtype), ang.sin().to(dtype)


def rms_norm(x, w):
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)
    return w * xf.to(x.dtype)


def rotate(x, cos, sin):
    x1, x2 = x[..., :HEAD_DIM // 2], x[..., HEAD_DIM // 2:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def block(x, cos, sin, an, wq, wk, wv, wo, fn, wg, wu, wd, cache=None, pos=0):
    """One decoder layer. x [B, T, D]; cos/sin [T, HEAD_DIM] for positions pos..pos+T.
    cache: optional (k_cache, v_cache) of shape [B, N_KV, T_max, HEAD_DIM], filled in place."""
    b, t, _ = x.shape
    h = rms_norm(x, an)
    q = F.linear(h, wq).view(b, t, N_HEAD, HEAD_DIM).transpose(1, 2)
    k = F.linear(h, wk).view(b, t, N_KV, HEAD_DIM).transpose(1, 2)
    v = F.linear(h, wv).view(b, t, N_KV, HEAD_DIM).transpose(1, 2)
    q, k = rotate(q, cos, sin), rotate(k, cos, sin)
    rep = N_HEAD // N_KV
    if cache is not None:
        kc, vc = cache
        kc[:, :, pos:pos + t] = k
        vc[:, :, pos:pos + t] = v
        k, v = kc[:, :, :pos + t], vc[:, :, :pos + t]
    if t == 1 and cache is not None:
        # Decoding one token: the 3 query heads sharing a KV head become 3 query rows of that
        # head (q head h uses KV head h // 3), so the cache is read in place, never copied.
        a = F.scaled_dot_product_attention(q.reshape(b, N_KV, rep, HEAD_DIM), k, v)
        a = a.reshape(b, N_HEAD, 1, HEAD_DIM)
    else:
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        # With a cache and T > 1 the prompt starts at pos 0, so a plain causal mask is right.
        a = F.scaled_dot_product_attention(q, k, v, is_causal=t > 1)
    x = x + F.linear(a.transpose(1, 2).reshape(b, t, DIM), wo)
    h = rms_norm(x, fn)
    return x + F.linear(F.silu(F.linear(h, wg)) * F.linear(h, wu), wd)


def layer_args(w, i):
    p = f"layers.{i}."
    return (w[p + "attn_norm"], w[p + "q"], w[p + "k"], w[p + "v"], w[p + "o"],
            w[p + "ffn_norm"], w[p + "gate"], w[p + "up"], w[p + "down"])


def hidden(w, ids, cos, sin, block_fn=block, caches=None, pos=0):
    """Final-normed hidden states [B, T, D]."""
    x = F.embedding(ids, w["embed"])
    for i in range(N_LAYERS):
        if caches is None:
            x = block_fn(x, cos, sin, *layer_args(w, i))
        else:
            x = block(x, cos, sin, *layer_args(w, i), cache=caches[i], pos=pos)
    return rms_norm(x, w["norm"])


def logits(w, ids, cos, sin, **kw):
    return hidden(w, ids, cos, sin, **kw) @ w["embed"].t()


@torch.no_grad()
def perplexity(w, tokens, window=512, n_windows=1, batch=16):
    """exp(mean NLL) over n_windows consecutive windows of `window` tokens, every position after
    the first of each window scored (the first has no context), no BOS."""
    dev = w["embed"].device
    ids = torch.as_tensor(np.asarray(tokens[:window * n_windows], dtype=np.int64), device=dev)
    ids = ids.view(n_windows, window)
    cos, sin = rope_tables(window, dev, w["embed"].dtype)
    nll, count = 0.0, 0
    for s in range(0, n_windows, batch):
        x = ids[s:s + batch]
        lg = logits(w, x, cos, sin).float()
        lp = lg[:, :-1].log_softmax(-1).gather(-1, x[:, 1:, None]).squeeze(-1)
        nll -= lp.sum().item()
        count += lp.numel()
    return math.exp(nll / count)


@torch.no_grad()
def generate(w, prompts, n_new, temperature=0.0, min_p=0.0, generator=None):
    """Batched sampling with a KV cache. prompts: LongTensor [B, P] (one common length).
    temperature 0 is greedy. Returns [B, P + n_new]."""
    dev, dt = w["embed"].device, w["embed"].dtype
    b, p = prompts.shape
    total = p + n_new
    cos, sin = rope_tables(total, dev, dt)
    caches = [(torch.empty(b, N_KV, total, HEAD_DIM, device=dev, dtype=dt),
               torch.empty(b, N_KV, total, HEAD_DIM, device=dev, dtype=dt))
              for _ in range(N_LAYERS)]
    out = torch.empty(b, total, dtype=torch.long, device=dev)
    out[:, :p] = prompts
    cur, pos = prompts, 0
    for step in range(n_new):
        t = cur.shape[1]
        h = hidden(w, cur, cos[pos:pos + t], sin[pos:pos + t], caches=caches, pos=pos)
        lg = (h[:, -1] @ w["embed"].t()).float()
        if temperature <= 0:
            nxt = lg.argmax(-1)
        else:
            pr = (lg / temperature).softmax(-1)
            if min_p > 0:
                pr = pr * (pr >= min_p * pr.max(-1, keepdim=True).values)
            nxt = torch.multinomial(pr, 1, generator=generator).squeeze(-1)
        pos += t
        out[:, pos] = nxt
        cur = nxt[:, None]
    return out
