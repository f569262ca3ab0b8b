#!/usr/bin/env python3
"""Two SVG figures (no plotting library on this machine; plain SVG):
tinypath.svg: every point of paired-main2 + lowat (static pooled over both runs): static / best
  single path (log scale) against TCP on the smaller path / TCP on the best path, low-BDP points
  filled and labelled, high-BDP points hollow.
p044-trace.svg: one static trial of run 1 at p044 (round 1): the fast subflow's bytes in flight and
  unsent, the slow (default-path) subflow's unsent + in flight, and the client MPTCP socket's
  data-level backlog (write_seq - snd_una) against its send buffer, every 200 ms."""
import json, os, math, statistics, collections, re, datetime, glob, gzip
H = os.path.dirname(os.path.abspath(__file__)); D = os.path.join(H, '..')
def svg(w, h, body): return f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">\n<rect width="{w}" height="{h}" fill="white"/>\n' + body + '</svg>\n'
# figure 1
P = collections.defaultdict(lambda: collections.defaultdict(list)); cls = {}
for run in ['paired-main2', 'lowat']:
    for r in json.load(open(os.path.join(D, run, 'results.json'))):
        if r['status'] == 'ok':
            P[r['point']][r['procedure']].append(r['goodput_mbps']); cls[r['point']] = r['bdp']
W, Hh, L, B, T, R = 640, 420, 60, 50, 30, 20
X = lambda x: L + x * (W - L - R)
Y = lambda y: T + (math.log(2.0) - math.log(y)) / (math.log(2.0) - math.log(0.2)) * (Hh - T - B)
b = []
for yv in [0.2, 0.3, 0.5, 0.7, 0.95, 1.0, 1.5, 2.0]:
    b.append(f'<line x1="{L}" x2="{W-R}" y1="{Y(yv):.1f}" y2="{Y(yv):.1f}" stroke="{"#c00" if yv == 0.95 else "#ddd"}" stroke-dasharray="{"4,3" if yv == 0.95 else ""}"/><text x="{L-6}" y="{Y(yv)+4:.1f}" text-anchor="end">{yv}</text>')
for xv in [0, 0.2, 0.4, 0.6, 0.8, 1.0]:
    b.append(f'<line x1="{X(xv):.1f}" x2="{X(xv):.1f}" y1="{T}" y2="{Hh-B}" stroke="{"#888" if xv == 0.2 else "#eee"}"/><text x="{X(xv):.1f}" y="{Hh-B+14}" text-anchor="middle">{xv}</text>')
for p, d in sorted(P.items()):
    c = [statistics.mean(d['tcp-path1']), statistics.mean(d['tcp-path2'])]; bb = max(c)
    x, y = min(c) / bb, statistics.mean(d['mptcp-static']) / bb
    y = min(max(y, 0.2), 2.0)
    if cls[p] == 'low':
        b.append(f'<circle cx="{X(x):.1f}" cy="{Y(y):.1f}" r="4.5" fill="#1f6fb4"/><text x="{X(x)+6:.1f}" y="{Y(y)-5:.1f}" fill="#1f6fb4">{p}</text>')
    else:
        b.append(f'<circle cx="{X(x):.1f}" cy="{Y(y):.1f}" r="4" fill="none" stroke="#999"/>')
b.append(f'<text x="{(L+W-R)/2}" y="{Hh-12}" text-anchor="middle">TCP on the smaller path / TCP on the best path (means)</text>')
b.append(f'<text x="14" y="{(T+Hh-B)/2}" text-anchor="middle" transform="rotate(-90 14 {(T+Hh-B)/2})">static MPTCP / best single path (log)</text>')
b.append(f'<text x="{L}" y="18">paired-main2 + lowat, static pooled over both runs: filled = low-BDP (13), hollow = high-BDP (50); red dashed 0.95</text>')
open(os.path.join(H, 'tinypath.svg'), 'w').write(svg(W, Hh, '\n'.join(b) + '\n'))
# figure 2
def ts(s): return datetime.datetime.fromisoformat(s.replace('Z', '+00:00'))
tr = [json.loads(l) for l in open(os.path.join(H, 'diag', 'runs', 'paired', 'trials.jsonl'))]
t = [x for x in tr if x['configuration'] == 'p044' and x['cell'] == 'mptcp-static' and x['trial'] == 1][0]
fast = [s['local'] for s in t['subflows'] if s['path'] != 'default'][0]; slow = t['subflows'][0]['local']
st = ts(t['start'][:26] + 'Z')
op = lambda f: gzip.open(f + '.gz', 'rt') if not os.path.exists(f) else open(f)
num = lambda rx, s: float(re.search(rx, s).group(1)) if re.search(rx, s) else 0.0
S = collections.defaultdict(dict)
for l in op(os.path.join(H, 'diag', 'ss.txt')):
    p = l.split(' ', 4)
    if len(p) == 5 and p[2] in (fast, slow):
        S[p[0]][p[2]] = p[4]
M = {}
for l in op(os.path.join(H, 'diag', 'ss.txt.msk')):
    p = l.split(' ', 4)
    if len(p) == 5 and p[2] == slow and p[1].endswith('-client'): M[p[0]] = p[4]
rows = []
for k in sorted(S):
    x = (ts(k) - st).total_seconds()
    if not 0 <= x <= 13: continue
    f, s, m = S[k].get(fast, ''), S[k].get(slow, ''), M.get(k, '')
    bl = ((int(re.search(r'write_seq:(\w+)', m).group(1), 16) - int(re.search(r'snd_una:(\w+)', m).group(1), 16)) / 1000) if 'write_seq' in m else None
    rows.append((x, num(r'unacked:(\d+)', f) * 1.448 + num(r'notsent:(\d+)', f) / 1000, num(r'unacked:(\d+)', s) * 1.448 + num(r'notsent:(\d+)', s) / 1000, bl, num(r'tb(\d+),', m) / 1000 if m else None))
W, Hh = 720, 360
x0 = min(r[0] for r in rows); x1 = max(r[0] for r in rows)
X = lambda x: L + (x - x0) / (x1 - x0) * (W - L - R)
ym = 1000
Y = lambda y: T + (1 - y / ym) * (Hh - T - B)
b = []
for yv in range(0, ym + 1, 200):
    b.append(f'<line x1="{L}" x2="{W-R}" y1="{Y(yv):.1f}" y2="{Y(yv):.1f}" stroke="#eee"/><text x="{L-6}" y="{Y(yv)+4:.1f}" text-anchor="end">{yv}</text>')
for xv in range(math.ceil(x0), int(x1) + 1):
    b.append(f'<text x="{X(xv):.1f}" y="{Hh-B+14}" text-anchor="middle">{xv}</text>')
for i, (col, lab) in enumerate([('#1f6fb4', 'fast subflow (detour, 12 ms): in flight + unsent'), ('#d62728', 'slow subflow (default path, 160 ms, 1.4 % loss): in flight + unsent'), ('#2ca02c', 'MPTCP socket: written, not yet acked at the data level'), ('#999', 'MPTCP socket send buffer (sk_sndbuf)')]):
    pts = ' '.join(f'{X(r[0]):.1f},{Y(min(r[i+1], ym)):.1f}' for r in rows if r[i + 1] is not None)
    dash = 'stroke-dasharray="5,3"' if i == 3 else ''
    b.append(f'<polyline fill="none" stroke="{col}" stroke-width="1.6" {dash} points="{pts}"/>')
    b.append(f'<rect x="{L+10}" y="{T+8+i*14}" width="12" height="3" fill="{col}"/><text x="{L+28}" y="{T+12+i*14}">{lab}</text>')
b.append(f'<text x="{(L+W-R)/2}" y="{Hh-12}" text-anchor="middle">s after the trial started (the agent starts first; the connection opens at ~1.7 s)</text>')
b.append(f'<text x="14" y="{(T+Hh-B)/2}" text-anchor="middle" transform="rotate(-90 14 {(T+Hh-B)/2})">kB</text>')
b.append(f'<text x="{L}" y="18">p044, static, run 1 round 1 ({t["goodput_mbps"]:.2f} Mbit/s; TCP on the detour alone 41.2): ss every 200 ms</text>')
open(os.path.join(H, 'p044-trace.svg'), 'w').write(svg(W, Hh, '\n'.join(b) + '\n'))
