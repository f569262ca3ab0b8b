#!/usr/bin/env python3
# Writes this README's generated part (run from the repository root, prints to stdout) from
# report.md, status.py, lock-log.txt and only.txt: python3 docs/results/design/paired-main/readme.py
# [HAND.md] > docs/results/design/paired-main/README.md, where HAND.md holds the hand-written
# sections (what the rows say, not done, resume: copy them from the README before regenerating).
import re, subprocess, sys
D = "docs/results/design/paired-main"
rep = open(D + "/report.md").read()
pa = rep[rep.index("## Paired analysis"):]
def block(start, stop):
    s = pa.index(start); e = pa.index(stop, s + len(start)); return pa[s:e].strip()
summary = block("| procedure | points | harmed", "\n\n")
harmed = "\n".join(l for l in pa.split("\n") if l.startswith("Harmed points,"))
fewer = "\n".join(l for l in pa.split("\n") if l.startswith("mptcp-backup-first:") and "fewer subflows" in l)
kernel = [l for l in pa.split("\n") if l.startswith("**The kernel's own cost**")][0]
vs = block("| X | points | geometric mean", "\n\n")
targets = block("| procedure | target |", "\n\n")
st = subprocess.run(["python3", D + "/status.py", D], capture_output=True, text=True).stdout
m = re.search(r"complete (\d+)", st); n = int(m.group(1))
complete = re.search(r"complete: (.*)", st).group(1)
load = re.search(r"1-min load.*", st).group(0)
trials = re.search(r"trials (\d+), ok (\d+), not ok (\d+)", st)
span = re.search(r"first trial (\S+), last (\S+)", st)
import ast
builds = "; ".join(f"{k}: {v} trials" for k, v in ast.literal_eval(re.search(r"builds: (.*)", st).group(1)).items())
bf1 = re.search(r"backup-first trials ending.*", st).group(0)
gaps = "\n".join("- " + l for l in st.split("\n") if re.match(r"^(tcp|mptcp)\S*: \d+ ok trials", l))
locks = [l.split() for l in open(D + "/lock-log.txt")]
chunks, tot, sess = [], 0.0, []
from datetime import datetime
for a, b in zip(locks[0::2], locks[1::2]):
    t0 = datetime.fromisoformat(a[2].replace("Z", "+00:00")); t1 = datetime.fromisoformat(b[2].replace("Z", "+00:00"))
    tot += (t1 - t0).total_seconds() / 60
    chunks.append(f"{a[2][11:16]}-{b[2][11:16]} ({(t1 - t0).total_seconds() / 60:.1f} min)")
    # sessions: holds more than two hours apart belong to different sessions
    if not sess or (t0 - sess[-1][1]).total_seconds() > 7200:
        sess.append([t0, t1, 0.0])
    sess[-1][1] = t1; sess[-1][2] += (t1 - t0).total_seconds() / 60
cmp = subprocess.run(["python3", D + "/status.py", D, "docs/results/design/paired-bf"], capture_output=True, text=True).stdout
cmp = cmp[cmp.index("\n| point |"):].strip()
cmp = "\n".join(("\n- " + l if not l.startswith("|") else l) for l in cmp.split("\n"))
extra = open(sys.argv[1]).read() if len(sys.argv) > 1 else ""
print(f"""# paired-main: the paired design with the current build, static (default) beside backup-first (issue 26)

**Partial, {n} of 63 points** measured (every procedure with 3 ok trials at each). Every target
verdict below is about these {n} points only; the issue's design target needs >= 60 points.

## What is run

```
mpdetour-lab design --bin mpdetour --points 200 --seed 1 --trials 3 \\
  --procedures tcp-path1,tcp-path2,mptcp-1sf,mptcp-static,mptcp-backup-first \\
  --only $(cat only.txt) --out docs/results/design/paired-main --resume --budget 7m --shard K/2 --name pmainK
```

K = 1 and 2 (two runners, separate namespace sets, as in paired-bf and paired-bf2), each chunk
under the measurement lock, continued with `--resume`. Both shards ran at once in the first
session (2026-11-27 03:25-04:31 UTC) and in the second session's first chunk (08:48-08:58); from
09:00 the second session ran one shard per chunk, alternating, because the machine was at load
8-9 with six labs at once, and its last two chunks had `--budget 4m` and `--budget 1m` (one or two
points) to stay within 45 minutes of lock per session. The budget only decides where a chunk
stops; every point runs the same way. Seed 1 and the default space
(capacity 1-100 Mbit/s, RTT 10-400 ms, loss 0-2 %, buffer 0.1-2 BDP, uniform), so points carry
d200's, paired200's and paired-bf's IDs. 3 trials per procedure and point in rotating rounds on
one lab build per point; 10 s transfers, goodput from 1 s, cubic.

- **Points (`--only`, only.txt)**: the first 63 points of the design's seeded order, which run in that
  order: {open(D + '/only.txt').read().strip()}.
  All 63 are among paired-bf's 65 points (paired-bf ran positions 1-66 of the same order except
  p111), so every point compares with paired-bf's static figures, and 61 with its backup-first
  ones (paired-bf has no backup-first figure at p114 and p119: its first runner recorded those
  trials as failed). paired-bf's 63 points *with* backup-first were not used: they leave out
  exactly the two points where backup-first failed, a choice made on the outcome.
- **Procedures**: the five of paired-bf and paired-bf2. `mptcp-adaptive` is not included: at
  paired-bf2's pace (8 points in 14 minutes with 2 shards, 105 s per point) the 45 minutes of
  lock the first session had give about 25 points with five procedures (estimated before the run; it
  gave 23); a sixth adds 20 % per point
  (about 21 points), for a policy that is not the default, was below static at 4 of 18 points and
  above at none in paired200, and is not a candidate. The procedure list is part of the design:
  every later chunk of this directory runs the same five.
- **Build**: `mpdetour` and `mpdetour-lab` built with `make build` from commit e18e286 of branch
  design (= main at the first session's start); the second session built the same commit again
  (`make build` in a worktree at e18e286). Its backupfirst.go differs from paired-bf2's build
  (4ef5539) only in a comment; the engine both policies share gained, since 4ef5539, cwnd clamps
  for tunnel subflows (the design's detours are NAT ones) and cross-family handling. Stamped:
  every trial records it ({builds}). Resumed chunks must use binaries of the same commit, or the
  run measures two builds.
- **Load**: {load} (2 shared cores; two runners at once until 08:58, one from 09:00; other
  helpers' labs, builds and tests beside it). The runs held the measurement lock: {", ".join(chunks)}, {tot:.1f} min in all ({", ".join(f"{m:.1f} min {x:%H:%M}-{y:%H:%M}" for x, y, m in sess)} by session).
- **Trials**: {trials.group(1)} recorded, {trials.group(2)} ok, {trials.group(3)} not ok; {span.group(1)} to {span.group(2)} (trial starts).
- **Points measured**: {complete}.

Report with every point: [report.md](report.md) (section "Paired analysis"). Regenerate:
`mpdetour-lab design --report --out docs/results/design/paired-main`. Progress:
`python3 docs/results/design/paired-main/status.py docs/results/design/paired-main`.

## Results (partial, {n} of 63 points)

{summary}

{harmed}

{fewer}

{kernel}

Backup-first against static, per point (backup-first / static of the means, 95 % bootstrap
interval over the rounds; "below" / "above" = the interval lies wholly below / above 1):

{vs}

Longest gap in delivery per trial ({bf1}):

{gaps}

## Beside paired-bf (context, not a paired comparison)

paired-bf measured the same points with build 9502ed4 (backup-first's old rules) without the
lock, on 2026-11-26 21:59-23:54 UTC. Per point, the MPTCP procedures' means here and there
(`python3 status.py docs/results/design/paired-main docs/results/design/paired-bf`):

{cmp}

## Targets of issue 26 on these {n} points

{targets}

{extra}
""")
