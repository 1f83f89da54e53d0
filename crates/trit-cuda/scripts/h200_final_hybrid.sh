#!/bin/bash
# Hybrid decode bench on the full 27B shape (model generated in the background by final.sh).
while [ ! -f /tmp/models/27b.done ]; do sleep 2; done
tail -2 $OUT/gen27.log
timeout 75 /tmp/bin/trit bench --device cuda -m /tmp/models/27b/model-q2_0.gguf -p 0 -n 128 -r 3 2>&1 | grep -E "\|.*tg|rror|weights read"
