#!/usr/bin/env python3
"""Per trial of diag/ (or another OUT): the subflows from the 200 ms ss samples (ss-sampler-fast.py)
joined by local address within the trial's window (start .. start + window + 1 s), and the MPTCP
sockets of both ends (OUT/ss.txt.msk, the client's by its initial subflow's local address, the
server's by that address as its peer).
Per subflow: samples, median cwnd, median in flight (unacked), share of samples with
"window, no data" (in flight < cwnd - 2 and no unsent bytes: the subflow could send but the MPTCP
level gave it nothing), share "full" (in flight >= cwnd - 2), median sk_sndbuf (tb) and its last
busy / sndbuf_limited / rwnd_limited ms, retransmissions (last ss sample's retrans total),
first sample with bytes_acked > 100 kB (s after the trial's start).
MPTCP socket (client): share of samples with sk_wmem_queued >= 0.9 sk_sndbuf (send buffer full),
median sndbuf; server: median and max rmem_alloc / rcvbuf.
usage: diag.py OUT [POINT]"""
import collections, datetime, json, re, statistics, sys, glob, os
out = sys.argv[1]; only = sys.argv[2] if len(sys.argv) > 2 else None
def ts(s): return datetime.datetime.fromisoformat(s.replace("Z", "+00:00"))
def num(rx, s, d=None):
    m = re.search(rx, s); return float(m.group(1)) if m else d
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sslog
SF, MC, MS = ({k: [(ts(a), b) for a, b in v] for k, v in d.items()} for d in sslog.samples(out))
trials = []
for f in sorted(glob.glob(os.path.join(out, 'runs', '*', 'trials.jsonl'))):
    trials += [json.loads(l) for l in open(f)]
med = lambda v: statistics.median(v) if v else float('nan')
print("| point | procedure | round | goodput | longest gap s | subflow | MB | rtx | n | cwnd | in flight | window, no data | full | sndbuf kB | busy s | sndbuf-lim s | first sample s | first 100 kB acked s | msk sndbuf full | msk sndbuf kB | server rcv fill med/max |")
print("|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
for t in sorted(trials, key=lambda t: (t['configuration'], t['cell'], t['trial'])):
    if only and t['configuration'] != only: continue
    st = ts(t['start'][:26] + 'Z' if not t['start'].endswith('Z') else t['start'][:26] + 'Z')
    w = (t.get('window_s') or 10) + 1
    inwin = lambda L: [(x, s) for x, s in L if 0 <= (x - st).total_seconds() <= w + 1]
    first = t['subflows'][0]['local'] if t['subflows'] else None
    mc = [s for _, s in inwin(MC.get(first, []))]
    full = [1 if num(r"w(\d+),", s, 0) >= 0.9 * num(r"tb(\d+),", s, 1) else 0 for s in mc]
    mtb = [num(r"tb(\d+),", s) for s in mc]
    ms = [s for _, s in inwin(MS.get(first, []))]
    fill = [num(r"\(r(\d+),", s, 0) / num(r"rb(\d+),", s, 1) for s in ms]
    mskc = (f"{sum(full)/len(full):.2f} | {med(mtb)/1000:.0f} | " if mc else " | | ") + (f"{med(fill):.2f}/{max(fill):.2f}" if ms else "")
    for sf in t['subflows']:
        S = inwin(SF.get(sf['local'], []))
        if not S:
            print(f"| {t['configuration']} | {t['cell']} | {t['trial']} | {t['goodput_mbps']:.2f} | {t['max_gap_s']:.2f} | {sf['path']} | {sf['bytes']/1e6:.1f} | {sf['retrans']} | 0 |"); continue
        cw = [num(r"cwnd:(\d+)", s, 0) for _, s in S]; un = [num(r"unacked:(\d+)", s, 0) for _, s in S]
        ns = [num(r"notsent:(\d+)", s, 0) for _, s in S]
        nodata = sum(1 for c, u, n in zip(cw, un, ns) if u < c - 2 and n == 0) / len(S)
        fl = sum(1 for c, u in zip(cw, un) if u >= c - 2) / len(S)
        tb = [num(r"tb(\d+),", s, 0) for _, s in S]
        last = S[-1][1]
        busy = num(r'busy:(\d+)ms', last, 0) / 1000; sbl = num(r'sndbuf_limited:(\d+)ms', last, 0) / 1000
        f0 = (S[0][0] - st).total_seconds()
        fa = next(((x - st).total_seconds() for x, s in S if num(r"bytes_acked:(\d+)", s, 0) > 100000), float('nan'))
        print(f"| {t['configuration']} | {t['cell']} | {t['trial']} | {t['goodput_mbps']:.2f} | {t['max_gap_s']:.2f} | {sf['path']} | {sf['bytes']/1e6:.1f} | {sf['retrans']} | {len(S)} | {med(cw):.0f} | {med(un):.0f} | {nodata:.2f} | {fl:.2f} | {med(tb)/1000:.0f} | {busy:.1f} | {sbl:.1f} | {f0:.1f} | {fa:.1f} | {mskc} |")
