#!/bin/bash
# Run 2 (after the planned run ended at 00:02 UTC with time to spare): 6 more rounds at p149 only,
# the point whose mechanism the scaled limit was built for, same build and procedures, its own
# --out (p149-more) and lab name (rttpts2); ss samples into ss-p149.txt, load into load-p149.txt.
cd /work/wt-rttpts
D=docs/results/design/lowatrtt-points
( while :; do echo "$(date -u +%FT%TZ) $(cut -d' ' -f1-3 /proc/loadavg)" >>$D/load-p149.txt; sleep 30; done ) & LP=$!
python3 $D/../lowat-p149/ss-sampler.py rttpts2 $D/ss-p149.txt & SP=$!
trap 'kill $LP $SP' EXIT
echo "requested $(date -u +%FT%TZ)" >>$D/chunks-p149.txt
MEASURE_TAG=rttpts2 /work/runs/measure bash -c '
  echo "slot $(date -u +%FT%TZ) load $(cut -d" " -f1 /proc/loadavg)" >>'$D'/chunks-p149.txt
  [ $(date -u +%s) -le $(date -u -d "2026-11-28 01:10" +%s) ] || { echo "no slot by 01:10, not run"; exit 3; }
  exec /work/runs/bin-rtt/mpdetour-lab design --bin /work/runs/bin-rtt/mpdetour \
    --points 200 --seed 1 --trials 6 \
    --procedures tcp-path1,tcp-path2,mptcp-static,mptcp-static+lowat,mptcp-static+lowatrtt \
    --only p149 --out '$D'/p149-more --resume --budget 9m --name rttpts2'
echo "ended $(date -u +%FT%TZ) rc=$?" >>$D/chunks-p149.txt
