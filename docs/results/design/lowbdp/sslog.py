"""The 200 ms samples of OUT (ss-sampler-fast.py): OUT/ss.txt (subflows, keyed by local address)
and OUT/ss.txt.msk (MPTCP sockets: the client's keyed by its local address, the server's by its
peer's address). Returns (subflows, client, server), each key -> [(time string, ss text)] in file
order. Used by diag.py and hol.py."""
import collections, os


def samples(out):
    sf, mc, ms = (collections.defaultdict(list) for _ in range(3))
    for l in open(os.path.join(out, 'ss.txt')):
        p = l.split(' ', 4)
        if len(p) == 5: sf[p[2]].append((p[0], p[4]))
    for l in open(os.path.join(out, 'ss.txt.msk')):
        p = l.split(' ', 4)
        if len(p) < 5: continue
        if p[1].endswith('-client'): mc[p[2]].append((p[0], p[4]))
        else: ms[p[3].replace('[::ffff:', '').replace(']', '')].append((p[0], p[4]))
    return sf, mc, ms
