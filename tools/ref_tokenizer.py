#!/usr/bin/env python3
"""Golden fixtures for trit's tokenizer and chat-template code, from the Python reference stack.

Writes (small JSON files, committed):
  tests/fixtures/tokenizer/qwen3_ids.json      Python `tokenizers` on the Qwen3 tokenizer.json
  tests/fixtures/tokenizer/smollm2_ids.json    Python `tokenizers` rebuilt from the SmolLM2 GGUF vocab + merges
  tests/fixtures/chat/qwen3_renders.json       Jinja2 renderings of the official Qwen3 template
  tests/fixtures/chat/smollm2_renders.json     Jinja2 renderings of the template inside the SmolLM2 GGUF

The render fixtures embed the template source (Apache-2.0, like the models), so the Rust
template tests run without the cache. The Jinja environment is written here the way transformers' `apply_chat_template` builds it
(sandboxed, trim_blocks + lstrip_blocks, its own `tojson`, `raise_exception`, `strftime_now`,
reasoning-field aliasing); when transformers is importable every rendering is also checked against
`apply_chat_template` itself.

Before writing anything the script checks the independent golden ids recorded in
docs/assets.md §1 and §3 (the latter come from llama.cpp), so a drifting reference fails loudly.

Usage (CI does not run this; it needs the cache assets and a venv with tokenizers, jinja2, gguf):
  python3 tools/ref_tokenizer.py [--cache DIR]
"""

import argparse
import json
import os
import sys
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Strings chosen to exercise every branch of the pre-tokenizer and byte-level BPE: CJK, emoji
# (multi-codepoint ZWJ sequences split across byte tokens), whitespace runs and tabs, digit runs,
# contractions, special tokens glued to text, code, RTL and Indic scripts, combining characters
# (changed by Qwen's NFC normalizer), control characters.
QWEN3_TEXTS = [
    "Hello world",
    "Hello, my dog is cute",
    "苹果发布M5芯片",
    " Hello world\n\n  tabs\tand  spaces 12345 ☃ 🤖",
    "<|im_start|>user\nHi<|im_end|>",
    "",
    " ",
    "   leading and trailing   ",
    "\n\n\n",
    "\t\tdef f(x):\n\t\treturn x*2\n",
    'fn main() {\n    println!("{}", 1 + 2);\n}\n',
    "3.14159 and 1,000,000 and 2024-01-01 and 12345678901234567890",
    "I'm you're they've we'll she'd IT'S DON'T",
    "日本語のテキストと한국어 텍스트",
    "Привет, мир! Ελληνικά κείμενα",
    "مرحبا بالعالم",
    "emoji: 👩‍👩‍👧‍👦 🏳️‍🌈 👍🏽 😀",
    "combining: e\u0301 vs \u00e9, A\u030a, n\u0303o",
    "Ｆｕｌｌｗｉｄｔｈ ｔｅｘｔ",
    "<think>\nLet me think.\n</think>\n\nThe answer is 42.",
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    "<|endoftext|><|im_end|><|im_start|>",
    "<|im_start| not quite special <|im_end",
    "x = [i**2 for i in range(10) if i % 2 == 0]  # squares",
    "https://example.com/path?query=1&b=2#frag",
    "Mixed 中文 and English 混合 text.",
    "\r\nWindows\r\nline endings\r\n",
    "à la carte — “quotes” ‘single’ … ellipsis",
    "a\u200bb\u200dc\ufeffd",
    "\u0000 control \u0007 chars \u001b[31m red",
    "ภาษาไทย and नमस्ते दुनिया",
    "    four spaces then text    \t",
]

SMOLLM2_TEXTS = [
    "The capital of France is",
    "Hello world",
    "苹果发布M5芯片",
    " Hello world\n\n  tabs\tand  spaces 12345 ☃ 🤖",
    "<|im_start|>user\nHi<|im_end|>",
    "",
    "   leading and trailing   ",
    "\t\tdef f(x):\n\t\treturn x*2\n",
    "3.14159 and 1,000,000 and 2024-01-01",
    "I'm you're they've we'll she'd IT'S DON'T",
    "Привет, мир!",
    "emoji: 👩‍👩‍👧‍👦 👍🏽 😀",
    "combining: e\u0301 vs \u00e9",
    "<|endoftext|><repo_name>x<file_sep>",
    "x = [i**2 for i in range(10) if i % 2 == 0]  # squares",
    "\r\nWindows\r\nline endings\r\n",
]

# Independent goldens from docs/assets.md (Python tokenizers 0.23.3 for Qwen3, llama.cpp for SmolLM2).
QWEN3_ASSET_IDS = {
    "Hello world": [9707, 1879],
    "Hello, my dog is cute": [9707, 11, 847, 5562, 374, 18838],
    "苹果发布M5芯片": [104167, 90447, 44, 20, 105016],
    " Hello world\n\n  tabs\tand  spaces 12345 ☃ 🤖": [
        21927, 1879, 271, 220, 22398, 52477, 220, 12621, 220, 16, 17, 18, 19, 20, 25125, 225,
        11162, 97, 244,
    ],
    "<|im_start|>user\nHi<|im_end|>": [151644, 872, 198, 13048, 151645],
}
QWEN3_TEMPLATE_ASSET_IDS = [
    151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 151645, 198, 151644, 872, 198, 104167,
    90447, 44, 20, 105016, 151645, 198, 151644, 77091, 198,
]
SMOLLM2_ASSET_IDS = {
    "The capital of France is": [504, 3575, 282, 4649, 314],
    "Hello world": [19556, 905],
    "苹果发布M5芯片": [179, 229, 134, 43774, 12034, 235, 32947, 221, 61, 37, 179, 228, 124, 33913, 225],
}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city. Use <b>metric</b> units & don't guess; 天气",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. \"Paris\""},
                "days": {"type": "integer", "minimum": 1, "maximum": 7, "default": 1},
                "threshold": {"type": "number", "default": 0.5},
                "units": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "verbose": {"type": "boolean", "default": False},
                "extra": {"type": ["string", "null"], "default": None},
            },
            "required": ["city"],
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {"name": "get_time", "description": "Current UTC time", "parameters": {"type": "object", "properties": {}}},
}

# (name, messages, add_generation_prompt, tools, kwargs)
QWEN3_CHATS = [
    (
        "system_user",
        [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "苹果发布M5芯片"}],
        True, None, {},
    ),
    (
        "system_user_no_thinking",
        [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "苹果发布M5芯片"}],
        True, None, {"enable_thinking": False},
    ),
    (
        "user_only_thinking_true",
        [{"role": "user", "content": "Hi there"}],
        True, None, {"enable_thinking": True},
    ),
    (
        "user_only_no_generation_prompt",
        [{"role": "user", "content": "  spaces and\ttabs  \n"}],
        False, None, {},
    ),
    (
        "multi_turn_history_drops_old_thinking",
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is the capital of France?"},
            {"role": "assistant", "content": "<think>\nThe user asks about France.\n</think>\n\nParis."},
            {"role": "user", "content": "And of Germany?"},
            {"role": "assistant", "content": "Berlin."},
            {"role": "user", "content": "Thanks! /no_think"},
        ],
        True, None, {},
    ),
    (
        "last_assistant_keeps_thinking",
        [
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "<think>\n\nSimple arithmetic.\n\n</think>\n\n\n4"},
        ],
        False, None, {},
    ),
    (
        "reasoning_content_field",
        [
            {"role": "user", "content": "Say hi"},
            {"role": "assistant", "content": "Hi!", "reasoning_content": "\nGreeting requested.\n"},
        ],
        False, None, {},
    ),
    (
        "reasoning_alias_field",
        [
            {"role": "user", "content": "Say bye"},
            {"role": "assistant", "content": "Bye!", "reasoning": "Farewell requested."},
        ],
        False, None, {},
    ),
    (
        "tools_call_and_response",
        [
            {"role": "system", "content": "You can check the weather."},
            {"role": "user", "content": "Weather in Paris and the time?"},
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "I need two tools.",
                "tool_calls": [
                    {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2, "threshold": 1.5e-7, "flags": [True, None]}}},
                    {"type": "function", "function": {"name": "get_time", "arguments": "{}"}},
                ],
            },
            {"role": "tool", "content": '{"temp_c": 18.5, "sky": "cloudy"}'},
            {"role": "tool", "content": "12:00 UTC"},
            {"role": "assistant", "content": "<think>\nGot both.\n</think>\n\nParis: 18.5 °C, cloudy; it is 12:00 UTC."},
        ],
        False, [WEATHER_TOOL, TIME_TOOL], {},
    ),
    (
        "tools_no_system_generation_prompt",
        [
            {"role": "user", "content": "Weather in Tokyo?"},
            {"role": "assistant", "content": "Let me check.", "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Tokyo"}'}},
            ]},
            {"role": "tool", "content": "rain"},
        ],
        True, [WEATHER_TOOL], {"enable_thinking": False},
    ),
    (
        "system_in_middle",
        [
            {"role": "user", "content": "first"},
            {"role": "system", "content": "mid-conversation system note"},
            {"role": "user", "content": "second"},
        ],
        True, None, {},
    ),
    (
        "tool_response_text_in_user_turn",
        [
            {"role": "user", "content": "Real question"},
            {"role": "assistant", "content": "<think>\nhmm\n</think>\n\ncalling", "tool_calls": [{"name": "get_time", "arguments": {}}]},
            {"role": "user", "content": "<tool_response>\n12:00\n</tool_response>"},
        ],
        True, [TIME_TOOL], {},
    ),
]

SMOLLM2_CHATS = [
    ("default_system", [{"role": "user", "content": "Hello!"}], True, None, {}),
    (
        "own_system_multi_turn",
        [
            {"role": "system", "content": "Answer in French."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Bonjour !"},
            {"role": "user", "content": "Capital of France?"},
        ],
        True, None, {},
    ),
    ("no_generation_prompt", [{"role": "user", "content": "x"}], False, None, {}),
]


def transformers_like_env():
    """A Jinja environment configured the way transformers' apply_chat_template configures it."""

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # Unlike Jinja's own filter: no HTML escaping, Python json.dumps spacing.
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def alias_reasoning(messages):
    """transformers copies a message's reasoning under every name templates read."""
    out = []
    for m in messages:
        r = next((m[k] for k in REASONING_FIELDS if m.get(k) is not None), None)
        if r is not None:
            m = {"thinking": r, **m, "reasoning_content": r}
        out.append(m)
    return out


def render(env, template, messages, add_generation_prompt, tools, kwargs, special_tokens):
    compiled = env.from_string(template)
    return compiled.render(
        messages=alias_reasoning(messages),
        tools=tools,
        documents=None,
        add_generation_prompt=add_generation_prompt,
        **{**special_tokens, **kwargs},
    )


def check_against_transformers(template, cases, rendered, special_tokens):
    try:
        from transformers.utils.chat_template_utils import render_jinja_template
    except Exception as e:  # transformers is optional
        print(f"  (transformers not importable, skipping cross-check: {e})")
        return
    for (name, messages, gen, tools, kwargs), ours in zip(cases, rendered):
        theirs, _ = render_jinja_template(
            conversations=[messages], tools=tools, chat_template=template,
            add_generation_prompt=gen, **{**special_tokens, **kwargs},
        )
        assert theirs[0] == ours, f"{name}: transformers renders differently:\n{theirs[0]!r}\nvs\n{ours!r}"
    print(f"  transformers.render_jinja_template agrees on {len(cases)} renderings")


def sha256(path):
    import hashlib

    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def write_json(rel, obj):
    path = os.path.join(ROOT, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {rel} ({os.path.getsize(path)} bytes)")


def id_cases(tok, texts):
    cases = []
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False).ids
        decoded = tok.decode(ids, skip_special_tokens=False)
        decoded_skip = tok.decode(ids, skip_special_tokens=True)
        cases.append({"text": text, "ids": ids, "decoded": decoded, "decoded_skip_special": decoded_skip})
    return cases


def qwen3(cache):
    tok_path = os.path.join(cache, "qwen3", "tokenizer.json")
    cfg_path = os.path.join(cache, "qwen3", "tokenizer_config.json")
    tok = Tokenizer.from_file(tok_path)
    for text, ids in QWEN3_ASSET_IDS.items():
        got = tok.encode(text, add_special_tokens=False).ids
        assert got == ids, f"qwen3 {text!r}: {got} != assets.md {ids}"
        assert tok.decode(got, skip_special_tokens=False) == text
    print(f"qwen3: assets.md golden ids reproduced ({len(QWEN3_ASSET_IDS)} strings)")
    write_json("tests/fixtures/tokenizer/qwen3_ids.json", {
        "source": "Python tokenizers on .cache/qwen3/tokenizer.json (tools/ref_tokenizer.py)",
        "tokenizers_version": __import__("tokenizers").__version__,
        "tokenizer_json_sha256": sha256(tok_path),
        "add_special_tokens": False,
        "cases": id_cases(tok, QWEN3_TEXTS),
    })

    with open(cfg_path, encoding="utf-8") as f:
        template = json.load(f)["chat_template"]
    special = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    env = transformers_like_env()
    rendered = [render(env, template, m, g, t, k, special) for (_, m, g, t, k) in QWEN3_CHATS]
    ids = tok.encode(rendered[0], add_special_tokens=False).ids
    assert ids == QWEN3_TEMPLATE_ASSET_IDS, f"template golden mismatch: {ids}"
    tail = tok.encode(rendered[1], add_special_tokens=False).ids[-6:]
    assert tail == [77091, 198, 151667, 271, 151668, 271], tail
    print("qwen3: assets.md template golden ids reproduced")
    check_against_transformers(template, QWEN3_CHATS, rendered, special)
    write_json("tests/fixtures/chat/qwen3_renders.json", {
        "source": "Jinja2 (transformers-style environment) on the chat_template of .cache/qwen3/tokenizer_config.json",
        "jinja2_version": jinja2.__version__,
        "tokenizer_config_sha256": sha256(cfg_path),
        "template": template,
        "bos_token": "",
        "eos_token": "<|im_end|>",
        "cases": [
            {"name": n, "messages": m, "add_generation_prompt": g, "tools": t, "kwargs": k, "rendered": r}
            for (n, m, g, t, k), r in zip(QWEN3_CHATS, rendered)
        ],
    })


def read_gguf_tokenizer(path):
    import gguf

    reader = gguf.GGUFReader(path)

    def field(key):
        f = reader.fields.get(key)
        return None if f is None else f.contents()

    return {k: field(k) for k in [
        "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
        "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.add_bos_token", "tokenizer.chat_template",
    ]}


def smollm2(cache):
    path = os.path.join(cache, "smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    meta = read_gguf_tokenizer(path)
    assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.pre"] == "smollm"
    tokens = meta["tokenizer.ggml.tokens"]
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=False))
    # llama.cpp's `smollm` pre-tokenizer: every digit alone, then the GPT-2 regex.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    control = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, meta["tokenizer.ggml.token_type"]) if ty == 3]
    tok.add_special_tokens(control)
    for text, ids in SMOLLM2_ASSET_IDS.items():
        got = tok.encode(text, add_special_tokens=False).ids
        assert got == ids, f"smollm2 {text!r}: {got} != llama.cpp {ids}"
    print(f"smollm2: llama.cpp golden ids from assets.md reproduced ({len(SMOLLM2_ASSET_IDS)} strings)")
    write_json("tests/fixtures/tokenizer/smollm2_ids.json", {
        "source": "Python tokenizers rebuilt from the vocab+merges of .cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf "
                  "(Digits(individual) + ByteLevel regex, CONTROL tokens special; tools/ref_tokenizer.py)",
        "gguf_sha256": sha256(path),
        "add_special_tokens": False,
        "cases": id_cases(tok, SMOLLM2_TEXTS),
    })

    template = meta["tokenizer.chat_template"]
    special = {"bos_token": tokens[meta["tokenizer.ggml.bos_token_id"]], "eos_token": tokens[meta["tokenizer.ggml.eos_token_id"]]}
    env = transformers_like_env()
    rendered = [render(env, template, m, g, t, k, special) for (_, m, g, t, k) in SMOLLM2_CHATS]
    check_against_transformers(template, SMOLLM2_CHATS, rendered, special)
    write_json("tests/fixtures/chat/smollm2_renders.json", {
        "source": "Jinja2 (transformers-style environment) on tokenizer.chat_template of the SmolLM2 GGUF",
        "jinja2_version": jinja2.__version__,
        "template": template,
        "bos_token": special["bos_token"],
        "eos_token": special["eos_token"],
        "cases": [
            {"name": n, "messages": m, "add_generation_prompt": g, "tools": t, "kwargs": k, "rendered": r}
            for (n, m, g, t, k), r in zip(SMOLLM2_CHATS, rendered)
        ],
    })


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", default=os.environ.get("TRIT_CACHE", os.path.join(ROOT, ".cache")))
    args = ap.parse_args()
    if not os.path.exists(os.path.join(args.cache, "qwen3", "tokenizer.json")):
        sys.exit(f"no assets in {args.cache}: run tools/fetch_assets.sh first")
    qwen3(args.cache)
    smollm2(args.cache)


if __name__ == "__main__":
    main()
