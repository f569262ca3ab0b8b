#!/bin/bash
# run.sh NAME OUT TRIALS PROCEDURES POINTS: the design's points POINTS x TRIALS interleaved rounds of
# PROCEDURES (build in /work/runs/bin-lowbdp), in --resume chunks of --budget 10m under
# /work/runs/measure (no chunk starts after 04:05 UTC; --budget stops before a new point, so the
# last chunk ends by ~04:15), with ss samples of the client's subflows and of both ends' MPTCP
# sockets every 200 ms (ss-sampler-fast.py -> OUT/ss.txt, OUT/ss.txt.msk), both namespaces'
# counters once a second (lowat-p149/nstat-sampler.sh -> OUT/nstat.txt), both namespaces' buffer
# sysctls every 5 s (OUT/sysctl.txt) and the 1-min load every 30 s (OUT/load.txt).
NAME=$1 OUT=$2 TRIALS=$3 PROCS=$4 POINTS=$5
cd /work/wt-lowbdp
D=docs/results/design/lowbdp
B=/work/runs/bin-lowbdp
END=$(date -u -d "2026-11-28 04:05" +%s)
mkdir -p $OUT
( while :; do echo "$(date -u +%FT%TZ) $(cut -d' ' -f1-3 /proc/loadavg)" >>$OUT/load.txt; sleep 30; done ) & LP=$!
python3 $D/ss-sampler-fast.py $NAME $OUT/ss.txt 0.2 & SP=$!
$D/../lowat-p149/nstat-sampler.sh $NAME $OUT/nstat.txt & NP=$!
( while :; do for ns in $NAME-client $NAME-server; do ip netns exec $ns true 2>/dev/null || continue
    echo "$(date -u +%FT%TZ) $ns wmem=$(ip netns exec $ns sysctl -n net.ipv4.tcp_wmem | tr '\t' ,) rmem=$(ip netns exec $ns sysctl -n net.ipv4.tcp_rmem | tr '\t' ,) stale=$(ip netns exec $ns sysctl -n net.mptcp.stale_loss_cnt)" >>$OUT/sysctl.txt; done; sleep 5; done ) & CP=$!
trap 'kill $LP $SP $NP $CP' EXIT
n() { cat $OUT/runs/paired/trials.jsonl 2>/dev/null | wc -l; }
want=$(( TRIALS * $(echo $PROCS | tr , '\n' | wc -l) * $(echo $POINTS | tr , '\n' | wc -l) ))
while :; do
  before=$(n)
  [ "$before" -ge "$want" ] && { echo "done: $before trials"; break; }
  [ "$(date -u +%s)" -ge "$END" ] && { echo "04:05 UTC reached with $before trials"; break; }
  echo "chunk requested $(date -u +%FT%TZ) trials $before" >>$OUT/chunks.txt
  MEASURE_TAG=lowbdp /work/runs/measure bash -c '
    now=$(date -u +%s); left=$(( '$END' - now ))
    echo "chunk slot $(date -u +%FT%TZ) load $(cut -d" " -f1 /proc/loadavg)" >>'$OUT'/chunks.txt
    [ $left -le 0 ] && { echo "04:05 UTC passed while waiting for a slot"; exit 3; }
    b=$(( left < 600 ? left : 600 ))
    exec '$B'/mpdetour-lab design --bin '$B'/mpdetour --points 200 --seed 1 --trials '$TRIALS' \
      --procedures '$PROCS' --only '$POINTS' --out '$OUT' --resume --budget ${b}s --name '$NAME
  rc=$?
  echo "chunk ended $(date -u +%FT%TZ) rc=$rc trials $(n) load $(cut -d' ' -f1 /proc/loadavg)" >>$OUT/chunks.txt
  [ $rc -eq 3 ] && break
  [ "$(n)" -eq "$before" ] && { echo "no new trials in a chunk (rc=$rc): stop"; break; }
done
