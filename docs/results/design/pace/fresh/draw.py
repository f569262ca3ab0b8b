#!/usr/bin/env python3
"""Draw the fresh points for docs/results/design/pace/fresh (issue 26).

Pool: paired-main2's points (docs/results/design/lowat/only.txt, only2.txt, only3.txt merged and
deduplicated, sorted) minus the 13 points of docs/results/design/pace/only.txt.
Draw: 8 points with random.Random(2611).sample over the sorted pool; written in sorted order.
Run from the repository root: python3 docs/results/design/pace/fresh/draw.py
"""
import random

def read(path):
    return [p for p in open(path).read().strip().split(",") if p]

pool = set()
for f in ("only.txt", "only2.txt", "only3.txt"):
    pool.update(read("docs/results/design/lowat/" + f))
print("paired-main2 points:", len(pool))
used = set(read("docs/results/design/pace/only.txt"))
rest = sorted(pool - used)
print("minus pace's 13:", len(rest))
pts = sorted(random.Random(2611).sample(rest, 8))
print(",".join(pts))
open("docs/results/design/pace/fresh/only.txt", "w").write(",".join(pts) + "\n")
