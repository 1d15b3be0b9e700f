#!/usr/bin/env python3
"""Render docs/results.md's tables from the committed JSON (stdlib only).

    python3 docs/data/render_tables.py > /tmp/tables.md

Inputs (all in docs/data/):
  sweep-inprocess.json      kvbench --sim --sweep, the reference grid, 3 reps, medians
  inprocess-matched.json    kvbench --sim at the full stack's settings (C=8, rtt 0, ...)
  fullstack.json            kvdemo runs through the full stack, one record per rep
  fullstack-run1.json       the same full-stack runs made earlier, before merging integrate's
                            later changes (demo scrape settings, kv event-health fallback)
The reference figures are copied from /work/shared/reference-experiment.md.
Every "ours" figure is printed from the JSON; nothing is typed in by hand.
"""
import json
import os
import statistics

HERE = os.path.dirname(os.path.abspath(__file__))
NS = [2, 7, 12, 24]
POL = ["random", "round-robin", "kv", "approximate"]
REF_COL = {"random": "baseline", "round-robin": "round-robin", "kv": "kv"}

# The reference's 6-worker tables (reference-experiment.md), indexed by N.
REF = {
    "hit_c8": {"baseline": [95.0, 55.5, 32.1, 17.5], "round-robin": [95.0, 53.5, 29.2, 17.5],
               "kv": [97.5, 83.0, 67.9, 43.3]},
    "cached_c4": {"baseline": [.814, .431, .241, .135], "round-robin": [.814, .385, .262, .126],
                  "kv": [.857, .788, .664, .429]},
    "cached_c16": {"baseline": [.814, .425, .268, .141], "round-robin": [.814, .442, .237, .148],
                   "kv": [.835, .779, .695, .431]},
    "cached_c8": {"round-robin": [.814, .439, .247, .149], "kv": [.835, .702, .573, .361],
                  "kv, no seed": [.848, .729, .547, .343], "approximate": [.848, .638, .480, .245]},
    "spp_c4": {"round-robin": [6.00, 6.00, 6.00, 5.92], "kv": [1.00, 2.86, 4.00, 5.17]},
    "ttft_c4": {"baseline": [(37, 122), (63, 184), (94, 193), (101, 254)],
                "round-robin": [(41, 125), (89, 142), (106, 140), (113, 143)],
                "kv": [(34, 73), (40, 129), (43, 138), (64, 149)]},
    "ttft_c16": {"baseline": [(64, 325), (142, 1353), (193, 1441), (205, 1508)],
                 "round-robin": [(74, 332), (111, 576), (190, 646), (199, 774)],
                 "kv": [(67, 206), (72, 240), (77, 193), (109, 242)]},
    "rps_c16": {"baseline": [18.9, 14.1, 13.9, 13.3], "round-robin": [19.1, 16.0, 14.7, 14.3],
                "kv": [21.1, 20.1, 19.2, 17.6]},
    # kv request hit rate at C=4 / 8 / 16, and the bound, for N = 7, 12, 24.
    "kv_bound": {7: (100, (93, 83, 91)), 12: (100, (80, 68, 82)), 24: (99, (52, 43, 52))},
}


def load(name):
    with open(os.path.join(HERE, name)) as f:
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
    s.append("### Cached-token ratio, concurrency 4 and 16 (ours / reference (ours - reference); max 0.857)\n")
    rows = []
    for c, key in ((4, "cached_c4"), (16, "cached_c16")):
        for i, n in enumerate(NS):
            rows.append([n, c] + [ratio_cell(ix[(p, n, c)]["cached_ratio"], ref_of(key, p, i)) for p in POL]
                        + [f"{ix[('kv', n, c)]['bound_cached_ratio']:.3f}"])
    s.append(table(["N", "C", "random / baseline", "round-robin", "kv", "approximate", "bound"], rows))

    s.append("\n### Cached-token ratio, concurrency 8 (the reference's hash-seed table)\n")
    rows = []
    for i, n in enumerate(NS):
        rows.append([n] + [ratio_cell(ix[(p, n, 8)]["cached_ratio"], ref_of("cached_c8", p, i)) for p in POL]
                    + [f"- / {REF['cached_c8']['kv, no seed'][i]:.3f}", f"{ix[('kv', n, 8)]['bound_cached_ratio']:.3f}"])
    s.append(table(["N", "random", "round-robin", "kv", "approximate", "kv, no seed (ref only)", "bound"], rows))

    s.append("\n### Request hit rate, concurrency 8 (any cached token; ours / reference (points))\n")
    rows = []
    for i, n in enumerate(NS):
        rows.append([n] + [pct_cell(ix[(p, n, 8)]["hit_any"], ref_of("hit_c8", p, i)) for p in POL])
    s.append(table(["N", "random / baseline", "round-robin", "kv", "approximate"], rows))
    s.append("\nThe same with the whole shared prefix cached (`hit_full`, ours only):\n")
    rows = [[n] + [f"{100 * ix[(p, n, 8)]['hit_full']:.1f}%" for p in POL] for n in NS]
    s.append(table(["N"] + POL, rows))

    s.append("\n### TTFT p50 / p99, ms (ours ; reference)\n")
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

    s.append("\n### Throughput, requests/s, concurrency 16 (ours / reference (relative))\n")
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

    s.append("\n### Distinct servers per prefix, concurrency 4 (ours / reference)\n")
    rows = []
    for i, n in enumerate(NS):
        row = [n]
        for p in POL:
            o, ref = ix[(p, n, 4)]["servers_per_prefix"], ref_of("spp_c4", p, i)
            row.append(f"{o:.2f} / {ref:.2f}" if ref is not None else f"{o:.2f} / -")
        rows.append(row)
    s.append(table(["N", "random", "round-robin", "kv", "approximate"], rows))

    s.append("\n### kv request hit rate against the bound, concurrency 4 / 8 / 16 (ours ; reference)\n")
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
    s.append("### Concurrency 8: cached-token ratio, in-process (calibrated) / in-process (matched) / full stack; reference\n")
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

    s.append("\n### Concurrency 8: request hit rate (any), in-process (calibrated) / matched / full stack; reference\n")
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

    s.append("\n### Concurrency 8, full stack against the matched in-process run: TTFT, throughput, servers per prefix, engine hit rate\n")
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
    d = os.path.join(HERE, "sensitivity")
    if not os.path.isdir(d):
        return ""
    sens = {f[:-5]: index(json.load(open(os.path.join(d, f)))) for f in os.listdir(d) if f.endswith(".json")}
    s = ["### kv, concurrency 8: cached-token ratio against the KV-event lag the router sees (rtt 35 ms, scrape 50 ms)\n"]
    lags = ["lag-0s", "lag-5ms", "lag-50ms", "lag-250ms"]
    rows = [[n] + [f"{sens[l][('kv', n, 8)]['cached_ratio']:.3f}" for l in lags] for n in NS]
    s.append(table(["N", "0 ms", "5 ms (default)", "50 ms", "250 ms"], rows))
    s.append("\n### Concurrency 8: cached-token ratio with the client round trip at 35 ms (calibrated) and 0 (as on loopback)\n")
    rows = [[n] + [f"{ix_sweep[(p, n, 8)]['cached_ratio']:.3f} ; {sens['rtt0'][(p, n, 8)]['cached_ratio']:.3f}" for p in POL] for n in NS]
    s.append(table(["N"] + [p + " (35 ms ; 0)" for p in POL], rows))
    s.append("\n### Concurrency 8: cached-token ratio with one router replica and with two (each its own index / history and in-flight view)\n")
    rows = [[n] + [f"{ix_sweep[(p, n, 8)]['cached_ratio']:.3f} ; {sens['replicas2'][(p, n, 8)]['cached_ratio']:.3f}" for p in ("kv", "approximate")] for n in NS]
    s.append(table(["N", "kv (1 ; 2 replicas)", "approximate (1 ; 2 replicas)"], rows))
    return "".join(s)


def lag_table():
    """kvrouter's KV-event lag per policy, from the kvdemo logs (one line per run)."""
    import glob
    import re
    pat = re.compile(r"kvdemo: (\S+): KV-event lag over (\d+) batches: mean ([\d.]+) ms, p50 <= ([\d.]+) ms, p99 <= ([\d.]+) ms")
    runs = {}
    for path in sorted(glob.glob(os.path.join(HERE, "fullstack", "n*-seed?.log"))):
        for line in open(path):
            m = pat.search(line)
            if m:
                runs.setdefault(m.group(1), []).append((int(m.group(2)), float(m.group(3)), float(m.group(4)), float(m.group(5))))
    if not runs:
        return ""
    s = ["\n### kvrouter's KV-event lag (receive time minus the batch's timestamp), full stack, per run\n"]
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
    path = os.path.join(HERE, "fullstack-run1.json")
    if not os.path.exists(path):
        return ""
    r1 = median_fullstack(load("fullstack-run1.json"))
    s = ["\n#### The full stack twice: cached-token ratio, this run ; the earlier run (medians of 3 seeds)\n"]
    rows = [[n] + [f"{fs[(p, n)]['cached_ratio']:.3f} ; {r1[(p, n)]['cached_ratio']:.3f}" for p in POL] for n in NS]
    s.append(table(["N"] + POL, rows))
    return "".join(s)


def stats(sweep, matched, fs):
    """The summary figures the prose cites (not part of the page's tables)."""
    out = []
    d = sorted(((fs[(p, n)]["cached_ratio"] - matched[(p, n, 8)]["cached_ratio"], p, n) for p in POL for n in NS), key=lambda x: abs(x[0]))
    out.append("full vs matched cached: " + ", ".join(f"{p}/{n} {x:+.3f}" for x, p, n in d))
    out.append(f"  within 0.01: {sum(abs(x) <= 0.0105 for x, _, _ in d)}, max {max(abs(x) for x, _, _ in d):.3f}")
    d = sorted(((fs[(p, n)]["cached_ratio"] - sweep[(p, n, 8)]["cached_ratio"], p, n) for p in POL for n in NS), key=lambda x: abs(x[0]))
    out.append("full vs calibrated cached: " + ", ".join(f"{p}/{n} {x:+.3f}" for x, p, n in d))
    d = sorted(((100 * (fs[(p, n)]["hit_any"] - sweep[(p, n, 8)]["hit_any"]), p, n) for p in POL for n in NS), key=lambda x: abs(x[0]))
    out.append("full vs calibrated hit pts: " + ", ".join(f"{p}/{n} {x:+.1f}" for x, p, n in d))
    d = sorted(((fs[(p, n)]["ttft_p50_ms"] - matched[(p, n, 8)]["ttft_p50_ms"], p, n) for p in POL for n in NS))
    out.append("ttft p50 full - matched ms: " + ", ".join(f"{p}/{n} {x:+.0f}" for x, p, n in d))
    d = sorted(((100 * (fs[(p, n)]["requests_per_s"] / matched[(p, n, 8)]["requests_per_s"] - 1), p, n) for p in POL for n in NS))
    out.append("rps full/matched %: " + ", ".join(f"{p}/{n} {x:+.0f}" for x, p, n in d))
    for n in NS:
        k = fs[("kv", n)]["cached_ratio"]
        out.append(f"kv/random N={n} {k / fs[('random', n)]['cached_ratio']:.2f} kv/rr {k / fs[('round-robin', n)]['cached_ratio']:.2f}")
    out.append("errors " + str(sum(v["errors"] for v in fs.values())) + " reps " + str(sum(v["reps"] for v in fs.values())))
    return "\n".join(out)


def main():
    sweep = index(load("sweep-inprocess.json"))
    print("## In-process tables\n")
    print(sweep_tables(sweep))
    print("## Sensitivity (in-process)\n")
    print(sensitivity_tables(sweep))
    if os.path.exists(os.path.join(HERE, "fullstack.json")):
        matched = index(load("inprocess-matched.json"))
        fs = median_fullstack(load("fullstack.json"))
        print("## Full-stack tables\n")
        print(fullstack_tables(sweep, matched, fs))
        print(run1_table(fs))
        if os.environ.get("STATS"):
            print(stats(sweep, matched, fs))


if __name__ == "__main__":
    main()
