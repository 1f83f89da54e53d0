#!/bin/bash
# GPU sampling from candidates + batched decode, one H200 call (see BENCHMARKS.md, "GPU batched
# decode, session 6"). Carry `.dev/gpu/gpusample` holding this script and bins.tar.xz with the
# stripped binaries of `cargo test --release -p trit-cuda --no-run` (gpu_sample, gpu_batch),
# `cargo build --release -p trit-cuda --example batch_decode` and
# `cargo build --release -p trit --example gen_model`; run `bash .dev/gpu/gpusample/run.sh`.
cd "$(dirname "$0")/../../.." || exit 1
G=.dev/gpu/gpusample
OUT=${OUT:-/tmp/out}; mkdir -p $OUT /tmp/bin /tmp/models
tar -xJf $G/bins.tar.xz -C /tmp/bin || exit 1
NVRTC_DIR=$(dirname "$(find /usr/local /opt /usr/lib \( -name 'libnvrtc.so' -o -name 'libnvrtc.so.13' -o -name 'libnvrtc.so.12' \) 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$NVRTC_DIR:/usr/local/cuda/lib64:${LD_LIBRARY_PATH}
export TRIT_CUDA_CACHE=/tmp/trit-cuda-cache
S=$OUT/summary.txt; : > $S
step() { echo "== $* ($(date +%T))" | tee -a $S; }
( nice /tmp/bin/gen_model --preset 8b --out /tmp/models/8b --formats q2_0 > /tmp/gen.log 2>&1; touch /tmp/models/8b.done;
  nice /tmp/bin/gen_model --preset 1.7b --out /tmp/models/1.7b --formats q2_0 >> /tmp/gen.log 2>&1; touch /tmp/models/1.7b.done ) &
for t in gpu_sample gpu_batch; do
  step $t; timeout 60 /tmp/bin/$t --ignored --test-threads 1 --nocapture > $OUT/$t.log 2>&1; echo "rc=$?" | tee -a $S
  grep -E "^test |candidate|requests|batched vs|GEMM|panicked|unexpected|test result" $OUT/$t.log | cut -c1-300 | tee -a $S
done
BD=/tmp/bin/batch_decode
for m in 8b 1.7b; do
  while [ ! -f /tmp/models/$m.done ]; do sleep 1; done
  M=/tmp/models/$m/model-q2_0.gguf
  step $m wide GEMM; timeout 40 $BD $M --batches 1,8,32,64 --steps 64 2>&1 | tee -a $S
  step $m plain GEMM; TRIT_CUDA_BATCH_GEMM=plain timeout 30 $BD $M --batches 32,64 --steps 64 --rows top 2>&1 | tail -2 | tee -a $S
  step $m timing; TRIT_CUDA_BATCH_TIMING=1 timeout 30 $BD $M --batches 32 --steps 3 2>&1 | grep "batched step" | tail -2 | tee -a $S
done
step 8b sampling; timeout 30 $BD /tmp/models/8b/model-q2_0.gguf --batches 32 --steps 32 --sample 2>&1 | tail -3 | tee -a $S
echo "================ SUMMARY"; cat $S
