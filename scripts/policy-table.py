#!/usr/bin/env python3
"""Compare one policy against kv (and partition at N=24) from kvbench --json records.

usage: policy-table.py records.json [policy [more-records.json]]
Prints, per N x C: ratio, goal reference (bound, or partition's ratio at N=24),
ratio/reference, TTFT p99 vs kv, throughput vs kv, and whether the cell meets the goal.
"""
import json, sys

recs = json.load(open(sys.argv[1]))
if len(sys.argv) > 3:
    recs += json.load(open(sys.argv[3]))
pol = sys.argv[2] if len(sys.argv) > 2 else "placement"
by = {(r["policy"], r["prefixes"], r["concurrency"]): r for r in recs}
print(f"| N | C | {pol} ratio | bound | reference | ratio/ref | p99 ms ({pol} / kv) | req/s ({pol} / kv) | ok |")
print("|---|---|---|---|---|---|---|---|---|")
fails = 0
for (p, n, c), r in sorted(by.items(), key=lambda x: (x[0][1], x[0][2])):
    if p != pol:
        continue
    kv = by.get(("kv", n, c))
    part = by.get(("partition", n, c))
    bound = r["bound_cached_ratio"]
    ref = bound if n < 24 or part is None else part["cached_ratio"]
    ratio = r["cached_ratio"]
    ok = ratio >= 0.95 * ref
    s = ""
    if kv:
        ok = ok and r["ttft_p99_ms"] <= kv["ttft_p99_ms"] + 0.5 and r["requests_per_s"] >= kv["requests_per_s"] * 0.995
        s = f"{r['ttft_p99_ms']:.0f} / {kv['ttft_p99_ms']:.0f} | {r['requests_per_s']:.2f} / {kv['requests_per_s']:.2f}"
    else:
        s = f"{r['ttft_p99_ms']:.0f} / - | {r['requests_per_s']:.1f} / -"
    fails += not ok
    refname = "bound" if ref == bound else "partition"
    print(f"| {n} | {c} | {ratio:.3f} | {bound:.3f} | {ref:.3f} ({refname}) | {ratio/ref:.3f} | {s} | {'yes' if ok else 'NO'} |")
print(f"\ncells failing: {fails}")
