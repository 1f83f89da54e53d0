#!/usr/bin/env bash
# trit vs llama.cpp on the same random ternary weights, in one run on one machine
# (performance.md §4 rules: same files, same threads, ratios as the currency).
#
#   tools/bench_side_by_side.sh --preset 1.7b|8b [-t 2] [-r 3] [-p 512] [-n 128]
#                               [--formats pq2_0,tq2_0,tq1_0,ptq1_0,q2_0] [--out DIR]
#                               [--trit BIN] [--llama-bench BIN] [--no-membw]
#
# 1. Generates the preset's random model (format/testgen, seed 0, Qwen3 tokenizer when present)
#    into $CACHE/bench/<preset>/, only the formats that are missing.
# 2. Builds `trit` (release) unless --trit is given, and copies the binary into the output
#    folder so a concurrent build in a shared target dir cannot swap it mid-run.
# 3. Runs `trit bench -o json --membw` on every format and llama.cpp's `llama-bench -o json` on
#    TQ2_0 and TQ1_0 (the ternary types with fast x86 kernels in stock llama.cpp), recording the
#    load average before each run and llama-bench's peak RSS with /usr/bin/time.
# 4. Prints (and writes to <out>/summary.md) the side-by-side table with ratios.
#
# llama-bench comes from the llama-cpp-python sdist build of tools/setup_peers.sh
# ($CACHE/llcpp-bin/llama-bench). $CACHE = $TRIT_CACHE or the main checkout's .cache.
set -euo pipefail

PRESET="" THREADS=2 REPS=3 NP=512 NG=128 FORMATS="pq2_0,tq2_0,tq1_0,ptq1_0,q2_0"
OUT="" TRIT="" LLAMA_BENCH="" MEMBW=1
usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --preset) PRESET="$2"; shift 2 ;;
    -t|--threads) THREADS="$2"; shift 2 ;;
    -r|--repetitions) REPS="$2"; shift 2 ;;
    -p) NP="$2"; shift 2 ;;
    -n) NG="$2"; shift 2 ;;
    --formats) FORMATS="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --trit) TRIT="$2"; shift 2 ;;
    --llama-bench) LLAMA_BENCH="$2"; shift 2 ;;
    --no-membw) MEMBW=0; shift ;;
    -h|--help) usage 0 ;;
    *) echo "bench_side_by_side: unknown argument '$1'" >&2; usage 2 >&2 ;;
  esac
done
case "$PRESET" in
  1.7b|8b|tiny) ;;
  "") echo "bench_side_by_side: --preset 1.7b|8b is required" >&2; exit 2 ;;
  *) echo "bench_side_by_side: unknown preset '$PRESET' (1.7b, 8b)" >&2; exit 2 ;;
esac

REPO="$(cd "$(dirname "$0")/.." && pwd)"
COMMON_GIT="$(git -C "$REPO" rev-parse --path-format=absolute --git-common-dir 2>/dev/null || true)"
if [ -n "$COMMON_GIT" ]; then ROOT="$(dirname "$COMMON_GIT")"; else ROOT="$REPO"; fi
CACHE="${TRIT_CACHE:-$ROOT/.cache}"
MODELS="$CACHE/bench/$PRESET"
OUT="${OUT:-$CACHE/bench/results/$PRESET-$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$MODELS" "$OUT"
log() { echo "== $* (load $(cut -d' ' -f1-3 /proc/loadavg), $(date +%T))" >&2; }

# --- binaries ---------------------------------------------------------------------------------
TARGET="${CARGO_TARGET_DIR:-$REPO/target}"
if [ -z "$TRIT" ]; then
  log "building trit (release) in $TARGET"
  (cd "$REPO" && cargo build --release -q -p trit-cli -p trit --example gen_model)
  TRIT="$TARGET/release/trit"
fi
cp "$TRIT" "$OUT/trit"
TRIT="$OUT/trit"
GEN="$TARGET/release/examples/gen_model"
if [ -z "$LLAMA_BENCH" ]; then
  LLAMA_BENCH="$CACHE/llcpp-bin/llama-bench"
  [ -x "$LLAMA_BENCH" ] || LLAMA_BENCH="$(find "$CACHE" -name llama-bench -type f -perm -u+x 2>/dev/null | head -1)"
fi
if [ -z "$LLAMA_BENCH" ] || [ ! -x "$LLAMA_BENCH" ]; then
  echo "bench_side_by_side: llama-bench not found under $CACHE (run tools/setup_peers.sh); trit only" >&2
  LLAMA_BENCH=""
fi

# --- models -----------------------------------------------------------------------------------
NEED=() MISSING=()
IFS=',' read -r -a NEED <<< "$FORMATS"
if [ -n "$LLAMA_BENCH" ]; then
  for f in tq2_0 tq1_0; do [[ ",$FORMATS," == *",$f,"* ]] || NEED+=("$f"); done
fi
for f in "${NEED[@]}"; do [ -s "$MODELS/model-$f.gguf" ] || MISSING+=("$f"); done
if [ ${#MISSING[@]} -gt 0 ]; then
  [ -x "$GEN" ] || (cd "$REPO" && cargo build --release -q -p trit --example gen_model)
  TOK=()
  [ -f "$CACHE/qwen3/tokenizer.json" ] && TOK=(--tokenizer "$CACHE/qwen3")
  list="$(IFS=,; echo "${MISSING[*]}")"
  log "generating $PRESET ($list) into $MODELS"
  "$GEN" --preset "$PRESET" --seed 0 "${TOK[@]}" --out "$MODELS" --formats "$list"
fi

# --- machine ----------------------------------------------------------------------------------
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "cpu: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) CPUs)"
  echo "flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|avx512f|avx512bw|avx512_vnni|avx_vnni|amx_int8)$' | tr '\n' ' ')"
  echo "kernel: $(uname -r)"
  echo "memory: $(free -g | awk '/^Mem:/{print $2 " GiB"}')"
  echo "trit: $("$TRIT" --version) ($(git -C "$REPO" rev-parse --short HEAD))"
  [ -n "$LLAMA_BENCH" ] && echo "llama-bench: $("$LLAMA_BENCH" --version 2>&1 | head -1)"
  echo "preset: $PRESET, threads $THREADS, repetitions $REPS, pp$NP, tg$NG"
} > "$OUT/machine.txt"
cat "$OUT/machine.txt" >&2

# --- runs -------------------------------------------------------------------------------------
: > "$OUT/commands.txt"
: > "$OUT/load.txt"
run() { # name, command...
  local name="$1"; shift
  log "$name"
  echo "$name $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/load.txt"
  echo "$*" >> "$OUT/commands.txt"
  if [ -x /usr/bin/time ]; then
    /usr/bin/time -f '%M' -o "$OUT/$name.maxrss_kb" "$@" > "$OUT/$name.json" 2> "$OUT/$name.err"
  else
    "$@" > "$OUT/$name.json" 2> "$OUT/$name.err"
  fi
}
MEMBW_FLAG=()
[ "$MEMBW" = 1 ] && MEMBW_FLAG=(--membw)
# Interleave the engines so slow drifts in machine load hit both alike.
IFS=',' read -r -a FMTS <<< "$FORMATS"
for f in "${FMTS[@]}"; do
  if [ -n "$LLAMA_BENCH" ] && { [ "$f" = tq2_0 ] || [ "$f" = tq1_0 ]; }; then
    run "llama-$f" "$LLAMA_BENCH" -m "$MODELS/model-$f.gguf" -p "$NP" -n "$NG" -t "$THREADS" -r "$REPS" -o json
  fi
  run "trit-$f" "$TRIT" bench "$MODELS/model-$f.gguf" -p "$NP" -n "$NG" -t "$THREADS" -r "$REPS" -o json "${MEMBW_FLAG[@]}"
done
if [ -n "$LLAMA_BENCH" ]; then
  for f in tq2_0 tq1_0; do
    [ -s "$OUT/llama-$f.json" ] || run "llama-$f" "$LLAMA_BENCH" -m "$MODELS/model-$f.gguf" -p "$NP" -n "$NG" -t "$THREADS" -r "$REPS" -o json
  done
fi
echo "after $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/load.txt"

# --- table ------------------------------------------------------------------------------------
python3 - "$OUT" "$NP" "$NG" "$FORMATS" <<'PY' | tee "$OUT/summary.md"
import json, os, sys
out, np_, ng, formats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split(",")
def load(name):
    p = os.path.join(out, name + ".json")
    try:
        rows = json.load(open(p))
    except (OSError, ValueError):
        return None
    r = {"pp": None, "tg": None, "rss": None, "ceil": None, "bw": None, "size": None}
    for row in rows:
        key = "pp" if row["n_gen"] == 0 else "tg"
        r[key] = (row["avg_ts"], row["stddev_ts"], row["samples_ts"])
        r["size"] = row["model_size"]
        if key == "tg" and row.get("decode_ceiling_ts"):
            r["ceil"] = (row["decode_ceiling_ts"], row["ceiling_fraction"])
        if row.get("membw_best_gbs"):
            r["bw"] = (row["membw_best_gbs"], row["membw_median_gbs"])
        if row.get("peak_rss_bytes"):
            r["rss"] = row["peak_rss_bytes"]
    kb = os.path.join(out, name + ".maxrss_kb")
    if r["rss"] is None and os.path.exists(kb):
        try:
            r["rss"] = int(open(kb).read().split()[-1]) * 1024
        except ValueError:
            pass
    return r
names = sorted(f[:-5] for f in os.listdir(out) if f.endswith(".json"))
res = {n: load(n) for n in names}
ref_pp = res.get("llama-tq2_0") and res["llama-tq2_0"]["pp"]
ref_tg = max((res[n]["tg"] for n in ("llama-tq2_0", "llama-tq1_0") if res.get(n) and res[n]["tg"]),
             key=lambda v: v[0], default=None)
fmt = lambda v: "—" if v is None else f"{v[0]:.2f} ± {v[1]:.2f}"
ratio = lambda v, ref: "—" if v is None or ref is None else f"{v[0] / ref[0]:.2f}×"
print(f"| engine | type | size MiB | pp{np_} t/s | tg{ng} t/s | pp ÷ llama.cpp TQ2_0 | tg ÷ llama.cpp best | tg % of ceiling | peak RSS MiB |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
rank = {f: i for i, f in enumerate(["tq2_0", "tq1_0"] + formats)}
order = sorted(names, key=lambda n: (not n.startswith("llama"), rank.get(n.split("-", 1)[1], 99), n))
for n in order:
    r = res[n]
    if r is None:
        print(f"| {n} | (no result, see {n}.err) | | | | | | | |")
        continue
    eng, ty = n.split("-", 1)
    eng = "llama.cpp" if eng == "llama" else "trit"
    ceil = "—" if r["ceil"] is None else f"{100 * r['ceil'][1]:.0f} % of {r['ceil'][0]:.1f}"
    rss = "—" if r["rss"] is None else f"{r['rss'] / 2**20:.0f}"
    size = "—" if r["size"] is None else f"{r['size'] / 2**20:.1f}"
    print(f"| {eng} | {ty.upper()} | {size} | {fmt(r['pp'])} | {fmt(r['tg'])} | {ratio(r['pp'], ref_pp)} | {ratio(r['tg'], ref_tg)} | {ceil} | {rss} |")
bws = [res[n]["bw"] for n in names if res[n] and res[n]["bw"]]
if bws:
    print()
    print("memory read bandwidth per trit run (best / median GB/s): " +
          ", ".join(f"{b:.1f} / {m:.1f}" for b, m in bws))
print()
print("samples t/s (pp; tg):")
for n in order:
    r = res[n]
    if r:
        s = lambda v: "—" if v is None else " ".join(f"{x:.2f}" for x in v[2])
        print(f"- {n}: {s(r['pp'])}; {s(r['tg'])}")
PY
echo "load averages (1/5/15 min) before each run:" | tee -a "$OUT/summary.md"
sed 's/^/    /' "$OUT/load.txt" | tee -a "$OUT/summary.md"
echo "results in $OUT" >&2
