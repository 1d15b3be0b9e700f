#!/usr/bin/env python3
"""Classify the measured misses of kvbench --route-log files (stdlib only).

    go run ./testbench/cmd/kvbench --sim --sweep --warmup 100 --requests 600 \\
        --progress never --policy placement --prefixes 24 --concurrency 4 --reps 9 \\
        --replicas 2 --route-log F.jsonl > /dev/null
    python3 scripts/routelog.py misses F.jsonl [G.jsonl ...]

Per file, per policy and concurrency, summed over repetitions. A request's prefix is
as many blocks as any request of that prefix found cached on any server at its route
(the workload's tails are unique); a request misses when it was admitted with fewer
of them cached. Where the prefix was cached when the request was routed is the
simulated engines' own prefix caches (`cached_blocks`), not any router's view:

- misses, by where the prefix was at the route: cached on the chosen server (evicted
  before admission), cached elsewhere only, or nowhere; of those held nowhere, how many
  went to the server the prefix's previous request went to ("its last server"), and of
  those how many right after a miss of it there (that previous request missed too).
- lost-prefix routes (every measured route of a prefix cached nowhere, with no earlier
  request of it still before its first token anywhere): kept on the last server or
  moved, and, with replicas, whether the previous request was the same replica's; and
  kept or moved by the requests the last server's engine had running or waiting then.
- misses and full hits per server, the spread of misses over repetitions, and per
  server the prefixes whose latest request went there (its share of the partition),
  averaged over the measured routes.
- survival: for each measured request sent to the server its prefix's previous request
  went to, whether it found the whole prefix there, by how many other distinct prefixes
  that server served in between (at most 4 shown; "4" is 4 or more).
"""
import collections
import json
import statistics
import sys


def runs(path):
    """Yields (run key, events in file order) per run of one route log."""
    by = collections.OrderedDict()
    with open(path) as f:
        for line in f:
            ev = json.loads(line)
            by.setdefault((ev["policy"], ev.get("concurrency", 0), ev["rep"]), []).append(ev)
    return by.items()


def classify(events):
    c = collections.Counter()
    blocks = collections.Counter()
    for ev in events:
        if ev["event"] == "route":
            p = ev["prefix"]
            blocks[p] = max(blocks[p], max(s["cached_blocks"] for s in ev["servers"]))
    bs = None
    route, first = {}, {}
    for ev in events:
        (route if ev["event"] == "route" else first)[ev["seq"]] = ev
    # Infer the block size from a full hit: cached tokens over cached blocks.
    for seq, ev in first.items():
        b = route[seq]["servers"][ev["server"]]["cached_blocks"]
        if b and ev.get("cached_tokens", 0) and ev["cached_tokens"] % b == 0:
            bs = ev["cached_tokens"] // b
            break
    bs = bs or 16
    last = {}        # prefix -> (server, replica, missed) of its previous request
    inprefill = collections.defaultdict(set)  # prefix -> seqs routed, no first token yet
    since = {}       # prefix -> other prefixes its last server served since
    for ev in events:
        seq, p = ev["seq"], ev["prefix"]
        if ev["event"] == "first_token":
            inprefill[p].discard(seq)
            continue
        full = blocks[p]
        missed = first.get(seq, {}).get("cached_tokens", 0) // bs < full
        held = [i for i, s in enumerate(ev["servers"]) if full and s["cached_blocks"] >= full]
        prev = last.get(p)
        if not ev.get("warmup"):
            if not held and not inprefill[p] and prev:
                kept = ev["server"] == prev[0]
                c["lost-prefix routes"] += 1
                c["  kept on its last server" if kept else "  moved"] += 1
                busy = ev["servers"][prev[0]]["running"] + ev["servers"][prev[0]]["waiting"]
                c[f"lost-prefix routes, last server running {min(busy, 2)}{'+' if busy >= 2 else ''}: "
                  f"{'kept' if kept else 'moved'}"] += 1
                c["    previous request by the same replica" if prev[1] == ev["replica"]
                  else "    previous request by another replica"] += kept
            if missed:
                c["misses"] += 1
                if ev["server"] in held:
                    c["  prefix on the chosen server, evicted before admission"] += 1
                elif held:
                    c["  prefix elsewhere only"] += 1
                else:
                    c["  prefix nowhere"] += 1
                    if prev and ev["server"] == prev[0]:
                        c["    on its last server"] += 1
                        c["      right after a miss of it there"] += prev[2]
            c[f"server {ev['server']}: {'misses' if missed else 'full hits'}"] += 1
            if p in since and prev and prev[0] == ev["server"]:
                k = min(len(since[p]), 4)
                c[f"survival: {k} other prefixes between: requests"] += 1
                c[f"survival: {k} other prefixes between: found the prefix"] += not missed
        last[p] = (ev["server"], ev["replica"], missed)
        inprefill[p].add(seq)
        if not ev.get("warmup"):
            c["routes"] += 1
            for q in last.values():
                c[f"server {q[0]}: prefixes x routes"] += 1
        # Other prefixes the server served since each prefix's last request there.
        for q, seen in since.items():
            if last[q][0] == ev["server"] and q != p:
                seen.add(p)
        since[p] = set()
    return c


ORDER = ["misses", "  prefix on the chosen server, evicted before admission",
         "  prefix elsewhere only", "  prefix nowhere", "    on its last server",
         "      right after a miss of it there", "lost-prefix routes",
         "  kept on its last server", "    previous request by the same replica",
         "    previous request by another replica", "  moved"]


def misses(paths):
    for path in paths:
        tot, per = collections.OrderedDict(), collections.defaultdict(list)
        for (pol, conc, _rep), events in runs(path):
            c = classify(events)
            tot.setdefault((pol, conc), collections.Counter()).update(c)
            per[(pol, conc)].append(c["misses"])
        for (pol, conc), c in tot.items():
            m = sorted(per[(pol, conc)])
            print(f"{path}: {pol}, C = {conc}; misses per repetition: min {m[0]}, "
                  f"median {statistics.median(m)}, max {m[-1]}")
            for k in ORDER + sorted(k for k in c if k.startswith("lost-prefix routes, ")) + \
                    sorted(k for k in c if k.startswith("server ") and "x routes" not in k) + \
                    sorted(k for k in c if k.startswith("survival")):
                print(f"  {k:<60} {c[k]:>6}")
            for k in sorted(k for k in c if "x routes" in k):
                name = k.replace("prefixes x routes", "prefixes served there last (mean)")
                print(f"  {name:<60} {c[k] / c['routes']:>6.2f}")


def main(argv):
    if len(argv) < 3 or argv[1] != "misses":
        sys.exit(__doc__)
    misses(argv[2:])


if __name__ == "__main__":
    main(sys.argv)
