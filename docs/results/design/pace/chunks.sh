#!/bin/bash
# chunks.sh NAME OUTDIR TRIALS PROCEDURES ONLY: runs 2 and 3 of the pace run (run.sh was run 1):
# the paired runner in chunks of --budget 8m under /work/runs/measure until it says the design is
# complete, with the 1-min load every 30 s (OUTDIR/load.txt) and the lab's tbf counters once a
# second (OUTDIR/tc.txt, lowat-p149's tc-sampler.sh).
name=$1 out=$2 trials=$3 procs=$4 only=$5
cd /work/wt-pace
B=/work/runs/bin-pace
mkdir -p $out
( while :; do echo "$(date -u +%FT%TZ) $(cut -d' ' -f1-3 /proc/loadavg)" >>$out/load.txt; sleep 30; done ) & LP=$!
docs/results/design/lowat-p149/tc-sampler.sh $name $out/tc.txt & TP=$!
trap 'kill $LP $TP' EXIT
for i in $(seq 1 20); do
  MEASURE_TAG=pace /work/runs/measure $B/mpdetour-lab design --bin $B/mpdetour \
    --points 200 --seed 1 --trials $trials --procedures $procs \
    --only $only --out $out --resume --budget 8m --name $name >$out/chunk.log 2>&1
  rc=$?
  cat $out/chunk.log >>$out/run.log
  echo "$(date -u +%FT%TZ) chunk $i rc=$rc" >>$out/run.log
  [ $rc = 0 ] && ! grep -q "continue with --resume" $out/chunk.log && break
done
rm -f $out/chunk.log
