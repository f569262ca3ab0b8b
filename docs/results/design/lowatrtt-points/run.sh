#!/bin/bash
# lowatrtt-points: p019, p025, p139, p149 x 6 rounds of tcp-path1, tcp-path2, mptcp-static,
# mptcp-static+lowat, mptcp-static+lowatrtt (build 2a4aed7, /work/runs/bin-rtt), in --resume chunks
# of --budget 9m (no new point after 01:25 UTC), with ss samples of the client namespace's
# subflows once a second (ss-sampler.py -> ss.txt) and the 1-min load every 30 s (load.txt).
# Each chunk's request and slot times go to chunks.txt (the wait for a measurement slot).
cd /work/wt-rttpts
D=docs/results/design/lowatrtt-points
END=$(date -u -d "2026-11-28 01:25" +%s)
( while :; do echo "$(date -u +%FT%TZ) $(cut -d' ' -f1-3 /proc/loadavg)" >>$D/load.txt; sleep 30; done ) & LP=$!
python3 $D/../lowat-p149/ss-sampler.py rttpts $D/ss.txt & SP=$!
trap 'kill $LP $SP' EXIT
n() { cat $D/runs/paired/trials.jsonl 2>/dev/null | wc -l; }
while :; do
  before=$(n)
  [ "$before" -ge 120 ] && { echo "done: $before trials"; break; }
  [ "$(date -u +%s)" -ge "$END" ] && { echo "01:25 UTC reached with $before trials"; break; }
  echo "chunk requested $(date -u +%FT%TZ) trials $before" >>$D/chunks.txt
  MEASURE_TAG=rttpts /work/runs/measure bash -c '
    now=$(date -u +%s); left=$(( '$END' - now ))
    echo "chunk slot $(date -u +%FT%TZ) load $(cut -d" " -f1 /proc/loadavg)" >>'$D'/chunks.txt
    [ $left -le 0 ] && { echo "01:25 UTC passed while waiting for a slot"; exit 3; }
    b=$(( left < 540 ? left : 540 ))
    exec /work/runs/bin-rtt/mpdetour-lab design --bin /work/runs/bin-rtt/mpdetour \
      --points 200 --seed 1 --trials 6 \
      --procedures tcp-path1,tcp-path2,mptcp-static,mptcp-static+lowat,mptcp-static+lowatrtt \
      --only p019,p025,p139,p149 --out '$D' --resume --budget ${b}s --name rttpts'
  rc=$?
  echo "chunk ended $(date -u +%FT%TZ) rc=$rc trials $(n)" >>$D/chunks.txt
  [ $rc -eq 3 ] && break
  [ "$(n)" -eq "$before" ] && { echo "no new trials in a chunk (rc=$rc): stop"; break; }
done
