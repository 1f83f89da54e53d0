#!/usr/bin/env python3
"""mlx-lm reference for LoRA adapters on a Qwen3.5 hybrid → tests/fixtures/lora/qwen35_*

Writes a random mlx-lm adapter for trit's random `tiny-qwen35` model (8 layers, hidden 256,
layers 3 and 7 full attention, the others Gated DeltaNet; the MLX folder made by
`gen_model --preset tiny-qwen35 --seed 0 --formats mlx`): rank 4, scale 6, num_layers 3 (layers
5 and 6 DeltaNet, 7 full attention), every projection of those blocks (the twelve keys below;
mlx-lm wraps the ones each block has). A ~ U(±1/sqrt(in)) as mlx-lm initializes it, B ~
N(0, 0.05²) (a trained B is not zero), both stored as f16. mlx-lm's own `load_adapters` checks
every name and shape against the model it built.

Then runs mlx-lm 0.32.2 (CPU, parameters cast to f32) with the adapter on a 12-token prompt and 4
greedy steps through its cache, and keeps each of the 5 rows of logits (vocab 4,096, f32) in
qwen35_steps.f32, the greedy tokens and the adapter's effect in tiny-qwen35.json.

  /work/main/.cache/venv/bin/python tools/ref_lora_qwen35.py
"""

import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ref_lora import add_pair, save_adapter  # noqa: E402
from ref_smollm2 import dump_json  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(REPO, "tests", "fixtures", "lora")
RANK, SCALE, LAYERS = 4, 6.0, [5, 6, 7]
PROMPT = [11, 500, 7, 1234, 99, 2048, 3, 77, 4000, 12, 640, 5]
STEPS = 4
KEYS = [
    "linear_attn.in_proj_qkv", "linear_attn.in_proj_z", "linear_attn.in_proj_a",
    "linear_attn.in_proj_b", "linear_attn.out_proj",
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
]


def shapes(cfg):
    """(in, out) of each key, per layer kind, from the text config."""
    d, f = cfg["hidden_size"], cfg["intermediate_size"]
    q = cfg["num_attention_heads"] * cfg["head_dim"]
    kv = cfg["num_key_value_heads"] * cfg["head_dim"]
    kw = cfg["linear_num_key_heads"] * cfg["linear_key_head_dim"]
    hv = cfg["linear_num_value_heads"]
    vw = hv * cfg["linear_value_head_dim"]
    mlp = {"mlp.gate_proj": (d, f), "mlp.up_proj": (d, f), "mlp.down_proj": (f, d)}
    linear = {"linear_attn.in_proj_qkv": (d, 2 * kw + vw), "linear_attn.in_proj_z": (d, vw),
              "linear_attn.in_proj_a": (d, hv), "linear_attn.in_proj_b": (d, hv),
              "linear_attn.out_proj": (vw, d), **mlp}
    full = {"self_attn.q_proj": (d, 2 * q), "self_attn.k_proj": (d, kv),
            "self_attn.v_proj": (d, kv), "self_attn.o_proj": (q, d), **mlp}
    return linear, full


def write_adapter(folder, cfg):
    interval = cfg["full_attention_interval"]
    linear, full = shapes(cfg)
    rng = np.random.default_rng(35)
    weights = {}
    for layer in LAYERS:
        kind = full if (layer + 1) % interval == 0 else linear
        for key, (n_in, n_out) in kind.items():
            add_pair(weights, rng, f"language_model.model.layers.{layer}.{key}", n_in, n_out,
                     RANK)
    save_adapter(folder, weights, len(LAYERS), RANK, SCALE, KEYS)


def run(folder, adapter):
    """The prompt's last logits, then STEPS greedy steps through mlx-lm's cache."""
    from pathlib import Path

    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.tuner.utils import load_adapters
    from mlx_lm.utils import load_model

    model, _ = load_model(Path(folder))
    if adapter:
        load_adapters(model, adapter)
    model.set_dtype(mx.float32)
    cache = make_prompt_cache(model)
    to_np = lambda x: np.array(x.astype(mx.float32), dtype=np.float32)  # noqa: E731
    rows = [to_np(model(mx.array([PROMPT]), cache=cache)[0, -1])]
    picks = []
    for _ in range(STEPS):
        picks.append(int(np.argmax(rows[-1])))
        rows.append(to_np(model(mx.array([[picks[-1]]]), cache=cache)[0, -1]))
    return np.stack(rows), picks


def main():
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["cargo", "run", "--release", "-p", "trit", "--example", "gen_model",
                        "--", "--preset", "tiny-qwen35", "--seed", "0", "--out", tmp,
                        "--formats", "mlx"], cwd=REPO, check=True)
        folder = os.path.join(tmp, "mlx")
        with open(os.path.join(folder, "config.json")) as f:
            cfg = json.load(f)["text_config"]
        adapter = os.path.join(OUT, "qwen35_adapter")
        write_adapter(adapter, cfg)
        base, _ = run(folder, None)
        rows, picks = run(folder, adapter)
    rows.astype("<f4").tofile(os.path.join(OUT, "qwen35_steps.f32"))
    result = {
        "model": "gen_model --preset tiny-qwen35 --seed 0 --formats mlx (DIR/mlx)",
        "adapter": "qwen35_adapter/ (rank 4, scale 6, num_layers 3: layers 5, 6 DeltaNet and "
                   "7 full attention, every projection, f16)",
        "reference": "mlx-lm qwen3_5 + tuner.utils.load_adapters, set_dtype float32, CPU",
        "prompt_ids": PROMPT,
        "greedy": picks,
        "rows": "qwen35_steps.f32: the prompt's last logits, then one row per greedy step",
        "vocab": int(rows.shape[1]),
        "adapter_effect_max_abs": float(np.max(np.abs(rows[0] - base[0]))),
        "versions": {p: importlib.metadata.version(p) for p in ["mlx", "mlx-lm", "numpy"]},
        "command": "python tools/ref_lora_qwen35.py",
    }
    dump_json(result, os.path.join(OUT, "tiny-qwen35.json"))
    print(json.dumps({k: result[k] for k in ["greedy", "adapter_effect_max_abs"]}))


if __name__ == "__main__":
    main()
