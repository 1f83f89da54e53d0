#!/bin/bash
# What each decode kernel kind really costs inside the captured graph (session 8): tg128 of
# the 8B shape with TRIT_CUDA_DEFINES="-DTRIT_PROBE_SKIP=N" (common.cuh: 1 attention,
# 2 quantize, 4 register GEMV, 8 streaming GEMV return right after their wait). Outputs are
# garbage in the skipped runs; only their speed means something. Each setting recompiles the
# kernels (~25 s). Usage: G=.dev/gpu/DIR (bins.tar.xz as h200_final.sh expects).
cd "$(dirname "$0")/../../.." || exit 1
mkdir -p /tmp/bin /tmp/models; tar -xJf "${G:?}/bins.tar.xz" -C /tmp/bin || exit 1
NVRTC_DIR=$(dirname "$(find /usr/local /opt /usr/lib \( -name 'libnvrtc.so' -o -name 'libnvrtc.so.13' -o -name 'libnvrtc.so.12' \) 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$NVRTC_DIR:/usr/local/cuda/lib64:${LD_LIBRARY_PATH}; export TRIT_CUDA_CACHE=/tmp/tc
/tmp/bin/gen_model --preset 8b --out /tmp/models/8b --formats q2_0 > /dev/null 2>&1
for N in none 1 2 4 8 12 none; do
  D=""; [ $N != none ] && D="-DTRIT_PROBE_SKIP=$N"
  echo -n "8b skip=$N: "; TRIT_CUDA_DEFINES="$D" timeout 60 /tmp/bin/trit bench --device cuda -m /tmp/models/8b/model-q2_0.gguf -p 0 -n 128 -r 3 2>&1 | grep -E "tg128|rror|anic" | awk -F'|' '{print $8}'
done
