#!/usr/bin/env python3
# Per MPTCP trial, the change of the namespace counters (nstat-sampler.sh output) from the last
# sample before the trial's start to the last sample within its window + 3 s, for the server
# (receiver) and client (sender) namespaces; then per procedure the sums over trials.
# usage: nstatdiff.py TRIALS.jsonl NSTAT.txt [COUNTER ...]
import collections, datetime, json, sys
S = collections.defaultdict(list)
for l in open(sys.argv[2]):
    p = l.split()
    if len(p) < 2:
        continue
    c = dict(kv.split("=") for kv in p[2:])
    S[p[1].rsplit("-", 1)[1]].append((datetime.datetime.fromisoformat(p[0].replace("Z", "+00:00")), {k: int(v) for k, v in c.items()}))
want = sys.argv[3:] or ["server:MPTcpExtRcvPruned", "server:TcpExtTCPRcvQDrop", "server:TcpExtTCPOFODrop", "server:TcpExtTCPZeroWindowDrop",
                        "server:MPTcpExtOFOQueue", "server:MPTcpExtRcvWndShared", "server:MPTcpExtRcvWndConflict",
                        "client:TcpRetransSegs", "client:MPTcpExtMPTCPRetrans", "client:MPTcpExtSubflowStale", "client:TcpExtTCPTimeouts",
                        "client:TcpExtTCPLossProbes", "client:MPTcpExtRcvWndConflictUpdate"]
tot = collections.defaultdict(lambda: collections.Counter())
n = collections.Counter()
for l in open(sys.argv[1]):
    t = json.loads(l)
    if t.get("status") != "ok":
        continue
    st = datetime.datetime.fromisoformat(t["start"][:26] + "+00:00")
    end = t.get("window_s", 10) + 3
    cell = t["cell"]
    n[cell] += 1
    for w in want:
        ns, name = w.split(":")
        ss = S.get(ns, [])
        before = [c for tm, c in ss if tm <= st]
        during = [c for tm, c in ss if 0 < (tm - st).total_seconds() <= end]
        if not before or not during:
            continue
        tot[cell][w] += during[-1].get(name, 0) - before[-1].get(name, 0)
cells = sorted(n, key=lambda c: (not c.startswith("tcp"), len(c), c))
print("| counter (namespace) | " + " | ".join(f"{c} ({n[c]})" for c in cells) + " |")
print("|---|" + "---:|" * len(cells))
for w in want:
    print(f"| {w.split(':')[1]} ({w.split(':')[0]}) | " + " | ".join(str(tot[c][w]) for c in cells) + " |")
