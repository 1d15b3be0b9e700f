#!/bin/sh
# Rebuilds the JSON records docs/results-policy.md renders (make docs-data): every
# registered policy over the reference grid, then kv, partition and placement under each
# variant. kvbench's sim mode runs on a virtual clock: the records do not depend on the
# machine's load. Writes to $1 (default docs/policy); `make docs` renders the tables.
set -e
out=${1:-docs/policy}
kvb=${KVBENCH:-go run ./testbench/cmd/kvbench}
mkdir -p "$out"
common="--sim --sweep --warmup 100 --requests 600 --progress never"
$kvb $common --json "$out/sweep.json" --plot "$out/cached-ratio-c8.svg" > /dev/null
common="$common --policy kv,partition,placement"
$kvb $common --json "$out/base.json" > /dev/null
$kvb $common --zipf 0.8 --json "$out/zipf08.json" > /dev/null
$kvb $common --zipf 1.2 --json "$out/zipf12.json" > /dev/null
$kvb $common --servers "kv=1GiB,speed=1;kv=1GiB,speed=1;kv=1GiB,speed=1;kv=1GiB,speed=1;kv=512MiB,speed=0.5;kv=512MiB,speed=0.5" --json "$out/hetero.json" > /dev/null
$kvb $common --churn "10s:-1,25s:+1,30s:-4,45s:+4" --json "$out/churn.json" > /dev/null
$kvb $common --replicas 2 --sync-interval 0 --json "$out/replicas2.json" > /dev/null
$kvb $common --replicas 4 --sync-interval 0 --json "$out/replicas4.json" > /dev/null
$kvb $common --replicas 2 --json "$out/replicas2-sync.json" > /dev/null
$kvb $common --replicas 4 --json "$out/replicas4-sync.json" > /dev/null
# Issue 13's goal at 9 repetitions: one router, and 2 and 4 synced replicas.
$kvb $common --reps 9 --json "$out/base-reps9.json" > /dev/null
$kvb $common --replicas 2 --reps 9 --json "$out/replicas2-sync-reps9.json" > /dev/null
$kvb $common --replicas 4 --reps 9 --json "$out/replicas4-sync-reps9.json" > /dev/null
# The goal at held-out workload seeds (kvbench --seed S runs workload seeds S, S+1, S+2
# as its 3 repetitions): 3 repetitions at --seed 2 to 10, and one at each seed 1 to 12,
# each set concatenated into one file of records carrying their seed; and 2 router
# replicas at --seed 2 to 10.
seeds() { # reps first last file [kvbench flags]
	tmp=$(mktemp -d)
	reps=$1 first=$2 last=$3 file=$4
	shift 4
	for s in $(seq "$first" "$last"); do
		$kvb $common --reps "$reps" --seed "$s" "$@" --json "$tmp/$s.json" > /dev/null
	done
	python3 -c 'import json, sys; print(json.dumps([r for f in sys.argv[1:] for r in json.load(open(f))], indent=2))' \
		$(for s in $(seq "$first" "$last"); do echo "$tmp/$s.json"; done) > "$file"
	rm -r "$tmp"
}
seeds 3 2 10 "$out/seeds-reps3.json"
seeds 1 1 12 "$out/seeds-reps1.json"
seeds 3 2 10 "$out/seeds-replicas2-reps3.json" --replicas 2
