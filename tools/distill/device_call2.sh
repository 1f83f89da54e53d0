#!/usr/bin/env bash
# Device call 2 of 2: rebuild the teacher GGUF from the parked part 1 and the carried part 2, then
# train.py --mode full: check the teacher, sample chat/text from it, train (wall-clock boxed),
# export the packed ternary model to $OUT, evaluate. $1 = seconds this command may run.
W=/tmp/distill
END=$(( $(date +%s) + ${1:-150} - 4 ))
cat "$W/teacher.part1" .dev/teacher.part2 > "$W/teacher.gguf" || exit 3
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $W/teacher.gguf" \
  | sha256sum -c - || { echo "teacher reassembly failed"; exit 3; }
export PYTHONUNBUFFERED=1
python3 tools/distill/train.py --mode full --work "$W" --data "$W/data" --out "$OUT" \
  --deadline-epoch "$END" --reserve 20 --no-ckpt --no-compile \
  --sample-seconds 10 --sample-batch 4096 --mb 64 --accum 1 --lr 1e-3 --warmup 15 \
  --mix 0.35,0.15 --monitor-seconds 30 2>&1 | tee "$OUT/log-full.txt"
ls -la "$OUT"
