#!/usr/bin/env python3
"""Summarize a kvbench --route-log per run (stdlib only).

    python3 scripts/routelog.py F.jsonl
    python3 scripts/routelog.py F.jsonl --trace testbench/kvbench/testdata/trace-small.jsonl

Per run (policy, repetition, concurrency): the cached-token ratio from the log's finish
lines, the ratio without the requests of at least --long prompt tokens, those requests
(sequence:server:cached tokens) and when the last request finished. With --trace (the
Mooncake-format trace the run replayed, one record per sequence number), the turns that
continue a conversation: a turn's history is the earlier request sharing most of its
leading hash ids, when that is more than --shared-ids (a system prompt's); counted
outside the long requests: how many turns, how many went to another server than their
history's, and the history tokens (shared hash ids x 512, at most the prompt) against
the tokens cached.
"""
import argparse
import collections
import json

TRACE_BLOCK_TOKENS = 512  # kvbench's TraceBlockTokens


def common(a, b):
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


def histories(trace, shared_ids):
    """For each record, (its history's sequence, shared hash ids) or None."""
    out = []
    for j, rec in enumerate(trace):
        best, n = None, shared_ids
        for i in range(j):
            c = common(trace[i]["hash_ids"], rec["hash_ids"])
            if c > n or (c == n and best is not None):
                best, n = i, c
        out.append((best, n) if best is not None else None)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log")
    ap.add_argument("--trace")
    ap.add_argument("--long", type=int, default=20000)
    ap.add_argument("--shared-ids", type=int, default=2)
    args = ap.parse_args()
    runs = collections.defaultdict(dict)
    for line in open(args.log):
        ev = json.loads(line)
        if ev["event"] == "finish":
            run = (ev["policy"], ev["rep"], ev.get("concurrency", 0))
            runs[run][ev["seq"]] = (ev["server"], ev.get("prompt_tokens", 0), ev.get("cached_tokens", 0), ev["t"])
    hist = None
    if args.trace:
        hist = histories([json.loads(l) for l in open(args.trace) if l.strip()], args.shared_ids)
    for run, reqs in sorted(runs.items()):
        prompt = sum(r[1] for r in reqs.values())
        cached = sum(r[2] for r in reqs.values())
        long_ = sorted(s for s, r in reqs.items() if r[1] >= args.long)
        rest_p = sum(r[1] for s, r in reqs.items() if s not in long_)
        rest_c = sum(r[2] for s, r in reqs.items() if s not in long_)
        line = "%s rep %d C %d: %d requests, ratio %.3f, without the %d of >= %d tokens %.3f; those %s; last done %.2f s" % (
            run[0], run[1], run[2], len(reqs), cached / max(prompt, 1), len(long_), args.long,
            rest_c / max(rest_p, 1), " ".join("%d:%d:%d" % (s, reqs[s][0], reqs[s][2]) for s in long_),
            max(r[3] for r in reqs.values()))
        if hist is not None:
            turns = moved = hist_tokens = got = 0
            for s, r in reqs.items():
                h = hist[s] if s < len(hist) else None
                if h is None or s in long_ or h[0] not in reqs:
                    continue
                turns += 1
                moved += reqs[h[0]][0] != r[0]
                hist_tokens += min(h[1] * TRACE_BLOCK_TOKENS, r[1])
                got += r[2]
            line += "; %d turns continue a conversation, %d on another server than their history, %d of %d history tokens cached" % (
                turns, moved, got, hist_tokens)
        print(line)


if __name__ == "__main__":
    main()
