#!/usr/bin/env python3
"""mechanism.py SAMPLEDIR...: per MPTCP connection on the client (the sender), from t=1 s:
the MPTCP socket's send buffer use (skmem w/tb, median and share of samples >= 90 %),
the data-level bytes in flight (write_seq - snd_una) against the MPTCP-level window
the receiver advertises (snd_wnd of the subflows), and per subflow: share of bytes,
share of samples idle (nothing in flight, nothing queued) and starved (nothing queued,
window not full), retransmitted bytes."""
import re, sys, statistics as st, importlib.util, io, contextlib
here = __file__.rsplit('/', 1)[0]
for d in sys.argv[1:]:
    sys.argv = [sys.argv[0], d]
    spec = importlib.util.spec_from_file_location('p', here + '/parse.py')
    with contextlib.redirect_stdout(io.StringIO()):
        p = importlib.util.module_from_spec(spec); spec.loader.exec_module(p)
    # skmem of the MPTCP sockets, by token, per sample time
    sk = {}
    for t, lines in p.samples(d + '/client.ss'):
        for i, l in enumerate(lines):
            if l.startswith('mptcp') and i + 1 < len(lines):
                m = re.search(r'token:([0-9a-f]+)', lines[i + 1]); s = re.search(r'skmem:\(r\d+,rb\d+,t\d+,tb(\d+),f\d+,w(\d+)', lines[i + 1])
                if m and s: sk.setdefault(m.group(1), {})[t] = (int(s.group(1)), int(s.group(2)))
    print('##', d)
    for tok, c in p.conns.items():
        rows = [r for r in c['rows'] if r[0] - c['rows'][0][0] >= 1.0]
        if c['last'] - c['first'] < 3 or not rows: continue
        keys = sorted(set(k for _, _, ss in rows for k in ss), key=lambda k: k[1])
        use = [w / tb for t, (tb, w) in sk.get(tok, {}).items() if t - c['rows'][0][0] >= 1.0 and tb]
        infl = [((m['write_seq'] or 0) - (m['snd_una'] or 0)) for _, m, _ in rows]
        wnd = [max((s['snd_wnd'] or 0) for s in ss.values()) for _, _, ss in rows if ss]
        first, last = rows[0][2], rows[-1][2]
        tot = sum(((last.get(k) or {}).get('bytes_acked') or 0) - ((first.get(k) or {}).get('bytes_acked') or 0) for k in keys) or 1
        line = f"{tok}: sndbuf use median {st.median(use) if use else float('nan'):.2f} (>=0.9 in {sum(u >= 0.9 for u in use) / max(len(use), 1):.0%}); in flight {st.median(infl)/1e3:.0f} kB of window {st.median(wnd)/1e3:.0f} kB |"
        for k in keys:
            name = 'def' if '10.0.3.2' in k[1] else 'det'
            seen = [ss[k] for _, _, ss in rows if k in ss]
            idle = sum(1 for s in seen if not s['unacked'] and not s['notsent']) / max(len(seen), 1)
            # not limited by its congestion window: nothing waits to be sent and
            # the window is not full (the subflow waits for data: starved)
            starved = sum(1 for s in seen if not s['notsent'] and (s['unacked'] or 0) < (s['cwnd'] or 0)) / max(len(seen), 1)
            b = ((last.get(k) or seen[-1]).get('bytes_acked') or 0) - ((first.get(k) or seen[0]).get('bytes_acked') or 0)
            rtx = ((seen[-1].get('bytes_retrans') or 0) - (seen[0].get('bytes_retrans') or 0)) / 1e3
            line += f" {name}: share {b / tot:.2f} idle {idle:.0%} starved {starved:.0%} rtx {rtx:.0f} kB |"
        print(line)
