#!/usr/bin/env python3
"""tinypath-fresh: the plan's decision rule (PLAN.md) on the tiny-path and non-tiny subsets, from
the design runner's results.json and report.md (both goodput windows) and the trials' subflows.

    python3 analyze.py [DIR] [--arms X,Y] [--first NAME=p001,p002,...] [--policy-log]   (markdown on stdout)

--arms: the procedures compared with static (default: mptcp-guard and G15); --first: the first
subset's name and points (default: tiny = this run's 13 tiny-path points); the other points of DIR
form the second subset ("other").

Per point and procedure the mean of the ok trials; X / static per point is the ratio of means; a
subset's geometric mean carries a Student t 95 % interval over its points' log ratios (as the
report's "geometric mean [95 % interval over points]"). Below / above static per point and harmed
points are the report's (bootstrap over rounds). A trial "shed" when the guard arms ended with one
subflow (the runner keeps such a trial: "the policy may close a detour subflow"); the subflow left
says which path was shed. That misses sheds of the default path, whose subflow stays listed
(docs/results/design/probe-noshed): with --policy-log (runs of build ea0e1b41 or later, whose
trials record the agent's subflow decisions) a shed is a `subflow shed` line of the trial's
policy_log instead, and the shed path is that line's path=.
"""
import collections, json, math, os, re, statistics as st, sys

args = sys.argv[1:]
opt = lambda k, dflt: args[args.index(k) + 1] if k in args else dflt
d = args[0] if args and not args[0].startswith("--") else os.path.dirname(os.path.abspath(__file__))
S = "mptcp-static"
XS = tuple(opt("--arms", "mptcp-guard,mptcp-guard+share15+starveoff").split(","))
ARMS = (S,) + XS
FIRST, TINY = opt("--first", "tiny=" + ",".join("p014 p045 p089 p099 p101 p106 p111 p117 p127 p140 p147 p163 p189".split())).split("=")
TINY = TINY.split(",")
OTHER = "non-tiny" if FIRST == "tiny" else "other"
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
       10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110,
       18: 2.101, 19: 2.093, 20: 2.086, 21: 2.080, 22: 2.074}

recs = [r for r in json.load(open(os.path.join(d, "results.json"))) if r["status"] == "ok"]
report = open(os.path.join(d, "report.md")).read()
last, equal = report.split("### Over the equal window", 1)
windows = {"to the last byte": ("goodput_mbps", last), "equal window (1-10 s)": ("equal_goodput_mbps", equal.split("\n## ", 1)[0])}


def means(key):
    g = collections.defaultdict(list)
    for r in recs:
        g[(r["point"], r["procedure"])].append(r[key])
    return {k: st.mean(v) for k, v in g.items()}


def geo(ratios):
    logs = [math.log(x) for x in ratios]
    m = st.mean(logs)
    if len(logs) < 2:
        return f"{math.exp(m):.3f}"
    h = T95.get(len(logs) - 1, 1.96) * st.stdev(logs) / math.sqrt(len(logs))
    return f"{math.exp(m):.3f} [{math.exp(m - h):.3f}, {math.exp(m + h):.3f}]"


def verdicts(sec):
    """X -> (below points, above points) against static; arm -> harmed points."""
    vs, harmed = {}, {}
    for line in sec.splitlines():
        c = [x.strip() for x in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(c) == 7 and c[0] in XS:
            vs[c[0]] = (re.findall(r"p\d{3}", c[3]), re.findall(r"p\d{3}", c[4]))
        m = re.match(r"Harmed points, (\S+): (.*)$", line)
        if m:
            harmed[m.group(1)] = re.findall(r"p\d{3}", m.group(2))
    return vs, harmed


points = sorted({r["point"] for r in recs})
done = [p for p in points if all((p, a) in means("goodput_mbps") for a in ARMS + ("tcp-path1", "tcp-path2"))]
subsets = {FIRST: [p for p in done if p in TINY], OTHER: [p for p in done if p not in TINY], "all": done}
print(f"Points with every procedure measured: {len(done)} of {len(points)} ({len(subsets[FIRST])} {FIRST}, {len(subsets[OTHER])} {OTHER}); ok trials {len(recs)}.\n")

for wname, (key, sec) in windows.items():
    m = means(key)
    vs, harmed = verdicts(sec)
    print(f"### {wname}\n")
    print("| subset | points | X | X / static: geometric mean [95 % over points] | X below static | X above static | harmed static / X | mean >= 0.95 x best static / X |")
    print("|---|---:|---|---|---|---|---|---|")
    for sname, ps in subsets.items():
        if not ps:
            continue
        best = {p: max(m[(p, "tcp-path1")], m[(p, "tcp-path2")]) for p in ps}
        for x in XS:
            below, above = ([q for q in vs.get(x, ([], []))[i] if q in ps] for i in (0, 1))
            hs = [q for q in harmed.get(S, []) if q in ps]
            hx = [q for q in harmed.get(x, []) if q in ps]
            ns = sum(m[(p, S)] >= 0.95 * best[p] for p in ps)
            nx = sum(m[(p, x)] >= 0.95 * best[p] for p in ps)
            print(f"| {sname} | {len(ps)} | {x} | {geo([m[(p, x)] / m[(p, S)] for p in ps])} | {len(below)}: {' '.join(below) or '-'} | "
                  f"{len(above)}: {' '.join(above) or '-'} | {len(hs)} ({' '.join(hs) or '-'}) / {len(hx)} ({' '.join(hx) or '-'}) | {ns} / {nx} |")
    print()

m = means("goodput_mbps")
print("### Per point (to the last byte; " + ("sheds: trials whose agent logged a shed, and the path shed)\n" if "--policy-log" in args
      else "sheds: trials that ended with one subflow, and the path left)\n"))
LABEL = {"mptcp-guard": "guard", "mptcp-guard+share15+starveoff": "G15", "mptcp-guard+share15+starveoff+rttoff": "G15R"}
lab = [LABEL.get(x, x) for x in XS]
print("| point | subset | best TCP Mbit/s | static / best | " + " | ".join(f"{l} / best" for l in lab) + " | "
      + " | ".join(f"{l} / static" for l in lab) + " | " + " | ".join(f"sheds {l}" for l in lab) + " |")
print("|---|---|---:|---:|" + "---:|" * (2 * len(XS)) + "---|" * len(XS))
sheds = collections.defaultdict(list)  # (point, arm) -> the path shed, per trial with a shed
for r in recs:
    if r["procedure"] not in XS:
        continue
    if "--policy-log" in args:
        shed = [re.search(r" path=(\S+)", l).group(1) for l in r.get("policy_log") or [] if 'msg="subflow shed' in l]
        if shed:
            sheds[(r["point"], r["procedure"])].append("+".join(shed))
    elif len(r.get("subflows") or []) == 1:
        sheds[(r["point"], r["procedure"])].append(r["subflows"][0]["path"])
for p in done:
    best = max(m[(p, "tcp-path1")], m[(p, "tcp-path2")])
    n = {a: sum(1 for r in recs if r["point"] == p and r["procedure"] == a) for a in XS}
    def sh(a):
        left = sheds[(p, a)]
        return f"{len(left)} of {n[a]}" + (f" ({'shed' if '--policy-log' in args else 'left'}: {', '.join(sorted(set(left)))})" if left else "")
    print(f"| {p} | {FIRST if p in TINY else OTHER} | {best:.2f} | {m[(p, S)] / best:.2f} | " + " | ".join(f"{m[(p, x)] / best:.2f}" for x in XS) + " | "
          + " | ".join(f"{m[(p, x)] / m[(p, S)]:.2f}" for x in XS) + " | " + " | ".join(sh(x) for x in XS) + " |")
