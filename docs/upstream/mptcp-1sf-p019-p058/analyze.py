#!/usr/bin/env python3
"""Per-round MPTCP/TCP ratios from repro.sh output (and ss samples).

Usage: analyze.py run-*.txt   (each file: one point; rows grouped by point and variant)
Per (point, variant): TCP and MPTCP goodput per trial, MPTCP/TCP per round, the
geometric mean of the per-round ratios with a Student t 95 % interval over the
rounds (on log ratios), the ratio of the means, and sums of the nstat deltas.
Two goodputs per trial: the bench's own (bytes from 1 s to the last byte over
that time: the design's figure; its window ends when the sender's backlog has
drained) and the equal-window goodput (the receiver's per-second samples of
seconds 1-10 only: the same 9 s for TCP and MPTCP). "len" is the bench
window's length in seconds (number of per-second samples).
If ss-X.txt lies beside run-X.txt, the MPTCP subflow's unsent bytes at 9 s
(notsent) are shown too. Where the rows carry the forward path's counters: the
bottleneck's (tbf) drops per packet it was offered (tbfdrop / (tx + tbfdrop)),
per procedure over all trials and MPTCP - TCP per round with a t interval.
"""
import math, os, re, sys, statistics
from collections import defaultdict

T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
        10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110,
        18: 2.101, 19: 2.093, 20: 2.086, 25: 2.060, 30: 2.042}

def t975(df):
    return T975.get(df) or T975[max(k for k in T975 if k <= df)]

row = re.compile(r'^(p\d+) (\S+) round (\d+) (tcp|mptcp): (\S+) Mbit/s mptcp=(\S+) .*?persec=\[([^\]]*)\].*?\| sender: (.*?)\| receiver: (.*?)\|(?: path: (.*?) \|)? load (\S+)')

def counters(s):
    out = {}
    for kv in s.split():
        k, _, v = kv.partition('=')
        try:
            out[k] = int(v)
        except ValueError:
            pass
    return out

def sssum(path):
    """client rwnd_limited %, sndbuf_limited %, snd_wnd, cwnd per (variant, round, proc)."""
    res = {}
    if not os.path.exists(path):
        return res
    key, side = None, None
    for line in open(path):
        m = re.match(r'## (\S+) (\S+) round (\d+) (\S+) (client|server)', line)
        if m:
            key, side = (m.group(2), int(m.group(3)), m.group(4)), m.group(5)
            continue
        if side == 'client' and 'cubic' in line or side == 'client' and ' bbr ' in line:
            d = {}
            for name in ('rwnd_limited', 'sndbuf_limited'):
                mm = re.search(name + r':\d+ms\(([\d.]+)%\)', line)
                d[name] = float(mm.group(1)) if mm else 0.0
            for name in ('snd_wnd', 'cwnd', 'ssthresh', 'notsent'):
                mm = re.search(r'\b' + name + r':(\d+)', line)
                d[name] = int(mm.group(1)) if mm else None
            mm = re.search(r'tb(\d+)', line)
            d['tb'] = int(mm.group(1)) if mm else None
            res.setdefault(key, d)
        if side == 'server' and line.lstrip().startswith('skmem') and 'subflows_max' in line:
            mm = re.search(r'rb(\d+)', line)
            res.setdefault(key + ('msk',), {})['msk_rb'] = int(mm.group(1)) if mm else None
    return res

def tinterval(xs):
    n = len(xs)
    m, sd = statistics.mean(xs), statistics.stdev(xs)
    h = t975(n - 1) * sd / math.sqrt(n)
    return m, m - h, m + h


def summary(tcp, mp, logs):
    """Means, ratio of means, and the geometric mean of per-round ratios with its t interval."""
    n = len(logs)
    mean, sd = statistics.mean(logs), statistics.stdev(logs)
    h = t975(n - 1) * sd / math.sqrt(n)
    return (f'TCP mean {statistics.mean(tcp):.2f} (sd {statistics.stdev(tcp):.2f}), MPTCP mean {statistics.mean(mp):.2f} '
            f'(sd {statistics.stdev(mp):.2f}); ratio of means {statistics.mean(mp) / statistics.mean(tcp):.3f}; '
            f'geometric mean of per-round MPTCP/TCP {math.exp(mean):.3f}, 95 % t interval [{math.exp(mean - h):.3f}, {math.exp(mean + h):.3f}] '
            f'(sd of log ratio {sd:.3f})')


def main(paths):
    """Rows of every file are pooled per (point, variant): pass run-X and run-Y
    of the same variant to get one table and interval over all their rounds."""
    data = defaultdict(dict)  # (pt, var) -> (file, round) -> proc -> fields
    ss, loads = {}, []
    for path in paths:
        base = os.path.basename(path)
        ss[base] = sssum(os.path.join(os.path.dirname(path), base.replace('run-', 'ss-', 1)))
        for line in open(path):
            m = row.match(line)
            if not m:
                continue
            pt, var, rnd, proc, g = m.group(1), m.group(2), int(m.group(3)), m.group(4), m.group(5)
            try:
                g = float(g)
                ps = [float(x) for x in m.group(7).split(',')]
            except ValueError:
                continue
            eq = sum(ps[1:10]) / 9 if len(ps) >= 10 else float('nan')
            if proc == 'mptcp' and m.group(6) != 'True':
                print(f'{pt} {var} round {rnd}: MPTCP fell back, trial dropped')
                continue
            data[(pt, var)].setdefault((base, rnd), {})[proc] = (g, counters(m.group(8)), counters(m.group(9)), eq, len(ps), counters(m.group(10) or ''))
            loads.append(float(m.group(11)))
    for (pt, var), rounds in data.items():
        print(f'== {pt} {var} ({", ".join(sorted({b for b, _ in rounds}))})')
        logs, tcp, mp, elogs, etcp, emp, lt, lm = [], [], [], [], [], [], [], []
        print('file:round | first | TCP Mbit/s (len s) | MPTCP Mbit/s (len s) | MPTCP/TCP | TCP 1-10 s | MPTCP 1-10 s | MPTCP/TCP 1-10 s | '
              'TCP snd rtx | MPTCP snd rtx | TCP / MPTCP fwd path drops (tbf, loss rule, delay line) | MPTCP subflow notsent at 9 s')
        sums = {'tcp': defaultdict(int), 'mptcp': defaultdict(int)}
        ddiff = []  # per round: MPTCP's tbf drop % minus TCP's
        for (base, r) in sorted(rounds):
            p = rounds[(base, r)]
            if 'tcp' not in p or 'mptcp' not in p:
                continue
            for proc in p:
                for k, v in p[proc][1].items():
                    sums[proc]['snd:' + k] += v
                for k, v in p[proc][2].items():
                    sums[proc]['rcv:' + k] += v
                for k, v in p[proc][5].items():
                    sums[proc]['path:' + k] += v
            t, mm_ = p['tcp'][0], p['mptcp'][0]
            tcp.append(t); mp.append(mm_)
            lt.append(p['tcp'][4]); lm.append(p['mptcp'][4])
            if t > 0 and mm_ > 0:
                logs.append(math.log(mm_ / t))
            et, em = p['tcp'][3], p['mptcp'][3]
            etcp.append(et); emp.append(em)
            if et > 0 and em > 0:
                elogs.append(math.log(em / et))
            pt_, pm_ = p['tcp'][5], p['mptcp'][5]
            if pt_.get('tx') and pm_.get('tx'):
                ddiff.append(100 * (pm_['tbfdrop'] / (pm_['tx'] + pm_['tbfdrop']) - pt_['tbfdrop'] / (pt_['tx'] + pt_['tbfdrop'])))
            sm = ss[base].get((var, r, 'mptcp'), {})
            def drops(x):
                c = x[5]
                return f"{c.get('tbfdrop', '-')}, {c.get('lossdrop', '-')}, {c.get('delaylinelost', '-')}" if c else '-'
            print(f"{base[4:-4]}:{r} | {'tcp' if r % 2 else 'mptcp'} | {t:.2f} ({p['tcp'][4]}) | {mm_:.2f} ({p['mptcp'][4]}) | {mm_ / t:.2f} | "
                  f"{et:.2f} | {em:.2f} | {em / et:.2f} | "
                  f"{p['tcp'][1].get('TcpRetransSegs', 0)} | {p['mptcp'][1].get('TcpRetransSegs', 0)} | "
                  f"{drops(p['tcp'])} / {drops(p['mptcp'])} | {sm.get('notsent', '-')}")
        n = len(logs)
        if n >= 2:
            print(f'rounds {n}; bench goodput: ' + summary(tcp, mp, logs))
            print(f'bench window (s, per-second samples): TCP median {statistics.median(lt)} (range {min(lt)}-{max(lt)}), '
                  f'MPTCP median {statistics.median(lm)} (range {min(lm)}-{max(lm)})')
        if len(elogs) >= 2:
            print('equal window (1-10 s): ' + summary(etcp, emp, elogs))
        for proc in ('tcp', 'mptcp'):
            keys = sorted(k for k in sums[proc] if not k.endswith(('SYNTX', 'SYNRX', 'SYNACKRX', 'ACKRX')))
            print(f'{proc} counter sums over {n} trials: ' + ' '.join(f'{k}={sums[proc][k]}' for k in keys))
        for proc in ('tcp', 'mptcp'):
            c = sums[proc]
            if c.get('path:tx'):
                print(f"{proc}: bottleneck (tbf) drops {c['path:tbfdrop']} of {c['path:tx'] + c['path:tbfdrop']} packets offered "
                      f"({100 * c['path:tbfdrop'] / (c['path:tx'] + c['path:tbfdrop']):.3f} %); sender retransmitted "
                      f"{c.get('snd:TcpRetransSegs', 0)} of {c.get('snd:TcpOutSegs', 0) or '-'} segments sent")
        if len(ddiff) >= 2:
            m, lo, hi = tinterval(ddiff)
            print(f'tbf drop % per round, MPTCP minus TCP: mean {m:+.3f} points, 95 % t interval [{lo:+.3f}, {hi:+.3f}] ({len(ddiff)} rounds)')
        print()
    if loads:
        loads.sort()
        print(f'load (1-min, at trial ends): min {loads[0]:.2f} median {statistics.median(loads):.2f} max {loads[-1]:.2f} ({len(loads)} trials)')


if __name__ == '__main__':
    main(sys.argv[1:])
