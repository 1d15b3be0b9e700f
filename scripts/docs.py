#!/usr/bin/env python3
"""Render every table in docs/ from the JSON committed beside it (stdlib only).

    python3 scripts/docs.py           # rewrite the rendered blocks in place (make docs)
    python3 scripts/docs.py --check   # fail if a committed table differs (make docs-check)
    python3 scripts/docs.py print goal run.json placement   # one renderer, for a new run

A rendered block in a Markdown file under docs/ reads

    <!-- render: NAME ARG... -->
    ...generated...
    <!-- /render -->

NAME is one of RENDERERS below; ARGs are paths relative to the repository root (and,
for some renderers, a policy name). Everything between the markers is replaced by the
renderer's output. --check also fails on a Markdown table outside any rendered block:
every figure in a table comes from committed data, none is typed in by hand. The package
READMEs listed in READMES are rendered and checked too, their older hand-written tables
excepted.

The reference experiment's published figures come from testbench/sim/reference.json, the one copy
the simulator's calibration reads too.
"""
import json
import os
import re
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "docs", "data")
NS = [2, 7, 12, 24]
POL = ["random", "round-robin", "kv", "approximate"]
REF_COL = {"random": "baseline", "round-robin": "round-robin", "kv": "kv"}


def reference():
    """The reference's figures keyed as the results tables read them (hit rates in %)."""
    with open(os.path.join(ROOT, "testbench", "sim", "reference.json")) as f:
        p = json.load(f)
    pct = lambda d: {k: [round(100 * x, 1) for x in v] for k, v in d.items()}
    kb = p["kv_hit_rate_vs_bound"]
    return {
        "hit_c8": pct(p["hit_rate_c8"]),
        "cached_c4": p["cached_ratio_c4"],
        "cached_c16": p["cached_ratio_c16"],
        "cached_c8": p["cached_ratio_c8"],
        "spp_c4": p["servers_per_prefix_c4"],
        "ttft_c4": {k: [tuple(x) for x in v] for k, v in p["ttft_ms_c4"].items()},
        "ttft_c16": {k: [tuple(x) for x in v] for k, v in p["ttft_ms_c16"].items()},
        "rps_c16": p["requests_per_s_c16"],
        "kv_bound": {n: (round(100 * kb["bound"][i]), tuple(round(100 * kb[c][i]) for c in ("c4", "c8", "c16")))
                     for i, n in enumerate(kb["ns"])},
    }


REF = reference()


def load(name):
    with open(os.path.join(DATA, name)) as f:
        return json.load(f)


def index(records):
    return {(r["policy"], r["prefixes"], r["concurrency"]): r for r in records}


def table(header, rows):
    out = ["", "| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out) + "\n"


def ratio_cell(ours, ref):
    if ref is None:
        return f"{ours:.3f} / -"
    return f"{ours:.3f} / {ref:.3f} ({ours - ref:+.3f})"


def pct_cell(ours, ref):
    if ref is None:
        return f"{100 * ours:.1f}% / -"
    return f"{100 * ours:.1f}% / {ref:.1f}% ({100 * ours - ref:+.1f})"


def rel(ours, ref):
    return f"{100 * (ours - ref) / ref:+.0f}%"


def ref_of(key, pol, i):
    col = REF[key].get(REF_COL.get(pol, pol))
    return None if col is None else col[i]


def sweep_tables(ix):
    s = []
    s.append("#### Cached-token ratio, concurrency 4 and 16 (ours / reference (ours - reference); max 0.857)\n")
    rows = []
    for c, key in ((4, "cached_c4"), (16, "cached_c16")):
        for i, n in enumerate(NS):
            rows.append([n, c] + [ratio_cell(ix[(p, n, c)]["cached_ratio"], ref_of(key, p, i)) for p in POL]
                        + [f"{ix[('kv', n, c)]['bound_cached_ratio']:.3f}"])
    s.append(table(["N", "C", "random / baseline", "round-robin", "kv", "approximate", "bound"], rows))

    s.append("\n#### Cached-token ratio, concurrency 8 (the reference's hash-seed table)\n")
    rows = []
    for i, n in enumerate(NS):
        rows.append([n] + [ratio_cell(ix[(p, n, 8)]["cached_ratio"], ref_of("cached_c8", p, i)) for p in POL]
                    + [f"- / {REF['cached_c8']['kv, no seed'][i]:.3f}", f"{ix[('kv', n, 8)]['bound_cached_ratio']:.3f}"])
    s.append(table(["N", "random", "round-robin", "kv", "approximate", "kv, no seed (ref only)", "bound"], rows))

    s.append("\n#### Request hit rate, concurrency 8 (any cached token; ours / reference (points))\n")
    rows = []
    for i, n in enumerate(NS):
        rows.append([n] + [pct_cell(ix[(p, n, 8)]["hit_any"], ref_of("hit_c8", p, i)) for p in POL])
    s.append(table(["N", "random / baseline", "round-robin", "kv", "approximate"], rows))
    s.append("\nThe same with the whole shared prefix cached (`hit_full`, ours only):\n")
    rows = [[n] + [f"{100 * ix[(p, n, 8)]['hit_full']:.1f}%" for p in POL] for n in NS]
    s.append(table(["N"] + POL, rows))

    s.append("\n#### TTFT p50 / p99, ms (ours ; reference)\n")
    rows = []
    for c, key in ((4, "ttft_c4"), (16, "ttft_c16")):
        for i, n in enumerate(NS):
            row = [n, c]
            for p in POL:
                r = ix[(p, n, c)]
                ref = ref_of(key, p, i)
                cell = f"{r['ttft_p50_ms']:.0f} / {r['ttft_p99_ms']:,.0f}"
                cell += f" ; {ref[0]} / {ref[1]:,}" if ref else " ; -"
                row.append(cell)
            rows.append(row)
    s.append(table(["N", "C", "random / baseline", "round-robin", "kv", "approximate"], rows))

    s.append("\n#### Throughput, requests/s, concurrency 16 (ours / reference (relative))\n")
    rows = []
    for i, n in enumerate(NS):
        row = [n]
        for p in POL:
            o, ref = ix[(p, n, 16)]["requests_per_s"], ref_of("rps_c16", p, i)
            row.append(f"{o:.1f} / {ref:.1f} ({rel(o, ref)})" if ref else f"{o:.1f} / -")
        rows.append(row)
    s.append(table(["N", "random / baseline", "round-robin", "kv", "approximate"], rows))
    s.append("\nkv's throughput gain over random at C=16: ours "
             + ", ".join(f"N={n} {rel(ix[('kv', n, 16)]['requests_per_s'], ix[('random', n, 16)]['requests_per_s'])}" for n in NS)
             + "; reference "
             + ", ".join(f"N={n} {rel(REF['rps_c16']['kv'][i], REF['rps_c16']['baseline'][i])}" for i, n in enumerate(NS)) + ".\n")

    s.append("\n#### Distinct servers per prefix, concurrency 4 (ours / reference)\n")
    rows = []
    for i, n in enumerate(NS):
        row = [n]
        for p in POL:
            o, ref = ix[(p, n, 4)]["servers_per_prefix"], ref_of("spp_c4", p, i)
            row.append(f"{o:.2f} / {ref:.2f}" if ref is not None else f"{o:.2f} / -")
        rows.append(row)
    s.append(table(["N", "random", "round-robin", "kv", "approximate"], rows))

    s.append("\n#### kv request hit rate against the bound, concurrency 4 / 8 / 16 (ours ; reference)\n")
    rows = []
    for n in NS:
        b = ix[("kv", n, 8)]["bound_hit_rate"]
        ours = " / ".join(f"{100 * ix[('kv', n, c)]['hit_any']:.0f}" for c in (4, 8, 16)) + "%"
        if n in REF["kv_bound"]:
            rb, rk = REF["kv_bound"][n]
            ref = f"{rk[0]} / {rk[1]} / {rk[2]}% (bound {rb}%)"
        else:
            ref = "-"
        rows.append([n, f"{100 * b:.0f}%", ours, ref])
    s.append(table(["N", "bound (ours)", "kv, ours", "kv, reference"], rows))
    return "".join(s)


def median_fullstack(records):
    """Group full-stack records (one per seed) by (policy, N) and take each figure's median."""
    groups = {}
    for r in records:
        groups.setdefault((r["policy"], r["prefixes"]), []).append(r)
    out = {}
    for k, rs in groups.items():
        m = {"reps": len(rs), "errors": sum(r["errors"] for r in rs)}
        for f in ("hit_any", "hit_full", "cached_ratio", "ttft_p50_ms", "ttft_p99_ms", "requests_per_s",
                  "servers_per_prefix", "engine_hit_rate", "bound_cached_ratio"):
            vals = [r[f] for r in rs if r[f] is not None]
            m[f] = statistics.median(vals) if vals else None
        m["cached_each"] = [r["cached_ratio"] for r in sorted(rs, key=lambda r: r["seed"])]
        out[k] = m
    return out


def fullstack_tables(ix_sweep, ix_matched, fs):
    s = []
    s.append("#### Concurrency 8: cached-token ratio, in-process (calibrated) / in-process (matched) / full stack; reference\n")
    rows = []
    for i, n in enumerate(NS):
        row = [n]
        for p in POL:
            a = ix_sweep[(p, n, 8)]["cached_ratio"]
            b = ix_matched[(p, n, 8)]["cached_ratio"]
            f = fs.get((p, n))
            ref = ref_of("cached_c8", p, i)
            cell = f"{a:.3f} / {b:.3f} / " + (f"**{f['cached_ratio']:.3f}**" if f else "n/a")
            cell += f" ; {ref:.3f}" if ref is not None else " ; -"
            row.append(cell)
        rows.append(row)
    s.append(table(["N", "random", "round-robin", "kv", "approximate"], rows))

    s.append("\nFull stack, each repetition's cached-token ratio (seeds 1, 2, 3):\n")
    rows = [[n] + [", ".join(f"{x:.3f}" for x in fs[(p, n)]["cached_each"]) if (p, n) in fs else "n/a" for p in POL] for n in NS]
    s.append(table(["N"] + POL, rows))

    s.append("\n#### Concurrency 8: request hit rate (any), in-process (calibrated) / matched / full stack; reference\n")
    rows = []
    for i, n in enumerate(NS):
        row = [n]
        for p in POL:
            a, b, f = ix_sweep[(p, n, 8)]["hit_any"], ix_matched[(p, n, 8)]["hit_any"], fs.get((p, n))
            ref = ref_of("hit_c8", p, i)
            cell = f"{100 * a:.1f} / {100 * b:.1f} / " + (f"**{100 * f['hit_any']:.1f}**" if f else "n/a")
            cell += f" ; {ref:.1f}%" if ref is not None else " ; -"
            row.append(cell)
        rows.append(row)
    s.append(table(["N", "random", "round-robin", "kv", "approximate"], rows))

    s.append("\n#### Concurrency 8, full stack against the matched in-process run: TTFT, throughput, servers per prefix, engine hit rate\n")
    rows = []
    for n in NS:
        for p in POL:
            m, f = ix_matched[(p, n, 8)], fs.get((p, n))
            if not f:
                rows.append([n, p, "n/a", "", "", "", ""])
                continue
            rows.append([n, p,
                         f"{m['ttft_p50_ms']:.0f} / {m['ttft_p99_ms']:.0f} ; {f['ttft_p50_ms']:.0f} / {f['ttft_p99_ms']:.0f}",
                         f"{m['requests_per_s']:.1f} ; {f['requests_per_s']:.1f}",
                         f"{m['servers_per_prefix']:.2f} ; {f['servers_per_prefix']:.2f}",
                         f"{100 * f['engine_hit_rate']:.1f}%" if f["engine_hit_rate"] is not None else "-",
                         f"{f['errors']}"])
    s.append(table(["N", "policy", "TTFT p50 / p99 ms (in-proc ; full)", "req/s (in-proc ; full)",
                    "servers/prefix (in-proc ; full)", "engines' hit rate (full)", "errors (full, 3 reps)"], rows))
    s.append(lag_table())
    return "".join(s)


def sensitivity_tables(ix_sweep):
    d = os.path.join(DATA, "sensitivity")
    if not os.path.isdir(d):
        return ""
    sens = {f[:-5]: index(json.load(open(os.path.join(d, f)))) for f in os.listdir(d) if f.endswith(".json")}
    s = ["#### kv, concurrency 8: cached-token ratio against the KV-event lag the router sees (rtt 35 ms, scrape 50 ms)\n"]
    lags = ["lag-0s", "lag-5ms", "lag-50ms", "lag-250ms"]
    rows = [[n] + [f"{sens[l][('kv', n, 8)]['cached_ratio']:.3f}" for l in lags] for n in NS]
    s.append(table(["N", "0 ms", "5 ms (default)", "50 ms", "250 ms"], rows))
    s.append("\n#### Concurrency 8: cached-token ratio with the client round trip at 35 ms (calibrated) and 0 (as on loopback)\n")
    rows = [[n] + [f"{ix_sweep[(p, n, 8)]['cached_ratio']:.3f} ; {sens['rtt0'][(p, n, 8)]['cached_ratio']:.3f}" for p in POL] for n in NS]
    s.append(table(["N"] + [p + " (35 ms ; 0)" for p in POL], rows))
    s.append("\n#### Concurrency 8: cached-token ratio with one router replica and with two (each its own index / history and in-flight view)\n")
    rows = [[n] + [f"{ix_sweep[(p, n, 8)]['cached_ratio']:.3f} ; {sens['replicas2'][(p, n, 8)]['cached_ratio']:.3f}" for p in ("kv", "approximate")] for n in NS]
    s.append(table(["N", "kv (1 ; 2 replicas)", "approximate (1 ; 2 replicas)"], rows))
    return "".join(s)


def lag_table():
    """kvrouter's KV-event lag per policy, from the kvdemo logs (one line per run)."""
    import glob
    import re
    pat = re.compile(r"kvdemo: (\S+): KV-event lag over (\d+) batches: mean ([\d.]+) ms, p50 <= ([\d.]+) ms, p99 <= ([\d.]+) ms")
    runs = {}
    for path in sorted(glob.glob(os.path.join(DATA, "fullstack", "n*-seed?.log"))):
        for line in open(path):
            m = pat.search(line)
            if m:
                runs.setdefault(m.group(1), []).append((int(m.group(2)), float(m.group(3)), float(m.group(4)), float(m.group(5))))
    if not runs:
        return ""
    s = ["\n#### kvrouter's KV-event lag (receive time minus the batch's timestamp), full stack, per run\n"]
    rows = []
    for p in POL:
        rs = runs.get(p, [])
        if not rs:
            continue
        means = sorted(r[1] for r in rs)
        rows.append([p, len(rs), f"{min(r[0] for r in rs)}-{max(r[0] for r in rs)}",
                     f"{means[0]:.2f}-{means[-1]:.2f} (median {statistics.median(means):.2f})",
                     f"<= {max(r[2] for r in rs):g}", f"<= {min(r[3] for r in rs):g} .. <= {max(r[3] for r in rs):g}"])
    s.append(table(["policy", "runs", "batches per run", "mean lag, ms", "p50 bucket, ms", "p99 bucket, ms"], rows))
    return "".join(s)


def run1_table(fs):
    path = os.path.join(DATA, "fullstack-run1.json")
    if not os.path.exists(path):
        return ""
    r1 = median_fullstack(load("fullstack-run1.json"))
    s = ["\n#### The full stack twice: cached-token ratio, this run ; the earlier run (medians of 3 seeds)\n"]
    rows = [[n] + [f"{fs[(p, n)]['cached_ratio']:.3f} ; {r1[(p, n)]['cached_ratio']:.3f}" for p in POL] for n in NS]
    s.append(table(["N"] + POL, rows))
    return "".join(s)




# ---- the reference's own tables (docs/reference.md) ----

def reference_tables(path):
    with open(os.path.join(ROOT, path)) as f:
        p = json.load(f)
    ns, s = p["ns"], []
    cols = ["baseline", "round-robin", "kv"]
    s.append("#### Request hit rate, concurrency 8\n")
    s.append(table(["N"] + cols, [[n] + [f"{100 * p['hit_rate_c8'][c][i]:.1f}%" for c in cols] for i, n in enumerate(ns)]))
    s.append(f"\n#### Cached-token ratio (max {p['max_cached_ratio']:.3f})\n")
    rows = [[n, conc] + [f"{p[key][c][i]:.3f}" for c in cols]
            for conc, key in ((4, "cached_ratio_c4"), (16, "cached_ratio_c16")) for i, n in enumerate(ns)]
    s.append(table(["N", "C"] + cols, rows))
    s.append("\n#### Distinct workers that served one prefix, concurrency 4\n")
    spp = p["servers_per_prefix_c4"]
    s.append(table(["N"] + list(spp), [[n] + [f"{spp[c][i]:.2f}" for c in spp] for i, n in enumerate(ns)]))
    s.append("\n#### TTFT p50 / p99, ms\n")
    rows = [[n, conc] + [f"{p[key][c][i][0]:,} / {p[key][c][i][1]:,}" for c in cols]
            for conc, key in ((4, "ttft_ms_c4"), (16, "ttft_ms_c16")) for i, n in enumerate(ns)]
    s.append(table(["N", "C"] + cols, rows))
    s.append("\n#### Throughput, requests/s, concurrency 16\n")
    s.append(table(["N"] + cols, [[n] + [f"{p['requests_per_s_c16'][c][i]:.1f}" for c in cols] for i, n in enumerate(ns)]))
    kb = p["kv_hit_rate_vs_bound"]
    s.append("\n#### kv request hit rate against the bound, concurrency 4 / 8 / 16\n")
    s.append(table(["N", "bound", "kv"], [[n, f"{100 * kb['bound'][i]:.0f}%", " / ".join(f"{100 * kb[c][i]:.0f}" for c in ("c4", "c8", "c16")) + "%"]
                                          for i, n in enumerate(kb["ns"])]))
    s.append("\n#### Hash seed and approximate mode: cached-token ratio, concurrency 8\n")
    c8 = p["cached_ratio_c8"]
    s.append(table(["N"] + list(c8), [[n] + [f"{c8[c][i]:.3f}" for c in c8] for i, n in enumerate(ns)]))
    return "".join(s)


# ---- kvbench --json records: policies against the bound and against kv ----

def records(*paths):
    recs = []
    for p in paths:
        with open(os.path.join(ROOT, p)) as f:
            recs += json.load(f)
    return recs


def by_cell(recs):
    return {(r["policy"], r["prefixes"], r["concurrency"]): r for r in recs}


def cells_table(path, metric="cached_ratio"):
    """Every policy's figure per N x C (cached_ratio also shows the bound)."""
    recs = records(path)
    order = []
    for r in recs:
        if r["policy"] not in order:
            order.append(r["policy"])
    ix = by_cell(recs)
    fmt = {"cached_ratio": "{:.3f}", "ttft_p99_ms": "{:,.0f}", "ttft_p50_ms": "{:,.0f}", "requests_per_s": "{:.2f}"}[metric]
    rows = []
    for n, c in sorted({(r["prefixes"], r["concurrency"]) for r in recs}):
        first = next(ix[(p, n, c)] for p in order if (p, n, c) in ix)
        bound = [f"{first['bound_cached_ratio']:.3f}"] if metric == "cached_ratio" else []
        rows.append([n, c] + bound + [fmt.format(ix[(p, n, c)][metric]) if (p, n, c) in ix else "-" for p in order])
    return table(["N", "C"] + (["bound"] if metric == "cached_ratio" else []) + order, rows)


def goal_reference(ix, n, c, r):
    """The reference point of a cell's goal: the measured perfect partition at N = 24
    (when the grid has it), else the bound; with its name."""
    part = ix.get(("partition", n, c))
    if n >= 24 and part:
        return part["cached_ratio"], "partition"
    return r["bound_cached_ratio"], "bound"


def goal_missed(ix, n, c, r):
    """What a cell r of (n, c) misses of the goal: "ratio" under 0.95 x the reference,
    "p99" over kv's (+0.5 ms), "req/s" under kv's (-0.5%); empty when met."""
    kv = ix.get(("kv", n, c))
    ref, _ = goal_reference(ix, n, c, r)
    missed = [] if r["cached_ratio"] >= 0.95 * ref else ["ratio"]
    if kv and r["ttft_p99_ms"] > kv["ttft_p99_ms"] + 0.5:
        missed.append("p99")
    if kv and r["requests_per_s"] < kv["requests_per_s"] * 0.995:
        missed.append("req/s")
    return missed


def goal_table(path, pol="placement"):
    """Per N x C: ratio against the reference point (the bound, or the measured perfect
    partition at N = 24), TTFT p99 and throughput against kv, and whether the goal holds:
    ratio >= 0.95 x reference, p99 <= kv's, throughput >= kv's."""
    ix = by_cell(records(path))
    rows, fails = [], 0
    for (p, n, c), r in sorted(ix.items(), key=lambda x: (x[0][1], x[0][2])):
        if p != pol:
            continue
        kv = ix.get(("kv", n, c))
        ref, refname = goal_reference(ix, n, c, r)
        ok = not goal_missed(ix, n, c, r)
        fails += not ok
        rows.append([n, c, f"{r['cached_ratio']:.3f}", f"{ref:.3f} ({refname})", f"{r['cached_ratio'] / ref:.3f}",
                     f"{r['ttft_p99_ms']:.0f} / {kv['ttft_p99_ms']:.0f}" if kv else f"{r['ttft_p99_ms']:.0f} / -",
                     f"{r['requests_per_s']:.2f} / {kv['requests_per_s']:.2f}" if kv else f"{r['requests_per_s']:.2f} / -",
                     "met" if ok else "**missed**"])
    out = table(["N", "C", f"{pol} ratio", "reference", "ratio/ref", f"TTFT p99 ms {pol} / kv", f"req/s {pol} / kv", "goal"], rows)
    return out + f"\nCells missing the goal: {fails} of {len(rows)}.\n"


def seeds_table(*args):
    """The goal at several workload seeds: kvbench --json grids (kv, partition and the
    policy, each record carrying its seed) concatenated in the files given; the last
    argument may name the policy. Per seed, the cells missing the goal and what they miss
    (as goal_table judges them), and the policy's N = 24 ratio against the partition at
    each concurrency; then, per cell, the seeds missing it."""
    pol = "placement"
    if args and not args[-1].endswith(".json"):
        args, pol = args[:-1], args[-1]
    recs = records(*args)
    cs24 = sorted({r["concurrency"] for r in recs if r["prefixes"] == 24})

    def n24(ix):
        out = []
        for c in cs24:
            r = ix.get((pol, 24, c))
            out.append(f"{r['cached_ratio'] / goal_reference(ix, 24, c, r)[0]:.3f}" if r else "-")
        return out
    return per_seed_table(recs, pol, goal_missed, [f"N = 24, C = {c}: ratio/partition" for c in cs24], n24)


def seeds_replicas_table(path, one, pol="placement"):
    """Router replicas at several workload seeds: per seed, the cells of `path` (grids of
    kv and the policy at --replicas R, concatenated, records carrying their seed) missing
    replicas_table's goal against one router's grid of the same seed in `one`."""
    solo = records(one)

    def missed(ix, n, c, r):
        o = by_cell([x for x in solo if x["seed"] == r["seed"]]).get((pol, n, c))
        kv = ix.get(("kv", n, c))
        return replicas_missed(r, kv, o) if kv and o else []
    return per_seed_table(records(path), pol, missed, [], lambda ix: [])


def per_seed_table(recs, pol, missed_of, extra_cols, extra):
    """Per seed of recs, the policy's cells that missed_of(ix, n, c, r) finds missing
    something, and extra(ix)'s columns; then, per cell, the seeds missing it."""
    rows, per_cell, cells = [], {}, 0
    seeds = sorted({r["seed"] for r in recs})
    for sd in seeds:
        ix = by_cell([r for r in recs if r["seed"] == sd])
        missed = []
        for (p, n, c), r in sorted(ix.items(), key=lambda x: (x[0][1], x[0][2])):
            if p != pol:
                continue
            cells += 1
            m = missed_of(ix, n, c, r)
            if m:
                missed.append(f"N = {n}, C = {c}: {', '.join(m)}")
                per_cell.setdefault((n, c), []).append(f"{sd} ({', '.join(m)})")
        rows.append([sd, "; ".join(missed) or "-"] + extra(ix))
    out = table(["seed", "cells missing the goal"] + extra_cols, rows)
    if per_cell:
        out += "\n" + table(["cell", "seeds missing it"],
                            [[f"N = {n}, C = {c}", ", ".join(v)] for (n, c), v in sorted(per_cell.items(), key=lambda x: (-len(x[1]), x[0]))])
    missing = sum(len(v) for v in per_cell.values())
    return out + f"\nCells missing the goal: {missing} of {cells} ({len(seeds)} seeds).\n"


def vs_kv_table(path, pol="placement"):
    """Per cell, a policy against kv; a loss is a ratio 0.005 under kv's, a p99 0.5 ms over,
    or throughput 0.5% under."""
    ix = by_cell(records(path))
    rows, losses = [], 0
    for (p, n, c), r in sorted(ix.items(), key=lambda x: (x[0][1], x[0][2])):
        kv = ix.get(("kv", n, c))
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
        rows.append([n, c, f"{r['cached_ratio']:.3f} / {kv['cached_ratio']:.3f}", f"{r['ttft_p99_ms']:.0f} / {kv['ttft_p99_ms']:.0f}",
                     f"{r['requests_per_s']:.2f} / {kv['requests_per_s']:.2f}", ", ".join(lost) or "-"])
    out = table(["N", "C", f"ratio {pol} / kv", f"TTFT p99 ms {pol} / kv", f"req/s {pol} / kv", "losses"], rows)
    return out + f"\nLosses against kv: {losses}.\n"


def replicas_missed(r, kv, o):
    """What a replicas cell r misses of issue 13's goal: "ratio" more than 1 point under
    one router's o, "p99" over 1.05 x kv's, "req/s" under kv's; empty when met."""
    lost = []
    if 100 * (r["cached_ratio"] - o["cached_ratio"]) < -1:
        lost.append("ratio")
    if r["ttft_p99_ms"] > 1.05 * kv["ttft_p99_ms"]:
        lost.append("p99")
    if r["requests_per_s"] < kv["requests_per_s"]:
        lost.append("req/s")
    return lost


def replicas_table(path, one, pol="placement"):
    """Router replicas against issue 13's goal, per cell: the policy's cached-token ratio
    within 1 point of one router's (the same grid in `one`), its TTFT p99 at most 5% over
    kv's and its throughput not under kv's (both from `path`); and the sync's cost."""
    ix, solo = by_cell(records(path)), by_cell(records(one))
    rows, missed = [], 0
    for (p, n, c), r in sorted(ix.items(), key=lambda x: (x[0][1], x[0][2])):
        kv, o = ix.get(("kv", n, c)), solo.get((p, n, c))
        if p != pol or kv is None or o is None:
            continue
        d = 100 * (r["cached_ratio"] - o["cached_ratio"])
        lost = replicas_missed(r, kv, o)
        missed += bool(lost)
        msgs, size = r.get("sync_messages_per_request"), r.get("sync_bytes_per_request")
        rows.append([n, c, f"{r['cached_ratio']:.3f} / {o['cached_ratio']:.3f}", f"{d:+.1f}",
                     f"{r['ttft_p99_ms']:.0f} / {kv['ttft_p99_ms']:.0f}", f"{r['requests_per_s']:.2f} / {kv['requests_per_s']:.2f}",
                     "-" if msgs is None else f"{msgs:.2f}", "-" if size is None else f"{size:.0f}", ", ".join(lost) or "-"])
    out = table(["N", "C", f"ratio {pol} / one router", "points", f"TTFT p99 ms {pol} / kv", f"req/s {pol} / kv",
                 "messages / request", "bytes / request", "missed"], rows)
    return out + f"\nCells missing the goal: {missed} of {len(rows)}.\n"


def runs_table(before, after, pol="placement"):
    """One policy across two runs of the same grid (say, before and after a change of
    default): per N x C, the cached-token ratio and TTFT p99 of each, and the changes."""
    a, b = by_cell(records(before)), by_cell(records(after))
    rows = []
    for (p, n, c), ra in sorted(a.items(), key=lambda x: (x[0][1], x[0][2])):
        rb = b.get((p, n, c))
        if p != pol or rb is None:
            continue
        rows.append([n, c, f"{ra['cached_ratio']:.3f}", f"{rb['cached_ratio']:.3f}", f"{rb['cached_ratio'] - ra['cached_ratio']:+.3f}",
                     f"{ra['ttft_p99_ms']:.0f}", f"{rb['ttft_p99_ms']:.0f}", f"{rb['ttft_p99_ms'] - ra['ttft_p99_ms']:+.0f}"])
    return table(["N", "C", "ratio before", "ratio after", "change", "TTFT p99 ms before", "after", "change"], rows)


# ---- docs/results-workloads.md (issue 14) ----

WORKLOAD_POLICIES = ["kv", "round-robin", "least-load", "placement"]


def workload_goal(r, kv):
    """Issue 14's goal of r against kv: ratio >= kv's (3 decimals), TTFT p99 <= 1.05 x kv's,
    throughput >= kv's within 0.5%. Returns the three cells and the missed checks."""
    checks = (("ratio", round(r["cached_ratio"], 3) >= round(kv["cached_ratio"], 3)),
              ("p99", r["ttft_p99_ms"] <= 1.05 * kv["ttft_p99_ms"]),
              ("throughput", r["requests_per_s"] >= 0.995 * kv["requests_per_s"]))
    return ["yes" if ok else "**NO**" for _, ok in checks], [m for m, ok in checks if not ok]


def workload_rows(recs):
    """(cell label, policy, record, goal cells, missed) for every policy of every cell."""
    grid = "workload" not in recs[0]
    key = (lambda r: (r["prefixes"], r["concurrency"])) if grid else (lambda r: ())
    ix = {(key(r), r["policy"]): r for r in recs}
    out = []
    for cell in sorted({key(r) for r in recs}):
        kv = ix.get((cell, "kv"))
        for p in WORKLOAD_POLICIES:
            r = ix.get((cell, p))
            if r is None:
                continue
            g, missed = (["-"] * 3, []) if p == "kv" or kv is None else workload_goal(r, kv)
            out.append((cell, p, r, g, missed))
    return grid, out


def workload_table(path):
    """One workload, every policy's medians and the goal against kv."""
    recs = records(path)
    grid, rows = workload_rows(recs)
    r0 = recs[0]
    goal = ["ratio >= kv", "p99 <= 1.05 kv", "thr >= kv"]
    if grid:
        head = (f"{r0['workers']} servers, prefix {r0['prefix_tokens']} + tail {r0['tail_tokens']} tokens, output "
                f"{r0['output_tokens']}, {r0['requests']} requests from empty caches, closed loop, {r0['reps']} repetitions (medians).\n")
        body = [[n, c, f"**{p}**" if p == "placement" else p, f"{r['cached_ratio']:.3f}", f"{r['bound_cached_ratio']:.3f}",
                 f"{r['ttft_p50_ms']:.0f}", f"{r['ttft_p99_ms']:.0f}", f"{r['requests_per_s']:.2f}",
                 "-" if r.get("servers_per_prefix") is None else f"{r['servers_per_prefix']:.2f}"] + g
                for (n, c), p, r, g, _ in rows]
        return head + table(["N", "C", "policy", "cached", "bound", "TTFT p50 ms", "TTFT p99 ms", "req/s", "servers/prefix"] + goal, body)
    head = (f"{r0['workers']} servers of {r0['kv_bytes_per_server'] / 2**30:g} GiB, max_model_len {r0['max_model_len']}, "
            f"{r0['requests']} requests, open loop, {r0['reps']} repetitions (medians).\n")
    body = [[f"**{p}**" if p == "placement" else p, f"{r['cached_ratio']:.3f}", f"{r['bound_cached_ratio']:.3f}",
             f"{r['ttft_p50_ms']:.0f}", f"{r['ttft_p99_ms']:.0f}", f"{r['requests_per_s']:.2f}", f"{r['tokens_per_s']:,.0f}",
             f"{r['load_spread']:.2f}", f"{r['servers_per_session']:.2f}", f"{r['preemptions']:.0f}", r["rejected"]] + g
            for _, p, r, g, _ in rows]
    return head + table(["policy", "cached", "bound", "TTFT p50 ms", "TTFT p99 ms", "req/s", "tok/s", "load spread",
                         "servers/session", "preemptions", "rejected"] + goal, body)


def workload_summary(*paths):
    """Per workload file: whether placement meets the goal against kv, and where not."""
    rows = []
    for path in paths:
        grid, rs = workload_rows(records(path))
        misses = [(f"N={cell[0]} C={cell[1]} " if grid else "") + "(" + ", ".join(m) + ")"
                  for cell, p, _, _, m in rs if p == "placement" and m]
        rows.append([os.path.basename(path)[:-len(".json")], "met" if not misses else "missed: " + "; ".join(misses)])
    return table(["workload", "placement against kv"], rows)


def workload_margins(directory, before=None):
    """Every workload file in directory (kvbench --policy kv,placement): placement's
    ratio, TTFT p99 and throughput against kv's per cell, whether the goal holds, and,
    with before, whether it held in the same file there (an earlier build's runs)."""
    import glob

    def cells(path):
        grid, rs = workload_rows(records(path))
        ix = {(cell, p): r for cell, p, r, _, _ in rs}
        return {cell: (r, ix[(cell, "kv")], m) for cell, p, r, _, m in rs if p == "placement" and (cell, "kv") in ix}

    rows, misses = [], 0
    paths = sorted(glob.glob(os.path.join(ROOT, directory, "*.json")))
    if not paths:
        raise SystemExit(f"{directory}: no workload files")
    for path in paths:
        name = os.path.basename(path)[:-len(".json")]
        old = {}
        if before:
            bpath = os.path.join(ROOT, before, os.path.basename(path))
            if os.path.exists(bpath):
                old = cells(bpath)
        for cell, (r, kv, m) in sorted(cells(path).items()):
            misses += bool(m)
            goal = "met" if not m else "**missed** (" + ", ".join(m) + ")"
            row = [name, f"N={cell[0]} C={cell[1]}" if cell else "-",
                   f"{r['cached_ratio']:.3f} / {kv['cached_ratio']:.3f}",
                   f"{r['ttft_p99_ms']:.0f} / {kv['ttft_p99_ms']:.0f} ({r['ttft_p99_ms'] / kv['ttft_p99_ms']:.2f})",
                   f"{r['requests_per_s']:.2f} / {kv['requests_per_s']:.2f} ({100 * (r['requests_per_s'] / kv['requests_per_s'] - 1):+.1f}%)",
                   goal]
            if before:
                b = old.get(cell)
                row.append("-" if b is None else ("met" if not b[2] else "missed (" + ", ".join(b[2]) + ")"))
            rows.append(row)
    head = ["workload", "cell", "ratio placement / kv", "TTFT p99 ms placement / kv", "req/s placement / kv", "goal"]
    if before:
        head.append("goal before")
    return table(head, rows) + f"\nCells missing the goal: {misses} of {len(rows)}.\n"


# ---- docs/results.md ----

def results_sweep():
    return sweep_tables(index(load("sweep-inprocess.json")))


def results_sensitivity():
    return sensitivity_tables(index(load("sweep-inprocess.json")))


def results_fullstack():
    sweep = index(load("sweep-inprocess.json"))
    matched = index(load("inprocess-matched.json"))
    fs = median_fullstack(load("fullstack.json"))
    return fullstack_tables(sweep, matched, fs) + run1_table(fs)


# ---- docs/results-killpod.md ----

def killpod_table(directory):
    """Requests failed while a pod is killed under load: one row per max_fallbacks, the
    runs' failed requests in file order and their median (kvdemo --kill-worker-after
    --json, one file per run)."""
    import glob
    runs = {}
    shape = None
    for path in sorted(glob.glob(os.path.join(ROOT, directory, "*.json"))):
        with open(path) as f:
            for r in json.load(f):
                if not r.get("kill_worker_after_s"):
                    continue
                key = (r["workers"], r["requests"], r["concurrency"], r["policy"], r["gateway"], r["kill_worker_after_s"])
                if shape is None:
                    shape = key
                elif key != shape:
                    raise SystemExit(f"{path}: a run of another shape {key} than {shape}")
                runs.setdefault(r["max_fallbacks"], []).append(r["errors"])
    if shape is None:
        raise SystemExit(f"{directory}: no kill runs")
    workers, requests, conc, policy, gateway, after = shape
    head = (f"{workers} vllm-sim servers, kvrouter (policy {policy}) behind the {gateway} gateway; "
            f"{requests} requests at concurrency {conc}, server 0 killed (SIGKILL) {after:g} s into the load.\n")
    rows = []
    for n in sorted(runs):
        label = "passive health, no fallbacks" if n == 0 else f"passive health and {n} fallbacks"
        errs = runs[n]
        rows.append([f"{label} (`--max-fallbacks {n}`)", ", ".join(str(e) for e in errs), len(errs),
                     f"{statistics.median(errs):g}"])
    return head + table(["", "failed requests", "runs", "median"], rows)


# ---- docs/faults.md ----

def faults_table(path):
    """The fault suite's table (kvdemo faults --json)."""
    with open(os.path.join(ROOT, path)) as f:
        rep = json.load(f)
    nr = rep.get("servers_without_replay", 0)
    replay = (f"the last {nr} without a replay socket" if nr else "all with a replay socket")
    head = (f"{rep['workers']} vllm-sim servers ({replay}), kvrouter (policy {rep['policy']}) behind the dev gateway; "
            f"{rep['requests_per_fault']} kvbench requests at concurrency {rep['concurrency']} through the gateway during each fault; "
            f"the suite's open-file limit {rep['open_file_limit']}.\n")
    rows = []
    for r in rep["rows"]:
        other = ", ".join(f"{n} {c}" for c, n in sorted(r.get("failed_by", {}).items())) or "-"
        def aware(v):
            return "not within 30 s" if v < 0 else f"{v:.0f}"
        div = "-" if r["divergence_blocks"] is None else str(r["divergence_blocks"])
        if r["divergence_blocks"] and r.get("divergence_by_server"):
            div += " (" + ", ".join(str(d) for d in r["divergence_by_server"]) + ")"
        note = r.get("note", "").replace("|", "\\|")
        if len(note) > 160:
            note = note[:157] + "..."
        rows.append([r["fault"], f"{r['failed_router']} / {r['requests']}", other, aware(r["kv_aware_after_ms"]),
                     aware(r["kv_aware_from_start_ms"]), f"{r['peak_rss_mb']:.0f}", r["peak_goroutines"], div, note])
    return head + table(["fault", "failed by the router / sent", "failed, other cause", "KV-aware after end (ms)",
                         "KV-aware after start (ms)", "kvrouter peak RSS (MB)", "peak goroutines",
                         "index divergence (blocks; per server, index - cache)", "note"], rows)


# ---- docs/latency.md ----

def latency_table(*paths):
    """kvdemo latency --json runs (TLS and plaintext), one row per endpoints x server
    setting: medians over the runs' rounds of the p50/p99 ratios against the trivial
    server measured in the same run, and of each process's CPU time per exchange."""
    rows = []
    groups = {}
    for path in paths:
        with open(os.path.join(ROOT, path)) as f:
            rep = json.load(f)
        rounds = rep["rounds"]
        for i in range(0, len(rounds) - 1, 2):
            k, t = rounds[i], rounds[i + 1]
            g = groups.setdefault(("plaintext" if rep["plaintext"] else "TLS", k["endpoints"]),
                                  {"runs": set(), "load": [], "p50": [], "p99": [], "kp50": [], "kp99": [],
                                   "tp50": [], "tp99": [], "kcpu": [], "tcpu": [], "kflt": [], "rate": []})
            g["runs"].add(path)
            g["load"].append(rep["loadavg_start"])
            g["p50"].append(k["p50_us"] / t["p50_us"])
            g["p99"].append(k["p99_us"] / t["p99_us"])
            g["kp50"].append(k["p50_us"]); g["kp99"].append(k["p99_us"])
            g["tp50"].append(t["p50_us"]); g["tp99"].append(t["p99_us"])
            g["kcpu"].append(k["cpu_us_per_exchange"]["kvrouter"])
            g["tcpu"].append(t["cpu_us_per_exchange"]["trivial"])
            if "minor_faults_per_exchange" in k:  # runs before 2026-12-01 did not record them
                g["kflt"].append(k["minor_faults_per_exchange"]["kvrouter"])
            g["rate"].append(min(k["achieved_per_s"], t["achieved_per_s"]))
    med = statistics.median
    for (mode, n), g in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        rows.append([mode, n, f"{len(g['runs'])} x {len(g['p50']) // len(g['runs'])}",
                     f"{min(g['load']):.1f}-{max(g['load']):.1f}",
                     f"{med(g['p50']):.2f} ({min(g['p50']):.2f}-{max(g['p50']):.2f})",
                     f"{med(g['p99']):.2f} ({min(g['p99']):.2f}-{max(g['p99']):.2f})",
                     f"{med(g['kp50']):.0f} / {med(g['kp99']):.0f}", f"{med(g['tp50']):.0f} / {med(g['tp99']):.0f}",
                     f"{med(g['kcpu']):.0f}", f"{med(g['tcpu']):.0f}",
                     f"{med(g['kflt']):.1f} ({min(g['kflt']):.1f}-{max(g['kflt']):.1f})" if g["kflt"] else "-",
                     f"{min(g['rate']):.0f}"])
    return table(["transport", "endpoints", "runs x rounds", "load avg at start", "p50 ratio, median (range)",
                  "p99 ratio, median (range)", "kvrouter p50 / p99 µs", "trivial p50 / p99 µs",
                  "kvrouter CPU µs/exchange", "trivial CPU µs/exchange",
                  "kvrouter minor faults/exchange, median (range)", "lowest achieved req/s"], rows)


# ---- docs/results-replicas.md ----

def replicas_fullstack_table(path):
    """kvdemo replicas --json: one router vs 2 replicas synced vs unsynced, medians over seeds."""
    with open(os.path.join(ROOT, path)) as f:
        rep = json.load(f)
    seeds = sorted({r["seed"] for r in rep["runs"]})
    head = (f"{rep['workers']} vllm-sim servers ({rep['kv_mib']} MiB KV cache each, time scale {rep['time_scale']:g}), "
            f"N={rep['prefixes']} prefixes of {rep['prefix_tokens']} tokens + {rep['tail_tokens']}-token tails, "
            f"{rep['output_tokens']} output tokens, {rep['requests']} requests at concurrency {rep['concurrency']} through the dev gateway; "
            f"median of {len(seeds)} runs (seeds {', '.join(map(str, seeds))}), errors summed.\n")
    med = statistics.median
    rows = []
    # Runs recorded before kvdemo read the hold counters have no holds columns.
    with_holds = all("holds" in x for r in rep["runs"] for x in r["routers"])
    policies = list(dict.fromkeys(r["policy"] for r in rep["runs"]))
    for pol in policies:
        for su in rep["setups"]:
            runs = [r for r in rep["runs"] if r["policy"] == pol and r["setup"] == su["name"]]
            if not runs:
                continue
            sm = lambda k: med(r["summary"][k] for r in runs)
            routed = [sum(x["routed"] for x in r["routers"]) for r in runs]
            share = "-"
            if su["routers"] > 1:
                share = " / ".join(f"{med(r['routers'][i]['routed'] / max(sum(x['routed'] for x in r['routers']), 1) for r in runs):.2f}"
                                   for i in range(su["routers"]))
            cpu = med(1000 * sum(x["cpu_s"] for x in r["routers"]) / max(t, 1) for r, t in zip(runs, routed))
            sync = lambda k: med(sum(x[k] for x in r["routers"]) / max(t, 1) for r, t in zip(runs, routed))
            synced = su["routers"] > 1 and any(x["sync_sent"] > 0 for r in runs for x in r["routers"])
            msgs = f"{sync('sync_sent'):.2f}" if synced else "-"
            byts = f"{sync('sync_bytes_received'):.0f}" if synced else "-"
            p99 = med(r["decision_p99_le_us"] for r in runs)
            dec = f"{med(r['decision_mean_us'] for r in runs):.0f} / {'>25000' if p99 < 0 else f'{p99:g}'}"
            lags = [r for r in runs if r.get("sync_lag_mean_ms") is not None]
            lag = "-"
            if lags:
                lp99 = med(r["sync_lag_p99_le_ms"] for r in lags)
                lag = f"{med(r['sync_lag_mean_ms'] for r in lags):.1f} / {'>1000' if lp99 < 0 else f'{lp99:g}'}"
            row = [pol, su["name"], f"{sm('cached_ratio'):.3f}", f"{sm('ttft_p50_ms'):.0f} / {sm('ttft_p99_ms'):.0f}",
                   f"{sm('requests_per_s'):.1f}", sum(r["summary"]["errors"] for r in runs), share, msgs, byts, lag,
                   f"{cpu:.2f}", dec]
            if with_holds:
                held = med(sum(x.get("holds", 0) for x in r["routers"]) / max(t, 1) for r, t in zip(runs, routed))
                hold_ms = med(1000 * sum(x.get("hold_s", 0) for x in r["routers"]) / max(t, 1) for r, t in zip(runs, routed))
                row += [f"{held:.2f}", f"{hold_ms:.2f}"]
            rows.append(row)
    cols = ["policy", "routers", "cached-token ratio", "TTFT p50 / p99 ms", "req/s", "errors",
            "share routed per replica", "snapshots sent / routed request", "bytes received / routed request",
            "sync lag mean / p99 <= ms", "router CPU ms / routed request", "decision mean / p99 <= us"]
    if with_holds:
        cols += ["holds / routed request", "hold ms / routed request"]
    return head + table(cols, rows)


def replicas_faults_table(path):
    """kvdemo faults --replicas --json: the replica faults."""
    with open(os.path.join(ROOT, path)) as f:
        rep = json.load(f)
    head = (f"{rep['routers']} kvrouter replicas (policy {rep['policy']}, peersync defaults: expiry {rep['expiry_ms']:.0f} ms, "
            f"join_interval {rep['join_interval_ms']:.0f} ms) over {rep['workers']} vllm-sim servers behind the dev gateway; "
            f"{rep['requests_per_phase']} kvbench requests at concurrency {rep['concurrency']} per phase, each phase on new prefixes; "
            f"partition held {rep['partition_ms'] / 1000:g} s.\n")
    ms = lambda r, k: "-" if r.get(k) is None else ("not within 30 s" if r[k] < 0 else f"{r[k]:.0f}")
    rows = []
    for r in rep["rows"]:
        after = "-" if r.get("after_ratio") is None else f"{r['after_ratio']:.3f}"
        note = r.get("note", "").replace("|", "\\|")
        if len(note) > 160:
            note = note[:157] + "..."
        rows.append([r["fault"], f"{r['failed']} / {r['requests']}", f"{r['cached_ratio']:.3f}", after,
                     r.get("phantom_requests", 0) or "-", ms(r, "gone_after_ms"), ms(r, "ready_after_ms"),
                     ms(r, "caught_up_after_ms"), ms(r, "split_after_ms"), ms(r, "healed_after_ms"), note])
    return head + table(["fault", "failed / sent", "cached-token ratio", "ratio after heal", "peer's requests in flight at kill",
                         "its state gone after (ms)", "restarted: ready after (ms)", "caught up after (ms)",
                         "split after (ms)", "healed after (ms)", "note"], rows)


# ---- extproc/README.md ----

def bench_values(path):
    """Go benchmark output (lines starting "Benchmark", "# ... load X" comments between
    runs): {sub-benchmark: {unit: [values]}} and the load averages noted."""
    runs, loads = {}, []
    with open(os.path.join(ROOT, path)) as f:
        for line in f:
            if line.startswith("#"):
                loads.append(float(line.split()[-1]))
                continue
            if not line.startswith("Benchmark"):
                continue
            fields = line.split()
            name = fields[0].split("/", 1)[1].rsplit("-", 1)[0] if "/" in fields[0] else fields[0]
            for value, unit in zip(fields[2::2], fields[3::2]):
                runs.setdefault(name, {}).setdefault(unit, []).append(float(value))
    return runs, loads


def turn_vs_cold_table(*paths):
    """BenchmarkDecisionTurnVsCold outputs, one file per build run alternately with the
    others: per build and conversation size, the median of turn/cold (range), how many
    values reached 2 (issue 14's bound), and the median CPU of each side."""
    med = statistics.median
    rows = []
    for size in ["2k", "32k", "128k"]:
        for path in paths:
            runs, loads = bench_values(path)
            v = runs.get(size)
            if not v:
                continue
            r = v["turn/cold"]
            rows.append([size, os.path.splitext(os.path.basename(path))[0], f"{min(loads):.1f}-{max(loads):.1f}",
                         f"{med(r):.2f} ({min(r):.2f}-{max(r):.2f})", f"{sum(x >= 2 for x in r)} of {len(r)}",
                         f"{med(v['turn-cpu-ns/op']) / 1e3:.0f}", f"{med(v['cold2k-cpu-ns/op']) / 1e3:.0f}"])
    return table(["history", "build (data file)", "load average", "turn/cold, median (range)", "values of 2 or more",
                  "turn CPU µs, median", "cold 2k CPU µs, median"], rows)


RENDERERS = {
    "turn-vs-cold": turn_vs_cold_table,
    "faults": faults_table,
    "killpod": killpod_table,
    "replicas-fullstack": replicas_fullstack_table,
    "replicas-faults": replicas_faults_table,
    "latency": latency_table,
    "reference": reference_tables,
    "results-sweep": results_sweep,
    "results-sensitivity": results_sensitivity,
    "results-fullstack": results_fullstack,
    "cells": cells_table,
    "goal": goal_table,
    "seeds": seeds_table,
    "seeds-replicas": seeds_replicas_table,
    "vs-kv": vs_kv_table,
    "replicas": replicas_table,
    "runs": runs_table,
    "workload": workload_table,
    "workload-summary": workload_summary,
    "workload-margins": workload_margins,
}

# Package READMEs with rendered blocks: rendered and checked like docs/, but their older
# hand-written tables are not refused (they predate this script; new ones are rendered).
READMES = ["extproc/README.md"]

BLOCK = re.compile(r"(<!-- render: ([^>]*?) -->\n)(.*?)(<!-- /render -->)", re.S)
TABLE_RULE = re.compile(r"^\|(\s*:?-+:?\s*\|)+\s*$", re.M)


def render_file(path):
    with open(path) as f:
        text = f.read()
    problems = []

    def one(m):
        words = m.group(2).split()
        fn = RENDERERS.get(words[0]) if words else None
        if fn is None:
            problems.append(f"{path}: unknown renderer {m.group(2)!r} (known: {', '.join(RENDERERS)})")
            return m.group(0)
        body = fn(*words[1:]).strip("\n")
        return f"{m.group(1)}\n{body}\n\n{m.group(4)}"

    new = BLOCK.sub(one, text)
    outside = TABLE_RULE.findall(BLOCK.sub("", new))
    if outside and os.path.relpath(path, ROOT) not in READMES:
        problems.append(f"{path}: {len(outside)} table(s) outside a rendered block: render them from committed data")
    return text, new, problems


def main():
    if sys.argv[1:2] == ["print"]:
        # python3 scripts/docs.py print NAME ARG...: one renderer's output, to read a run.
        print(RENDERERS[sys.argv[2]](*sys.argv[3:]))
        return
    check = "--check" in sys.argv[1:]
    paths = []
    for d, _, files in os.walk(os.path.join(ROOT, "docs")):
        paths += [os.path.join(d, f) for f in files if f.endswith(".md")]
    paths += [os.path.join(ROOT, p) for p in READMES]
    failed = False
    for path in sorted(paths):
        old, new, problems = render_file(path)
        rel = os.path.relpath(path, ROOT)
        for p in problems:
            print(os.path.relpath(p, ROOT) if p.startswith(ROOT) else p, file=sys.stderr)
            failed = True
        if old != new:
            if check:
                print(f"{rel}: a rendered table differs from its committed data: run make docs", file=sys.stderr)
                failed = True
            else:
                with open(path, "w") as f:
                    f.write(new)
                print(f"rendered {rel}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
