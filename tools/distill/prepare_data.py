"""Rebuild the teacher's tokenizer from its GGUF and tokenize the training / evaluation texts.

Runs on the CPU here. Writes into the output folder (default .dev/data):
  tokenizer.json          the rebuilt byte-level BPE tokenizer (also used by the MLX export)
  train_austen.u16        Austen novels except Pride and Prejudice, documents joined by <|endoftext|>
  train_kjv.u16           the King James Bible
  eval_pp.u16             Pride and Prejudice (held out: evaluation only, never trained on)
  prompts_text.u16        16-token windows of the training texts, used as sampling prompts
  meta.json               token counts and the chat prefix ids
"""

import argparse
import json
import os

import numpy as np
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from gguf_io import GGUFFile

TRAIN_AUSTEN = ["emma", "mansfieldpark", "northangerabbey", "persuasion", "sensesensibility"]
HELD_OUT = "prideprejudice"
# The default system turn of SmolLM2's chat template followed by an open user turn: the teacher
# then writes both a question and its answer, which keeps the chat behaviour in the distilled data.
CHAT_PREFIX = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
               "Face<|im_end|>\n<|im_start|>user\n")


def build_tokenizer(gguf):
    tokens = gguf.value("tokenizer.ggml.tokens")
    types = gguf.value("tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ", 1)) for m in gguf.value("tokenizer.ggml.merges")]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    # llama.cpp's `smollm` pre-tokenizer: every digit on its own, then the GPT-2 split regex.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    # Control tokens (type 3) are atomic and are never split by the pre-tokenizer.
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                            for i, t in enumerate(types) if t == 3])
    return tok


def check_tokenizer(tok):
    cases = {"The capital of France is": [504, 3575, 282, 4649, 314],
             "Hello world": [19556, 905],
             "苹果发布M5芯片": [179, 229, 134, 43774, 12034, 235, 32947, 221, 61, 37, 179, 228,
                            124, 33913, 225]}
    for text, want in cases.items():
        got = tok.encode(text, add_special_tokens=False).ids
        if got != want:
            raise SystemExit(f"tokenizer mismatch for {text!r}: {got} != {want}")
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>", add_special_tokens=False).ids
    if ids[0] != 1 or ids[-1] != 2:
        raise SystemExit(f"special tokens not atomic: {ids}")


def encode_file(tok, path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    return tok.encode(text, add_special_tokens=False).ids


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default=".cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--texts", default=".cache/texts")
    ap.add_argument("--out", default=".dev/data")
    ap.add_argument("--prompt-windows", type=int, default=20000)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    tok = build_tokenizer(GGUFFile(args.gguf))
    check_tokenizer(tok)
    tok.save(os.path.join(args.out, "tokenizer.json"))

    meta = {"docs": {}}
    austen = []
    for name in TRAIN_AUSTEN:
        ids = encode_file(tok, os.path.join(args.texts, name + ".txt"))
        meta["docs"][name] = len(ids)
        austen += ids + [0]  # <|endoftext|> between documents
    kjv = encode_file(tok, os.path.join(args.texts, "kjv.txt")) + [0]
    meta["docs"]["kjv"] = len(kjv) - 1
    pp = encode_file(tok, os.path.join(args.texts, HELD_OUT + ".txt"))
    meta["docs"][HELD_OUT + " (held out)"] = len(pp)
    arrays = {"train_austen": austen, "train_kjv": kjv, "eval_pp": pp}
    for name, ids in arrays.items():
        np.asarray(ids, dtype=np.uint16).tofile(os.path.join(args.out, name + ".u16"))

    # Sampling prompts: 16-token windows starting at random places of the training texts only.
    rng = np.random.default_rng(0)
    train = np.concatenate([np.asarray(austen, np.uint16), np.asarray(kjv, np.uint16)])
    starts = rng.integers(0, len(train) - 16, args.prompt_windows)
    windows = np.stack([train[s:s + 16] for s in starts])
    windows.astype(np.uint16).tofile(os.path.join(args.out, "prompts_text.u16"))

    meta["train_tokens"] = {"austen": len(austen), "kjv": len(kjv)}
    meta["chat_prefix"] = tok.encode(CHAT_PREFIX, add_special_tokens=False).ids
    # Single-token starts for free generation: <|endoftext|> and common opening words.
    starts_words = ["The", "In", "A", "I", "When", "Once", "How", "What", "Why", "This", "It",
                    "We", "My", "There", "Today", "If", "Many", "One", "Here", "After"]
    meta["start_tokens"] = [0] + [tok.encode(w, add_special_tokens=False).ids[0]
                                  for w in starts_words]
    meta["pp_first_512"] = pp[:512][:8]
    with open(os.path.join(args.out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(json.dumps(meta, indent=1))


if __name__ == "__main__":
    main()
