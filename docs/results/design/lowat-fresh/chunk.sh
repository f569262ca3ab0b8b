#!/bin/bash
# lowat-fresh: one chunk of shard K, run under /work/runs/measure (the budget is counted from
# here, after the slot is held): 20 minutes, cut so that no point starts after 04:20 UTC.
# Records the 1-min load at the chunk's start and end (load.txt). Exit 3: too late to start.
K=$1
cd /work/wt-fresh || exit 1
OUT=docs/results/design/lowat-fresh
STOP_POINT=$(date -u -d '2026-11-28 04:20:00' +%s)
B=$(( STOP_POINT - $(date +%s) )); [ $B -gt 1200 ] && B=1200
[ $B -le 30 ] && { echo "$(date -u +%T) budget $B s: not started"; exit 3; }
echo "$(date -u +%FT%TZ) fresh$K chunk-start $(cut -d' ' -f1 /proc/loadavg) budget ${B}s" >> $OUT/load.txt
echo "$(date -u +%T) chunk start, budget ${B}s"
/work/runs/bin-fresh/mpdetour-lab design --bin /work/runs/bin-fresh/mpdetour \
    --points 200 --seed 1 --trials 3 \
    --procedures tcp-path1,tcp-path2,mptcp-1sf,mptcp-static,mptcp-static+lowat \
    --only $(cat $OUT/only.txt) --out $OUT --resume --budget ${B}s --shard $K/2 --name fresh$K
rc=$?
echo "$(date -u +%FT%TZ) fresh$K chunk-end $(cut -d' ' -f1 /proc/loadavg) rc=$rc" >> $OUT/load.txt
exit $rc
