#!/usr/bin/env python3
# Samples bytes_acked and notsent of every established TCP socket in the lab client namespaces
# whose name starts with argv[1], every 0.5 s; appends "time local peer bytes_acked notsent" to argv[2].
import datetime, re, subprocess, sys, time
prefix, out = sys.argv[1], sys.argv[2]
while True:
    t = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    nss = [l.split()[0] for l in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.splitlines()]
    lines = []
    for ns in nss:
        if not (ns.startswith(prefix) and ns.endswith("-client")):
            continue
        r = subprocess.run(["ip", "netns", "exec", ns, "ss", "-tinH", "state", "established"], capture_output=True, text=True)
        cur = None
        for l in r.stdout.splitlines():
            if not l.startswith((" ", "\t")):
                p = l.split()
                cur = (p[-2], p[-1]) if len(p) >= 4 else None
            elif cur:
                a = re.search(r"bytes_acked:(\d+)", l)
                n = re.search(r"notsent:(\d+)", l)
                lines.append(f"{t} {cur[0]} {cur[1]} {a.group(1) if a else 0} {n.group(1) if n else 0}")
                cur = None
    if lines:
        with open(out, "a") as f:
            f.write("\n".join(lines) + "\n")
    time.sleep(0.5)
