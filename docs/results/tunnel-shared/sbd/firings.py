#!/usr/bin/env python3
"""When the shared-bottleneck rule acted, from the agent logs the bench kept
(MPDETOUR_BENCH_KEEP=1, chunks 2-4): for each static+sbd trial whose log was
kept, the rule's INFO lines ("shared bottleneck: subflow taken out of
scheduling") within the trial, seconds after the trial's start, which path
was taken out and the statistics. Writes firings.txt (the lines) and
prints a table. Usage: firings.py [run-log.txt]"""
import json, os, re, sys
from datetime import datetime, timezone

here = os.path.dirname(os.path.abspath(__file__))
log = open(os.path.join(here, "run-log.txt")).read().splitlines()
dirs, cur = [], None
for l in log:
    m = re.match(r"\[(\S+)\] lab up", l)
    if m:
        cur = m.group(1)
    m = re.search(r"kept in (/tmp/mpdetour-bench-\d+)", l)
    if m and cur:
        dirs.append((cur, m.group(1)))
ts = lambda s: datetime.fromisoformat(s.replace("Z", "+00:00"))
trials = [json.loads(l) for l in open(os.path.join(here, "trials.jsonl"))]
sbd = [t for t in trials if t["procedure"] == "mptcp-tunnel-static-sbd"]
lines, fired = [], {}
for conf, d in dirs:
    p = os.path.join(d, "mptcp-tunnel-static-sbd", "agent.log")
    if not os.path.exists(p):
        continue
    for l in open(p):
        if "shared bottleneck: subflow taken out" not in l:
            continue
        t = ts(re.search(r"time=(\S+)", l).group(1))
        for tr in sbd:
            st = ts(tr["start"])
            if tr["configuration"] == conf and 0 <= (t - st).total_seconds() <= 15:
                path = re.search(r" path=(\S+)", l).group(1)
                fired.setdefault((conf, tr["trial"]), []).append(((t - st).total_seconds(), path))
                lines.append(f"{conf} trial {tr['trial']} +{(t - st).total_seconds():.1f}s: " + l.strip())
with open(os.path.join(here, "firings.txt"), "w") as f:
    f.write("\n".join(lines) + "\n")
logged = {}
for conf, d in dirs:
    if os.path.exists(os.path.join(d, "mptcp-tunnel-static-sbd", "agent.log")):
        for tr in sbd:
            if tr["configuration"] == conf:
                logged.setdefault(conf, set())
# trials covered by kept logs: those started after the first kept dir's configuration came up
first = min((os.path.getmtime(d) for _, d in dirs), default=0)
print("| configuration | trials with the agent log kept | rule acted in | seconds after the trial's start | path taken out |")
print("|---|---:|---:|---|---|")
for conf in ["symmetric-loss1", "symmetric-delay100", "core-limited", "core-limited-delay100"]:
    covered = [tr for tr in sbd if tr["configuration"] == conf and ts(tr["start"]).timestamp() >= first]
    f = [fired[(conf, tr["trial"])] for tr in covered if (conf, tr["trial"]) in fired]
    secs = ", ".join(f"{x[0][0]:.1f}" for x in f)
    paths = ", ".join(sorted({x[0][1] for x in f}))
    print(f"| {conf} | {len(covered)} | {len(f)} | {secs} | {paths} |")
