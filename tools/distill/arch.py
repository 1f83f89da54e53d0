"""SmolLM2-135M shapes, tensor names and the GGUF Q/K row permutation (no torch needed)."""

N_LAYERS, DIM, FFN, N_HEAD, N_KV, HEAD_DIM, VOCAB = 30, 576, 1536, 9, 3, 64, 49152
ROPE_THETA, EPS = 100000.0, 1e-5
GROUP = 64  # ternary group along the input dimension; 576 = 9 x 64 is not a multiple of 128
MATRICES = ["q", "k", "v", "o", "gate", "up", "down"]
GGUF_NAMES = {"q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output", "gate": "ffn_gate",
              "up": "ffn_up", "down": "ffn_down", "attn_norm": "attn_norm",
              "ffn_norm": "ffn_norm"}


def ternary_names():
    return ["embed"] + [f"layers.{i}.{m}" for i in range(N_LAYERS) for m in MATRICES]


def norm_names():
    return ["norm"] + [f"layers.{i}.{n}" for i in range(N_LAYERS) for n in ("attn_norm", "ffn_norm")]


def gguf_name(name):
    if name == "embed":
        return "token_embd.weight"
    if name == "norm":
        return "output_norm.weight"
    _, i, m = name.split(".")
    return f"blk.{i}.{GGUF_NAMES[m]}.weight"


def gguf_to_hf_rows(w, n_head):
    """Undo convert_hf_to_gguf's Q/K row permutation (adjacent-pair RoPE -> rotate-half)."""
    out = w.shape[0]
    return w.reshape(n_head, out // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_to_gguf_rows(w, n_head):
    out = w.shape[0]
    return w.reshape(n_head, 2, out // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
