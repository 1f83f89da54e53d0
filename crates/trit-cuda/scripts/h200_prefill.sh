#!/bin/bash
# The batched-prefill GPU session (one device call): unpack the carried binaries, compile the
# kernels, run the GPU tests while the 1.7B/8B-shaped random models are generated, then
# `trit bench --device cuda -p 512 -n 128 -r 5` on both, and pp512 of the token-by-token path
# (TRIT_CUDA_PREFILL=0) on 8B for the side by side. A summary table is printed last.
# Usage (repository root of the device machine): bash .dev/gpu/h200_prefill.sh
cd "$(dirname "$0")/../.." || exit 1
G=.dev/gpu
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/bin /tmp/models
tar -xJf $G/bins.tar.xz -C /tmp/bin || exit 1
NVRTC_DIR=$(dirname "$(find /usr/local /opt /usr/lib \( -name 'libnvrtc.so' -o -name 'libnvrtc.so.13' -o -name 'libnvrtc.so.12' \) 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$NVRTC_DIR:/usr/local/cuda/lib64:${LD_LIBRARY_PATH}
export TRIT_CUDA_CACHE=/tmp/trit-cuda-cache
S=$OUT/summary.txt; : > $S
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $S
( /tmp/bin/gen_model --preset 1.7b --out /tmp/models/1.7b --formats q2_0 > $OUT/gen17.log 2>&1 ) &
( /tmp/bin/gen_model --preset 8b --out /tmp/models/8b --formats q2_0 > $OUT/gen8.log 2>&1 ) &
echo "== kernels_compile" | tee -a $S
timeout 60 /tmp/bin/kernels_compile 2>&1 | grep -E "test result|panicked|error" | tee -a $S
echo "== gpu_vs_cpu" | tee -a $S
timeout 150 /tmp/bin/gpu_vs_cpu --ignored --test-threads 1 --nocapture > $OUT/gputests.log 2>&1
echo "gpu tests rc=$?" | tee -a $S
grep -E "^test |relative logit|panicked|test result|greedy|differ" $OUT/gputests.log | cut -c1-200 | tee -a $S
wait
ls -la /tmp/models/*/ >> $OUT/gen8.log
T=/tmp/bin/trit
B=$OUT/bench.txt; : > $B
for m in 8b 1.7b; do
  echo "== $m prefill (default)" | tee -a $B
  timeout 60 $T bench --device cuda -m /tmp/models/$m/model-q2_0.gguf -p 512 -n 128 -r 5 2>&1 | tee $OUT/bench_$m.txt | grep -E "\|.*(pp|tg)|rror" | tee -a $B
done
echo "== 8b token by token (TRIT_CUDA_PREFILL=0)" | tee -a $B
TRIT_CUDA_PREFILL=0 timeout 30 $T bench --device cuda -m /tmp/models/8b/model-q2_0.gguf -p 512 -n 16 -r 1 2>&1 | grep -E "\|.*pp|rror" | tee -a $B
echo "================ SUMMARY"; cat $S; cat $B
