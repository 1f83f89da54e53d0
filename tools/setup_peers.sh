#!/usr/bin/env bash
# Install the reference peers used to generate test fixtures (never run by CI):
#   - a Python venv with mlx[cpu] + mlx-lm (the MLX reference), gguf-py, numpy, tokenizers, …
#   - llama-cpp-python 0.3.36 built from its sdist (it vendors llama.cpp commit 0c1e570)
#   - llama.cpp command-line tools from the same build tree: llama-perplexity, llama-bench,
#     llama-simple, llama-completion, llama-tokenize, llama-quantize → $CACHE/llcpp-bin/
# Everything lives under $CACHE (default: the main checkout's .cache, git-ignored). Safe to re-run: finished
# steps are skipped. The native build takes ~15 min on 2 cores; progress goes to stdout.
#
# CPU flags: we do NOT use GGML_NATIVE. Some of our VMs advertise AMX (and the kernel grants tile
# state) but tile instructions raise SIGILL, and a native build routes Q4_0/Q4_1/Q8_0/K-quants to
# the AMX buffer type. Instead every x86 extension the CPU reports is enabled explicitly, except
# AMX, so repacking stays on and nothing needs `--repack 0` / `use_extra_bufts=False`.
set -euo pipefail
# Default cache: the main checkout's .cache, shared by every git worktree of the repository.
COMMON_GIT="$(cd "$(dirname "$0")" && git rev-parse --path-format=absolute --git-common-dir 2>/dev/null || true)"
if [ -n "$COMMON_GIT" ]; then ROOT="$(dirname "$COMMON_GIT")"; else ROOT="$(cd "$(dirname "$0")/.." && pwd)"; fi
CACHE="${TRIT_CACHE:-$ROOT/.cache}"
VENV="$CACHE/venv"
LLCPP_VERSION=0.3.36
LLCPP_SDIST_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
SRC="$CACHE/src/llama_cpp_python-$LLCPP_VERSION"
BUILD="$CACHE/build/llcpp"
BIN="$CACHE/llcpp-bin"
JOBS="${JOBS:-$(nproc)}"
TOOLS=(llama-perplexity llama-bench llama-simple llama-completion llama-tokenize llama-quantize)
mkdir -p "$CACHE"

step() { echo "== $* ($(date +%T))"; }

# 1. Python packages (pinned where fixtures depend on them).
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import mlx_lm, gguf" 2>/dev/null; then
  step "venv $VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q "mlx[cpu]==0.32.4" "mlx-lm==0.32.2" "gguf==0.19.0" \
    numpy safetensors tokenizers jinja2 cmake ninja
fi
export PATH="$VENV/bin:$PATH"

# 2. llama-cpp-python sdist (sdist-only on PyPI), pinned by sha256.
if [ ! -d "$SRC" ]; then
  step "sdist llama-cpp-python $LLCPP_VERSION"
  mkdir -p "$CACHE/sdist" "$CACHE/src"
  pip download -q --no-deps "llama-cpp-python==$LLCPP_VERSION" -d "$CACHE/sdist"
  echo "$LLCPP_SDIST_SHA256  $CACHE/sdist/llama_cpp_python-$LLCPP_VERSION.tar.gz" | sha256sum -c --quiet -
  tar xzf "$CACHE/sdist/llama_cpp_python-$LLCPP_VERSION.tar.gz" -C "$CACHE/src"
fi

# 3. x86 feature flags from /proc/cpuinfo (AMX deliberately left out, see header).
cpu_has() { grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -qx "$1"; }
FLAGS=(-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
for pair in sse4_2:SSE42 avx:AVX avx2:AVX2 fma:FMA f16c:F16C bmi2:BMI2 avx_vnni:AVX_VNNI \
            avx512f:AVX512 avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16; do
  if cpu_has "${pair%%:*}"; then FLAGS+=("-DGGML_${pair#*:}=ON"); else FLAGS+=("-DGGML_${pair#*:}=OFF"); fi
done
COMMON=(-DCMAKE_BUILD_TYPE=Release -DLLAVA_BUILD=OFF "${FLAGS[@]}")

# 4. The Python binding; scikit-build-core keeps its CMake tree in $BUILD so step 5 reuses it.
if ! python -c "import llama_cpp" 2>/dev/null; then
  step "llama-cpp-python build (flags: ${FLAGS[*]})"
  CMAKE_ARGS="${COMMON[*]}" CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" \
    pip install -v "$SRC" --config-settings=build-dir="$BUILD"
fi

# 5. Command-line tools from the same tree and flags (objects are shared, so only the tools
#    compile). $ORIGIN rpaths let the binaries and their shared libraries move together.
missing=0
for t in "${TOOLS[@]}"; do [ -x "$BIN/$t" ] || missing=1; done
if [ "$missing" = 1 ]; then
  step "llama.cpp tools: ${TOOLS[*]}"
  cmake -S "$SRC" -B "$BUILD" "${COMMON[@]}" -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=ON \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON >/dev/null
  cmake --build "$BUILD" -j "$JOBS" --target "${TOOLS[@]}"
  mkdir -p "$BIN"
  for t in "${TOOLS[@]}"; do cp "$BUILD/bin/$t" "$BIN/"; done
  cp -P "$BUILD"/bin/lib*.so* "$BIN/"
fi

# 6. Smoke test on the SmolLM2 Q4_1 GGUF (a quantized type that would hit the AMX trap).
GGUF="$CACHE/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ -f "$GGUF" ]; then
  step "smoke test"
  "$BIN/llama-simple" -m "$GGUF" -n 8 "The capital of France is" 2>/dev/null | tail -n 2
  python - "$GGUF" <<'EOF'
import sys, llama_cpp
llm = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=64, verbose=False)
ids = llm.tokenize(b"The capital of France is", add_bos=False)
print("llama-cpp-python", llama_cpp.__version__, "ids", ids)
EOF
fi
step "peers ready: $VENV, $BIN"
