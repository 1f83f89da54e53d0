#!/usr/bin/env bash
# Device call 2 (see README.md): rebuild the teacher GGUF from the parked part 1 and the carried
# part 2, then start train.py --mode full DETACHED (setsid), so that training runs on across the
# following calls instead of stopping and reloading at each call boundary. This call then waits
# for the first snapshot (a packed model written a little before the call ends) and returns it.
#   $1 = seconds this command may run; $2 = seconds from now to the run's own deadline (training,
#   export and evaluation); $3 = extra snapshot times, in seconds from now, comma-separated
#   (one for each later call but the last, each a little before that call will end).
W=/tmp/distill
NOW=$(date +%s)
LIMIT=${1:-590}
SNAPS=$(( NOW + LIMIT - 25 ))
for s in ${3//,/ }; do SNAPS="$SNAPS,$(( NOW + s ))"; done
cat "$W/teacher.part1" .dev/teacher.part2 > "$W/teacher.gguf" || exit 3
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $W/teacher.gguf" \
  | sha256sum -c - || { echo "teacher reassembly failed"; exit 3; }
rm -rf "$W/final" "$W"/snap* "$W/train.pid"
export PYTHONUNBUFFERED=1
setsid nohup python3 tools/distill/train.py --mode full --work "$W" --data "$W/data" \
  --out "$W/final" --deadline-epoch $(( NOW + ${2:-1150} )) --snapshot-epochs "$SNAPS" \
  --reserve 25 --no-ckpt --sample-seconds 40 --sample-batch 8192 --mb 64 --accum 1 \
  --lr 1e-3 --warmup 40 --mix 0.35,0.10 --monitor-seconds 60 ${TRAIN_EXTRA:-} \
  > "$W/log.txt" 2>&1 < /dev/null &
echo "launched: snapshots at $SNAPS, deadline $(( NOW + ${2:-1150} )) (now $NOW)"
# train.py writes its pid once torch is imported; device_wait.sh needs it to tell alive from dead.
for _ in $(seq 120); do [ -f "$W/train.pid" ] && break; sleep 0.5; done
exec bash tools/distill/device_wait.sh "$(( LIMIT - 2 - $(date +%s) + NOW ))" snap0
