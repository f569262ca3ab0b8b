#!/usr/bin/env python3
# Per trial, the change of each tbf's sent/dropped counters (tc-sampler.sh output) from the last
# sample before the trial's start to the last within its window + 3 s, beside the trial's
# goodput and per-subflow retransmissions.
# usage: tcdiff.py TRIALS.jsonl TC.txt
import collections, datetime, json, sys
S = collections.defaultdict(list)
for l in open(sys.argv[2]):
    p = l.split()
    S[(p[1].split("-", 1)[1], p[2])].append((datetime.datetime.fromisoformat(p[0].replace("Z", "+00:00")), {k: int(v) for k, v in (x.split("=") for x in p[3:])}))
print("| trial | procedure | goodput | subflow retransmissions | " + " | ".join(f"{n} dev {d}: sent / dropped" for n, d in sorted(S)) + " |")
print("|---:|---|---:|---|" + "---:|" * len(S))
for l in open(sys.argv[1]):
    t = json.loads(l)
    st = datetime.datetime.fromisoformat(t["start"][:26] + "+00:00")
    end = t.get("window_s", 10) + 3
    cells = []
    for k in sorted(S):
        b = [c for tm, c in S[k] if tm <= st]
        d = [c for tm, c in S[k] if 0 < (tm - st).total_seconds() <= end]
        cells.append(f"{d[-1]['sent'] - b[-1]['sent']} / {d[-1]['dropped'] - b[-1]['dropped']}" if b and d else "-")
    rx = ", ".join(f"{s['path']} {s['retrans']}" for s in t.get("subflows") or [])
    print(f"| {t['trial']} | {t['cell']} | {t['goodput_mbps']:.2f} | {rx} | " + " | ".join(cells) + " |")
