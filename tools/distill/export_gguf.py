"""Write the distilled ternary model as an upstream-llama.cpp GGUF with Q2_0 tensors.

Input: the packed safetensors files that train.py writes (uint8 codes 4 per byte LSB-first with
code = t + 1, f16 scales per 64 weights, f32 norms; Hugging Face row order). Q2_0 (ggml type 42)
stores exactly that per 64 weights: an 18-byte block of f16 d followed by the 16 code bytes, so the
conversion is lossless. Q/K rows are permuted back to the GGUF order (adjacent-pair RoPE).
Metadata: llama.*, tokenizer.ggml.* and tokenizer.chat_template are copied from the teacher GGUF.
The written file is read back and compared with the packed values, bit for bit.

  python3 tools/distill/export_gguf.py --packed DIR [--teacher T.gguf] [--out F.gguf]
"""

import argparse
import glob
import os
import sys

import numpy as np
from safetensors.numpy import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_io as G  # noqa: E402
import arch as M  # noqa: E402

NAME = "SmolLM2 135M Instruct Ternary (QAT-distilled, Q2_0 g64)"


def load_packed(folder):
    packed = {}
    for f in sorted(glob.glob(os.path.join(folder, "packed-*.safetensors"))):
        packed.update(load_file(f))
    missing = [n for n in M.ternary_names() if n + ".codes" not in packed]
    missing += [n for n in M.norm_names() if n not in packed]
    if missing:
        raise SystemExit(f"packed model incomplete, missing {missing[:5]}")
    return packed


def gguf_rows(name, a):
    """HF row order -> GGUF row order for Q and K (rows carry their codes and scales along)."""
    if name.endswith(".q"):
        return M.hf_to_gguf_rows(a, M.N_HEAD)
    if name.endswith(".k"):
        return M.hf_to_gguf_rows(a, M.N_KV)
    return a


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--packed", required=True)
    ap.add_argument("--teacher", default=".cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--out", default="models/default/smollm2-135m-ternary-q2_0.gguf")
    args = ap.parse_args()
    packed = load_packed(args.packed)
    teacher = G.GGUFFile(args.teacher)

    w = G.GGUFWriter(alignment=32)
    w.add_kv("general.architecture", G.T_STR, "llama")
    w.add_kv("general.type", G.T_STR, "model")
    w.add_kv("general.name", G.T_STR, NAME)
    w.add_kv("general.basename", G.T_STR, "smollm2")
    w.add_kv("general.finetune", G.T_STR, "instruct-ternary-qat")
    w.add_kv("general.size_label", G.T_STR, "135M")
    w.add_kv("general.license", G.T_STR, "apache-2.0")
    w.add_kv("general.description", G.T_STR,
             "Ternary weights (t in {-1,0,+1}, one f16 scale per 64) distilled from "
             "HuggingFaceTB/SmolLM2-135M-Instruct by quantization-aware training (trit, "
             "tools/distill)")
    w.add_kv("general.quantization_version", G.T_U32, 2)
    w.add_kv("general.alignment", G.T_U32, 32)
    w.add_kv("general.file_type", G.T_U32, 41)  # LLAMA_FTYPE_MOSTLY_Q2_0
    for key, (vtype, value, etype) in teacher.kv.items():
        if key.startswith(("llama.", "tokenizer.ggml.")) or key == "tokenizer.chat_template":
            w.add_kv(key, vtype, value, etype)

    expected = {}
    order = [n for n in teacher.tensors]  # keep the teacher's tensor order
    by_gguf = {M.gguf_name(n): n for n in M.ternary_names() + M.norm_names()}
    if set(order) != set(by_gguf):
        raise SystemExit("teacher tensor names differ from the model's")
    for gname in order:
        n = by_gguf[gname]
        _, ne, _, _ = teacher.tensors[gname]
        if n in packed:  # a norm
            data = packed[n].astype(np.float32)
            w.add_tensor(gname, G.F32, ne, data)
            expected[gname] = ("f32", data)
            continue
        codes = gguf_rows(n, packed[n + ".codes"])
        scales = gguf_rows(n, packed[n + ".scales"]).astype(np.float16)
        if codes.shape != (ne[1], ne[0] // 4) or scales.shape != (ne[1], ne[0] // 64):
            raise SystemExit(f"{n}: packed shape {codes.shape} does not fit ne {ne}")
        w.add_tensor(gname, G.Q2_0, ne, G.q2_0_encode(codes, scales))
        expected[gname] = ("q2", codes, scales)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    w.write(args.out)

    # Read back and compare every tensor with what was packed.
    back = G.GGUFFile(args.out)
    for gname, exp in expected.items():
        ttype, ne, _, _ = back.tensors[gname]
        raw = back.raw(gname)
        if exp[0] == "f32":
            assert ttype == G.F32 and np.array_equal(raw.view(np.float32), exp[1].reshape(-1)), gname
            continue
        assert ttype == G.Q2_0, gname
        d, t = G.q2_0_decode(raw, int(np.prod(ne)))
        codes, scales = exp[1], exp[2]
        assert np.array_equal(d.astype(np.float16), scales.reshape(-1)), gname + " scales"
        want_t = np.stack([(codes >> (2 * j)) & 3 for j in range(4)], axis=-1).reshape(-1, 64)
        assert np.array_equal(t, want_t.astype(np.int8) - 1), gname + " codes"
        assert not (want_t == 3).any(), gname + " has code 3"
    assert back.value("general.file_type") == 41
    print(f"wrote {args.out}: {os.path.getsize(args.out)} bytes, {len(expected)} tensors, "
          f"{len(back.kv)} KV pairs; read back bit-exact")


if __name__ == "__main__":
    main()
