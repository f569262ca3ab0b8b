#!/usr/bin/env python3
"""drops.py TRIALS.jsonl TC.txt [POINT] [--trim OUT]: per trial of POINT (default p197), the packets
sent into and dropped by the default path's forward bottleneck (the tbf on r1's device C0, 25
packets at p197; lowat-p149 run D), counted as in lowat-p149/tcdiff.py: from the last tc sample at
or before the trial's start to the last within its window + 3 s. A window in which the counters fall
(the lab was rebuilt: a trial at a point's edge) is shown as "reset"; a failed trial as "failed"
(not counted). Then per procedure the sum over
its counted trials. --trim OUT writes the tc lines within POINT's trials (start - 5 s to end + 5 s)."""
import collections, datetime, json, sys

args = [a for a in sys.argv[1:] if not a.startswith("--")]
trials_path, tc_path = args[0], args[1]
point = args[2] if len(args) > 2 and not args[2].endswith(".txt") else "p197"


def ts(s):
    """An RFC 3339 UTC time (Z), fraction cut to microseconds."""
    s = s.rstrip("Z")
    if "." in s:
        a, f = s.split(".")
        s = a + "." + f[:6]
    return datetime.datetime.fromisoformat(s + "+00:00")


samples = []  # (time, sent, dropped, line)
lines = open(tc_path).read().splitlines()
for l in lines:
    p = l.split()
    if p[1].endswith("-r1") and p[2] == "C0":
        kv = dict(x.split("=") for x in p[3:])
        samples.append((ts(p[0]), int(kv["sent"]), int(kv["dropped"])))
trials = [json.loads(l) for l in open(trials_path)]
trials = [t for t in trials if t["configuration"] == point]
print(f"| trial | procedure | goodput Mbit/s | load | r1 C0 sent | dropped | dropped % |")
print("|---:|---|---:|---:|---:|---:|---:|")
tot = collections.defaultdict(lambda: [0, 0, 0])
for t in sorted(trials, key=lambda t: t["start"]):
    st = ts(t["start"])
    end = t.get("window_s", 10) + 3
    b = [s for s in samples if s[0] <= st]
    d = [s for s in samples if 0 < (s[0] - st).total_seconds() <= end]
    w = [s for s in samples if b and b[-1][0] <= s[0] and d and s[0] <= d[-1][0]]
    g, la = t["goodput_mbps"], t.get("loadavg_1m", float("nan"))
    if t["status"] != "ok":
        cell = "failed | | "
    elif not b or not d:
        cell = "- | - | -"
    elif any(y[1] < x[1] for x, y in zip(w, w[1:])):
        cell = "reset | | "
    else:
        sent, drop = d[-1][1] - b[-1][1], d[-1][2] - b[-1][2]
        cell = f"{sent} | {drop} | " + (f"{100 * drop / sent:.2f}" if sent else "-")
        a = tot[t["cell"]]
        a[0] += 1; a[1] += sent; a[2] += drop
    print(f"| {t['trial']} | {t['cell']} | {g:.2f} | {la:.2f} | {cell} |")
print()
print("| procedure | trials counted | sent | dropped | dropped % |")
print("|---|---:|---:|---:|---:|")
for c in sorted(tot):
    n, s, dr = tot[c]
    print(f"| {c} | {n} | {s} | {dr} | " + (f"{100 * dr / s:.2f} |" if s else "- |"))
if "--trim" in sys.argv:
    out = sys.argv[sys.argv.index("--trim") + 1]
    lo = min(ts(t["start"]) for t in trials) - datetime.timedelta(seconds=5)
    hi = max(ts(t["start"]) + datetime.timedelta(seconds=t.get("window_s", 10) + 5) for t in trials)
    with open(out, "w") as f:
        for l in lines:
            if lo <= ts(l.split()[0]) <= hi:
                f.write(l + "\n")
