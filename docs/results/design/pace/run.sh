#!/bin/bash
# The pace run: static with subflow_pacing beside static and TCP on each path, interleaved,
# 3 trials, at the points of only.txt (controls.py), in chunks of --budget 8m under
# /work/runs/measure until the runner says the design is complete. Samples the 1-min load every 30 s
# (load.txt) and the lab's tbf counters once a second (tc.txt, lowat-p149/tc-sampler.sh; p197 drops).
cd /work/wt-pace
D=docs/results/design/pace
B=/work/runs/bin-pace
( while :; do echo "$(date -u +%FT%TZ) $(cut -d' ' -f1-3 /proc/loadavg)" >>$D/load.txt; sleep 30; done ) & LP=$!
docs/results/design/lowat-p149/tc-sampler.sh pace1 $D/tc.txt & TP=$!
trap 'kill $LP $TP' EXIT
for i in $(seq 1 20); do
  MEASURE_TAG=pace /work/runs/measure $B/mpdetour-lab design --bin $B/mpdetour \
    --points 200 --seed 1 --trials 3 \
    --procedures tcp-path1,tcp-path2,mptcp-static,mptcp-static+pace \
    --only $(cat $D/only.txt) --out $D --resume --budget 8m --name pace1 >$D/chunk.log 2>&1
  rc=$?
  cat $D/chunk.log >>$D/run.log
  echo "$(date -u +%FT%TZ) chunk $i rc=$rc" >>$D/run.log
  # Done when a chunk ends without the runner's "continue with --resume".
  [ $rc = 0 ] && ! grep -q "continue with --resume" $D/chunk.log && break
done
rm -f $D/chunk.log
