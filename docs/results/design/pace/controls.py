#!/usr/bin/env python3
"""controls.py: the 4 control points of the pace run, drawn (seed 26, issue 26) from
paired-main2's 63 points without the 9 harmed ones (p197 and the points that static or static+lowat
harmed in docs/results/design/lowat). Prints the full --only list: harmed points, then controls."""
import random

harmed = ["p197", "p019", "p025", "p044", "p071", "p133", "p148", "p173", "p174"]
with open("../paired-main2/only.txt") as f:
    all63 = f.read().strip().split(",")
assert len(all63) == 63 and all(p in all63 for p in harmed)
rest = sorted(p for p in all63 if p not in harmed)
controls = sorted(random.Random(26).sample(rest, 4))
print(",".join(harmed + controls))
