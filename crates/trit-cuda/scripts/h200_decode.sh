#!/bin/bash
# The decode-speed GPU session (one device call): unpack the carried binaries (bins.tar.xz:
# trit, trit_before, gpu_vs_cpu, gen_model), run the GPU tests while the 1.7B/8B-shaped random
# models are generated, then `trit bench --device cuda -p 512 -n 128` side by side with the
# binary before the change and with the fused kernels switched off, one step's kernels under
# ncu (time per kernel) and the fused GEMVs' DRAM throughput (every matrix fused). Summary
# printed last.
# Usage: copy this script and bins.tar.xz to .dev/gpu/gpudecode/ (ignored by git) of the checkout
# the device call ships, carry that folder, and run from the repository root there:
#   bash .dev/gpu/gpudecode/h200_decode.sh [bench]   (bench: skip the GPU tests)
cd "$(dirname "$0")/../../.." || exit 1
G=.dev/gpu/gpudecode
OUT=${OUT:-/tmp/out}
R=${REPS:-5}
mkdir -p "$OUT" /tmp/bin /tmp/models
tar -xJf $G/bins.tar.xz -C /tmp/bin || exit 1
NVRTC_DIR=$(dirname "$(find /usr/local /opt /usr/lib \( -name 'libnvrtc.so' -o -name 'libnvrtc.so.13' -o -name 'libnvrtc.so.12' \) 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$NVRTC_DIR:/usr/local/cuda/lib64:${LD_LIBRARY_PATH}
export TRIT_CUDA_CACHE=/tmp/trit-cuda-cache
S=$OUT/summary.txt; : > $S
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee -a $S
( /tmp/bin/gen_model --preset 1.7b --out /tmp/models/1.7b --formats q2_0 > $OUT/gen17.log 2>&1 ) &
( /tmp/bin/gen_model --preset 8b --out /tmp/models/8b --formats q2_0 > $OUT/gen8.log 2>&1 ) &
if [ "$1" != bench ]; then
  echo "== gpu_vs_cpu" | tee -a $S
  timeout 150 /tmp/bin/gpu_vs_cpu --ignored --test-threads 1 --nocapture > $OUT/gputests.log 2>&1
  echo "gpu tests rc=$?" | tee -a $S
  grep -E "^test |relative logit|panicked|test result|greedy|differ" $OUT/gputests.log | cut -c1-220 | tee -a $S
fi
wait
T=/tmp/bin/trit
b() { timeout 60 "$@" 2>&1 | grep -E "\|.*(pp|tg)|rror" | tee -a $S; }
for m in 8b 1.7b; do
  M=/tmp/models/$m/model-q2_0.gguf
  echo "== $m before (main)" | tee -a $S; b /tmp/bin/trit_before bench --device cuda -m $M -p 512 -n 128 -r $R
  echo "== $m after" | tee -a $S; b $T bench --device cuda -m $M -p 512 -n 128 -r $R
  echo "== $m after, TRIT_CUDA_FUSED=0" | tee -a $S; TRIT_CUDA_FUSED=0 b $T bench --device cuda -m $M -p 0 -n 128 -r $R
done
M=/tmp/models/8b/model-q2_0.gguf
# Variants of the new binary (':' joins several variables).
for v in TRIT_CUDA_FUSED=1 TRIT_CUDA_FUSED=1:TRIT_CUDA_MAX_SPLIT=2 TRIT_CUDA_FUSED=1:TRIT_CUDA_ROWS_PER_WARP=2 \
    TRIT_CUDA_FUSED=qkv,gate_up,down,head TRIT_CUDA_FUSED=qkv,o,gate_up,head TRIT_CUDA_MAX_SPLIT=2 \
    TRIT_CUDA_ROWS_PER_WARP=2 TRIT_CUDA_PDL=0; do
  for m in 8b 1.7b; do
    echo "== $m after, $v" | tee -a $S; env ${v//:/ } timeout 60 $T bench --device cuda -m /tmp/models/$m/model-q2_0.gguf -p 0 -n 128 -r $R 2>&1 | grep -E "\|.*tg|rror" | tee -a $S
  done
done
echo "== 8b at depth 3968: before, after (16 splits), after with 8 and 32 splits" | tee -a $S
b /tmp/bin/trit_before bench --device cuda -m $M -p 0 -n 128 -d 3968 -r 2
b $T bench --device cuda -m $M -p 0 -n 128 -d 3968 -r 2
TRIT_CUDA_ATT_SPLITS=8 b $T bench --device cuda -m $M -p 0 -n 128 -d 3968 -r 2
TRIT_CUDA_ATT_SPLITS=32 b $T bench --device cuda -m $M -p 0 -n 128 -d 3968 -r 2
echo "== ncu: one 8B step at position 0 (embed, layer 0, layer 1)" | tee -a $S
TRIT_CUDA_FUSED=1 TRIT_CUDA_GRAPH=0 timeout 60 ncu --clock-control none --cache-control none -s 0 -c 12 --metrics gpu__time_duration.sum \
  $T bench --device cuda -m $M -p 0 -n 1 -r 1 --no-warmup > $OUT/ncu_all.txt 2>&1
grep -E "^  [a-z_0-9]+ \(|gpu__time" $OUT/ncu_all.txt | paste - - | awk '{print $1, $2, $(NF)}' | tee -a $S
echo "== ncu: fused GEMVs of layer 1 (8B)" | tee -a $S
TRIT_CUDA_FUSED=1 TRIT_CUDA_GRAPH=0 timeout 60 ncu --clock-control none --cache-control none -k regex:ternary_gemv_fused -s 4 -c 4 \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum.per_second,launch__registers_per_thread,launch__grid_size \
  $T bench --device cuda -m $M -p 0 -n 1 -r 1 --no-warmup > $OUT/ncu.txt 2>&1
grep -E "ternary_gemv|gpu__time|dram__|launch__|rror" $OUT/ncu.txt | head -40 | tee -a $S
if [ "$1" != bench ]; then
  TRIT_CUDA_GRAPH=0 timeout 60 /tmp/bin/gpu_vs_cpu --ignored --test-threads 1 > $OUT/gputests_nograph.log 2>&1
  echo "gpu tests without graph rc=$?" | tee -a $S; grep -E "test result|panicked" $OUT/gputests_nograph.log | tee -a $S
fi
echo "================ SUMMARY"; cat $S
