#!/usr/bin/env python3
# Samples every established TCP socket in the lab client namespaces whose name starts with argv[1]
# once a second with `ss -tinmH` and appends "TIME NS LOCAL PEER <ss -i fields>" to argv[2]
# (notsent, cwnd, rtt, pacing_rate, delivery_rate, retrans, skmem with w = sk_wmem_queued, ... as ss prints them).
import datetime, subprocess, sys, time
prefix, out = sys.argv[1], sys.argv[2]
while True:
    t = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    try:
        nss = [l.split()[0] for l in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.splitlines()]
    except Exception:
        nss = []
    lines = []
    for ns in nss:
        if not (ns.startswith(prefix) and ns.endswith("-client")):
            continue
        r = subprocess.run(["ip", "netns", "exec", ns, "ss", "-tinmH", "state", "established"], capture_output=True, text=True)
        cur = None
        for l in r.stdout.splitlines():
            if not l.startswith((" ", "\t")):
                p = l.split()
                cur = (p[-2], p[-1]) if len(p) >= 4 else None
            elif cur:
                lines.append(f"{t} {ns} {cur[0]} {cur[1]} {' '.join(l.split())}")
                cur = None
    if lines:
        with open(out, "a") as f:
            f.write("\n".join(lines) + "\n")
    time.sleep(1)
