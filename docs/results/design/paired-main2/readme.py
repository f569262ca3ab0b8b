#!/usr/bin/env python3
# Writes this README's generated part (run from the repository root, prints to stdout) from
# report.md, paired-main/status.py, lock-log.txt, load.txt and only.txt, and paired-main's report.md for the
# per-point comparison: python3 docs/results/design/paired-main2/readme.py [hand.md] \
#   > docs/results/design/paired-main2/README.md
# hand.md (committed beside it) holds the hand-written sections (what the rows say, not done, resume).
# Adapted from paired-main/readme.py (one MPTCP procedure here; lock log per shard; load sampled).
import math, os, re, statistics as stt, subprocess, sys
from datetime import datetime

D = os.environ.get("PM2_DIR", "docs/results/design/paired-main2")
OLD = "docs/results/design/paired-main"
rep = open(D + "/report.md").read()
pa = rep[rep.index("## Paired analysis"):]


def block(text, start, stop):
    s = text.index(start); e = text.index(stop, s + len(start)); return text[s:e].strip()


summary = block(pa, "| procedure | points | harmed", "\n\n")
harmed = "\n".join(l for l in pa.split("\n") if l.startswith("Harmed points,"))
kernel = [l for l in pa.split("\n") if l.startswith("**The kernel's own cost**")][0]
targets = block(pa, "| procedure | target |", "\n\n")

st = subprocess.run(["python3", OLD + "/status.py", D], capture_output=True, text=True).stdout
n = int(re.search(r"complete (\d+)", st).group(1))
complete = re.search(r"complete: (.*)", st).group(1)
incomplete = re.search(r"incomplete: (.*)", st)
tload = re.search(r"1-min load.*", st).group(0)
trials = re.search(r"trials (\d+), ok (\d+), not ok (\d+)", st)
span = re.search(r"first trial (\S+), last (\S+)", st)
import ast
builds = "; ".join(f"{k}: {v} trials" for k, v in ast.literal_eval(re.search(r"builds: (.*)", st).group(1)).items())
gaps = "\n".join("- " + l for l in st.split("\n") if re.match(r"^(tcp|mptcp)\S*: \d+ ok trials", l))

# lock log: "shard K chunk C: lock acquired T load ..." / "... lock released T load ... rc R"
acq, rel, chunks = {}, {}, []
for l in open(D + "/lock-log.txt"):
    m = re.match(r"shard (\d+) chunk (\d+): lock (acquired|released) (\S+)", l)
    if m:
        (acq if m.group(3) == "acquired" else rel)[(int(m.group(1)), int(m.group(2)))] = datetime.fromisoformat(m.group(4).replace("Z", "+00:00"))
held = 0.0
for k in sorted(acq):
    if k in rel:
        mins = (rel[k] - acq[k]).total_seconds() / 60
        held += mins
        chunks.append(f"shard {k[0]} chunk {k[1]} {acq[k]:%H:%M}-{rel[k]:%H:%M} ({mins:.1f} min)")
    else:
        chunks.append(f"shard {k[0]} chunk {k[1]} from {acq[k]:%H:%M} (running)")
first = min(acq.values()); last = max(rel.values()) if rel else first
# sampled load (every 30 s from the first chunk's start to the last release)
samples = []
for l in open(D + "/load.txt"):
    t, a = l.split()[0], float(l.split()[1])
    t = datetime.fromisoformat(t.replace("Z", "+00:00"))
    if first <= t <= last:
        samples.append(a)
sload = f"median {stt.median(samples):.2f}, max {max(samples):.2f} over {len(samples)} samples" if samples else "-"


def table(path):
    """Per-point table of a report's paired analysis: {point: {column: cell}}."""
    t = open(path).read()
    t = t[t.index("### Per point"):]
    lines = [l for l in t.split("\n") if l.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for l in lines[2:]:
        cells = [c.strip() for c in l.strip("|").split("|")]
        if not re.match(r"p\d+$", cells[0]):
            break
        rows[cells[0]] = dict(zip(head, cells))
    return rows


def num(c):
    m = re.match(r"\**(-?[\d.]+)", c or "")
    return float(m.group(1)) if m else None


def onesf_best(r):
    a, b, o = num(r["tcp-path1"]), num(r["tcp-path2"]), num(r["mptcp-1sf (path)"])
    return o / max(a, b) if a is not None and b is not None and o is not None and max(a, b) > 0 else None


new, old = table(D + "/report.md"), table(OLD + "/report.md")
done = set(complete.split(","))
both = [p for p in open(D + "/only.txt").read().strip().split(",") if p in done and p in new and p in old]
rows = []
lr = {"s": [], "o": [], "sn": [], "so": []}
for p in both:
    a, b = new[p], old[p]
    sn, so = a["mptcp-static / best"], b["mptcp-static / best"]
    on, oo = onesf_best(a), onesf_best(b)
    hn = " H" if "**H**" in sn else ""; ho = " H" if "**H**" in so else ""
    rows.append(f"| {p} | {a['BDP']} | {sn.replace(' **H**', '')}{hn} | {so.replace(' **H**', '')}{ho} | {on:.2f} | {oo:.2f} |")
    lr["sn"].append(num(sn)); lr["so"].append(num(so))
    lr["o"].append((on, oo))
cmp = "\n".join(["| point | BDP | static / best, paired-main2 (new) | static / best, paired-main (old) | mptcp-1sf / best, new | mptcp-1sf / best, old |",
                 "|---|---|---:|---:|---:|---:|"] + rows)


def gm(v):
    return math.exp(stt.mean(math.log(x) for x in v)) if v else float("nan")


def count(v, f):
    return sum(1 for x in v if f(x))


hn_new = count([new[p]["mptcp-static / best"] for p in both], lambda c: "**H**" in c)
hn_old = count([old[p]["mptcp-static / best"] for p in both], lambda c: "**H**" in c)
cmpsum = (f"Over the {len(both)} points both runs completed: static / best geometric mean {gm(lr['sn']):.3f} here, "
          f"{gm(lr['so']):.3f} in paired-main; harmed (H) here at {hn_new}, there at {hn_old}; "
          f"mean >= 0.95 x best here at {count(lr['sn'], lambda x: x >= 0.95)}, there at {count(lr['so'], lambda x: x >= 0.95)}; "
          f"mptcp-1sf / best geometric mean {gm([o[0] for o in lr['o'] if o[0] and o[0] > 0]):.3f} here, "
          f"{gm([o[1] for o in lr['o'] if o[1] and o[1] > 0]):.3f} there.")

tload2 = tload.split(": ", 1)[1]
inc = ("\n- **Started, not complete**: " + incomplete.group(1) + ".") if incomplete else ""
only = open(D + "/only.txt").read().strip()
extra = open(sys.argv[1]).read() if len(sys.argv) > 1 else ""
partial = f"**Partial, {n} of 63 points**" if n < 63 else "**All 63 points**"
print(f"""# paired-main2: the paired design on main's build (6c580aa) with the new instrument (issue 26)

{partial} measured (every procedure with 3 ok trials at each). The same 63 points as
[paired-main](../paired-main/README.md) (old instrument, build e18e286), static MPTCP (the
default) beside TCP on each path and MPTCP over the best path alone.

## What is run

```
mpdetour-lab design --bin mpdetour --points 200 --seed 1 --trials 3 \\
  --procedures tcp-path1,tcp-path2,mptcp-1sf,mptcp-static \\
  --only $(cat only.txt) --out docs/results/design/paired-main2 --resume --budget 8m --shard K/3 --name pm2sK
```

K = 1, 2 and 3: three runners at once (separate namespace sets), each a loop of chunks under the
shared measurement lock (`flock -s`), 30 s apart, continued with `--resume`; no chunk started after
12:58 UTC. `--budget 8m` only decides where a chunk stops; every point runs the same way. Seed 1 and
the default space (capacity 1-100 Mbit/s, RTT 10-400 ms, loss 0-2 %, buffer 0.1-2 BDP, uniform). 3
trials per procedure and point in rounds on one lab build per point; 10 s transfers, goodput from
1 s, cubic.

- **Instrument** (new, as in aa and paired-bbr): procedures within a round in a balanced order (a
  Williams square per point, shuffled from the seed and the point; recorded in design.json as
  `"order": "balanced"`), `net.ipv4.tcp_no_metrics_save = 1` in the lab (no TCP metrics cache carried
  from one trial to the next). Per-point intervals (harmed, MPTCP / best, Ben) are bootstrap
  percentile intervals over the 3 rounds, as before; the generator's Student t interval over points
  belongs to comparisons between MPTCP procedures, and this run has one (static), so no row below
  carries it. paired-main used the old instrument (rotating order, metrics cache on).
- **Points (`--only`, only.txt)**: the first 63 points of seed 1's order, the same list as
  paired-main: {only}.
- **Procedures**: tcp-path1, tcp-path2, mptcp-1sf, mptcp-static. No backup-first (it did not beat
  static in paired-bf, paired-bf2 or paired-main and is not the default); static is the default
  policy, so "the default not significantly below static" holds by construction here.
- **Build**: `mpdetour` and `mpdetour-lab` built with `make build` at commit 6c580aa (main's head at
  the session's start), copied aside before the run so that the binaries could not change during it.
  Stamped: every trial records it ({builds}).
- **Load** (2 shared cores; three runners at once, beside whatever else ran: the harm helper's
  runner may share the lock, other helpers build and test): 1-min load sampled every 30 s during the run: {sload}; at the trials' ends:
  {tload2}.
- **Lock**: {", ".join(chunks)}; {held:.1f} runner-minutes of lock in all, {first:%H:%M}-{last:%H:%M} UTC.
- **Trials**: {trials.group(1)} recorded, {trials.group(2)} ok, {trials.group(3)} not ok; {span.group(1)} to {span.group(2)} (trial starts).
- **Points measured**: {complete}.{inc}

Report with every point: [report.md](report.md) (section "Paired analysis"). Regenerate:
`mpdetour-lab design --report --out docs/results/design/paired-main2`. Progress:
`python3 docs/results/design/paired-main/status.py docs/results/design/paired-main2` (paired-main's script, which takes the directory). This README:
`python3 docs/results/design/paired-main2/readme.py docs/results/design/paired-main2/hand.md > docs/results/design/paired-main2/README.md`.

## Results ({n} of 63 points)

{summary}

{harmed}

{kernel}

Longest gap in delivery per trial:

{gaps}

## Beside paired-main (old instrument, build e18e286)

Per point where both runs have every procedure's trials: MPTCP static / best single path (the
reports' per-point column: ratio of means, 95 % bootstrap interval over the rounds; H = harmed,
the interval wholly below 0.95) and MPTCP over the best path alone / best single path (ratio of the
reports' means, no interval). Another run: other build, instrument and load, so context, not a
paired comparison.

{cmp}

{cmpsum}

## Targets of issue 26 on these {n} points

{targets}

{extra}""")
