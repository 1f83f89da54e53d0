#!/bin/bash
# The batched-decode GPU session (one device call): unpack the carried binaries, compile the
# kernels, run the batched-path GPU tests (and the single-path tests the prefill refactor
# touches) while the 1.7B/8B-shaped random models are generated, `trit serve --device cuda`
# under 32 concurrent streamed requests, then side by side on each model: `trit bench --device
# cuda -p 0 -n 128` (batch 1, CUDA graph) and `batch_decode --batches 1,8,32,64`, a per-phase
# timing of one batched step, the graph and the decode GEMM switched back (TRIT_CUDA_BATCH_GRAPH=0,
# TRIT_CUDA_BATCH_GEMM=prefill) for the side by side, and 32 sequences at depth 1024 on 8B.
# Usage (repository root of the device machine): bash .dev/gpu/gpubatch/h200_batch.sh [full]
# (`full` also re-runs the single-path GPU tests that go through the refactored prefill).
cd "$(dirname "$0")/../../.." || exit 1
G=.dev/gpu/gpubatch
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/bin /tmp/models
tar -xJf $G/bins.tar.xz -C /tmp/bin || exit 1
NVRTC_DIR=$(dirname "$(find /usr/local /opt /usr/lib \( -name 'libnvrtc.so' -o -name 'libnvrtc.so.13' -o -name 'libnvrtc.so.12' \) 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$NVRTC_DIR:/usr/local/cuda/lib64:${LD_LIBRARY_PATH}
export TRIT_CUDA_CACHE=/tmp/trit-cuda-cache
S=$OUT/summary.txt; : > $S
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $S
( timeout 120 /tmp/bin/gen_model --preset 1.7b --out /tmp/models/1.7b --formats q2_0 > $OUT/gen17.log 2>&1 ) &
( timeout 120 /tmp/bin/gen_model --preset 8b --out /tmp/models/8b --formats q2_0 > $OUT/gen8.log 2>&1 ) &
echo "== kernels_compile" | tee -a $S
timeout 60 /tmp/bin/kernels_compile 2>&1 | grep -E "test result|panicked|error" | tee -a $S
echo "== gpu_batch" | tee -a $S
timeout 90 /tmp/bin/gpu_batch --ignored --test-threads 1 --nocapture > $OUT/gpu_batch.log 2>&1
echo "gpu_batch rc=$?" | tee -a $S
grep -E "^test |batched vs|panicked|test result|emulation" $OUT/gpu_batch.log | cut -c1-240 | tee -a $S
echo "== gpu_batch, kernel by kernel (TRIT_CUDA_BATCH_GRAPH=0)" | tee -a $S
TRIT_CUDA_BATCH_GRAPH=0 timeout 90 /tmp/bin/gpu_batch --ignored --test-threads 1 --nocapture > $OUT/gpu_batch_nograph.log 2>&1
echo "gpu_batch (no graph) rc=$?" | tee -a $S
grep -E "batched vs|panicked|test result" $OUT/gpu_batch_nograph.log | cut -c1-240 | tee -a $S
echo "== serve --device cuda, 32 concurrent streams" | tee -a $S
timeout 90 python3 $G/serve_batch.py /tmp/bin/trit models/default/smollm2-135m-ternary-q2_0.gguf --n 32 --max-tokens 64 --parallel 32 > $OUT/serve.log 2>&1
echo "serve rc=$?" | tee -a $S
grep -vE "^metrics" $OUT/serve.log | cut -c1-240 | tee -a $S
wait
ls -la /tmp/models/*/ >> $OUT/gen8.log
B=$OUT/bench.txt; : > $B
for m in 8b 1.7b; do
  M=/tmp/models/$m/model-q2_0.gguf
  echo "== $m trit bench --device cuda -p 0 -n 128 -r 3" | tee -a $B
  timeout 60 /tmp/bin/trit bench --device cuda -m $M -p 0 -n 128 -r 3 2>&1 | tee $OUT/bench_$m.txt | grep -E "\|.*tg|rror" | tee -a $B
  echo "== $m batch_decode --batches 1,8,32,64 --steps 128" | tee -a $B
  timeout 90 /tmp/bin/batch_decode $M --batches 1,8,32,64 --steps 128 2>&1 | tee -a $B
  echo "== $m kernel by kernel (TRIT_CUDA_BATCH_GRAPH=0)" | tee -a $B
  TRIT_CUDA_BATCH_GRAPH=0 timeout 60 /tmp/bin/batch_decode $M --batches 1,32 --steps 128 2>&1 | grep batched | tee -a $B
  echo "== $m where a step's time goes (TRIT_CUDA_BATCH_TIMING=1, last of 7 steps)" | tee -a $B
  for nb in 1 32; do
    TRIT_CUDA_BATCH_TIMING=1 timeout 60 /tmp/bin/batch_decode $M --batches $nb --steps 3 2>&1 | grep "batched step" | tail -1 | tee -a $B
  done
done
echo "== 8b with the prefill GEMM for the decode step (TRIT_CUDA_BATCH_GEMM=prefill)" | tee -a $B
TRIT_CUDA_BATCH_GEMM=prefill timeout 60 /tmp/bin/batch_decode /tmp/models/8b/model-q2_0.gguf --batches 1,32 --steps 64 2>&1 | grep batched | tee -a $B
echo "== 8b deep contexts: batch_decode --batches 32 --prompt 1024 --steps 32" | tee -a $B
timeout 90 /tmp/bin/batch_decode /tmp/models/8b/model-q2_0.gguf --batches 32 --prompt 1024 --steps 32 2>&1 | tee -a $B
if [ "$1" = full ]; then
  echo "== gpu_vs_cpu (single path through the refactored prefill)" | tee -a $S
  timeout 60 /tmp/bin/gpu_vs_cpu --ignored --test-threads 1 --nocapture default_model long_prompt > $OUT/gpu_vs_cpu.log 2>&1
  echo "gpu_vs_cpu rc=$?" | tee -a $S
  grep -E "^test |relative logit|panicked|test result|greedy" $OUT/gpu_vs_cpu.log | cut -c1-200 | tee -a $S
fi
echo "================ SUMMARY"; cat $S; cat $B
