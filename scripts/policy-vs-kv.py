#!/usr/bin/env python3
"""Per N x C, a policy against kv from one kvbench --json file: cached-token ratio,
TTFT p99 and throughput, flagging every loss. usage: policy-vs-kv.py records.json [policy]"""
import json, sys

recs = json.load(open(sys.argv[1]))
pol = sys.argv[2] if len(sys.argv) > 2 else "placement"
by = {(r["policy"], r["prefixes"], r["concurrency"]): r for r in recs}
print(f"| N | C | ratio {pol} / kv | p99 ms {pol} / kv | req/s {pol} / kv | losses |")
print("|---|---|---|---|---|---|")
losses = 0
for (p, n, c), r in sorted(by.items(), key=lambda x: (x[0][1], x[0][2])):
    kv = by.get(("kv", n, c))
    if p != pol or kv is None:
        continue
    lost = []
    if r["cached_ratio"] < kv["cached_ratio"] - 0.005:
        lost.append("ratio")
    if r["ttft_p99_ms"] > kv["ttft_p99_ms"] + 0.5:
        lost.append("p99")
    if r["requests_per_s"] < kv["requests_per_s"] * 0.995:
        lost.append("req/s")
    losses += len(lost)
    print(f"| {n} | {c} | {r['cached_ratio']:.3f} / {kv['cached_ratio']:.3f} | "
          f"{r['ttft_p99_ms']:.0f} / {kv['ttft_p99_ms']:.0f} | "
          f"{r['requests_per_s']:.2f} / {kv['requests_per_s']:.2f} | {', '.join(lost) or '-'} |")
print(f"\nlosses: {losses}")
