#!/usr/bin/env python3
"""Compare one policy across two kvbench --json runs of the same grid (before / after).

usage: runs-table.py before.json after.json [policy]
Prints, per N x C: cached-token ratio and TTFT p99 before and after, and their changes.
"""
import json, sys

pol = sys.argv[3] if len(sys.argv) > 3 else "placement"
runs = []
for path in sys.argv[1:3]:
    runs.append({(r["prefixes"], r["concurrency"]): r for r in json.load(open(path)) if r["policy"] == pol})
a, b = runs
print(f"| N | C | ratio before | ratio after | change | TTFT p99 ms before | after | change |")
print("|---|---|---|---|---|---|---|---|")
for key in sorted(a):
    if key not in b:
        continue
    ra, rb = a[key], b[key]
    print(f"| {key[0]} | {key[1]} | {ra['cached_ratio']:.3f} | {rb['cached_ratio']:.3f} | "
          f"{rb['cached_ratio'] - ra['cached_ratio']:+.3f} | {ra['ttft_p99_ms']:.0f} | {rb['ttft_p99_ms']:.0f} | "
          f"{rb['ttft_p99_ms'] - ra['ttft_p99_ms']:+.0f} |")
