#!/bin/bash
# tinypath-rttoff: one chunk of shard K under /work/runs/measure: up to 20 min, none after 07:10 UTC.
K=$1
cd /work/wt-rttoff || exit 1
OUT=docs/results/design/tinypath-rttoff
STOP=$(date -u -d '2026-11-28 07:10:00' +%s)
B=$(( STOP - $(date +%s) )); [ $B -gt 1200 ] && B=1200
[ $B -le 30 ] && { echo "$(date -u +%T) budget $B s: not started"; exit 3; }
echo "$(date -u +%FT%TZ) rtt$K chunk-start $(cut -d' ' -f1 /proc/loadavg) budget ${B}s" >> $OUT/load.txt
/work/runs/bin-rttoff/mpdetour-lab design --bin /work/runs/bin-rttoff/mpdetour \
    --points 200 --seed 1 --trials 3 \
    --procedures tcp-path1,tcp-path2,mptcp-static,mptcp-guard+share15+starveoff+rttoff \
    --only $(cat $OUT/only.txt) --out $OUT --resume --budget ${B}s --shard $K/2 --name rtt$K
rc=$?
echo "$(date -u +%FT%TZ) rtt$K chunk-end $(cut -d' ' -f1 /proc/loadavg) rc=$rc" >> $OUT/load.txt
exit $rc
