#!/usr/bin/env bash
# A device call that waits for the detached training run (device_call2.sh) and returns what it has
# made: $1 = seconds this command may run, $2 = the folder under /tmp/distill to wait for
# (snap<i> or final). If the run has died before writing the final model, this call trains in its
# place until shortly before it ends, so it still returns a model: --mode resume from the last
# snapshot's checkpoint, or, with none yet, --mode full the way the previous run did it (eager,
# the smaller sampling batch). Copies the packed files, the metrics and the log into $OUT.
W=/tmp/distill
NOW=$(date +%s)
END=$(( NOW + ${1:-590} - 5 ))
WHAT=${2:-final}
alive() { [ -f "$W/train.pid" ] && kill -0 "$(cat "$W/train.pid")" 2>/dev/null; }
while [ ! -f "$W/$WHAT/DONE" ] && [ ! -f "$W/final/DONE" ] && alive \
      && [ "$(date +%s)" -lt "$END" ]; do
  sleep 1
done
if ! alive && [ ! -f "$W/$WHAT/DONE" ] && [ ! -f "$W/final/DONE" ] \
   && [ $(( END - $(date +%s) )) -gt 90 ]; then
  export PYTHONUNBUFFERED=1
  common=(--work "$W" --data "$W/data" --out "$W/final" --deadline-epoch $(( END - 3 ))
          --reserve 25 --no-ckpt --mix 0.35,0.10 --monitor-seconds 60)
  if [ -f "$W/ckpt.pt" ]; then
    echo "the training run is gone; resuming from $W/ckpt.pt within this call"
    python3 tools/distill/train.py --mode resume "${common[@]}" --lr 3e-4 --warmup 10 \
      ${TRAIN_EXTRA:-} >> "$W/log.txt" 2>&1
  else
    echo "the training run is gone with no checkpoint; a short eager run within this call"
    python3 tools/distill/train.py --mode full "${common[@]}" --no-compile --sample-seconds 20 \
      --sample-batch 4096 --lr 1e-3 --warmup 15 ${TRAIN_EXTRA:-} >> "$W/log.txt" 2>&1
  fi
fi
# A run that has ended writes the final model: prefer it to a snapshot.
[ -f "$W/final/EXPORTED" ] && WHAT=final
cp "$W/$WHAT"/packed-*.safetensors "$W/$WHAT"/metrics-*.json "$OUT"/ 2>/dev/null
cp "$W/log.txt" "$OUT/log.txt"
echo "returned $WHAT after $(( $(date +%s) - NOW )) s:"; ls -la "$OUT"
tail -n 45 "$W/log.txt"
