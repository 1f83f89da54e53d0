#!/bin/bash
# Packs what a device run needs into .dev/gpu/NAME/bins.tar.xz (stripped; ~8 MB): `trit`, the
# GPU test binaries, kernels_compile, and the batch_decode / gen_model examples, built first:
#   cargo test --release -p trit-cuda --no-run && cargo build --release -p trit-cli --features cuda
#   cargo build --release -p trit-cuda --examples && cargo build --release -p trit --example gen_model
# Usage: bash crates/trit-cuda/scripts/pack_bins.sh NAME; then carry .dev/gpu/NAME (h200_ab.sh's
# OLD/NEW). Test binaries are the newest of their name in target/release/deps.
set -e
cd "$(dirname "$0")/../../.."
[ -n "$1" ] || { echo "usage: $0 NAME" >&2; exit 2; }
D=.dev/gpu/$1
T=$(mktemp -d)
mkdir -p "$D"
for t in gpu_vs_cpu gpu_kernels gpu_batch gpu_hybrid gpu_sample gpu_greedy gpu_serve_loop kernels_compile; do
  f=$(ls -t target/release/deps/$t-* | grep -v "\.d$" | head -1)
  cp "$f" "$T/$t"
done
cp target/release/trit target/release/examples/batch_decode target/release/examples/trace_step target/release/examples/gen_model "$T/"
strip "$T"/*
tar -cJf "$D/bins.tar.xz" -C "$T" .
rm -rf "$T"
ls -la "$D/bins.tar.xz"
