#!/bin/bash
# A/B of two builds on one machine start (session 8): every GPU test of the NEW binaries, then
# tg128 of OLD and NEW alternated (twice) on the 8B and 1.7B shapes and on the 27B hybrid.
# Usage: OLD=.dev/gpu/A NEW=.dev/gpu/B bash crates/trit-cuda/scripts/h200_ab.sh, each folder
# holding bins.tar.xz as h200_final.sh expects; carry both. VARIANTS="ENV=V ..." adds runs of
# NEW with each setting (e.g. VARIANTS="TRIT_CUDA_ATT_MIN_CHUNK=64 TRIT_CUDA_PERSIST=1") on the
# 8B and 1.7B shapes, VARIANTS27 likewise on the 27B hybrid. HYBRIDS="27b-qwen35 27b-prism"
# (default 27b-qwen35) picks the hybrid presets measured (27b-prism: Bonsai 2's rotated form).
# DEPTHS="128 512" adds, on the 8B and 1.7B shapes, 32 steps from each cached depth (old, new,
# then new with each VARIANTS setting). Test logs stay in /tmp/<test>.log; only their summary
# lines are printed (a failing assert that prints logits would flood the output's tail).
# A setting may join several with '+' (VARIANTS27="A=1+B=2"). TEST_ENVS="A=1 B=2+C=3" runs the
# tests once more under each setting.
cd "$(dirname "$0")/../../.." || exit 1
mkdir -p /tmp/new /tmp/old /tmp/models
tar -xJf "$NEW/bins.tar.xz" -C /tmp/new && tar -xJf "$OLD/bins.tar.xz" -C /tmp/old || exit 1
NVRTC_DIR=$(dirname "$(find /usr/local /opt /usr/lib \( -name 'libnvrtc.so' -o -name 'libnvrtc.so.13' -o -name 'libnvrtc.so.12' \) 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$NVRTC_DIR:/usr/local/cuda/lib64:${LD_LIBRARY_PATH}
HYBRIDS=${HYBRIDS:-27b-qwen35}
( for m in 8b 1.7b $HYBRIDS; do nice /tmp/new/gen_model --preset $m --out /tmp/models/$m --formats q2_0 > /tmp/gen_$m.log 2>&1; touch /tmp/models/$m.done; done ) &
for e in X=0 $TEST_ENVS; do
  for t in ${TESTS:-gpu_vs_cpu gpu_kernels gpu_batch gpu_hybrid gpu_sample}; do
    echo "== $t $e"; env ${e//+/ } TRIT_CUDA_CACHE=/tmp/cache_new timeout 150 /tmp/new/$t --ignored --test-threads 1 --nocapture > /tmp/$t.log 2>&1; echo "rc=$?"
    grep -E "^test result|^test .*FAILED|panicked at" /tmp/$t.log | cut -c1-240
  done
done
tb() { echo -n "$1 $2 $3: "; env ${3//+/ } TRIT_CUDA_CACHE=/tmp/cache_$2 timeout 90 /tmp/$2/trit bench --device cuda -m /tmp/models/$1/model-q2_0.gguf -p 0 -n 128 -r 3 2>&1 | grep -E "tg128|rror|anic" | awk -F'|' '{print $8}'; }
# tb at a cached depth: model, build, setting, depth.
td() { echo -n "$1 $2 $3 d$4: "; env ${3//+/ } TRIT_CUDA_CACHE=/tmp/cache_$2 timeout 90 /tmp/$2/trit bench --device cuda -m /tmp/models/$1/model-q2_0.gguf -p 0 -n 32 -d $4 -r 2 2>&1 | grep -E "tg32|rror|anic" | awk -F'|' '{print $8}'; }
for m in 8b 1.7b; do
  while [ ! -f /tmp/models/$m.done ]; do sleep 2; done
  # Old first, then new first: in session 11 whichever build ran first in a pair measured 1-3 %
  # faster on the 8B (also for builds that did not touch its code), so one order alone biases.
  for r in 1 2; do
    if [ $r = 1 ]; then tb $m old X=0; tb $m new X=0; else tb $m new X=0; tb $m old X=0; fi
    for v in $VARIANTS; do tb $m new $v; done
  done
  for d in $DEPTHS; do
    td $m old X=0 $d; td $m new X=0 $d
    for v in $VARIANTS; do td $m new $v $d; done
  done
done
for h in $HYBRIDS; do
  while [ ! -f /tmp/models/$h.done ]; do sleep 2; done
  tb $h old X=0; tb $h new X=0; tb $h new X=0; tb $h old X=0
  for v in $VARIANTS27; do tb $h new $v; done
done
