#!/usr/bin/env python3
"""Progress of a resumable paired design run from its per-trial records:
python3 status.py DESIGN_DIR (e.g. docs/results/design/paired-main2).
Prints points complete (every procedure with its trials), trials, load,
time span, builds, and backup-first trials that ended without the detour."""
import collections, glob, json, statistics as st, sys

d = sys.argv[1] if len(sys.argv) > 1 else "."
design = json.load(open(d + "/design.json"))
procs, trials = design["procedures"], design["trials"]
r = [json.loads(l) for f in sorted(glob.glob(d + "/runs/paired*/trials.jsonl")) for l in open(f)]
ok = collections.Counter((x["configuration"], x["cell"]) for x in r if x["status"] == "ok")
points = sorted({x["configuration"] for x in r})
complete = [p for p in points if all(ok[(p, c)] >= trials for c in procs)]
print(f"points started {len(points)}, complete {len(complete)} ({trials} ok trials of each of {len(procs)} procedures)")
print("complete:", ",".join(complete))
partial = [p for p in points if p not in complete]
if partial:
    print("incomplete:", ", ".join(f"{p} ({sum(min(ok[(p, c)], trials) for c in procs)} of {trials * len(procs)})" for p in partial))
bad = [x for x in r if x["status"] != "ok"]
print(f"trials {len(r)}, ok {len(r) - len(bad)}, not ok {len(bad)}" + "".join(f"\n  {x['configuration']}/{x['cell']}/{x['trial']}: {x['status']} {x.get('error', '')}" for x in bad))
loads = [x["loadavg_1m"] for x in r if "loadavg_1m" in x]
if loads:
    q = st.quantiles(loads, n=10) if len(loads) > 1 else loads * 9
    print(f"1-min load at the trials' ends: min {min(loads):.2f}, median {st.median(loads):.2f}, 90th percentile {q[-1]:.2f}, max {max(loads):.2f}")
starts = sorted(x["start"] for x in r)
if starts:
    print(f"first trial {starts[0][:19]}Z, last {starts[-1][:19]}Z")
print("builds:", dict(collections.Counter(f"mpdetour {x['versions'].get('mpdetour')}, mpdetour-lab {x['versions'].get('mpdetour-lab')}" for x in r)))
bf = [x for x in r if x["status"] == "ok" and x["cell"] == "mptcp-backup-first"]
one = sorted(f"{x['configuration']}/{x['trial']}" for x in bf if len(x.get("subflows") or []) < 2)
print(f"backup-first trials ending with fewer than 2 subflows: {len(one)} of {len(bf)}" + (": " + ", ".join(one) if one else ""))
for c in procs:
    g = [x.get("max_gap_s", 0) for x in r if x["status"] == "ok" and x["cell"] == c]
    if g:
        print(f"{c}: {len(g)} ok trials, longest gap > 1 s in {sum(v > 1 for v in g)}, > 3 s in {sum(v > 3 for v in g)}, max {max(g):.1f} s")

# With a second design directory (python3 status.py DIR OTHER, e.g. paired-bf): per complete
# point, each MPTCP procedure's mean here and there (another run: other build and load, so
# context, not a paired comparison), and the geometric mean of here / there.
if len(sys.argv) > 2:
    o = sys.argv[2]
    ro = [json.loads(l) for f in sorted(glob.glob(o + "/runs/paired*/trials.jsonl")) for l in open(f)]
    def means(rs):
        m = collections.defaultdict(list)
        for x in rs:
            if x["status"] == "ok":
                m[(x["configuration"], x["cell"])].append(x["goodput_mbps"])
        return {k: st.mean(v) for k, v in m.items()}
    mh, mo = means(r), means(ro)
    cells = [c for c in procs if c.startswith("mptcp-") and c != "mptcp-1sf"]
    print(f"\n| point | " + " | ".join(f"{c} here | {c} {o.rstrip('/').split('/')[-1]}" for c in cells) + " |")
    print("|---|" + "---:|---:|" * len(cells))
    logs = collections.defaultdict(list)
    import math
    for p in complete:
        row = []
        for c in cells:
            h, t = mh.get((p, c)), mo.get((p, c))
            row += [f"{h:.2f}" if h else "-", f"{t:.2f}" if t else "-"]
            if h and t:
                logs[c].append(math.log(h / t))
        print(f"| {p} | " + " | ".join(row) + " |")
    for c in cells:
        if logs[c]:
            print(f"{c}: here / {o.rstrip('/').split('/')[-1]} geometric mean {math.exp(st.mean(logs[c])):.3f} over {len(logs[c])} points")
