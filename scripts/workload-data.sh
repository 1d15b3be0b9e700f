#!/bin/sh
# Rebuilds the JSON records docs/results-workloads.md renders (make workloads-data): every
# workload table, the traces at 2x (3 and 9 repetitions) and faster, and the held-out
# seeds and sizes. The commands are the ones the page gives beside each table. kvbench's
# sim mode runs on a virtual clock: the records do not depend on the machine's load.
# Writes to $1 (default docs/data/workloads); `python3 scripts/docs.py` renders the tables.
# Files named *-before.json, heldout/before/, probe/before/ and probe/traces/before/ record
# builds before a change and are not rebuilt here.
set -e
out=${1:-docs/data/workloads}
kvb=${KVBENCH:-go run ./testbench/cmd/kvbench}
mkdir -p "$out/heldout"
all="--sim --policy kv,round-robin,least-load,placement --reps 3"
run() { # file [kvbench flags]
	file=$1
	shift
	$kvb "$@" --progress never --json "$out/$file" > /dev/null
}
long="--kv-bytes 16GiB --max-model-len 131072"
trace="--trace testbench/kvbench/testdata/trace-small.jsonl --kv-bytes 8GiB"
run chat.json $all --workload chat
run chat-no-system.json $all --workload chat --system-prompts 0
run agent.json $all --workload agent $long
run mixed.json $all --workload mixed $long
run trace.json $all $trace --speedup 2
run trace-reps9.json --sim --policy kv,placement --reps 9 $trace --speedup 2
for s in 3 4 8; do
	run trace-speedup$s.json --sim --policy kv,placement --reps 3 $trace --speedup $s
done
for s in 1 2; do
	run trace-600-seed$s.json $all --trace docs/data/workloads/trace-600-seed$s.jsonl --speedup 2 --kv-bytes 8GiB
done
# Overload: trace-600 faster than 2x and the reference at 32 and 64 clients.
o="--sim --policy kv,placement --reps 3"
for s in 3 4; do
	run overload-trace-600-seed1-speedup$s.json $o --trace docs/data/workloads/trace-600-seed1.jsonl --speedup $s --kv-bytes 8GiB
done
run overload-trace-600-seed2-speedup3.json $o --trace docs/data/workloads/trace-600-seed2.jsonl --speedup 3 --kv-bytes 8GiB
run overload-concurrency.json $o --prefixes 2,7,12,24 --concurrency 32,64
run tight-memory.json $all --prefixes 24 --concurrency 8,16 --kv-bytes 512MiB
run long-tails.json $all --prefixes 2,7,12,24 --concurrency 8 --prefix-tokens 1024 --tail-tokens 1000
run servers-12.json $all --workers 12 --prefixes 2,7,12,24 --concurrency 8,16

# Held-out seeds and sizes: placement against kv only.
h="--sim --policy kv,placement --reps 3"
for s in 2 3; do
	run heldout/chat-seed$s.json $h --workload chat --seed $s
	run heldout/chat-no-system-seed$s.json $h --workload chat --system-prompts 0 --seed $s
	run heldout/agent-seed$s.json $h --workload agent $long --seed $s
	run heldout/mixed-seed$s.json $h --workload mixed $long --seed $s
	run heldout/tight-memory-seed$s.json $h --prefixes 24 --concurrency 8,16 --kv-bytes 512MiB --seed $s
	run heldout/servers-12-seed$s.json $h --workers 12 --prefixes 2,7,12,24 --concurrency 8,16 --seed $s
done
for w in 4 8; do
	run heldout/chat-workers$w.json $h --workload chat --workers $w
	run heldout/agent-workers$w.json $h --workload agent $long --workers $w
	run heldout/reference-workers$w.json $h --workers $w --prefixes 2,7,12,24 --concurrency 8,16
done
run heldout/mixed-workers8.json $h --workload mixed $long --workers 8
run heldout/chat-kv2GiB.json $h --workload chat --kv-bytes 2GiB
run heldout/chat-kv80GiB.json $h --workload chat --kv-bytes 80GiB
run heldout/reference-kv2GiB.json $h --prefixes 7,12,24 --concurrency 8,16 --kv-bytes 2GiB
run heldout/reference-kv80GiB.json $h --prefixes 7,24 --concurrency 8,16 --kv-bytes 80GiB
run heldout/mixed-kv80GiB.json $h --workload mixed --kv-bytes 80GiB --max-model-len 131072
run heldout/reference-c32.json $h --prefixes 2,7,12,24 --concurrency 32
run heldout/tight-memory-c32.json $h --prefixes 24 --concurrency 32 --kv-bytes 512MiB
run heldout/servers-12-c32.json $h --workers 12 --prefixes 7,24 --concurrency 32
run heldout/chat-conversations96.json $h --workload chat --conversations 96
run heldout/chat-conversations144.json $h --workload chat --conversations 144
run heldout/chat-no-system-conversations96.json $h --workload chat --system-prompts 0 --conversations 96

# Probed axes (docs/results-workloads.md "Probed axes"): placement against kv on axes the
# tables above and the held-out set leave fixed. reference.json is the control: the same
# cells at the calibrated defaults. --zipf, --output-tokens and --prefix-tokens/--tail-tokens
# shape the reference workload only (the chat, agent and mixed scripts fix their own).
p="$out/probe"
mkdir -p "$p"
ref="--prefixes 7,24 --concurrency 8,16"
grid="--prefixes 2,7,12,24 --concurrency 8,16"
mm="kv=4GiB,speed=1;kv=4GiB,speed=1;kv=1GiB,speed=0.7;kv=1GiB,speed=0.7;kv=1GiB,speed=0.7;kv=1GiB,speed=0.7"
run probe/reference.json $h $grid
run probe/output-tokens20.json $h $ref --output-tokens 20
run probe/output-tokens500.json $h $ref --output-tokens 500
run probe/prefix512-tail64.json $h $ref --prefix-tokens 512 --tail-tokens 64
run probe/prefix8192-tail256.json $h $ref --prefix-tokens 8192 --tail-tokens 256
run probe/zipf1.json $h $grid --zipf 1.0
run probe/uniform-fleet.json $h $grid --speed-factors 1,1,1,1,1,1
run probe/uniform-fleet-chat.json $h --workload chat --speed-factors 1,1,1,1,1,1
run probe/mixed-memory.json $h $grid --servers "$mm"
run probe/mixed-memory-chat.json $h --workload chat --servers "$mm"
run probe/event-lag100ms.json $h $grid --event-lag 100ms
run probe/event-lag100ms-chat.json $h --workload chat --event-lag 100ms
run probe/scrape500ms.json $h $grid --scrape-interval 500ms
run probe/scrape500ms-chat.json $h --workload chat --scrape-interval 500ms
run probe/replicas2-chat.json $h --workload chat --replicas 2
run probe/replicas2-mixed.json $h --workload mixed $long --replicas 2
run probe/replicas2-agent.json $h --workload agent $long --replicas 2
run probe/replicas2-chat-no-system.json $h --workload chat --system-prompts 0 --replicas 2
run probe/replicas2-trace-600-seed1.json $h --trace docs/data/workloads/trace-600-seed1.jsonl --speedup 2 --kv-bytes 8GiB --replicas 2
# Traces of the generator's other shapes (kvbench --gen-trace F --gen-trace-shape SHAPE
# --trace-requests 300 --seed S): Mooncake-like conversations (seeds 1, 2) at 2x, where
# the fleet keeps up, and 6x, where it falls behind; agents on shared tool prefixes
# (seed 1) at 4x and 16x. Their own table in "Probed axes" renders probe/traces.
mkdir -p "$p/traces"
for t in conversation-seed1:2 conversation-seed1:6 conversation-seed2:2 conversation-seed2:6 toolagent-seed1:4 toolagent-seed1:16; do
	f=${t%%:*}
	s=${t#*:}
	run probe/traces/$f-speedup$s.json $h --trace docs/data/workloads/trace-$f.jsonl --speedup $s --kv-bytes 8GiB
done
