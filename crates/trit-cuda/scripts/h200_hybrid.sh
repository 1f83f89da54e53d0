#!/bin/bash
# Hybrid (qwen35) GPU checks and speed on the H200, session 6 (branch gpuhadamard): the GPU
# tests of gpu_hybrid in the default configuration and with the other DeltaNet/fused-GEMV
# variants, a per-kernel ncu profile of one decode step of the 4-layer 27B probe, tg128 of the
# variants on it, and the full 27B shape. Expects in /tmp/bin: trit (built with
# `cargo build --release -p trit-cli --features cuda`), gen_model
# (`cargo build --release -p trit --example gen_model`), gpu_hybrid (the test binary of
# `cargo test --release -p trit-cuda --no-run`); optional trit_before (an older trit).
# Usage: OUT=/tmp/out bash h200_hybrid.sh [quick]   (quick: no 27B model, ~1 min)
OUT=${OUT:-/tmp/out}; mkdir -p $OUT /tmp/models
NVRTC_DIR=$(dirname "$(find /usr/local /opt /usr/lib \( -name 'libnvrtc.so' -o -name 'libnvrtc.so.13' -o -name 'libnvrtc.so.12' \) 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$NVRTC_DIR:/usr/local/cuda/lib64:${LD_LIBRARY_PATH}
export TRIT_CUDA_CACHE=${TRIT_CUDA_CACHE:-/tmp/trit-cuda-cache}
B=/tmp/bin; S=$OUT/hybrid_summary.txt; : > $S; t0=$(date +%s)
el() { echo "== [$(( $(date +%s) - t0 ))s] $*" | tee -a $S; }
[ "$1" != quick ] && ( timeout 150 $B/gen_model --preset 27b-qwen35 --out /tmp/models/27b --formats q2_0 > /tmp/gen27.log 2>&1; touch /tmp/models/27b.done ) &
( timeout 40 $B/gen_model --preset 27b-qwen35-4l --out /tmp/models/4l --formats q2_0 > /tmp/gen4l.log 2>&1; touch /tmp/models/4l.done ) &
el gpu_hybrid default; timeout 60 $B/gpu_hybrid --ignored --test-threads 1 --nocapture > $OUT/hybrid_tests.log 2>&1; echo "rc=$?" | tee -a $S
grep -E "^test |relative|panicked|test result|differ" $OUT/hybrid_tests.log | cut -c1-240 | tee -a $S
for v in "TRIT_CUDA_DN_STEP=2" "TRIT_CUDA_DN_STEP=0 TRIT_CUDA_FUSED=0" "TRIT_CUDA_FUSED=1"; do
  el gpu_hybrid logits $v; env $v timeout 30 $B/gpu_hybrid --ignored --test-threads 1 --nocapture logits 2>&1 | grep -E "relative|panicked|test result" | cut -c1-240 | tee -a $S; done
while [ ! -f /tmp/models/4l.done ]; do sleep 1; done
M4=/tmp/models/4l/model-q2_0.gguf
# One step is 38 kernels by default (embed, 3 × 8 DeltaNet, 10 full attention, norm + head,
# position): skip two steps, profile two.
el ncu 4l; TRIT_CUDA_GRAPH=0 timeout 30 ncu --clock-control none -s 76 -c 76 --metrics gpu__time_duration.sum,dram__bytes_read.sum $B/trit bench --device cuda -m $M4 -p 0 -n 4 -r 1 --no-warmup > $OUT/hybrid_ncu.txt 2>&1; echo "rc=$?" | tee -a $S
for v in "" "TRIT_CUDA_DN_STEP=2" "TRIT_CUDA_DN_STEP=0 TRIT_CUDA_FUSED=0" "TRIT_CUDA_FUSED=1"; do
  el bench 4l "$v"; env $v timeout 25 $B/trit bench --device cuda -m $M4 -p 512 -n 128 -r 5 2>&1 | grep -E "\|.*(pp|tg)|rror" | tee -a $S; done
[ "$1" = quick ] && { el done; exit 0; }
el wait 27b; while [ ! -f /tmp/models/27b.done ]; do sleep 1; done; tail -1 /tmp/gen27.log | tee -a $S
M=/tmp/models/27b/model-q2_0.gguf
for t in trit trit_before; do [ -x $B/$t ] || continue; el bench 27b $t
  timeout 50 $B/$t bench --device cuda -m $M -p 512 -n 128 -r 5 2>&1 | grep -E "\|.*(pp|tg)|rror|weights" | tee -a $S; done
el bench 27b TRIT_CUDA_DN_STEP=2; TRIT_CUDA_DN_STEP=2 timeout 50 $B/trit bench --device cuda -m $M -p 0 -n 128 -r 5 2>&1 | grep -E "\|.*tg|rror" | tee -a $S
el done
