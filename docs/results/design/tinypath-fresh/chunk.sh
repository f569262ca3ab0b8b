#!/bin/bash
# tinypath-fresh: one chunk of shard K under /work/runs/measure: up to 20 min, none after 06:55 UTC.
K=$1
cd /work/wt-tiny2 || exit 1
OUT=docs/results/design/tinypath-fresh
STOP=$(date -u -d '2026-11-28 06:55:00' +%s)
B=$(( STOP - $(date +%s) )); [ $B -gt 1200 ] && B=1200
[ $B -le 30 ] && { echo "$(date -u +%T) budget $B s: not started"; exit 3; }
echo "$(date -u +%FT%TZ) tiny$K chunk-start $(cut -d' ' -f1 /proc/loadavg) budget ${B}s" >> $OUT/load.txt
/work/runs/bin-tiny/mpdetour-lab design --bin /work/runs/bin-tiny/mpdetour \
    --points 200 --seed 1 --trials 3 \
    --procedures tcp-path1,tcp-path2,mptcp-static,mptcp-guard,mptcp-guard+share15+starveoff \
    --only $(cat $OUT/only.txt) --out $OUT --resume --budget ${B}s --shard $K/2 --name tiny$K
rc=$?
echo "$(date -u +%FT%TZ) tiny$K chunk-end $(cut -d' ' -f1 /proc/loadavg) rc=$rc" >> $OUT/load.txt
exit $rc
