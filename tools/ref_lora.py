#!/usr/bin/env python3
"""mlx-lm reference for LoRA adapters → tests/fixtures/lora/

Writes a random mlx-lm adapter for trit's random `tiny` model (4 layers, hidden 256; the MLX
folder made by `gen_model --preset tiny --seed 0`): rank 4, scale 8, num_layers 2 (layers 2
and 3), keys q_proj, v_proj, o_proj, up_proj, down_proj; A ~ U(±1/sqrt(in)) as mlx-lm
initializes it, B ~ N(0, 0.05²) (mlx-lm starts B at zero; a trained B is not), both stored as
f16 so the fixture stays small (~40 KB). Then runs mlx-lm 0.32.2 (CPU, model cast to f32)
with and without the adapter (`mlx_lm.load(folder, adapter_path=...)`) on the ChatML prompt of
tools/ref_models.py and keeps the last-position logits: top 20 and every 148th id (1024 values).

  /work/main/.cache/venv/bin/python tools/ref_lora.py
"""

import importlib.metadata
import json
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ref_smollm2 import default_cache, dump_json, top_k  # noqa: E402
from ref_models import PROMPT_IDS, SAMPLE_COUNT, SAMPLE_STEP, gen_command  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(REPO, "tests", "fixtures", "lora")
RANK, SCALE, LAYERS, N_LAYERS = 4, 8.0, [2, 3], 4
KEYS = {  # module → (in, out) for the tiny preset
    "self_attn.q_proj": (256, 256),
    "self_attn.v_proj": (256, 128),
    "self_attn.o_proj": (256, 256),
    "mlp.up_proj": (256, 768),
    "mlp.down_proj": (768, 256),
}


def add_pair(weights, rng, stem, n_in, n_out, rank):
    """A random LoRA pair under `stem` (f16): A ~ U(±1/sqrt(in)) as mlx-lm initializes it,
    B ~ N(0, 0.05²) (mlx-lm starts B at zero; a trained B is not)."""
    import mlx.core as mx

    a = rng.uniform(-1 / np.sqrt(n_in), 1 / np.sqrt(n_in), (n_in, rank))
    b = rng.normal(0.0, 0.05, (rank, n_out))
    weights[stem + ".lora_a"] = mx.array(a.astype(np.float16))
    weights[stem + ".lora_b"] = mx.array(b.astype(np.float16))


def save_adapter(folder, weights, num_layers, rank, scale, keys):
    """adapters.safetensors and adapter_config.json, as mlx-lm's trainer writes them."""
    import mlx.core as mx

    os.makedirs(folder, exist_ok=True)
    mx.save_safetensors(os.path.join(folder, "adapters.safetensors"), weights)
    config = {"fine_tune_type": "lora", "num_layers": num_layers,
              "lora_parameters": {"rank": rank, "scale": scale, "dropout": 0.0,
                                  "keys": list(keys)}}
    with open(os.path.join(folder, "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=2)


def write_adapter(folder):
    rng = np.random.default_rng(8)
    weights = {}
    for layer in LAYERS:
        for key, (n_in, n_out) in KEYS.items():
            add_pair(weights, rng, f"model.layers.{layer}.{key}", n_in, n_out, RANK)
    save_adapter(folder, weights, len(LAYERS), RANK, SCALE, KEYS)


def last_logits(folder, adapter):
    import mlx.core as mx
    from mlx_lm import load

    model, _ = load(folder, adapter_path=adapter)
    model.set_dtype(mx.float32)
    out = model(mx.array([PROMPT_IDS]))[0, -1]
    return np.array(out.astype(mx.float32), dtype=np.float32)


def main():
    cache = default_cache()
    folder = os.path.join(cache, "refmodels", "tiny", "mlx")
    if not os.path.isdir(folder):
        subprocess.run(gen_command(cache, "tiny"), cwd=REPO, check=True)
    adapter = os.path.join(OUT, "mlx_adapter")
    write_adapter(adapter)
    base = last_logits(folder, None)
    adapted = last_logits(folder, adapter)
    ids, vals = top_k(adapted, 20)
    sample = np.arange(SAMPLE_COUNT) * SAMPLE_STEP
    result = {
        "model": "refmodels/tiny/mlx (gen_model --preset tiny --seed 0)",
        "adapter": "mlx_adapter/ (rank 4, scale 8, num_layers 2, 5 keys, f16)",
        "prompt_ids": PROMPT_IDS,
        "top20": {"ids": ids, "logits": vals},
        "sampled_indices": {"start": 0, "step": SAMPLE_STEP, "count": SAMPLE_COUNT},
        "sampled_logits": [float(adapted[i]) for i in sample],
        "adapter_effect_max_abs": float(np.max(np.abs(adapted - base))),
        "base_argmax": int(np.argmax(base)),
        "adapted_argmax": int(np.argmax(adapted)),
        "versions": {p: importlib.metadata.version(p) for p in ["mlx", "mlx-lm", "numpy"]},
        "command": "python tools/ref_lora.py",
    }
    dump_json(result, os.path.join(OUT, "tiny.json"))
    print(json.dumps({k: result[k] for k in ["adapter_effect_max_abs", "base_argmax",
                                             "adapted_argmax"]}))


if __name__ == "__main__":
    main()
