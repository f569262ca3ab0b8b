#!/usr/bin/env python3
"""What was run, from runs/paired*/trials.jsonl, load.txt and load30.txt in DIR (default: this
directory): trials and their status, builds, times, points completed per shard (3 ok trials of every
procedure) in the shard's run order, the 1-min load."""
import collections, glob, json, os, statistics, sys

d = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
procs = ["tcp-path1", "tcp-path2", "mptcp-1sf", "mptcp-static", "mptcp-static+lowat"]
order = open(os.path.join(d, "only.txt")).read().strip().split(",")
recs = []
for f in sorted(glob.glob(os.path.join(d, "runs", "paired*", "trials.jsonl"))):
    recs += [dict(json.loads(l), _shard=f.split("/")[-2]) for l in open(f) if l.strip()]
st = collections.Counter(r["status"] for r in recs)
print(f"trials: {len(recs)}, status: {dict(st)}")
print("builds:", dict(collections.Counter((r["versions"]["mpdetour"], r["versions"]["mpdetour-lab"]) for r in recs)))
starts = sorted(r["start"] for r in recs)
if starts:
    print(f"first trial start {starts[0]}, last trial start {starts[-1]}")
ok = collections.Counter((r["configuration"], r["cell"]) for r in recs if r["status"] == "ok")
for k, sh in ((1, order[1::2]), (2, order[0::2])):
    done = [p for p in sh if all(ok[(p, c)] >= 3 for c in procs)]
    part = [p for p in sh if p not in done and any(ok[(p, c)] for c in procs)]
    print(f"shard {k}: {len(done)} of {len(sh)} complete: {', '.join(done)}; partial: {', '.join(part) or 'none'}; not run: {', '.join(p for p in sh if p not in done and p not in part)}")
bad = [(r["configuration"], r["cell"], r["trial"], r["status"]) for r in recs if r["status"] != "ok"]
print("not ok:", bad or "none")
la = [r["loadavg_1m"] for r in recs if r.get("loadavg_1m") is not None]
if la:
    print(f"load at the trials' ends: min {min(la):.2f}, median {statistics.median(la):.2f}, max {max(la):.2f} ({len(la)})")
for name in ("load.txt", "load30.txt"):
    p = os.path.join(d, name)
    if os.path.exists(p):
        col = 3 if name == "load.txt" else 1
        v = [float(l.split()[col]) for l in open(p) if l.strip()]
        print(f"{name}: median {statistics.median(v):.2f}, max {max(v):.2f} ({len(v)} samples)")
