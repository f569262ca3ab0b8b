#!/bin/bash
cd /work/wt-pace2
OUT=docs/results/design/pace/fresh
( while true; do echo "$(date -u +%FT%TZ) $(cut -d' ' -f1 /proc/loadavg)" >> $OUT/load.txt; sleep 30; done ) &
LP=$!
echo $LP > /tmp/pace2-loadpid
STOP=$(date -u -d "2026-11-28 01:22:00 UTC" +%s)
n=0
while [ $(date -u +%s) -lt $STOP ]; do
  n=$((n+1)); t0=$(date -u +%s)
  echo "=== chunk $n start $(date -u +%FT%TZ)"
  MEASURE_TAG=pace2 /work/runs/measure /work/runs/bin-pace2/mpdetour-lab design --bin /work/runs/bin-pace2/mpdetour --points 200 --seed 1 --trials 3 --procedures tcp-path1,tcp-path2,mptcp-static,mptcp-static+pace --only $(cat $OUT/only.txt) --out $OUT --resume --budget 9m --name pace2f
  rc=$?
  t1=$(date -u +%s)
  echo "=== chunk $n end $(date -u +%FT%TZ) rc=$rc secs=$((t1-t0))"
  if [ $((t1-t0)) -lt 60 ]; then echo "=== short chunk: assume all done"; break; fi
done
kill $LP
echo "=== loop done $(date -u +%FT%TZ)"
