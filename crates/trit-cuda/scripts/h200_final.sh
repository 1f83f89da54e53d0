#!/bin/bash
# Usage: copy to .dev/gpu/final/final.sh with bins.tar.xz (trit, gen_model, batch_decode, gpu_vs_cpu,
# gpu_batch, gpu_hybrid, kernels_compile) and .dev/peer/llama_src.tar.xz; carry both folders.
# Final GPU session of session 5 on the merged main: every GPU test, serve with 32 streams,
# pp512/tg128 of trit and llama.cpp's CUDA llama-bench side by side, batched decode, copy
# bandwidth, GEMV DRAM throughput (ncu), hybrid decode when its files are there.
cd "$(dirname "$0")/../../.." || exit 1
G=.dev/gpu/final
OUT=${OUT:-/tmp/out}; mkdir -p $OUT /tmp/bin /tmp/models
tar -xJf $G/bins.tar.xz -C /tmp/bin || exit 1
NVRTC_DIR=$(dirname "$(find /usr/local /opt /usr/lib \( -name 'libnvrtc.so' -o -name 'libnvrtc.so.13' -o -name 'libnvrtc.so.12' \) 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$NVRTC_DIR:/usr/local/cuda/lib64:${LD_LIBRARY_PATH}
export TRIT_CUDA_CACHE=/tmp/trit-cuda-cache
S=$OUT/summary.txt; : > $S
step() { echo "== $* ($(date +%T))" | tee -a $S; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee -a $S
( mkdir -p /tmp/ll && tar -xJf .dev/peer/llama_src.tar.xz -C /tmp/ll &&
  cmake -S /tmp/ll/llama.cpp -B /tmp/ll/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TOOLS=ON > $OUT/llama_build.log 2>&1 &&
  nice cmake --build /tmp/ll/build --target llama-bench -j 12 >> $OUT/llama_build.log 2>&1; echo "llama build rc=$?" >> $OUT/llama_build.log ) &
LLPID=$!
( nice /tmp/bin/gen_model --preset 27b-qwen35 --out /tmp/models/27b --formats q2_0 > $OUT/gen27.log 2>&1; echo "gen27 rc=$?" >> $OUT/gen27.log; touch /tmp/models/27b.done ) &
( nice /tmp/bin/gen_model --preset 8b --out /tmp/models/8b --formats q2_0 > $OUT/gen8.log 2>&1; touch /tmp/models/8b.done ) &
( nice /tmp/bin/gen_model --preset 1.7b --out /tmp/models/1.7b --formats q2_0 > $OUT/gen17.log 2>&1; touch /tmp/models/1.7b.done ) &
step kernels_compile; timeout 60 /tmp/bin/kernels_compile 2>&1 | grep -E "test result|panicked" | tee -a $S
step gpu_vs_cpu; timeout 150 /tmp/bin/gpu_vs_cpu --ignored --test-threads 1 --nocapture > $OUT/gpu_vs_cpu.log 2>&1; echo "rc=$?" | tee -a $S
grep -E "^test |relative|panicked|test result|greedy" $OUT/gpu_vs_cpu.log | cut -c1-200 | tee -a $S
step gpu_batch; timeout 120 /tmp/bin/gpu_batch --ignored --test-threads 1 --nocapture > $OUT/gpu_batch.log 2>&1; echo "rc=$?" | tee -a $S
grep -E "^test |batched vs|panicked|test result" $OUT/gpu_batch.log | cut -c1-200 | tee -a $S
if [ -x /tmp/bin/gpu_hybrid ]; then
  step gpu_hybrid; timeout 150 /tmp/bin/gpu_hybrid --ignored --test-threads 1 --nocapture > $OUT/gpu_hybrid.log 2>&1; echo "rc=$?" | tee -a $S
  grep -E "^test |relative|panicked|test result|greedy" $OUT/gpu_hybrid.log | cut -c1-200 | tee -a $S
fi
step serve; timeout 90 python3 crates/trit-cuda/scripts/serve_batch.py /tmp/bin/trit models/default/smollm2-135m-ternary-q2_0.gguf --n 32 --max-tokens 64 --parallel 32 > $OUT/serve.log 2>&1; echo "rc=$?" | tee -a $S
grep -vE "^metrics" $OUT/serve.log | tail -6 | cut -c1-200 | tee -a $S
step torch-bw
python3 - <<'PY' 2>&1 | tail -1 | tee -a $S
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
while [ ! -f /tmp/models/8b.done ] || [ ! -f /tmp/models/1.7b.done ]; do sleep 2; done
T=/tmp/bin/trit
step trit bench
for m in 8b 1.7b; do
  timeout 90 $T bench --device cuda -m /tmp/models/$m/model-q2_0.gguf -p 512 -n 128 -r 5 2>&1 | grep -E "\|.*(pp|tg)|rror" | tee -a $S
done
step batch_decode
for m in 8b 1.7b; do
  timeout 90 /tmp/bin/batch_decode /tmp/models/$m/model-q2_0.gguf --batches 1,8,32 --steps 128 2>&1 | tee -a $S
done
step ncu-gemv
TRIT_CUDA_GRAPH=0 timeout 90 ncu --clock-control none -k regex:ternary_gemv -s 6 -c 6 \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
  $T bench --device cuda -m /tmp/models/8b/model-q2_0.gguf -p 0 -n 1 -r 1 --no-warmup > $OUT/ncu_gemv.txt 2>&1
grep -E "ternary_gemv|gpu__time|dram__" $OUT/ncu_gemv.txt | head -24 | tee -a $S
step llama.cpp; wait $LLPID; tail -1 $OUT/llama_build.log | tee -a $S
LB=/tmp/ll/build/bin/llama-bench
if [ -x $LB ]; then
  for m in 8b 1.7b; do
    timeout 120 $LB -m /tmp/models/$m/model-q2_0.gguf -ngl 99 -fa 1 -p 512 -n 128 -r 10 2>&1 | tee $OUT/llama_$m.txt | grep -E "\| (pp|tg)" | tee -a $S
    timeout 120 $T bench --device cuda -m /tmp/models/$m/model-q2_0.gguf -p 512 -n 128 -r 10 2>&1 | grep -E "\|.*(pp|tg)|rror" | tee -a $S
  done
fi
if [ -f crates/trit-cuda/scripts/h200_final_hybrid.sh ]; then step hybrid; OUT=$OUT timeout 200 bash crates/trit-cuda/scripts/h200_final_hybrid.sh 2>&1 | tee -a $S; fi
echo "================ SUMMARY"; cat $S
