#!/bin/bash
# Settings side by side on the 8B shape, each with tg128 (untraced, two rounds in alternating
# order) and one traced step's per-link table (examples/trace_step.rs + trace_report.py; the
# trace costs ~12 %, read it for structure). Session 34.
# Usage: G=.dev/gpu/NAME VARIANTS="X=0 TRIT_CUDA_REG_WARPS=8 TRIT_CUDA_REG_WARPS=8+TRIT_CUDA_STREAM_MAX_WARPS=16" \
#   [PROMPT=64] [MODEL=8b] bash crates/trit-cuda/scripts/h200_trace.sh
# (G holds bins.tar.xz from pack_bins.sh; carry it. Settings join several with '+'; X=0 is the
# default; a TRIT_CUDA_DEFINES setting of one define is kept in the traced runs beside
# -DTRIT_TRACE.) TESTS="gpu_vs_cpu gpu_greedy" also runs those GPU test binaries under every
# setting (their summary lines; logs in /tmp/<test>_<n>.log). The traces come back as
# $OUT/trace_<n>.csv.gz, n the setting's place in VARIANTS.
cd "$(dirname "$0")/../../.." || exit 1
mkdir -p /tmp/new /tmp/models
tar -xJf "$G/bins.tar.xz" -C /tmp/new || exit 1
NVRTC_DIR=$(dirname "$(find /usr/local /opt /usr/lib \( -name 'libnvrtc.so' -o -name 'libnvrtc.so.13' -o -name 'libnvrtc.so.12' \) 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$NVRTC_DIR:/usr/local/cuda/lib64:${LD_LIBRARY_PATH}
MODEL=${MODEL:-8b}
M=/tmp/models/$MODEL/model-q2_0.gguf
[ -f "$M" ] || /tmp/new/gen_model --preset "$MODEL" --out /tmp/models/$MODEL --formats q2_0 > /tmp/gen.log 2>&1 || exit 1
VARIANTS=${VARIANTS:-X=0}
tb() { echo -n "tg128 $1: "; env ${1//+/ } TRIT_CUDA_CACHE=/tmp/cache_plain timeout 90 /tmp/new/trit bench --device cuda -m $M -p 0 -n 128 -r 3 2>&1 | grep -E "tg128|rror|anic" | awk -F'|' '{print $8}'; }
n=0
for v in $VARIANTS; do
  n=$((n + 1))
  for t in $TESTS; do
    echo -n "$t $v: "; env ${v//+/ } TRIT_CUDA_CACHE=/tmp/cache_plain timeout 200 /tmp/new/$t --ignored --test-threads 1 > /tmp/${t}_$n.log 2>&1; echo "rc=$?"
    grep -E "^test result|^test .*FAILED|panicked at" /tmp/${t}_$n.log | cut -c1-240
  done
done
for v in $VARIANTS; do tb "$v"; done
for v in $(echo $VARIANTS | tr ' ' '\n' | tac); do tb "$v"; done
n=0
for v in $VARIANTS; do
  n=$((n + 1))
  echo "== trace $n: $v"
  extra=$(echo "$v" | tr '+' '\n' | sed -n 's/^TRIT_CUDA_DEFINES=//p')
  env ${v//+/ } TRIT_CUDA_CACHE=/tmp/cache_trace TRIT_CUDA_DEFINES="-DTRIT_TRACE $extra" timeout 120 \
    /tmp/new/trace_step $M --prompt ${PROMPT:-64} --steps 1 --out $OUT/trace_$n.csv 2>&1 | tail -1
  python3 crates/trit-cuda/scripts/trace_report.py $OUT/trace_$n.csv 2>&1 | tail -n +2 | head -12
  gzip -f $OUT/trace_$n.csv
done
