#!/usr/bin/env python3
# ss-sampler-fast.py PREFIX OUT INTERVAL_S: lowat-p149/ss-sampler.py's sampling, every INTERVAL_S
# (0.2 here) instead of once a second, and the MPTCP sockets beside the subflows. Per sample:
# every established TCP socket (the subflows and plain TCP) in the namespace PREFIX-client with
# `ss -tinmH`, one line "TIME NS LOCAL PEER <ss -i fields>" to OUT (the format sfstats.py,
# chronotrials.py read: cwnd, rtt, notsent, retrans, delivery_rate, skmem w, busy/sndbuf_limited);
# the MPTCP sockets of PREFIX-client and PREFIX-server with `ss -MinmH`, the same format, to OUT.msk.
import datetime, subprocess, sys, time
prefix, out, iv = sys.argv[1], sys.argv[2], float(sys.argv[3])
def sample(ns, flags):
    r = subprocess.run(["ip", "netns", "exec", ns, "ss", flags, "state", "established"], capture_output=True, text=True)
    res, cur = [], None
    for l in r.stdout.splitlines():
        if not l.startswith((" ", "\t")):
            p = l.split()
            cur = (p[-2], p[-1]) if len(p) >= 4 else None
        elif cur:
            res.append((cur, " ".join(l.split())))
            cur = None
    return res
while True:
    t0 = time.time()
    t = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    try:
        nss = [l.split()[0] for l in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.splitlines()]
    except Exception:
        nss = []
    a, b = [], []
    for ns in nss:
        if not ns.startswith(prefix):
            continue
        if ns == prefix + "-client":
            a += [f"{t} {ns} {c[0]} {c[1]} {f}" for c, f in sample(ns, "-tinmH")]
        if ns in (prefix + "-client", prefix + "-server"):
            b += [f"{t} {ns} {c[0]} {c[1]} {f}" for c, f in sample(ns, "-MinmH")]
    if a:
        with open(out, "a") as f:
            f.write("\n".join(a) + "\n")
    if b:
        with open(out + ".msk", "a") as f:
            f.write("\n".join(b) + "\n")
    time.sleep(max(0.0, iv - (time.time() - t0)))
