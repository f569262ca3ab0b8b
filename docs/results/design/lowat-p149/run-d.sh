#!/bin/bash
# Run D: p197, where the default subflow loses more packets with the detour beside it: the tbf
# bottlenecks' drop counters (tc-sampler.sh) beside TCP, MPTCP over path 1 alone and static.
cd /work/wt-p149
D=docs/results/design/lowat-p149
python3 $D/ss-sampler.py p149d $D/ss-d.txt & SP=$!
$D/tc-sampler.sh p149d $D/tc-d.txt & TP=$!
MEASURE_TAG=p149 /work/runs/measure /work/runs/bin-p149/mpdetour-lab design --bin /work/runs/bin-p149/mpdetour \
  --points 200 --seed 1 --trials 2 \
  --procedures tcp-path1,mptcp-1sf,mptcp-static \
  --only p197 --out $D/p197-tc --name p149d
echo "rc=$?"
kill $SP $TP
