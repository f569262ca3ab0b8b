#!/bin/bash
# rttdesign: one chunk of shard K, run under /work/runs/measure; the budget is counted from here
# (after the slot is held) so that no point starts after 01:26 UTC. Exit 3: too late to start.
K=$1
cd /work/wt-rttdesign || exit 1
OUT=docs/results/design/lowatrtt
STOP_POINT=$(date -u -d '2026-11-28 01:26:00' +%s)
B=$(( STOP_POINT - $(date +%s) )); [ $B -gt 540 ] && B=540
[ $B -le 30 ] && { echo "$(date -u +%T) budget $B s: not started"; exit 3; }
echo "$(date -u +%T) chunk start, budget ${B}s"
exec /work/runs/bin-rtt/mpdetour-lab design --bin /work/runs/bin-rtt/mpdetour \
    --points 200 --seed 1 --trials 3 \
    --procedures tcp-path1,tcp-path2,mptcp-static,mptcp-static+lowat,mptcp-static+lowatrtt \
    --only $(cat $OUT/only.txt) --out $OUT --resume --budget ${B}s --shard $K/2 --name rttd$K
