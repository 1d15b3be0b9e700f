#!/bin/sh
# Runs the reference grid for kv, partition and placement under each variant of issue 7
# and writes one JSON file per variant to $1 (default /tmp/variants).
set -e
out=${1:-/tmp/variants}
kvb=${KVBENCH:-go run ./cmd/kvbench}
mkdir -p "$out"
common="--sim --sweep --warmup 100 --requests 600 --progress never --policy kv,partition,placement"
$kvb $common --json "$out/base.json" > "$out/base.md"
$kvb $common --zipf 0.8 --json "$out/zipf08.json" > "$out/zipf08.md"
$kvb $common --zipf 1.2 --json "$out/zipf12.json" > "$out/zipf12.md"
$kvb $common --servers "kv=1GiB,speed=1;kv=1GiB,speed=1;kv=1GiB,speed=1;kv=1GiB,speed=1;kv=512MiB,speed=0.5;kv=512MiB,speed=0.5" --json "$out/hetero.json" > "$out/hetero.md"
$kvb $common --churn "10s:-1,25s:+1,30s:-4,45s:+4" --json "$out/churn.json" > "$out/churn.md"
$kvb $common --replicas 2 --json "$out/replicas2.json" > "$out/replicas2.md"
$kvb $common --replicas 4 --json "$out/replicas4.json" > "$out/replicas4.md"
