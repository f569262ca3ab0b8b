#!/usr/bin/env python3
# Of the realworld space's first 200 points (seed 1), how many could make the buffer sizer act?
# Upper bound: 2 x (sum of both capacities) x the larger RTT with a full bottleneck queue, over the
# smallest maximum it starts from (tcp_wmem[2] = 4 MiB). Loss-limited estimate: each path's rate
# capped by Mathis et al. (MSS 1448 x 1.22 / (base RTT x sqrt(loss))). An estimate of where the
# rule can act, not a measurement.
# bin/mpdetour-lab design --space realworld --points 200 --seed 1 --dry-run > /tmp/rw200.txt
# python3 docs/results/design/mechanisms-realworld/acts-estimate.py /tmp/rw200.txt
import math, re, sys
n = cap = mat = 0
for l in open(sys.argv[1]):
    if not re.match(r"p\d+ ", l):
        continue
    n += 1
    kv = dict(re.findall(r"(C\d\.\w+)=(\S+)", l))
    sumc = summ = mx = 0
    for i in (0, 1):
        r = float(kv[f"C{i}.rate"].rstrip("kbit")) * 1e3
        d = float(kv[f"C{i}.delay"].rstrip("us")) * 1e-6
        loss = float(kv[f"C{i}.loss"].rstrip("%")) / 100
        q = int(kv[f"C{i}.queue"])
        mx = max(mx, 2 * d + q * 1500 * 8 / r)
        sumc += r / 8
        summ += min(r / 8, 1448 * 1.22 / (2 * d * math.sqrt(loss)) if loss > 0 else 1e12)
    cap += 2 * sumc * mx > 4194304
    mat += 2 * summ * mx > 4194304
print(f"{n} points: rule above 4 MiB by capacity at {cap}, loss-limited estimate at {mat}")
