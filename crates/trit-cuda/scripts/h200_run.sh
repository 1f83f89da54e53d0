#!/bin/bash
# One complete GPU session: unpack the carried binaries, check NVRTC/driver, run the GPU test
# suite, generate the 1.7B/8B-shaped random models, benchmark, measure the copy bandwidth
# ceiling with torch, and read the GEMV kernel's DRAM throughput with ncu.
# Usage (repository root of the device machine): bash .dev/gpu/h200_run.sh [quick]
# Logs go to $OUT; a summary table is printed last.
cd "$(dirname "$0")/../.." || exit 1
G=.dev/gpu
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/bin /tmp/models
tar -xJf $G/bins.tar.xz -C /tmp/bin || exit 1
NVRTC_DIR=$(dirname "$(find /usr/local /opt /usr/lib \( -name 'libnvrtc.so' -o -name 'libnvrtc.so.13' -o -name 'libnvrtc.so.12' \) 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$NVRTC_DIR:/usr/local/cuda/lib64:${LD_LIBRARY_PATH}
export TRIT_CUDA_CACHE=/tmp/trit-cuda-cache
echo "nvrtc dir: $NVRTC_DIR"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,memory.used --format=csv | tee $OUT/smi.txt
S=$OUT/summary.txt; : > $S
step() { echo "== $*" | tee -a $OUT/steps.log; }

# llama.cpp's CUDA llama-bench (the peer), built in the background from the stripped sdist
# source (llama_src.tar.xz: vendor/llama.cpp of llama-cpp-python 0.3.36 without models, docs,
# tests, examples, non-CPU/CUDA backends and other tools).
if [ -f $G/llama_src.tar.xz ] && [ -z "$1" ]; then
  ( mkdir -p /tmp/ll && tar -xJf $G/llama_src.tar.xz -C /tmp/ll &&
    cmake -S /tmp/ll/llama.cpp -B /tmp/ll/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TOOLS=ON > $OUT/llama_build.log 2>&1 &&
    cmake --build /tmp/ll/build --target llama-bench -j 14 >> $OUT/llama_build.log 2>&1; echo "llama build rc=$?" >> $OUT/llama_build.log ) &
  LLPID=$!
fi
step compile; timeout 120 /tmp/bin/kernels_compile 2>&1 | tail -3 | tee -a $S
step gputests; timeout 240 /tmp/bin/gpu_vs_cpu --ignored --test-threads 1 --nocapture > $OUT/gputests.log 2>&1; echo "gpu tests rc=$?" | tee -a $S
[ "$1" != final ] && TRIT_CUDA_PDL=0 timeout 240 /tmp/bin/gpu_vs_cpu --ignored --test-threads 1 --nocapture > $OUT/gputests_nopdl.log 2>&1; echo "gpu tests without PDL rc=$?" | tee -a $S
grep -E "error|greedy|test result|panicked" $OUT/gputests.log | head -30 | tee -a $S

step torch-bw
python3 - <<'PY' 2>&1 | tee -a $S
import torch
n = 2 * 1024**3 // 4
x = torch.randn(n, device="cuda"); y = torch.empty_like(x)
for _ in range(3): y.copy_(x)
torch.cuda.synchronize()
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
s.record()
for _ in range(20): y.copy_(x)
e.record(); torch.cuda.synchronize()
ms = s.elapsed_time(e) / 20
print(f"d2d copy 2 GiB: {ms:.3f} ms, {2*n*4/ms/1e6:.0f} GB/s (read+write)")
PY

step genmodels
( /tmp/bin/gen_model --preset 1.7b --out /tmp/models/1.7b --formats q2_0,tq1_0 > $OUT/gen17.log 2>&1 ) &
( /tmp/bin/gen_model --preset 8b --out /tmp/models/8b --formats q2_0 > $OUT/gen8.log 2>&1 ) &
wait
ls -la /tmp/models/* | tee -a $OUT/steps.log

T=/tmp/bin/trit
if [ "$1" = final ]; then
  TRIT_CUDA_ROWS_PER_WARP=8 timeout 200 /tmp/bin/gpu_vs_cpu --ignored --test-threads 1 > $OUT/gputests_r8.log 2>&1; echo "gpu tests with 8 rows per warp rc=$?" | tee -a $S
  for m in 1.7b 8b; do
    for sp in 4 2; do
      echo "$m max split $sp:" | tee -a $S
      TRIT_CUDA_MAX_SPLIT=$sp timeout 100 $T bench --device cuda -m /tmp/models/$m/model-q2_0.gguf -p 512 -n 128 -r 5 2>&1 | grep -E "\|.*(pp|tg)|rror" | tee -a $S
    done
  done
  echo "================ SUMMARY"; cat $S; exit 0
fi
step bench-1.7b
timeout 150 $T bench --device cuda -m /tmp/models/1.7b/model-q2_0.gguf -p 512 -n 128 -r 3 2>&1 | tee $OUT/bench17.txt | grep -E "\|.*(pp|tg)|weights read|load time|rror" | tee -a $S
timeout 100 $T bench --device cuda -m /tmp/models/1.7b/model-tq1_0.gguf -p 0 -n 128 -r 3 2>&1 | grep -E "\|.*tg|rror" | tee -a $S
step bench-8b
timeout 200 $T bench --device cuda -m /tmp/models/8b/model-q2_0.gguf -p 512 -n 128 -r 3 2>&1 | tee $OUT/bench8.txt | grep -E "\|.*(pp|tg)|weights read|load time|rror" | tee -a $S
if [ "$1" != quick ]; then
  for r in 2 8; do
    echo "rows per warp $r:" | tee -a $S
    TRIT_CUDA_ROWS_PER_WARP=$r timeout 100 $T bench --device cuda -m /tmp/models/8b/model-q2_0.gguf -p 0 -n 128 -r 3 2>&1 | grep -E "\|.*tg|rror" | tee -a $S
  done
  echo "no PDL (8B):" | tee -a $S
  TRIT_CUDA_PDL=0 timeout 100 $T bench --device cuda -m /tmp/models/8b/model-q2_0.gguf -p 512 -n 128 -r 3 2>&1 | grep -E "\|.*(pp|tg)|rror" | tee -a $S
  echo "no graph:" | tee -a $S
  TRIT_CUDA_GRAPH=0 timeout 100 $T bench --device cuda -m /tmp/models/8b/model-q2_0.gguf -p 0 -n 128 -r 3 2>&1 | grep -E "\|.*tg|rror" | tee -a $S
fi
step ncu
TRIT_CUDA_GRAPH=0 timeout 120 ncu --clock-control none -s 0 -c 14 --metrics gpu__time_duration.sum \
  $T bench --device cuda -m /tmp/models/8b/model-q2_0.gguf -p 0 -n 1 -r 1 --no-warmup > $OUT/ncu_all.txt 2>&1
grep -E "^  [a-z_0-9]+ \(|gpu__time" $OUT/ncu_all.txt | paste - - | awk '{print $1, $2, $(NF)}' | tee -a $S
TRIT_CUDA_GRAPH=0 timeout 120 ncu --clock-control none -k regex:ternary_gemv -s 8 -c 4 \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum.per_second,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active \
  $T bench --device cuda -m /tmp/models/8b/model-q2_0.gguf -p 0 -n 1 -r 1 --no-warmup > $OUT/ncu.txt 2>&1
grep -E "ternary_gemv|gpu__time|dram__|launch__reg|warps_active|rror" $OUT/ncu.txt | head -40 | tee -a $S
if [ -n "$LLPID" ]; then
  step llama.cpp; wait $LLPID; tail -2 $OUT/llama_build.log | tee -a $S
  LB=/tmp/ll/build/bin/llama-bench
  if [ -x $LB ]; then
    for m in 8b 1.7b; do
      timeout 120 $LB -m /tmp/models/$m/model-q2_0.gguf -ngl 99 -fa 1 -p 512 -n 128 -r 10 2>&1 | tee $OUT/llama_$m.txt | grep -E "\| (pp|tg)" | tee -a $S
      timeout 100 $T bench --device cuda -m /tmp/models/$m/model-q2_0.gguf -p 512 -n 128 -r 10 2>&1 | grep -E "\|.*(pp|tg)|rror" | tee -a $S
    done
  fi
fi
echo "================ SUMMARY"; cat $S
