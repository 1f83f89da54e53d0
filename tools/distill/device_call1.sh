#!/usr/bin/env bash
# Device call 1 of 2 (see README.md): park teacher part 1 and the tokenized data outside the
# repository copy (in /tmp, which lives as long as the machine), and warm the page cache for torch
# in a detached process while call 2 uploads. Call 2 must follow at once (the machine is given
# back 30 s after a call ends).
W=/tmp/distill
mkdir -p "$W" && cp .dev/teacher.part1 "$W/teacher.part1" && cp -r .dev/data "$W/data" || exit 3
ls -la "$W" "$W/data"
setsid nohup python3 -c "import torch, numpy, safetensors, tokenizers; torch.zeros(1).cuda()" \
  >/dev/null 2>&1 < /dev/null &
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
