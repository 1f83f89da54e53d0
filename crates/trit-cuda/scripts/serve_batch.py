#!/usr/bin/env python3
"""`trit serve --device cuda` under 32 concurrent streamed requests (the GPU machine's check of
the server's batched GPU path). Standard library only.

    serve_batch.py TRIT_BINARY MODEL [--n 32] [--max-tokens 64] [--parallel 32] [--device cuda]
                   [--token-prompts VOCAB]

Starts the server on a free loopback port, sends each prompt once alone (greedy, streamed) and
then all N at once, and checks that every stream completes: content chunks, a finish_reason,
`data: [DONE]`. Prints the aggregate completion tokens/s of the concurrent run, how many
concurrent replies equal their solo reply token for token, and the server's /metrics counters.
Exit status 1 if any request fails or does not complete. `--token-prompts VOCAB` sends each
prompt as a list of token ids below VOCAB instead of text (the completions API takes either):
for `gen_model`'s random-weight models, whose placeholder tokenizer encodes text to nothing.
"""
import json
import subprocess
import sys
import threading
import time
import urllib.request


def stream(base, prompt, max_tokens):
    body = json.dumps({
        "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True},
    }).encode()
    req = urllib.request.Request(base + "/v1/completions", body,
                                 {"Content-Type": "application/json"})
    text, finish, done, usage = [], None, False, None
    with urllib.request.urlopen(req, timeout=300) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                break
            chunk = json.loads(data)
            if chunk.get("usage"):
                usage = chunk["usage"]
            for c in chunk.get("choices", []):
                text.append(c.get("text", ""))
                finish = c.get("finish_reason") or finish
    return {"text": "".join(text), "finish": finish, "done": done, "usage": usage}


def main():
    args = sys.argv[1:]
    binary, model = args[0], args[1]
    opts = dict(zip(args[2::2], args[3::2]))
    n = int(opts.get("--n", 32))
    max_tokens = int(opts.get("--max-tokens", 64))
    parallel = opts.get("--parallel", "32")
    device = opts.get("--device", "cuda")
    vocab = int(opts.get("--token-prompts", 0))
    server = subprocess.Popen(
        [binary, "serve", model, "--device", device, "--port", "0", "--ctx", "512",
         "--parallel", parallel], stderr=subprocess.PIPE, text=True)
    try:
        line = server.stderr.readline()
        print("server:", line.strip())
        addr = line.split("http://")[1].split()[0]
        base = "http://" + addr
        if vocab:
            # 12-19 ids per prompt, spread over the vocabulary, different for every request.
            prompts = [[(i * 7919 + j * 104729) % (vocab - 1) + 1 for j in range(12 + i % 8)]
                       for i in range(n)]
        else:
            prompts = [f"Story {i}: once upon a time in a land of {i * 7} rivers,"
                       for i in range(n)]
        t0 = time.time()
        solo = [stream(base, p, max_tokens) for p in prompts[:8]]
        t_solo = time.time() - t0
        results = [None] * n
        errors = []

        def one(i):
            try:
                results[i] = stream(base, prompts[i], max_tokens)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(f"request {i}: {e}")

        threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        t0 = time.time()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.time() - t0
        ok = [r for r in results if r and r["done"] and r["finish"] and r["text"]]
        toks = sum(r["usage"]["completion_tokens"] for r in ok if r["usage"])
        solo_toks = sum(r["usage"]["completion_tokens"] for r in solo if r["usage"])
        same = sum(1 for s, r in zip(solo, results) if r and s["text"] == r["text"])
        print(f"solo: 8 requests one after another, {solo_toks} tokens in {t_solo:.2f} s "
              f"= {solo_toks / t_solo:.1f} tok/s")
        print(f"concurrent: {len(ok)}/{n} streams complete, {toks} tokens in {wall:.2f} s "
              f"= {toks / wall:.1f} tok/s aggregate")
        print(f"concurrent replies equal to their solo reply: {same}/{len(solo)}")
        for e in errors:
            print("ERROR", e)
        with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("trit") and "_bucket" not in line:
                    print("metrics:", line)
        print("sample reply:", json.dumps(ok[0]["text"][:120]) if ok else None)
        return 0 if len(ok) == n and not errors else 1
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
