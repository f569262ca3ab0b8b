#!/bin/bash
# Run A: the size sweep at p149 (one interleaved run), with 1-min load every 30 s and ss samples.
cd /work/wt-p149
D=docs/results/design/lowat-p149
( while :; do echo "$(date -u +%FT%TZ) $(cut -d' ' -f1-3 /proc/loadavg)" >>$D/load-a.txt; sleep 30; done ) & LP=$!
python3 $D/ss-sampler.py p149a $D/ss-a.txt & SP=$!
MEASURE_TAG=p149 /work/runs/measure /work/runs/bin-p149/mpdetour-lab design --bin /work/runs/bin-p149/mpdetour \
  --points 200 --seed 1 --trials 6 \
  --procedures tcp-path1,tcp-path2,mptcp-static,mptcp-static+lowat,mptcp-static+lowat256,mptcp-static+lowat512,mptcp-static+lowat1024 \
  --only p149 --out $D --name p149a
echo "rc=$?"
kill $LP $SP
