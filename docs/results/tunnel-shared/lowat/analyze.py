#!/usr/bin/env python3
"""Tables of README.md from trials.jsonl (this directory).

Per configuration and detour kind (NAT, tunnel), MPTCP with the static
policy without (mptcp-*-static) and with the per-subflow unsent limit
(mptcp-*-static-lowat, subflow_lowat 131072) against issue 26's target of
that configuration, paired by round (--interleave: round n ran trial n of
every cell, minutes apart): the per-round ratio, the ratio of the run's
means, and the mean of the per-round ratios with a Student t 95 %
interval over rounds.

- best: the better single path of the pair (TCP on the default path, TCP
  through that detour), chosen by the run's means; each round's ratio uses
  that procedure's trial of the same round.
- sum: TCP on the default path + TCP through that detour, same round.
- lowat / static: the lowat procedure's goodput over the static one's,
  same round.
For context, the ratio of means of docs/results/current-build/brennan2017
(mptcp-nat / mptcp-tunnel: the default policy, which is static) is given."""
import sys, json, math, os, re, statistics as st
from collections import defaultdict

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../tools"))
from tint import tint  # noqa: E402  (docs/results/tools/tint.py)


def load(path):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    return rows, [r for r in rows if r.get("status") == "ok"]


rows, ok = load(os.path.join(here, "trials.jsonl"))
_, old = load(os.path.join(here, "../../current-build/brennan2017/trials.jsonl"))
g = defaultdict(dict)
for r in ok:
    g[(r["configuration"], r["procedure"])][r["trial"]] = r["goodput_mbps"]
og = defaultdict(dict)
for r in old:
    og[(r["configuration"], r["procedure"])][r["trial"]] = r["goodput_mbps"]

ALL = ["symmetric-loss1", "symmetric-delay100", "symmetric", "core-limited", "core-limited-loss1", "core-limited-delay100"]
CONFIGS = [c for c in ALL if any(k[0] == c for k in g)]
LABEL = {"symmetric": "Symmetric", "symmetric-loss1": "Symmetric, 1 % loss", "symmetric-delay100": "Symmetric, 100 ms",
         "core-limited": "Core-limited", "core-limited-loss1": "Core-limited, 1 % loss", "core-limited-delay100": "Core-limited, 100 ms"}
PROCS = ["tcp", "tcp-nat", "tcp-tunnel", "mptcp-nat-static", "mptcp-nat-static-lowat", "mptcp-tunnel-static", "mptcp-tunnel-static-lowat"]
TARGET = {"symmetric": ("best", 0.98), "symmetric-loss1": ("best", 0.98), "symmetric-delay100": ("best", 0.98),
          "core-limited": ("sum", 0.97), "core-limited-delay100": ("sum", 0.9), "core-limited-loss1": ("best", 1.0)}
# symmetric 1 % loss has a second target: >= the best single path (1.0),
# and more than it, as the default path carries something alone.
ALSO = {"symmetric-loss1": 1.0}
KINDS = [("NAT", "tcp-nat", "mptcp-nat-static", "mptcp-nat-static-lowat", "mptcp-nat"),
         ("tunnel", "tcp-tunnel", "mptcp-tunnel-static", "mptcp-tunnel-static-lowat", "mptcp-tunnel")]


def mean(src, c, p):
    v = list(src[(c, p)].values())
    return st.mean(v) if v else float("nan")



def rounds(c):
    return sorted(set.intersection(*(set(g[(c, p)]) for p in PROCS)))


# Load: 1-min average sampled every 30 s from the first chunk's start to the
# last chunk's end (run-log.txt), and at each trial's end (trials.jsonl).
log = open(os.path.join(here, "run-log.txt")).read()
starts = re.findall(r"measure: slot \d, (\d\d:\d\d:\d\d)", log)
ends = re.findall(r"measure: slot \d released (\d\d:\d\d:\d\d)", log)
samples = []
for l in open(os.path.join(here, "load.txt")):
    f = l.split()
    if len(f) >= 2:
        samples.append((f[0][11:19], float(f[1])))
if starts:
    lo, hi = starts[0], (ends[-1] if ends else "99:99:99")
    inrun = [v for t, v in samples if lo <= t <= hi]
else:
    inrun = []
tl = [r["loadavg_1m"] for r in ok]
print(f"trials: {len(rows)}, ok {len(ok)}; configurations {len(CONFIGS)}; rounds complete per configuration: "
      + ", ".join(f"{c} {len(rounds(c))}" for c in CONFIGS))
print(f"builds: {sorted({r['versions']['mpdetour'] for r in ok})}; kernel {sorted({r['versions']['kernel'] for r in ok})}")
print(f"first trial {min(r['start'] for r in ok)}, last {max(r['start'] for r in ok)}; chunks {len(starts)}: "
      + ", ".join(f"{a}-{b}" for a, b in zip(starts, ends)))
if inrun:
    print(f"1-min load, sampled every 30 s over the run ({len(inrun)} samples): median {st.median(inrun):.2f}, max {max(inrun):.2f}")
print(f"1-min load at trial ends: median {st.median(tl):.2f}, max {max(tl):.2f}")
print()

print("### Goodput, Mbit/s: mean (sd), n (complete rounds)\n")
print("| configuration | " + " | ".join(PROCS) + " |")
print("|---|" + "---:|" * len(PROCS))
for c in CONFIGS:
    cells = []
    for p in PROCS:
        v = [g[(c, p)][n] for n in rounds(c)]
        cells.append(f"{st.mean(v):.2f} ({st.stdev(v) if len(v) > 1 else 0:.2f}) n={len(v)}" if v else "-")
    print(f"| {LABEL[c]} | " + " | ".join(cells) + " |")
print()


def ref(c, single, n):
    kind, _ = TARGET[c]
    if kind == "sum":
        return g[(c, "tcp")][n] + g[(c, single)][n], "sum"
    best = "tcp" if mean(g, c, "tcp") >= mean(g, c, single) else single
    return g[(c, best)][n], best


def oldratio(c, single, proc):
    kind, _ = TARGET[c]
    if not og[(c, proc)]:
        return float("nan")
    if kind == "sum":
        return mean(og, c, proc) / (mean(og, c, "tcp") + mean(og, c, single))
    return mean(og, c, proc) / max(mean(og, c, "tcp"), mean(og, c, single))


print("### MPTCP over its target's reference (best single path or single-path sum), paired by round\n")
print("| configuration | detour | target | reference | procedure | per round | ratio of means | mean of rounds [95 % t] | vs target | current-build run (default policy) |")
print("|---|---|---|---|---|---|---:|---|---|---:|")
for c in CONFIGS:
    kind, tmin = TARGET[c]
    ns = rounds(c)
    for name, single, static, lowat, dflt in KINDS:
        for p in (static, lowat):
            per = [g[(c, p)][n] / ref(c, single, n)[0] for n in ns]
            refname = ref(c, single, ns[0])[1]
            rom = st.mean(g[(c, p)][n] for n in ns) / st.mean(ref(c, single, n)[0] for n in ns)
            m, a, b = tint(per)
            vs = []
            for tm in [tmin] + ([ALSO[c]] if c in ALSO else []):
                side = "above" if a >= tm else "below" if b < tm else "spans"
                vs.append(f"{tm}: {'met' if rom >= tm else 'missed'}, interval {side}")
            status = "; ".join(vs)
            print(f"| {LABEL[c]} | {name} | {kind} >= {tmin} | {refname} | {p} | {', '.join(f'{x:.3f}' for x in per)} | {rom:.3f} | "
                  f"{m:.3f} [{a:.3f}, {b:.3f}] | {status} | {oldratio(c, single, dflt):.3f} |")
print()

print("### lowat / static, same detour, paired by round\n")
print("| configuration | detour | per round | ratio of means | mean of rounds [95 % t] |")
print("|---|---|---|---:|---|")
for c in CONFIGS:
    ns = rounds(c)
    for name, single, static, lowat, dflt in KINDS:
        per = [g[(c, lowat)][n] / g[(c, static)][n] for n in ns]
        m, a, b = tint(per)
        print(f"| {LABEL[c]} | {name} | {', '.join(f'{x:.3f}' for x in per)} | {st.mean(g[(c, lowat)][n] for n in ns) / st.mean(g[(c, static)][n] for n in ns):.3f} | {m:.3f} [{a:.3f}, {b:.3f}] |")
print()

# Subflow split: bytes per path (window) of the MPTCP procedures.
print("### Bytes per subflow in the goodput window, MB: mean over rounds (default path / detour)\n")
print("| configuration | " + " | ".join(p for _, _, s, l, _ in KINDS for p in (s, l)) + " |")
print("|---|" + "---:|" * 4)
for c in CONFIGS:
    cells = []
    for _, _, s, l, _ in KINDS:
        for p in (s, l):
            d, o = [], []
            for r in ok:
                if r["configuration"] == c and r["procedure"] == p:
                    d.append(sum(sf.get("window_bytes", 0) for sf in r["subflows"] if sf["path"] == "default") / 1e6)
                    o.append(sum(sf.get("window_bytes", 0) for sf in r["subflows"] if sf["path"] != "default") / 1e6)
            cells.append(f"{st.mean(d):.1f} / {st.mean(o):.1f}" if d else "-")
    print(f"| {LABEL[c]} | " + " | ".join(cells) + " |")
print()

# Where the link is shared (symmetric profile), each byte costs the client's
# access link what it costs TCP on that path alone in the plain symmetric
# configuration (tcp-tunnel's goodput is below tcp's by the tunnel's
# headers and smaller MSS; loss and delay are on L2, past the access link).
# With the measured byte split (default path f, detour 1 - f), the goodput
# the access link allows is 1 / (f / tcp + (1 - f) / tcp-<detour>) with the
# plain symmetric means: the ceiling that split leaves, whatever the
# scheduler does with queues; given over the configuration's best single path.
print("### Symmetric profile: ceiling of the byte split on the shared access link, of the best single path\n")
print("| configuration | procedure | detour share of bytes | ceiling / best | measured / best |")
print("|---|---|---:|---:|---:|")
S = "symmetric"
for c in [c for c in CONFIGS if c.startswith("symmetric")]:
    for name, single, static, lowat, dflt in KINDS:
        for p in (static, lowat):
            fd = []
            for r in ok:
                if r["configuration"] == c and r["procedure"] == p and r["trial"] in rounds(c):
                    d = sum(sf.get("window_bytes", 0) for sf in r["subflows"] if sf["path"] == "default")
                    o = sum(sf.get("window_bytes", 0) for sf in r["subflows"] if sf["path"] != "default")
                    fd.append(d / (d + o))
            f = st.mean(fd)
            ns, ss = rounds(c), rounds(S)
            ceil = 1 / (f / st.mean(g[(S, "tcp")][n] for n in ss) + (1 - f) / st.mean(g[(S, single)][n] for n in ss))
            best = max(st.mean(g[(c, "tcp")][n] for n in ns), st.mean(g[(c, single)][n] for n in ns))
            meas = st.mean(g[(c, p)][n] for n in ns) / best
            print(f"| {LABEL[c]} | {p} | {1 - f:.2f} | {ceil / best:.3f} | {meas:.3f} |")
