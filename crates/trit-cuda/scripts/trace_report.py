#!/usr/bin/env python3
"""Where a traced decode step's time goes, from examples/trace_step.rs's CSV.

  python3 crates/trit-cuda/scripts/trace_report.py trace.csv [--layers]

Groups the records into kernel launches (kind + id; a launch whose id repeats within a step,
like the quantize's input buffer, is split where a block starts after the previous launch has
ended), orders them by their last block's end (the chain) and prints, per launch kind in the
layer's order, averaged over the step's layers, in µs relative to the predecessor's last block
end ("ready"): when the launch's first and last block started, when the first and last block
returned from griddepcontrol.wait, when its last block ended (the link's cost), the
blocks' median time from wait to end, and the median time of each TRACE_MARK point reached
(m0–m3: the attention's q/k norm + rotation, attention rounds, warps merged, splits merged;
the GEMVs' input ready). --layers prints every launch instead.
"""
import csv
import statistics
import sys
from collections import defaultdict

KINDS = {1: "stream", 2: "reg", 3: "fused", 4: "attn", 5: "quant", 6: "advance", 7: "argmax"}


def launches(rows):
    by = defaultdict(list)
    for r in rows:
        by[(r["kind"], r["id"])].append(r)
    out = []
    for (kind, ident), rs in by.items():
        rs.sort(key=lambda r: r["start"])
        cur = [rs[0]]
        end = rs[0]["end"]
        for r in rs[1:]:
            if r["start"] > end:
                out.append((kind, ident, cur))
                cur, end = [r], r["end"]
            else:
                cur.append(r)
                end = max(end, r["end"])
        out.append((kind, ident, cur))
    out.sort(key=lambda l: max(r["end"] for r in l[2]))
    return out


def summary(kind, ident, rs, ready):
    waits = [r["waited"] for r in rs if r["waited"] > 0]
    us = lambda t: (t - ready) / 1e3
    marks = {}
    for m in ("m0", "m1", "m2", "m3"):
        at = [us(r[m]) for r in rs if r.get(m, 0) > 0]
        marks[m] = statistics.median(at) if at else float("nan")
    return {
        **marks,
        "kind": KINDS.get(kind, str(kind)),
        "id": ident,
        "blocks": len(rs),
        "start0": us(min(r["start"] for r in rs)),
        "start1": us(max(r["start"] for r in rs)),
        "wait0": us(min(waits)) if waits else float("nan"),
        "wait1": us(max(waits)) if waits else float("nan"),
        "end": us(max(r["end"] for r in rs)),
        "work": statistics.median([(r["end"] - r["waited"]) / 1e3 for r in rs if r["waited"] > 0])
        if waits else float("nan"),
    }


def main():
    path = sys.argv[1]
    per_layer = "--layers" in sys.argv
    steps = defaultdict(list)
    with open(path) as f:
        for r in csv.DictReader(f):
            for k in ("kind", "block", "smid", "start", "waited", "end", "step",
                      "m0", "m1", "m2", "m3"):
                if k in r:
                    r[k] = int(r[k])
            steps[r["step"]].append(r)
    cols = ["start0", "start1", "wait0", "wait1", "end", "work", "m0", "m1", "m2", "m3"]
    for step, rows in sorted(steps.items()):
        ls = launches(rows)
        t_first = min(r["start"] for r in rows)
        t_last = max(r["end"] for r in rows)
        print(f"step {step}: {len(ls)} launches, {len(rows)} blocks, "
              f"{(t_last - t_first) / 1e3:.1f} µs from the first start to the last end")
        sums = []
        prev_end = None
        for kind, ident, rs in ls:
            ready = prev_end if prev_end is not None else min(r["start"] for r in rs)
            sums.append(summary(kind, ident, rs, ready))
            prev_end = max(r["end"] for r in rs)
        if per_layer:
            print("kind     blocks " + " ".join(f"{c:>7}" for c in cols))
            for s in sums:
                print(f"{s['kind']:<8} {s['blocks']:>6} " + " ".join(f"{s[c]:7.2f}" for c in cols))
        # The layer's pattern: the kinds between two attention launches.
        att = [i for i, s in enumerate(sums) if s["kind"] == "attn"]
        if len(att) < 3:
            continue
        period = att[1] - att[0]
        groups = defaultdict(list)
        for a in att[1:-1]:
            for j in range(period):
                groups[j].append(sums[a - 1 + j] if a - 1 + j < len(sums) else None)
        print(f"per layer ({len(att) - 2} middle layers), µs after the predecessor's last end:")
        print("link     blocks " + " ".join(f"{c:>7}" for c in cols))
        total = 0.0
        for j in range(period):
            g = [s for s in groups[j] if s]
            mean = {c: statistics.mean(s[c] for s in g) for c in cols}
            total += mean["end"]
            print(f"{g[0]['kind']:<8} {g[0]['blocks']:>6} " + " ".join(f"{mean[c]:7.2f}" for c in cols))
        print(f"layer: {total:.2f} µs")
        tail = sums[att[-1] - 1 + period:]
        for s in tail:
            print(f"tail {s['kind']:<8} {s['blocks']:>6} " + " ".join(f"{s[c]:7.2f}" for c in cols))


if __name__ == "__main__":
    main()
