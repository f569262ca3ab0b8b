#!/bin/bash
# Run E: 6 more rounds at p149 of static, static + 128 KiB and static + 1 MiB beside TCP on path 1
# (the best single path there), with ss samples; starts only if it gets a slot by 21:17 UTC.
cd /work/wt-p149
D=docs/results/design/lowat-p149
python3 $D/ss-sampler.py p149e $D/ss-e.txt & SP=$!
( while :; do echo "$(date -u +%FT%TZ) $(cut -d' ' -f1-3 /proc/loadavg)" >>$D/load-e.txt; sleep 30; done ) & LP=$!
MEASURE_TAG=p149 /work/runs/measure bash -c '[ $(date -u +%s) -le $(date -u -d "2026-11-27 21:17" +%s) ] || { echo "no slot by 21:17, not run"; exit 3; }
  exec /work/runs/bin-p149/mpdetour-lab design --bin /work/runs/bin-p149/mpdetour \
  --points 200 --seed 1 --trials 6 \
  --procedures tcp-path1,mptcp-static,mptcp-static+lowat,mptcp-static+lowat1024 \
  --only p149 --out '$D'/rerun --name p149e'
echo "rc=$?"
kill $SP $LP
