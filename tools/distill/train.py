"""Distil SmolLM2-135M-Instruct into ternary weights by quantization-aware training (one GPU).

Modes (all time-boxed by wall clock, so each device call ends with a finished, exported model):
  smoke   random teacher weights, short budgets: a dress rehearsal of every code path (sampling,
          compiled training step, checkpoint, eval, packing) that also warms torch.compile's cache
          and records the step time and memory in <work>/bench.json
  full    check the teacher, sample chat/text from it, train phase 1, evaluate, export
  resume  load <work>/ckpt.pt and the samples, train phase 2 (warm restart at a lower peak LR),
          evaluate, export

One run may outlive the device call that starts it (device_call2.sh launches it detached and later
calls only wait for it): --snapshot-epochs lists the moments, each a little before a call ends, at
which it writes the packed model to <work>/snap<i>/ (for that call to return) and the resume
checkpoint (for device_wait.sh's fallback if the process dies). <out>/EXPORTED and <out>/DONE mark
the final export and the end of the evaluation; <work>/train.pid lets the waiting calls see
whether the process is still alive.

The student keeps float32 latent ("master") weights. Each optimizer step it ternarizes them
(model.ternarize: per row and group of 64) into bf16 leaf tensors that the forward pass uses; the
gradient that reaches those leaves is copied to the masters unchanged (the straight-through
estimator), so quantization costs one cheap pass per step instead of one per micro-batch.
Loss: KL(teacher || student) over the full vocabulary at temperature 1, plus a small CE term.
"""

import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model as M  # noqa: E402

T0 = time.time()
LOG = []


def log(msg, **kv):
    line = f"[{time.time() - T0:7.1f}s] {msg}" + "".join(f" {k}={v}" for k, v in kv.items())
    print(line, flush=True)
    LOG.append(line)


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["smoke", "full", "resume"], required=True)
    ap.add_argument("--work", default="/tmp/distill")
    ap.add_argument("--data", default=".dev/data")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/distill/out"))
    ap.add_argument("--time-limit", type=float, default=540, help="seconds for the whole script")
    ap.add_argument("--deadline-epoch", type=float, default=0,
                    help="absolute end time (unix seconds); overrides --time-limit")
    ap.add_argument("--no-ckpt", action="store_true", help="skip the final resume checkpoint")
    ap.add_argument("--snapshot-epochs", default="",
                    help="comma-separated unix times: export + checkpoint to <work>/snap<i>/")
    ap.add_argument("--reserve", type=float, default=45, help="seconds kept for save/eval/export")
    ap.add_argument("--sample-seconds", type=float, default=75)
    ap.add_argument("--sample-batch", type=int, default=2048)
    ap.add_argument("--temperature", type=float, default=0.9)
    ap.add_argument("--min-p", type=float, default=0.02)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--mb", type=int, default=64, help="sequences per micro-batch")
    ap.add_argument("--accum", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--lr-min-frac", type=float, default=0.05)
    ap.add_argument("--warmup", type=int, default=40)
    ap.add_argument("--ce", type=float, default=0.1)
    ap.add_argument("--threshold", type=float, default=0.75)
    ap.add_argument("--mix", default="0.25,0.15", help="fractions of Austen and KJV rows")
    ap.add_argument("--eval-windows", type=int, default=16, help="512-token windows of P&P")
    ap.add_argument("--monitor-seconds", type=float, default=60)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    return ap.parse_args()


# ---------------------------------------------------------------------------------------------

def load_teacher(args, dev):
    if args.mode == "smoke":
        g = torch.Generator().manual_seed(0)
        w = {}
        for n in M.ternary_names():
            shape = {"embed": (M.VOCAB, M.DIM)}.get(n)
            if shape is None:
                m = n.split(".")[-1]
                out = {"q": M.DIM, "k": 192, "v": 192, "o": M.DIM, "gate": M.FFN, "up": M.FFN,
                       "down": M.DIM}[m]
                shape = (out, M.FFN if m == "down" else M.DIM)
            w[n] = torch.randn(shape, generator=g) * 0.1
        for n in M.norm_names():
            w[n] = torch.ones(M.DIM)
        return {k: v.to(dev) for k, v in w.items()}
    from gguf_io import GGUFFile
    gg = GGUFFile(os.path.join(args.work, "teacher.gguf"))
    return {k: torch.from_numpy(v).to(dev) for k, v in M.load_gguf_weights(gg).items()}


def student_weights(master, threshold, dtype):
    """Ternarized (matrices, embedding) or plain (norms) copies of the masters."""
    out = {}
    for n, p in master.items():
        if n in TERNARY:
            s, t = M.ternarize(p.detach(), threshold)
            out[n] = M.dequant(s, t).to(dtype)
        else:
            out[n] = p.detach().to(dtype)
    return out


def packed_student(master, threshold):
    """The exported form: uint8 codes (4 per byte) and f16 scales per ternary tensor, f32 norms."""
    packed = {}
    for n, p in master.items():
        if n in TERNARY:
            s, t = M.ternarize(p.detach().float(), threshold)
            packed[n + ".codes"] = M.pack_codes(t.to(torch.int8)).cpu()
            packed[n + ".scales"] = s.to(torch.float16).cpu()
        else:
            packed[n] = p.detach().float().cpu()
    return packed


def unpacked_weights(packed, dev):
    w = {}
    for n in M.ternary_names():
        t = M.unpack_codes(packed[n + ".codes"].to(dev))
        w[n] = M.dequant(packed[n + ".scales"].to(dev).float(), t)
    for n in M.norm_names():
        w[n] = packed[n].to(dev)
    return w


TERNARY = set(M.ternary_names())


# ---------------------------------------------------------------------------------------------
# Teacher sampling

def sample_teacher(args, tw, meta, dev, seconds):
    """Generate rows of seq+1 tokens from the bf16 teacher for `seconds`; prompt kinds rotate:
    chat prefix (the teacher writes the question and the answer), a single start token, and a
    16-token window of the training texts."""
    total = args.seq + 1
    prompts_text = torch.from_numpy(
        np.fromfile(os.path.join(args.data, "prompts_text.u16"), dtype=np.uint16).astype(np.int64)
    ).view(-1, 16)
    chat = torch.tensor(meta["chat_prefix"])
    starts = torch.tensor(meta["start_tokens"])
    gen = torch.Generator(device=dev).manual_seed(1234 + int(time.time()) % 1000)
    cpu_gen = torch.Generator().manual_seed(int(time.time()) % 100000)
    rows, kinds, t_start, i = [], [], time.time(), 0
    b = args.sample_batch
    while time.time() - t_start < seconds:
        kind = ["chat", "start", "chat", "text"][i % 4]
        if kind == "chat":
            p = chat[None].expand(b, -1)
        elif kind == "start":
            p = starts[torch.randint(len(starts), (b, 1), generator=cpu_gen)]
        else:
            p = prompts_text[torch.randint(len(prompts_text), (b,), generator=cpu_gen)]
        p = p.to(dev)
        n_new = total - p.shape[1] if args.mode != "smoke" else 48
        out = M.generate(tw, p, n_new, args.temperature, args.min_p, generator=gen)
        if out.shape[1] < total:  # smoke mode: pad short rows so shapes match the real run
            out = torch.cat([out, out[:, :1].expand(-1, total - out.shape[1])], dim=1)
        rows.append(out.to(torch.int32))
        kinds.append(kind)
        i += 1
        log("sampled batch", kind=kind, rows=b, secs=f"{time.time() - t_start:.1f}")
    samples = torch.cat(rows)
    return samples, kinds


# ---------------------------------------------------------------------------------------------
# Training

def make_loss(ce_w):
    def loss_fn(h, emb, t_logits, tgt):
        s = (h @ emb.t()).float()
        ls = s.log_softmax(-1)
        lt = t_logits.float().log_softmax(-1)
        kl = (lt.exp() * (lt - ls)).sum(-1).mean()
        ce = -ls.gather(-1, tgt[:, None]).mean()
        return kl + ce_w * ce, kl.detach(), ce.detach()
    return loss_fn


class Batcher:
    def __init__(self, args, samples, dev):
        self.seq, self.mb, self.dev = args.seq, args.mb, dev
        au = np.fromfile(os.path.join(args.data, "train_austen.u16"), dtype=np.uint16)
        kjv = np.fromfile(os.path.join(args.data, "train_kjv.u16"), dtype=np.uint16)
        self.au = torch.from_numpy(au.astype(np.int64)).to(dev)
        self.kjv = torch.from_numpy(kjv.astype(np.int64)).to(dev)
        self.samples = samples.to(dev).long() if samples is not None else None
        fa, fk = (float(x) for x in args.mix.split(","))
        if self.samples is None:
            fa, fk = fa / (fa + fk), fk / (fa + fk)
        self.na = round(self.mb * fa)
        self.nk = round(self.mb * fk) if self.samples is not None else self.mb - self.na
        self.ns = self.mb - self.na - self.nk
        self.ar = torch.arange(self.seq + 1, device=dev)

    def windows(self, stream, n):
        s = torch.randint(0, len(stream) - self.seq - 1, (n, 1), device=self.dev)
        return stream[s + self.ar]

    def next(self):
        parts = [self.windows(self.au, self.na), self.windows(self.kjv, self.nk)]
        if self.ns:
            idx = torch.randint(0, len(self.samples), (self.ns,), device=self.dev)
            parts.append(self.samples[idx])
        return torch.cat(parts)


def train(args, tw_bf16, master, opt, samples, dev, deadline, phase, snapshot=None):
    block_fn, loss_fn, tern = M.block, make_loss(args.ce), M.ternarize
    use_compile = not args.no_compile
    if use_compile:
        block_fn = torch.compile(M.block, fullgraph=True, dynamic=False)
        loss_fn = torch.compile(loss_fn, fullgraph=True, dynamic=False)
        tern = torch.compile(M.ternarize, dynamic=False)
    batcher = Batcher(args, samples, dev)
    dt = torch.bfloat16 if dev != "cpu" else torch.float32
    cos, sin = M.rope_tables(args.seq, dev, dt)
    lr_peak, lr_min = args.lr, args.lr * args.lr_min_frac

    def requantize():
        with torch.no_grad():
            for n, p in master.items():
                if n in TERNARY:
                    s, t = tern(p, args.threshold)
                    sw[n].copy_(M.dequant(s, t))
                else:
                    sw[n].copy_(p)

    def micro_steps(block_fn, loss_fn):
        kl_sum = ce_sum = 0.0
        for _ in range(args.accum):
            ids = batcher.next()
            x, tgt = ids[:, :-1], ids[:, 1:]
            with torch.no_grad():
                th = M.hidden(tw_bf16, x, cos, sin, block_fn=block_fn)
                t_logits = th @ tw_bf16["embed"].t()
            h = M.hidden(sw, x, cos, sin, block_fn=block_fn)
            loss, kl, ce = loss_fn(h.reshape(-1, M.DIM), sw["embed"],
                                   t_logits.reshape(-1, M.VOCAB), tgt.reshape(-1))
            (loss / args.accum).backward()
            kl_sum += kl
            ce_sum += ce
            del t_logits, th, h, loss
        return kl_sum, ce_sum

    pp = np.fromfile(os.path.join(args.data, "eval_pp.u16"), dtype=np.uint16)
    last_ppl = time.time()
    sw = {n: torch.empty(p.shape, dtype=dt, device=dev, requires_grad=True)
          for n, p in master.items()}
    try:
        requantize()
    except Exception as e:  # noqa: BLE001
        log("compiled ternarize failed, using eager", error=repr(e)[:300])
        tern = M.ternarize
        requantize()
    t_train0 = None
    step, tokens, hist = 0, 0, []
    snap_times = sorted(float(x) for x in args.snapshot_epochs.split(",") if x)
    snap_times = [t for t in snap_times if t < deadline]
    last_log = time.time()
    while True:
        now = time.time()
        if now >= deadline:
            break
        if t_train0 is None and step == 1:
            t_train0 = now  # after compilation: the schedule runs on measured time
        frac = 0.0 if t_train0 is None else min(1.0, (now - t_train0) / (deadline - t_train0))
        lr = lr_min + 0.5 * (lr_peak - lr_min) * (1 + math.cos(math.pi * frac))
        lr *= min(1.0, (step + 1) / args.warmup)
        for gparam in opt.param_groups:
            gparam["lr"] = lr
        try:
            kl_sum, ce_sum = micro_steps(block_fn, loss_fn)
        except Exception as e:  # noqa: BLE001
            if not use_compile:
                raise
            # torch.compile failed on this machine: carry on eagerly rather than lose the call.
            log("compiled step failed, falling back to eager", error=repr(e)[:300])
            use_compile, block_fn, loss_fn, tern = False, M.block, make_loss(args.ce), M.ternarize
            for n in sw:
                sw[n].grad = None
            kl_sum, ce_sum = micro_steps(block_fn, loss_fn)
        for n, p in master.items():
            p.grad = sw[n].grad.float()
            sw[n].grad = None
        gnorm = torch.nn.utils.clip_grad_norm_(list(master.values()), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        requantize()
        step += 1
        tokens += args.accum * args.mb * args.seq
        if step <= 2 or time.time() - last_log > 20 or time.time() >= deadline:
            kl_v = (kl_sum / args.accum).item()
            ce_v = (ce_sum / args.accum).item()
            el = time.time() - (t_train0 or now)
            hist.append({"step": step, "tokens": tokens, "kl": kl_v, "ce": ce_v, "lr": lr,
                         "t": round(time.time() - T0, 1)})
            log(f"{phase} step", step=step, tokens=tokens, kl=f"{kl_v:.4f}", ce=f"{ce_v:.3f}",
                gnorm=f"{gnorm.item():.3f}", lr=f"{lr:.2e}",
                tok_s=f"{(tokens - args.accum * args.mb * args.seq) / max(el, 1e-6):.0f}",
                mem_gb=f"{torch.cuda.max_memory_allocated() / 2**30:.1f}" if dev != "cpu" else 0)
            last_log = time.time()
        if time.time() - last_ppl > args.monitor_seconds:
            # Monitoring only (no decision depends on it): the bf16 ternary student on the
            # held-out first 512 tokens of Pride and Prejudice.
            ppl = M.perplexity({n: p.detach() for n, p in sw.items()}, pp, 512, 1)
            hist.append({"step": step, "ppl_pp_512_bf16": ppl, "t": round(time.time() - T0, 1)})
            log(f"{phase} monitor", step=step, ppl_pp_512_bf16=f"{ppl:.3f}")
            last_ppl = time.time()
        if snapshot is not None and snap_times and time.time() >= snap_times[0]:
            snap_times.pop(0)
            snapshot(step, tokens, hist)
    train_secs = time.time() - (t_train0 or time.time())
    return {"steps": step, "tokens": tokens, "train_seconds": round(train_secs, 1),
            "tok_per_s": round(tokens / max(train_secs, 1e-6)), "history": hist,
            "compiled": use_compile}


# ---------------------------------------------------------------------------------------------
# Evaluation and export

def evaluate(args, teacher_f32, packed, dev, tok):
    pp = np.fromfile(os.path.join(args.data, "eval_pp.u16"), dtype=np.uint16)
    sw = unpacked_weights(packed, dev)
    res = {}
    for name, w in (("teacher", teacher_f32), ("student", sw)):
        res[name] = {"ppl_pp_512": M.perplexity(w, pp, 512, 1),
                     "ppl_pp_8k": M.perplexity(w, pp, 512, args.eval_windows)}
    for k in ("ppl_pp_512", "ppl_pp_8k"):
        res["ratio_" + k] = res["student"][k] / res["teacher"][k]
    chat_q = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
              "Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
              "<|im_start|>assistant\n")
    prompts = ["The capital of France is", "Once upon a time", chat_q]
    res["greedy"] = {}
    for p in prompts:
        ids = torch.tensor([tok.encode(p, add_special_tokens=False).ids], device=dev)
        res["greedy"][p] = {}
        for name, w in (("teacher", teacher_f32), ("student", sw)):
            out = M.generate(w, ids, 40)[0, ids.shape[1]:].tolist()
            res["greedy"][p][name] = {"ids": out, "text": tok.decode(out, skip_special_tokens=False)}
    return res


def export(packed, out_dir, limit=14 * 2**20):
    """Split the packed tensors into safetensors files of at most `limit` bytes."""
    from safetensors.torch import save_file
    os.makedirs(out_dir, exist_ok=True)
    files, cur, size = [], {}, 0
    for n, t in packed.items():
        nb = t.numel() * t.element_size()
        if cur and size + nb > limit:
            files.append(cur)
            cur, size = {}, 0
        cur[n] = t.contiguous()
        size += nb
    files.append(cur)
    for i, f in enumerate(files):
        save_file(f, os.path.join(out_dir, f"packed-{i}.safetensors"))
    return len(files)


# ---------------------------------------------------------------------------------------------

def main():
    args = parse()
    dev = args.device
    os.makedirs(args.work, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)
    for marker in ("EXPORTED", "DONE"):
        if os.path.exists(os.path.join(args.out, marker)):
            os.remove(os.path.join(args.out, marker))
    with open(os.path.join(args.work, "train.pid"), "w") as f:
        f.write(str(os.getpid()))
    # Exact float32 for the teacher check and the evaluation (training itself runs in bf16).
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    deadline_all = args.deadline_epoch or T0 + args.time_limit
    metrics = {"mode": args.mode, "args": vars(args)}
    with open(os.path.join(args.data, "meta.json")) as f:
        meta = json.load(f)
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(args.data, "tokenizer.json"))
    if dev != "cpu":
        log("device", name=torch.cuda.get_device_name(), torch=torch.__version__)

    teacher = load_teacher(args, dev)  # float32, HF layout
    log("teacher loaded")
    if args.mode != "smoke":
        pp = np.fromfile(os.path.join(args.data, "eval_pp.u16"), dtype=np.uint16)
        ppl = M.perplexity(teacher, pp, 512, 1)
        metrics["teacher_check_ppl_512_f32"] = ppl
        log("teacher ppl (f32, P&P first 512)", ppl=f"{ppl:.4f}", expected=16.141)
        if abs(ppl - 16.141) > 0.05:
            raise SystemExit("teacher check failed: the PyTorch teacher does not match")
    train_dt = torch.bfloat16 if dev != "cpu" else torch.float32
    tw = {k: v.to(train_dt) for k, v in teacher.items()}

    samples_path = os.path.join(args.work, "samples.npy")
    ckpt_path = os.path.join(args.work, "ckpt.pt")
    if args.mode == "resume":
        samples = torch.from_numpy(np.load(samples_path))
        ck = torch.load(ckpt_path, map_location=dev)
        master = {n: torch.nn.Parameter(ck["master"][n]) for n in ck["master"]}
        phase = "phase2"
        metrics["previous"] = ck["info"]
    else:
        samples, kinds = sample_teacher(args, tw, meta, dev, args.sample_seconds)
        np.save(samples_path, samples.cpu().numpy())
        metrics["samples"] = {"rows": len(samples), "tokens": int(samples.numel()),
                              "kinds": {k: kinds.count(k) for k in set(kinds)}}
        log("samples", rows=len(samples), tokens=samples.numel())
        if dev != "cpu":
            torch.cuda.empty_cache()  # the KV caches of sampling: hand back before training
        # A few sampled rows, decoded, for the record.
        metrics["sample_text"] = [tok.decode(samples[i * args.sample_batch, :160].tolist(),
                                             skip_special_tokens=False)
                                  for i in range(min(4, len(kinds)))]
        master = {n: torch.nn.Parameter(v.clone().float()) for n, v in teacher.items()}
        phase = "phase1"
        ck = None
    opt = torch.optim.AdamW(list(master.values()), lr=args.lr, betas=(0.9, 0.95),
                            weight_decay=0.0, eps=1e-8, fused=dev != "cpu")
    if ck is not None:
        opt.load_state_dict(ck["opt"])
        del ck

    prev_tokens = metrics.get("previous", {}).get("tokens_total", 0)
    n_snap = [0]

    def snapshot(step, tokens, hist):
        """Checkpoint (for a resume on this machine) and packed model (for the calling device
        command to return) in the middle of training; DONE is written last."""
        t = time.time()
        d = os.path.join(args.work, f"snap{n_snap[0]}")
        n_snap[0] += 1
        os.makedirs(d, exist_ok=True)
        torch.save({"master": {n: p.detach() for n, p in master.items()},
                    "opt": opt.state_dict(),
                    "info": {"tokens_total": prev_tokens + tokens, "phase": phase}}, ckpt_path)
        n = export(packed_student(master, args.threshold), d)
        with open(os.path.join(d, "metrics-snap.json"), "w") as f:
            json.dump({"step": step, "tokens": tokens, "tokens_total": prev_tokens + tokens,
                       "history": hist, "log": LOG, **{k: v for k, v in metrics.items()
                                                       if k != "log"}}, f, indent=1)
        open(os.path.join(d, "DONE"), "w").close()
        log("snapshot", dir=d, files=n, step=step, tokens=tokens,
            secs=f"{time.time() - t:.1f}")

    if dev != "cpu":
        torch.cuda.reset_peak_memory_stats()
    info = train(args, tw, master, opt, samples, dev, deadline_all - args.reserve, phase,
                 snapshot=snapshot)
    metrics["train"] = info
    log("training done", steps=info["steps"], tokens=info["tokens"],
        secs=info["train_seconds"], tok_s=info["tok_per_s"])
    info["tokens_total"] = prev_tokens + info["tokens"]
    if not args.no_ckpt:
        torch.save({"master": {n: p.detach() for n, p in master.items()},
                    "opt": opt.state_dict(),
                    "info": {"tokens_total": info["tokens_total"], "phase": phase}}, ckpt_path)
        log("checkpoint saved")

    # Export first, so the model comes back even if the evaluation runs out of time.
    packed = packed_student(master, args.threshold)
    del opt
    metrics["export_files"] = export(packed, args.out)
    with open(os.path.join(args.out, f"metrics-{args.mode}.json"), "w") as f:
        json.dump(metrics, f, indent=1)
    open(os.path.join(args.out, "EXPORTED"), "w").close()
    log("exported", files=metrics["export_files"])
    metrics["eval"] = evaluate(args, teacher, packed, dev, tok)
    log("eval", **{k: (f"{v:.4f}" if isinstance(v, float) else v)
                   for k, v in metrics["eval"].items() if k.startswith("ratio")})
    for who in ("teacher", "student"):
        log(who, **{k: f"{v:.4f}" for k, v in metrics["eval"][who].items()})
    for p, r in metrics["eval"]["greedy"].items():
        log("greedy", prompt=repr(p[-30:]), teacher=repr(r["teacher"]["text"][:80]),
            student=repr(r["student"]["text"][:80]))
    if args.mode == "smoke":
        metrics["bench"] = {"compiled": info["compiled"], "tok_per_s": info["tok_per_s"],
                            "peak_mem_gb": torch.cuda.max_memory_allocated() / 2**30
                            if dev != "cpu" else 0}
        with open(os.path.join(args.work, "bench.json"), "w") as f:
            json.dump(metrics["bench"], f)
    metrics["log"] = LOG
    metrics["total_seconds"] = round(time.time() - T0, 1)
    with open(os.path.join(args.out, f"metrics-{args.mode}.json"), "w") as f:
        json.dump(metrics, f, indent=1)
    open(os.path.join(args.out, "DONE"), "w").close()
    log("done")


if __name__ == "__main__":
    main()
