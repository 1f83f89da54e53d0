#!/bin/bash
# Why a decode kernel takes the time it does (session 9): ncu's speed-of-light, scheduler and
# warp-state sections for the kernels of one decode step that match KERNELS, run outside the
# graph (TRIT_CUDA_GRAPH=0) with clocks and caches as in normal use. Prints per kernel: time,
# DRAM throughput, issue-slot use, IPC, eligible warps per scheduler and the top stall reasons.
# Usage: G=.dev/gpu/DIR (bins.tar.xz as h200_final.sh expects) [MODEL=27b-qwen35-4l]
#   [KERNELS=regex:ternary_gemv] [SKIP=40] [COUNT=6] bash crates/trit-cuda/scripts/h200_ncu.sh
# BATCH=N profiles N sequences' batched steps instead (batch_decode --batches N, GPU candidates),
# e.g. KERNELS=regex:ternary_gemm_small BATCH=8.
cd "$(dirname "$0")/../../.." || exit 1
mkdir -p /tmp/bin /tmp/models; tar -xJf "${G:?}/bins.tar.xz" -C /tmp/bin || exit 1
NVRTC_DIR=$(dirname "$(find /usr/local /opt /usr/lib \( -name 'libnvrtc.so' -o -name 'libnvrtc.so.13' -o -name 'libnvrtc.so.12' \) 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$NVRTC_DIR:/usr/local/cuda/lib64:${LD_LIBRARY_PATH}; export TRIT_CUDA_CACHE=/tmp/tc
NCU=$(command -v ncu || find / -name ncu -type f -perm -u+x 2>/dev/null | head -1)
M=${MODEL:-27b-qwen35-4l}
[ -f /tmp/models/$M/model-q2_0.gguf ] || /tmp/bin/gen_model --preset $M --out /tmp/models/$M --formats q2_0 > /dev/null 2>&1
if [ -n "$BATCH" ]; then RUN="/tmp/bin/batch_decode /tmp/models/$M/model-q2_0.gguf --batches $BATCH --steps 2 --rows top"
else RUN="/tmp/bin/trit bench --device cuda -m /tmp/models/$M/model-q2_0.gguf -p 0 -n 2 -r 1"; fi
TRIT_CUDA_GRAPH=0 timeout 300 $NCU --clock-control none -k "${KERNELS:-regex:ternary_gemv}" \
  -s "${SKIP:-40}" -c "${COUNT:-6}" --section SpeedOfLight --section SchedulerStats \
  --section WarpStateStats --section Occupancy --page details \
  $RUN > /tmp/ncu.txt 2>&1
# The whole report comes back as a file where the device tool collects $OUT (session 10: the
# short list below missed the scheduler's and the stall rules' lines).
[ -n "$OUT" ] && cp /tmp/ncu.txt "$OUT/ncu-${M}-${BATCH:-1}-${SKIP:-40}.txt"
grep -E "^  [a-z_0-9]+.*\(|Duration|DRAM Throughput|Memory Throughput|L2 Hit Rate|Issue Slots Busy|Issued Warp Per Scheduler|No Eligible|Executed Ipc Active|Eligible Warps Per Scheduler|Warp Cycles Per Issued|Achieved Occupancy|Registers Per Thread|stalled|Stall" /tmp/ncu.txt | cut -c1-220 | head -${LINES_MAX:-150}
