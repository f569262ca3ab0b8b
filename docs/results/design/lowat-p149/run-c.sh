#!/bin/bash
# Run C: p197 (stays harmed with the limit) with receiver- and sender-side counters (nstat) and ss samples.
cd /work/wt-p149
D=docs/results/design/lowat-p149
( while :; do echo "$(date -u +%FT%TZ) $(cut -d' ' -f1-3 /proc/loadavg)" >>$D/load-c.txt; sleep 30; done ) & LP=$!
python3 $D/ss-sampler.py p149c $D/ss-c.txt & SP=$!
$D/nstat-sampler.sh p149c $D/nstat-c.txt & NP=$!
MEASURE_TAG=p149 /work/runs/measure /work/runs/bin-p149/mpdetour-lab design --bin /work/runs/bin-p149/mpdetour \
  --points 200 --seed 1 --trials 3 \
  --procedures tcp-path1,tcp-path2,mptcp-1sf,mptcp-static,mptcp-static+lowat \
  --only p197 --out $D/p197 --name p149c
echo "rc=$?"
kill $LP $SP $NP
