#!/bin/bash
# The whole-step kernel on the H200 (megastep.rs): its GPU tests, then 8B tg128 with and
# without it (alternated) and on the greedy device loop. Usage: carry .dev/gpu/$B (B=NAME,
# default mega) and run `B=NAME bash crates/trit-cuda/scripts/h200_mega.sh`. TESTS adds
# other GPU test binaries (default gpu_greedy); MODELS the presets benched (default 8b);
# VARIANTS settings run with the kernel on (e.g. "TRIT_CUDA_DEFINES=-DMS_SLOTS=8").
cd "$(dirname "$0")/../../.." || exit 1
B=${B:-mega}
mkdir -p /tmp/b /tmp/models
tar -xJf ".dev/gpu/$B/bins.tar.xz" -C /tmp/b || exit 1
NVRTC_DIR=$(dirname "$(find /usr/local /opt /usr/lib \( -name 'libnvrtc.so' -o -name 'libnvrtc.so.13' -o -name 'libnvrtc.so.12' \) 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$NVRTC_DIR:/usr/local/cuda/lib64:${LD_LIBRARY_PATH}
export TRIT_CUDA_CACHE=/tmp/cache
MODELS=${MODELS:-8b}
( for m in $MODELS; do nice /tmp/b/gen_model --preset $m --out /tmp/models/$m --formats q2_0 > /tmp/gen_$m.log 2>&1; touch /tmp/models/$m.done; done ) &
for t in gpu_mega ${TESTS-gpu_greedy}; do
  echo "== $t"; timeout 240 /tmp/b/$t --ignored --test-threads 1 --nocapture > /tmp/$t.log 2>&1; echo "rc=$?"
  grep -E "^test |panicked at|relative logit" /tmp/$t.log | cut -c1-200 | head -30
done
tb() { echo -n "$1 $2 $3: "; env ${2//+/ } timeout 100 /tmp/b/trit bench --device cuda -m /tmp/models/$1/model-q2_0.gguf -p 0 -n 128 -r 3 $3 2>&1 | grep -E "tg128|rror|anic" | awk -F'|' '{print $8}' | head -3; }
for m in $MODELS; do
  while [ ! -f /tmp/models/$m.done ]; do sleep 2; done
  for r in 1 2; do
    tb $m X=0; tb $m TRIT_CUDA_MEGA=1
    for v in $VARIANTS; do tb $m TRIT_CUDA_MEGA=1+$v; done
  done
  tb $m X=0 --greedy; tb $m TRIT_CUDA_MEGA=1 --greedy
done
