#!/usr/bin/env python3
"""Summarize a kvbench --route-log per run (stdlib only).

    python3 scripts/routelog.py F.jsonl
    python3 scripts/routelog.py F.jsonl --trace testbench/kvbench/testdata/trace-small.jsonl
    python3 scripts/routelog.py F.jsonl --misses
    python3 scripts/routelog.py F.jsonl --copies
    python3 scripts/routelog.py F.jsonl --drain
    python3 scripts/routelog.py F.jsonl --chain

Per run (policy, repetition, concurrency): the cached-token ratio from the log's finish
lines, the ratio without the requests of at least --long prompt tokens, those requests
(sequence:server:cached tokens:decision kind) and when the last request finished; then
per policy its measured routes by decision kind (the route lines' `kind`, the rule that
chose the server: kv's hit/load, placement's holder/home/replica/...; "-" where the
policy names none). With --trace (the
Mooncake-format trace the run replayed, one record per sequence number), the turns that
continue a conversation: a turn's history is the earlier request sharing most of its
leading hash ids, when that is more than --shared-ids (a system prompt's); counted
outside the long requests: how many turns, how many went to another server than their
history's, and the history tokens (shared hash ids x 512, at most the prompt) against
the tokens cached.

With --servers instead, per policy and concurrency, summed over repetitions: per server
the measured requests and their share, mean decode time (first token to finish) and
time to first token, the share of the measured time with a request running there, and
the prefixes it served; the servers per prefix; and, from a sim run's route lines, how
many requests went to a server already running one while another server idled, with
their mean decode time against that of requests sent to an idle server (a request
sharing a server's steps decodes slower). In a fleet of unequal speeds a
closed loop's throughput is the clients over the mean request time, so it follows the
share of requests on the fast servers.

With --copies instead, per policy and concurrency, summed over repetitions (a sim run of
the reference workload, as --misses): each measured miss as a cold start (its prefix
cached nowhere, the server never sent it before), a copy (the prefix cached on another
server only), a remake (the server had computed it before: evicted and remade) or a
second miss within one prefill (the server's earlier request of it had no first token
yet); per copy, the full hits it served before the next miss of its prefix there, the
copies that served none, and the copies made while a holder finished a request within
the copy's own time to first token (a holder's slot came free while the copy prefilled).

With --drain instead, per run: how an open-loop replay's throughput (kvbench's served
requests over the first send to the last finish) splits into the arrivals' span (first to
last route) and the drain after the last arrival, and which request finished last, with
its latency; then the median run per policy. A trace fixes the arrivals' span; a chat or
agent workload does not (a turn is sent a think time after the last one's answer, so the
span ends with the conversation that finishes last). When the fleet keeps up with a trace,
the drain is the last requests' latency, and it alone tells policies apart. The last
request is named with the kind of the decision that routed it.

With --chain instead, per run of a chat, agent or mixed workload (a route line's `prefix`
is the script's session): the session whose last turn finished last. Its turns are sent a
think time after each answer, so the span (first send to last finish) is its start, think
times and round trips, fixed by the script, plus its turns' latencies (route to finish),
which the policy moves: the span splits into those two. Then its turns
(sequence:server:latency), how long before it the next-to-last session ended, the
throughput without the last session's requests (over the first send to the last finish of
the others), the mean latency of all requests, and the median run per policy. When the
fixed part is the same in every run, the throughput is that one session's latencies: a
makespan, not the fleet's capacity.

With --misses instead, per policy and concurrency, summed over repetitions (a sim run of
the reference workload: each route line carries the servers' cached blocks). A
request's prefix is as many blocks as any request of that prefix found cached on any
server at its route (the workload's tails are unique); a request misses when it was
admitted with fewer of them cached. Where the prefix was cached when the request was routed is the
simulated engines' own prefix caches (`cached_blocks`), not any router's view:

- misses, by what they found of the prefix at admission (none of it, or part of it:
  the blocks of its head that LRU eviction, tail first, left) and by where the prefix
  was at the route: cached on the chosen server (evicted
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
import argparse
import collections
import json
import statistics

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
    route, done = {}, {}
    for ev in events:
        if ev["event"] in ("route", "finish"):
            (route if ev["event"] == "route" else done)[ev["seq"]] = ev
    # Infer the block size from a full hit: cached tokens over cached blocks.
    for seq, ev in done.items():
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
        if ev["event"] != "route":
            continue
        full = blocks[p]
        missed = done.get(seq, {}).get("cached_tokens", 0) // bs < full
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
                got = done.get(seq, {}).get("cached_tokens", 0) // bs
                c["  finding part of it" if got else "  finding none of it"] += 1
                c["partial blocks"] += got
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


ORDER = ["misses", "  finding none of it", "  finding part of it",
         "  prefix on the chosen server, evicted before admission",
         "  prefix elsewhere only", "  prefix nowhere", "    on its last server",
         "      right after a miss of it there", "lost-prefix routes",
         "  kept on its last server", "    previous request by the same replica",
         "    previous request by another replica", "  moved"]


def misses(path):
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
        if c["  finding part of it"]:
            print(f"  {'blocks a miss finding part of it found (mean)':<60} "
                  f"{c['partial blocks'] / c['  finding part of it']:>6.1f}")
        for k in sorted(k for k in c if "x routes" in k):
            name = k.replace("prefixes x routes", "prefixes served there last (mean)")
            print(f"  {name:<60} {c[k] / c['routes']:>6.2f}")


def copies(path):
    """Per policy and concurrency, summed over repetitions: the measured misses split
    into cold starts, copies, remakes and second misses within one prefill, and what
    each copy bought (--copies in the module doc)."""
    tot, per = collections.OrderedDict(), collections.defaultdict(list)
    for (pol, conc, _rep), events in runs(path):
        route, done, first = {}, {}, {}
        for ev in events:
            {"route": route, "finish": done, "first_token": first}.get(ev["event"], {})[ev["seq"]] = ev
        full = collections.Counter()
        for ev in route.values():
            full[ev["prefix"]] = max(full[ev["prefix"]], max(x["cached_blocks"] for x in ev["servers"]))
        bs = 16
        for seq, ev in done.items():
            b = route[seq]["servers"][ev["server"]]["cached_blocks"] if seq in route else 0
            if b and ev.get("cached_tokens", 0) and ev["cached_tokens"] % b == 0:
                bs = ev["cached_tokens"] // b
                break
        c = collections.Counter()
        sent = collections.defaultdict(list)  # (server, prefix) -> seqs routed there
        open_ = {}                            # (server, prefix) -> the copy there, until its next miss
        for seq in sorted(route, key=lambda q: (route[q]["t"], q)):
            ev = route[seq]
            s, p, t = ev["server"], ev["prefix"], ev["t"]
            k = (s, p)
            missed = done.get(seq, {}).get("cached_tokens", 0) // bs < full[p]
            meas = not ev.get("warmup")
            if not missed:
                if k in open_ and meas:
                    open_[k]["hits"] += 1
                sent[k].append(seq)
                continue
            open_.pop(k, None)
            held = [i for i, x in enumerate(ev["servers"]) if i != s and full[p] and x["cached_blocks"] >= full[p]]
            if sent[k]:
                computed = any(q in first and first[q]["t"] <= t for q in sent[k])
                kind = "remakes (evicted and remade)" if computed else "second misses within one prefill"
            elif held:
                kind = "copies"
            else:
                kind = "cold starts"
            sent[k].append(seq)
            if not meas:
                continue
            c["misses"] += 1
            c[kind] += 1
            if kind == "copies":
                cp = open_[k] = {"hits": 0}
                end = t + first[seq]["ttft_ms"] / 1000 if seq in first else t
                c["  made while a holder finished a request within its time to first token"] += any(
                    d["server"] in held and t < d["t"] <= end for d in done.values())
                per[(pol, conc, "copies")].append(cp)
        tot.setdefault((pol, conc), collections.Counter()).update(c)
        per[(pol, conc)].append(c["misses"])
    for (pol, conc), c in tot.items():
        m = sorted(per[(pol, conc)])
        cps = per[(pol, conc, "copies")]
        print(f"{path}: {pol}, C = {conc}; misses per repetition: {' '.join(map(str, m))} (median {statistics.median(m)})")
        for k in ["misses", "cold starts", "second misses within one prefill", "remakes (evicted and remade)", "copies",
                  "  made while a holder finished a request within its time to first token"]:
            print(f"  {k:<72} {c[k]:>5}")
        if cps:
            print(f"  {'  full hits the copies served (mean per copy)':<72} {statistics.mean(x['hits'] for x in cps):>5.1f}")
            print(f"  {'  copies that served none':<72} {sum(x['hits'] == 0 for x in cps):>5}")


def servers(path):
    """Per policy and concurrency, summed over repetitions: per server the measured
    requests, their mean decode time (first token to finish) and time to first token, the
    share of the measured span with a request on it, and the prefixes it served; then
    the servers per prefix (per repetition, averaged)."""
    tot = collections.OrderedDict()
    for (pol, conc, _rep), events in runs(path):
        reqs = collections.defaultdict(dict)
        for ev in events:
            if ev["event"] in ("route", "first_token", "finish"):
                reqs[ev["seq"]][ev["event"]] = ev
        meas = [r for r in reqs.values() if len(r) == 3 and not r["route"].get("warmup")]
        if not meas:
            continue
        span = max(r["finish"]["t"] for r in meas) - min(r["route"]["t"] for r in meas)
        t = tot.setdefault((pol, conc), {"span": 0.0, "spp": [], "srv": collections.defaultdict(lambda: collections.defaultdict(float)),
                                         "shared": [], "alone": []})
        t["span"] += span
        sites = collections.defaultdict(set)
        spans = collections.defaultdict(list)
        for r in meas:
            s, rt = r["route"]["server"], r["route"]
            sites[rt["prefix"]].add(s)
            spans[s].append((rt["t"], r["finish"]["t"]))
            c = t["srv"][s]
            c["requests"] += 1
            c["decode"] += r["finish"]["t"] - r["first_token"]["t"]
            c["ttft"] += r["first_token"]["ttft_ms"] / 1000
            c["prefixes"] += 0
            if "servers" in rt:
                # Joined a busy endpoint while another idled, or went to an idle one.
                load = [x["in_flight"] for x in rt["servers"]]
                if load[s] == 0:
                    t["alone"].append(r["finish"]["t"] - r["first_token"]["t"])
                elif min(load) == 0:
                    t["shared"].append(r["finish"]["t"] - r["first_token"]["t"])
        for s, iv in spans.items():
            busy, end = 0.0, None
            for a, b in sorted(iv):
                if end is None or a > end:
                    busy += b - a
                    end = b
                elif b > end:
                    busy += b - end
                    end = b
            t["srv"][s]["busy"] += busy
        for s in {x for v in sites.values() for x in v}:
            t["srv"][s]["prefixes"] += sum(s in v for v in sites.values())
        t["spp"].append(statistics.mean(len(v) for v in sites.values()))
    for (pol, conc), t in tot.items():
        n = sum(c["requests"] for c in t["srv"].values())
        reps = len(t["spp"])
        print(f"{path}: {pol}, C = {conc}; {int(n)} measured requests in {reps} repetitions, "
              f"{statistics.mean(t['spp']):.2f} servers per prefix")
        if t["shared"] or t["alone"]:
            mean = lambda v: f"{1000 * statistics.mean(v):.0f}" if v else "-"
            print(f"  routed to a busy server while another idled: {len(t['shared'])} (mean decode {mean(t['shared'])} ms); "
                  f"to an idle server: {len(t['alone'])} (mean decode {mean(t['alone'])} ms)")
        print("  server  requests  share  decode ms  ttft ms  busy  prefixes served")
        for s in sorted(t["srv"]):
            c = t["srv"][s]
            k = c["requests"]
            print(f"  {s:>6}  {int(k):>8}  {k / n:>5.3f}  {1000 * c['decode'] / k:>9.0f}  "
                  f"{1000 * c['ttft'] / k:>7.0f}  {c['busy'] / t['span']:>4.2f}  {c['prefixes'] / reps:>15.2f}")


def drain(path):
    per = collections.defaultdict(list)
    for run, reqs in by_request(path, ("kind",)):
        routes = [r["route"] for r in reqs.values() if "route" in r]
        done = sorted((r["finish"], s) for s, r in reqs.items() if "finish" in r)
        if not routes or not done:
            continue
        first, last_in = min(routes), max(routes)
        end, seq = done[-1]
        row = (len(done) / (end - first), last_in - first, end - last_in, seq, end - reqs[seq]["route"], len(done))
        per[run[0]].append(row)
        print("%s rep %d: %.3f requests/s = %d / (%.2f s of arrivals + %.2f s of drain); last done: request %d (%s), %.2f s after its route" % (
            run[0], run[1], row[0], row[5], row[1], row[2], row[3], reqs[seq].get("kind") or "-", row[4]))
    for policy, rows in per.items():
        m = sorted(rows)[(len(rows) - 1) // 2]
        print("median %s: %.3f requests/s, drain %.2f s (request %d, latency %.2f s)" % (policy, m[0], m[2], m[3], m[4]))


def by_request(path, fields=()):
    """Per run, keyed (policy, rep, concurrency) and sorted so: per request (seq) the
    times of its route and finish lines, and the route line's fields named."""
    out = []
    for (pol, conc, rep), events in runs(path):
        reqs = {}
        for ev in events:
            if ev["event"] in ("route", "finish"):
                r = reqs.setdefault(ev["seq"], {})
                r[ev["event"]] = ev["t"]
                if ev["event"] == "route":
                    r.update((f, ev.get(f)) for f in fields)
        out.append(((pol, rep, conc), reqs))
    return sorted(out, key=lambda run: run[0])


def chain(path):
    per = collections.defaultdict(list)
    for run, reqs in by_request(path, ("prefix", "server")):
        done = {s: r for s, r in reqs.items() if "route" in r and "finish" in r}
        if not done:
            continue
        first = min(r["route"] for r in reqs.values() if "route" in r)
        ends = collections.defaultdict(float)
        for r in done.values():
            ends[r["prefix"]] = max(ends[r["prefix"]], r["finish"])
        order = sorted(ends, key=ends.get)
        last = order[-1]
        span = ends[last] - first
        turns = sorted((s, r) for s, r in done.items() if r["prefix"] == last)
        lat = sum(r["finish"] - r["route"] for _, r in turns)
        others = [r for r in done.values() if r["prefix"] != last]
        without = len(others) / (max(r["finish"] for r in others) - first) if others else 0
        slack = ends[last] - ends[order[-2]] if len(order) > 1 else 0
        mean = sum(r["finish"] - r["route"] for r in done.values()) / len(done)
        per[run[0]].append((len(done) / span, span - lat, lat, without, mean))
        print("%s rep %d: %.3f requests/s = %d / (%.2f s fixed + %.2f s of session %d's %d latencies); "
              "next session ended %.2f s before; without it %.3f requests/s; mean latency %.3f s" % (
                  run[0], run[1], len(done) / span, len(done), span - lat, lat, last, len(turns), slack, without, mean))
        print("  turns: " + " ".join("%d:%d:%.2f" % (s, r["server"], r["finish"] - r["route"]) for s, r in turns))
    for policy, rows in per.items():
        m = sorted(rows)[(len(rows) - 1) // 2]
        print("median run %s: %.3f requests/s (%.2f s fixed + %.2f s of latencies); without the last session %.3f; mean latency %.3f s" % (
            (policy,) + m))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log")
    ap.add_argument("--trace")
    ap.add_argument("--long", type=int, default=20000)
    ap.add_argument("--shared-ids", type=int, default=2)
    ap.add_argument("--misses", action="store_true", help="classify the measured misses instead")
    ap.add_argument("--servers", action="store_true", help="per server: requests, decode time, busy share, prefixes")
    ap.add_argument("--copies", action="store_true", help="misses as cold starts, copies, remakes; what each copy served")
    ap.add_argument("--drain", action="store_true", help="per run: throughput as arrivals' span plus drain, the last request")
    ap.add_argument("--chain", action="store_true", help="per run: the session that ends last, the span as fixed part plus its latencies")
    args = ap.parse_args()
    if args.chain:
        chain(args.log)
        return
    if args.drain:
        drain(args.log)
        return
    if args.copies:
        copies(args.log)
        return
    if args.misses:
        misses(args.log)
        return
    if args.servers:
        servers(args.log)
        return
    runs = collections.defaultdict(dict)
    kinds = {}                                          # (run, seq) -> decision kind
    by_kind = collections.defaultdict(collections.Counter)  # policy -> measured routes by kind
    for line in open(args.log):
        ev = json.loads(line)
        if ev["event"] == "route":
            run = (ev["policy"], ev["rep"], ev.get("concurrency", 0))
            kinds[run + (ev["seq"],)] = ev.get("kind") or "-"
            if not ev.get("warmup"):
                by_kind[ev["policy"]][ev.get("kind") or "-"] += 1
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
            rest_c / max(rest_p, 1), " ".join("%d:%d:%d:%s" % (s, reqs[s][0], reqs[s][2], kinds.get(run + (s,), "-")) for s in long_),
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
    for policy, c in by_kind.items():
        n = sum(c.values())
        print("%s decisions by kind (%d measured routes, all runs): %s" % (
            policy, n, ", ".join("%s %d (%.3f)" % (k, v, v / n) for k, v in c.most_common())))


if __name__ == "__main__":
    main()
