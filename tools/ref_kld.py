"""Writes tests/fixtures/smollm2/kl_divergence.json: llama.cpp's llama-perplexity KL divergence
of the default model (ternary, QAT-distilled from SmolLM2-135M-Instruct) from SmolLM2-135M-Instruct
Q4_1 over the first 8 windows of 128 tokens of Pride and Prejudice, flash attention off:

  1. llama.cpp writes the base file (`--kl-divergence-base`) from the Q4_1 model; its header,
     tokens and a sample of its records (the next token's and 24 fixed ids' log-probabilities,
     the scale and offset of every record) go to the fixture, with its perplexity;
  2. llama.cpp compares the default model with that file (`--kl-divergence`): its statistics;
  3. trit writes the base file from the same model and text; llama.cpp reads it and compares
     the default model with it: its statistics again (llama.cpp reading trit's file), and the
     largest difference between the two files' log-probabilities (a record, not a test input).

Needs tools/setup_peers.sh (llama-perplexity), tools/fetch_assets.sh (smollm2, texts), cargo.
"""
import json, os, re, struct, subprocess, sys, tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("TRIT_CACHE", ROOT / ".cache"))
LLAMA = CACHE / "llcpp-bin" / "llama-perplexity"
BASE_MODEL = CACHE / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL = next((ROOT / "models" / "default").glob("*.gguf"))
TEXT = CACHE / "texts" / "prideprejudice.txt"
CTX, CHUNKS = 128, 8
SAMPLE_IDS = list(range(0, 49152, 2048))  # 24 fixed ids


def run(cmd):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{cmd[0]} failed:\n{r.stderr[-3000:]}")
    return r.stdout + r.stderr


def stats(out):
    """llama-perplexity's final statistics as numbers."""
    want = {
        "ppl_q": r"Mean PPL\(Q\)\s*:\s*([-\d.]+)",
        "ppl_base": r"Mean PPL\(base\)\s*:\s*([-\d.]+)",
        "cor": r"Cor\(ln\(PPL\(Q\)\), ln\(PPL\(base\)\)\):\s*([-\d.]+)%",
        "ln_ratio": r"Mean ln\(PPL\(Q\)/PPL\(base\)\)\s*:\s*([-\d.]+)",
        "kld": r"Mean    KLD:\s*([-\d.]+)",
        "kld_max": r"Maximum KLD:\s*([-\d.]+)",
        "kld_99": r"99\.0%   KLD:\s*([-\d.]+)",
        "kld_median": r"Median  KLD:\s*([-\d.]+)",
        "p_diff_rms": r"RMS Δp    :\s*([-\d.]+)",
        "same_top": r"Same top p:\s*([-\d.]+)",
    }
    got = {}
    for k, pat in want.items():
        m = re.search(pat, out)
        if not m:
            sys.exit(f"no {k} in llama-perplexity's output:\n{out[-3000:]}")
        got[k] = float(m.group(1))
    return got


def read_file(path):
    raw = Path(path).read_bytes()
    assert raw[:8] == b"_logits_"
    n_ctx, n_vocab, n_chunk = struct.unpack_from("<3i", raw, 8)
    tokens = np.frombuffer(raw, "<i4", n_ctx * n_chunk, 20)
    nv = 2 * ((n_vocab + 1) // 2) + 4
    recs = np.frombuffer(raw, "<u2", offset=20 + 4 * len(tokens)).reshape(-1, nv)
    head = recs[:, :4].copy().view("<f4")  # scale, min_log_prob
    logp = head[:, :1] * recs[:, 4:4 + n_vocab].astype(np.float32) + head[:, 1:2]
    return n_ctx, n_vocab, n_chunk, tokens, head, logp


def main():
    out = {"generated_by": "tools/ref_kld.py", "ctx": CTX, "chunks": CHUNKS,
           "text": "texts/prideprejudice.txt", "base_model": "smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
           "model": "models/default/" + MODEL.name, "llama_cpp_build": "0c1e570 (llama-cpp-python 0.3.36)"}
    common = ["-c", CTX, "-fa", "off", "-t", "2"]
    with tempfile.TemporaryDirectory() as d:
        base = Path(d) / "base_llama.kld"
        o = run([LLAMA, "-m", BASE_MODEL, "-f", TEXT, "--chunks", CHUNKS, *common,
                 "--kl-divergence-base", base])
        out["base_ppl"] = float(re.search(r"Final estimate: PPL = ([\d.]+)", o).group(1))
        out["llama_cpp"] = stats(run([LLAMA, "-m", MODEL, *common, "--kl-divergence-base", base,
                                      "--kl-divergence"]))
        n_ctx, n_vocab, n_chunk, tokens, head, logp = read_file(base)
        out["header"] = {"n_ctx": n_ctx, "n_vocab": n_vocab, "n_chunk": n_chunk}
        out["tokens"] = tokens.tolist()
        first = n_ctx // 2
        nexts = [int(tokens[c * n_ctx + p + 1]) for c in range(n_chunk) for p in range(first, n_ctx - 1)]
        out["records"] = [
            {"scale": float(head[i, 0]), "min_log_prob": round(float(head[i, 1]), 4),
             "next": nexts[i], "next_log_prob": round(float(logp[i, nexts[i]]), 4),
             "sample_log_probs": [round(float(logp[i, t]), 3) for t in SAMPLE_IDS]}
            for i in range(len(nexts))]
        out["sample_ids"] = SAMPLE_IDS

        subprocess.run(["cargo", "build", "--release", "-p", "trit-cli", "-q"], cwd=ROOT, check=True)
        trit = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "release" / "trit"
        ours = Path(d) / "base_trit.kld"
        run([trit, "perplexity", BASE_MODEL, "-f", TEXT, "-c", CTX, "--chunks", CHUNKS,
             "--kl-divergence-base", ours])
        out["llama_cpp_reading_trits_file"] = stats(
            run([LLAMA, "-m", MODEL, *common, "--kl-divergence-base", ours, "--kl-divergence"]))
        t = read_file(ours)
        assert t[:3] == (n_ctx, n_vocab, n_chunk) and (t[3] == tokens).all(), "headers differ"
        seen = logp > -10
        out["trit_file_vs_llama_file_max_abs_log_prob_diff_above_minus_10"] = float(
            np.abs(t[5] - logp)[seen].max())
    dst = ROOT / "tests" / "fixtures" / "smollm2" / "kl_divergence.json"
    records = out.pop("records")
    text = json.dumps(out, indent=1)[:-2] + ',\n "records": [\n'
    text += ",\n".join(json.dumps(r, separators=(",", ":")) for r in records) + "\n ]\n}\n"
    dst.write_text(text)
    print(f"wrote {dst}: llama.cpp KLD {out['llama_cpp']['kld']}, on trit's file "
          f"{out['llama_cpp_reading_trits_file']['kld']}")


if __name__ == "__main__":
    main()
