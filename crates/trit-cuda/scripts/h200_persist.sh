#!/bin/bash
# First GPU call of session 8: every GPU test (the persistent MLP prototype had never run on a
# GPU), then tg128 with and without TRIT_CUDA_PERSIST=1, and ncu of the persistent kernel.
# Usage: G=.dev/gpu/DIR (bins.tar.xz as h200_final.sh expects).
cd "$(dirname "$0")/../../.." || exit 1
G=${G:-.dev/gpu/p1}
mkdir -p /tmp/bin /tmp/models
tar -xJf $G/bins.tar.xz -C /tmp/bin || exit 1
NVRTC_DIR=$(dirname "$(find /usr/local /opt /usr/lib \( -name 'libnvrtc.so' -o -name 'libnvrtc.so.13' -o -name 'libnvrtc.so.12' \) 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$NVRTC_DIR:/usr/local/cuda/lib64:${LD_LIBRARY_PATH}
export TRIT_CUDA_CACHE=/tmp/trit-cuda-cache
step() { echo "== $* ($(date +%T))"; }
( for m in ${MODELS:-8b 1.7b}; do nice /tmp/bin/gen_model --preset $m --out /tmp/models/$m --formats q2_0 > /tmp/gen_$m.log 2>&1; touch /tmp/models/$m.done; done ) &
step kernels_compile; timeout 60 /tmp/bin/kernels_compile 2>&1 | grep -E "test result|panicked"
for t in ${TESTS:-/tmp/bin/gpu_*}; do
  n=$(basename $t)
  step $n; timeout 150 $t --ignored --test-threads 1 --nocapture > /tmp/$n.log 2>&1; echo "rc=$?"
  grep -E "^test |relative|panicked|test result|greedy|batched vs|max " /tmp/$n.log | cut -c1-220 | head -60
done
T=/tmp/bin/trit
for m in ${MODELS:-8b 1.7b}; do
  while [ ! -f /tmp/models/$m.done ]; do sleep 2; done
  step tg128 $m
  for v in 0 1 0 1; do
    echo -n "PERSIST=$v "; TRIT_CUDA_PERSIST=$v timeout 60 $T bench --device cuda -m /tmp/models/$m/model-q2_0.gguf -p 0 -n 128 -r 3 2>&1 | grep -E "tg128|rror|anic" ; echo " rc=$?"
  done
done
if [ -n "$NCU" ]; then
  step ncu persist 8B
  TRIT_CUDA_PERSIST=1 TRIT_CUDA_GRAPH=0 timeout 90 /usr/local/cuda/bin/ncu --clock-control none -k regex:"$NCU" --launch-skip 100 -c 4 --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed $T bench --device cuda -m /tmp/models/8b/model-q2_0.gguf -p 0 -n 8 -r 1 2>&1 | grep -E "persist|gemv|duration|bytes_read|throughput" | tr -s ' '
fi
