#!/bin/bash
# Final GPU run of a session on main, one machine start: every GPU test, trit and llama.cpp's
# CUDA llama-bench side by side on the same GGUF files, batched decode, the 27B hybrid, and
# ncu's DRAM throughput of the decode GEMVs. Usage: put bins.tar.xz (trit, gen_model,
# batch_decode and the test binaries gpu_* / kernels_compile, named without their hash) in
# $G (default .dev/gpu/final7/), have .dev/peer/llama_src.tar.xz (vendor/llama.cpp of the
# llama-cpp-python 0.3.36 sdist, stripped as docs/gpu-peer.md says), carry both folders.
# Everything that matters is printed to stdout (the device tool returns few files).
cd "$(dirname "$0")/../../.." || exit 1
G=${G:-.dev/gpu/final7}
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
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TOOLS=ON > $OUT/llama_build.log 2>&1 &&
  nice cmake --build /tmp/ll/build --target llama-bench -j 14 >> $OUT/llama_build.log 2>&1; echo "llama build rc=$?" >> $OUT/llama_build.log ) &
LLPID=$!
( for m in 8b 1.7b 27b-qwen35; do nice /tmp/bin/gen_model --preset $m --out /tmp/models/$m --formats q2_0 > /tmp/gen_$m.log 2>&1; touch /tmp/models/$m.done; done ) &
step kernels_compile; timeout 60 /tmp/bin/kernels_compile 2>&1 | grep -E "test result|panicked" | tee -a $S
for t in /tmp/bin/gpu_*; do
  n=$(basename $t)
  step $n; timeout 150 $t --ignored --test-threads 1 --nocapture > /tmp/$n.log 2>&1; echo "rc=$?" | tee -a $S
  grep -E "^test |relative|panicked|test result|greedy|batched vs" /tmp/$n.log | cut -c1-220 | tee -a $S
done
T=/tmp/bin/trit
tb() { timeout 90 $T bench --device cuda -m /tmp/models/$1/model-q2_0.gguf -p 512 -n 128 -r $2 2>&1 | grep -E "(pp|tg)[0-9]+|rror" | tee -a $S; }
while [ ! -f /tmp/models/1.7b.done ]; do sleep 2; done
step trit bench; tb 8b 5; tb 1.7b 5
step tg128 with o fused too
for m in 8b 1.7b; do TRIT_CUDA_FUSED=qkv,o,gate_up,head timeout 60 $T bench --device cuda -m /tmp/models/$m/model-q2_0.gguf -p 0 -n 128 -r 3 2>&1 | grep -E "tg128|rror" | tee -a $S; done
step "tg128 with the persistent MLP kernel (prototype, TRIT_CUDA_PERSIST=1)"
for m in 8b 1.7b; do TRIT_CUDA_PERSIST=1 timeout 60 $T bench --device cuda -m /tmp/models/$m/model-q2_0.gguf -p 0 -n 128 -r 3 2>&1 | grep -E "tg128|rror" | tee -a $S; echo "rc=$?" | tee -a $S; done
step batch_decode
for m in 8b 1.7b; do timeout 90 /tmp/bin/batch_decode /tmp/models/$m/model-q2_0.gguf --batches 32,64 --steps 64 --rows full,top 2>&1 | grep "B=" | tee -a $S; done
step ncu decode GEMVs 8B
TRIT_CUDA_GRAPH=0 timeout 90 /usr/local/cuda/bin/ncu --clock-control none -k regex:ternary_gemv --launch-skip 700 -c 8 --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed $T bench --device cuda -m /tmp/models/8b/model-q2_0.gguf -p 0 -n 8 -r 1 2>&1 | grep -E "ternary_gemv|duration|bytes_read|throughput" | tr -s ' ' | tee -a $S
while [ ! -f /tmp/models/27b-qwen35.done ]; do sleep 2; done
step hybrid 27B; tail -1 /tmp/gen_27b-qwen35.log | tee -a $S
timeout 90 $T bench --device cuda -m /tmp/models/27b-qwen35/model-q2_0.gguf -p 512 -n 128 -r 3 2>&1 | grep -E "(pp|tg)[0-9]+|rror" | tee -a $S
step llama.cpp; wait $LLPID; tail -1 $OUT/llama_build.log | tee -a $S
LB=/tmp/ll/build/bin/llama-bench
if [ -x $LB ]; then
  for m in 8b 1.7b; do
    timeout 120 $LB -m /tmp/models/$m/model-q2_0.gguf -ngl 99 -fa 1 -p 512 -n 128 -r 5 > /tmp/llama_$m.txt 2>&1
    echo "llama-bench $m rc=$?" | tee -a $S; grep -E "^\|" /tmp/llama_$m.txt | tee -a $S; tail -2 /tmp/llama_$m.txt | tee -a $S
    tb $m 5
  done
else
  tail -30 $OUT/llama_build.log
fi
echo "================ SUMMARY"; cat $S
