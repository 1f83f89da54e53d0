"""Write the distilled ternary model as an MLX affine 2-bit folder (mlx-lm `llama`).

Per quantized module: `weight` uint32 [out, in/16] (codes 16 per word, LSB-first: the packed
bytes read as little-endian words), `scales` = s and `biases` = -s (f16, one per 64 weights), so
codes 0/1/2 decode to -s/0/+s exactly (formats.md §3.3). Rows stay in Hugging Face order (the
packed files already are). Norms are stored as float32. The tied embedding is quantized too and
doubles as the LM head (`tie_word_embeddings`).

  python3 tools/distill/export_mlx.py --packed DIR [--teacher T.gguf] [--tokenizer tokenizer.json]
                                      [--out .cache/default-mlx]
"""

import argparse
import json
import os
import shutil
import sys

import numpy as np
from safetensors.numpy import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import arch as A  # noqa: E402
import gguf_io as G  # noqa: E402
from export_gguf import load_packed  # noqa: E402

HF_MODULE = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
             "o": "self_attn.o_proj", "gate": "mlp.gate_proj", "up": "mlp.up_proj",
             "down": "mlp.down_proj", "attn_norm": "input_layernorm",
             "ffn_norm": "post_attention_layernorm"}


def hf_path(name):
    if name == "embed":
        return "model.embed_tokens"
    if name == "norm":
        return "model.norm"
    _, i, m = name.split(".")
    return f"model.layers.{i}.{HF_MODULE[m]}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--packed", required=True)
    ap.add_argument("--teacher", default=".cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--tokenizer", default=".dev/data/tokenizer.json")
    ap.add_argument("--out", default=".cache/default-mlx")
    args = ap.parse_args()
    packed = load_packed(args.packed)
    teacher = G.GGUFFile(args.teacher)

    tensors = {}
    for n in A.ternary_names():
        codes = np.ascontiguousarray(packed[n + ".codes"])  # uint8 [out, in/4]
        scales = packed[n + ".scales"].astype(np.float16)
        p = hf_path(n)
        tensors[p + ".weight"] = codes.view("<u4").astype(np.uint32)  # [out, in/16]
        tensors[p + ".scales"] = scales
        tensors[p + ".biases"] = -scales
    for n in A.norm_names():
        tensors[hf_path(n) + ".weight"] = packed[n].astype(np.float32)
    os.makedirs(args.out, exist_ok=True)
    save_file(tensors, os.path.join(args.out, "model.safetensors"), metadata={"format": "mlx"})

    quant = {"group_size": A.GROUP, "bits": 2, "mode": "affine"}
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": A.DIM, "intermediate_size": A.FFN, "num_hidden_layers": A.N_LAYERS,
        "num_attention_heads": A.N_HEAD, "num_key_value_heads": A.N_KV, "head_dim": A.HEAD_DIM,
        "rms_norm_eps": A.EPS, "rope_theta": A.ROPE_THETA, "rope_scaling": None,
        "vocab_size": A.VOCAB, "max_position_embeddings": teacher.value("llama.context_length"),
        "tie_word_embeddings": True, "hidden_act": "silu", "attention_bias": False,
        "mlp_bias": False, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2,
        "torch_dtype": "float16", "quantization": quant, "quantization_config": quant,
    }
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)

    tokens = teacher.value("tokenizer.ggml.tokens")
    types = teacher.value("tokenizer.ggml.token_type")
    added = {str(i): {"content": tokens[i], "lstrip": False, "normalized": False,
                      "rstrip": False, "single_word": False, "special": True}
             for i, t in enumerate(types) if t == 3}
    tok_config = {
        "add_bos_token": False, "add_eos_token": False, "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": tokens[teacher.value("tokenizer.ggml.bos_token_id")],
        "eos_token": tokens[teacher.value("tokenizer.ggml.eos_token_id")],
        "pad_token": tokens[teacher.value("tokenizer.ggml.padding_token_id")],
        "unk_token": tokens[teacher.value("tokenizer.ggml.unknown_token_id")],
        "chat_template": teacher.value("tokenizer.chat_template"),
        "clean_up_tokenization_spaces": False, "model_max_length": config["max_position_embeddings"],
        "tokenizer_class": "GPT2Tokenizer",
    }
    with open(os.path.join(args.out, "tokenizer_config.json"), "w") as f:
        json.dump(tok_config, f, indent=2, ensure_ascii=False)
    with open(os.path.join(args.out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}, f, indent=2)
    shutil.copyfile(args.tokenizer, os.path.join(args.out, "tokenizer.json"))

    # Read back: every group decodes to -s/0/+s (biases == -scales bit for bit, no code 3).
    from safetensors.numpy import load_file
    back = load_file(os.path.join(args.out, "model.safetensors"))
    for n in A.ternary_names():
        p = hf_path(n)
        s, b = back[p + ".scales"], back[p + ".biases"]
        assert np.array_equal(b.view(np.uint16), (s.view(np.uint16) ^ 0x8000)), p
        words = back[p + ".weight"]
        assert np.array_equal(words.view(np.uint8), packed[n + ".codes"]), p
        codes = np.stack([(words >> (2 * j)) & 3 for j in range(16)], axis=-1)
        assert not (codes == 3).any(), p + " has code 3"
    print(f"wrote {args.out}: {len(tensors)} tensors, "
          f"{os.path.getsize(os.path.join(args.out, 'model.safetensors'))} bytes")


if __name__ == "__main__":
    main()
