#!/usr/bin/env python3
"""signal.py SAMPLEDIR: the candidate harm signal per two-subflow connection.

Per 1 s window ending at each sample from 1 s on: each subflow's share of the
bytes acked in the window, and its hold time: (unacked segments x MSS + not-sent
bytes) / its rate over the window (how long the data it holds keeps the
connection's in-order delivery waiting), in units of the other subflow's srtt."""
import sys, importlib.util
spec = importlib.util.spec_from_file_location('p', __file__.replace('signal.py', 'parse.py'))
sys.argv = [sys.argv[0], sys.argv[1]]
import io, contextlib
with contextlib.redirect_stdout(io.StringIO()):
    p = importlib.util.module_from_spec(spec); spec.loader.exec_module(p)
for tok, c in p.conns.items():
    rows = c['rows']
    keys = sorted(set(k for _, _, ss in rows for k in ss), key=lambda k: k[1])
    if len(keys) < 2 or c['last'] - c['first'] < 3: continue
    t0 = rows[0][0]
    out = []
    for i, (t, m, ss) in enumerate(rows):
        j = max(x for x in range(i + 1) if t - rows[x][0] >= 1.0) if t - t0 >= 1.0 else None
        if j is None: continue
        tj, _, sj = rows[j]
        dt = t - tj
        acked = {k: ((ss.get(k) or {}).get('bytes_acked') or 0) - ((sj.get(k) or {}).get('bytes_acked') or 0) for k in keys}
        tot = sum(acked.values()) or 1
        rec = [t - t0]
        for k in keys:
            s = ss.get(k)
            if not s: rec += [None, None]; continue
            other = [ss[o] for o in keys if o != k and o in ss]
            ortt = other[0]['rtt'] if other and other[0]['rtt'] else 50
            held = (s['unacked'] or 0) * 1448 + (s['notsent'] or 0)
            rate = acked[k] / dt
            hold = held / rate if rate > 0 else 99
            rec += [acked[k] / tot, hold * 1000 / ortt]
        out.append(rec)
    names = ['def' if '10.0.3.2' in k[1] else 'det' for k in keys]
    print(f"== {tok} {names}")
    for lo, hi in ((1, 2), (2, 3), (1, 9.9)):
        sel = [r for r in out if lo <= r[0] < hi]
        if not sel: continue
        def med(ix):
            v = sorted(x[ix] for x in sel if x[ix] is not None)
            return v[len(v) // 2] if v else float('nan')
        print(f"  t {lo}-{hi}s: " + '  '.join(f"{n}: share {med(1+2*i):.2f} hold {med(2+2*i):5.1f} x other srtt" for i, n in enumerate(names)))
