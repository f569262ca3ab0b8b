#!/usr/bin/env python3
"""parse.py SAMPLEDIR: per-connection time series from sample.sh's ss and nstat output.

Prints, per MPTCP connection seen on the client (the sender in the design's uploads),
one line per second: per subflow (default path = peer 10.0.3.2, else the detour)
goodput acked in that second, cwnd, srtt, retransmitted bytes, snd_wnd (the
MPTCP-level window the receiver advertises), unacked+notsent, rwnd_limited/
sndbuf_limited growth; MPTCP write_seq-snd_una (bytes in flight at the data level);
and the server's MPTcpExt counter deltas."""
import re, sys, collections
d = sys.argv[1]

def opened(path):
    import gzip, os
    return open(path) if os.path.exists(path) else gzip.open(path + '.gz', 'rt')

def samples(path):
    t = None; buf = []
    for line in opened(path):
        if line.startswith('@ '):
            if t is not None: yield t, buf
            t = float(line[2:]); buf = []
        else:
            buf.append(line.rstrip('\n'))
    if t is not None: yield t, buf

num = lambda s, k, f=float: (f(m.group(1)) if (m := re.search(r'(?:^|\s)' + k + r'[:=]([0-9.]+)', s)) else None)

def parse_ss(path):
    out = []  # (t, subs{(local,peer):dict}, mptcp{(local,peer):dict})
    for t, lines in samples(path):
        subs, mp = {}, {}
        i = 0
        kind = None
        while i < len(lines):
            h = lines[i].split()
            if not h: i += 1; continue
            if lines[i].startswith('\t') or lines[i].startswith(' '):
                i += 1; continue
            if h[0] in ('tcp', 'mptcp'):
                kind = h[0]; h = h[1:]
            else:
                kind = 'tcp'
            local, peer = h[2], h[3]
            info = lines[i + 1] if i + 1 < len(lines) else ''
            i += 2
            if kind == 'mptcp' or 'write_seq' in info:
                m = dict(sendq=int(h[1]), recvq=int(h[0]))
                for k in ('write_seq', 'snd_una', 'rcv_nxt'):
                    mm = re.search(k + r':([0-9a-f]+)', info)
                    m[k] = int(mm.group(1), 16) if mm else None
                mm = re.search(r'token:([0-9a-f]+)', info)
                m['token'] = mm.group(1) if mm else None
                mp[(local, peer)] = m
                continue
            if 'tcp-ulp-mptcp' not in info: continue
            s = dict(sendq=int(h[1]), recvq=int(h[0]))
            for k in ('cwnd', 'bytes_acked', 'bytes_retrans', 'bytes_received', 'notsent', 'unacked', 'snd_wnd', 'delivery_rate', 'rcv_ooopack', 'lastsnd', 'rcv_space'):
                s[k] = num(info, k)
            mm = re.search(r'rtt:([0-9.]+)/', info); s['rtt'] = float(mm.group(1)) if mm else None
            for k in ('busy', 'rwnd_limited', 'sndbuf_limited'):
                mm = re.search(k + r':([0-9]+)ms', info); s[k] = int(mm.group(1)) if mm else 0
            mm = re.search(r'token:[0-9a-f]+\(id:\d+\)/([0-9a-f]+)', info); s['rtoken'] = mm.group(1) if mm else None
            s['backup'] = 'flags:' in info and re.search(r'flags:\S*[bB]', info) is not None
            subs[(local, peer)] = s
        out.append((t, subs, mp))
    return out

def parse_nstat(path):
    out = []
    for t, lines in samples(path):
        c = {}
        for l in lines:
            f = l.split()
            if len(f) >= 2: c[f[0]] = int(f[1])
        out.append((t, c))
    return out

cl = parse_ss(d + '/client.ss'); sv_n = parse_nstat(d + '/server.nstat'); cl_n = parse_nstat(d + '/client.nstat')
# connections on the client by the MPTCP socket's remote token
conns = collections.OrderedDict()
for t, subs, mp in cl:
    for key, m in mp.items():
        if m['token'] is None: continue
        c = conns.setdefault(m['token'], dict(first=t, rows=[]))
        c['last'] = t
        ss = {k: v for k, v in subs.items() if v['rtoken'] == m['token']}
        c['rows'].append((t, m, ss))

def nstat_delta(series, t0, t1):
    a = [c for t, c in series if t0 - 0.3 <= t <= t0 + 0.3]
    b = [c for t, c in series if t1 - 0.3 <= t <= t1 + 0.3]
    if not a or not b: return {}
    a, b = a[0], b[-1]
    return {k: b[k] - a.get(k, 0) for k in b if b[k] - a.get(k, 0)}

for tok, c in conns.items():
    rows = c['rows']
    if c['last'] - c['first'] < 3: continue
    print(f"== conn {tok} {c['last']-c['first']:.1f}s subflows {sorted(set(p for _, _, ss in rows for (_, p) in ss))}")
    t0 = rows[0][0]
    prev = None
    for t, m, ss in rows:
        sec = int(t - t0)
        if prev is not None and sec == int(prev[0] - t0): continue
        line = f"t={t-t0:5.1f} infl={((m['write_seq'] or 0)-(m['snd_una'] or 0))/1e3:7.0f}kB sendq={m['sendq']/1e3:6.0f}kB |"
        for (l, p), s in sorted(ss.items(), key=lambda x: x[0][1]):
            pa = prev[2].get((l, p)) if prev else None
            dt = t - prev[0] if prev else 1
            acked = ((s['bytes_acked'] or 0) - ((pa or {}).get('bytes_acked') or 0)) * 8 / dt / 1e6 if pa else 0
            rtx = ((s['bytes_retrans'] or 0) - ((pa or {}).get('bytes_retrans') or 0)) / 1e3 if pa else 0
            rwl = (s['rwnd_limited'] - (pa or {}).get('rwnd_limited', 0)) if pa else 0
            sbl = (s['sndbuf_limited'] - (pa or {}).get('sndbuf_limited', 0)) if pa else 0
            name = 'def' if p.startswith('10.0.3.2') or '10.0.3.2' in p else 'det'
            line += f" {name}{'(b)' if s['backup'] else ''} {acked:5.1f}Mb cw={s['cwnd']} rtt={s['rtt']:.0f} rtx={rtx:.0f}kB unack={s['unacked']} nots={(s['notsent'] or 0)/1e3:.0f}k swnd={(s['snd_wnd'] or 0)/1e3:.0f}k rwl+{rwl} sbl+{sbl} |"
        print(line)
        prev = (t, m, ss)
    dn = nstat_delta(sv_n, c['first'], c['last'])
    dc = nstat_delta(cl_n, c['first'], c['last'])
    print('  server nstat:', {k: v for k, v in dn.items() if 'MPTcp' in k or 'OFO' in k})
    print('  client nstat:', {k: v for k, v in dc.items() if 'MPTcp' in k or 'Retrans' in k})
