#!/usr/bin/env python3
# Prints one line per trial of the given points from trials.jsonl files: goodput (to the last
# byte, equal window), window, longest gap, and per subflow bytes, RTT (smoothed/min), retransmissions.
# usage: trials.py POINT[,POINT] FILE...
import json, sys
pts = set(sys.argv[1].split(","))
for fn in sys.argv[2:]:
    for l in open(fn):
        t = json.loads(l)
        if t["configuration"] not in pts:
            continue
        sf = " | ".join("%s %.2fMB rtt %.0f/%.0f rx %d" % (s["path"], s["bytes"] / 1e6, s["rtt_ms"], s["min_rtt_ms"], s["retrans"])
                        for s in (t.get("subflows") or []))
        print(t["configuration"], t["trial"], t.get("cell", t["procedure"]).ljust(24),
              "%6.2f eq %6.2f win %5.1f gap %.2f@%.1f load %.1f" % (t.get("goodput_mbps", 0), t.get("equal_goodput_mbps", 0),
              t.get("window_s", 0), t.get("max_gap_s", 0), t.get("max_gap_end_s", 0), t.get("loadavg_1m", 0)), t["status"], sf)
