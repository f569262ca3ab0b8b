#!/bin/bash
# brennan2017-lowat: one round per chunk under /work/runs/measure; no round starts after 06:55 UTC.
cd /work/wt-b17b || exit 1
OUT=docs/results/current-build/brennan2017-lowat
STOP=$(date -u -d '2026-11-28 06:55:00' +%s)
for T in 1 2 3 4 5; do
  [ "$(date +%s)" -ge "$STOP" ] && { echo "$(date -u +%T) too late for round $T"; break; }
  echo "$(date -u +%FT%TZ) round $T start load $(cut -d' ' -f1 /proc/loadavg)" >> $OUT/load.txt
  MEASURE_TAG=b17 /work/runs/measure /work/runs/bin-b17/mpdetour-lab bench $OUT/scenario.yaml --interleave \
     --trials $T --resume --out $OUT --name b17 --bin /work/runs/bin-b17/mpdetour >> $OUT/run-log.txt 2>&1
  rc=$?
  echo "$(date -u +%FT%TZ) round $T end rc=$rc load $(cut -d' ' -f1 /proc/loadavg)" >> $OUT/load.txt
  git add $OUT && git commit -q -m "brennan2017-lowat: round $T done ($(date -u +%H:%M) UTC, partial results)" -- $OUT
  [ $rc = 0 ] || break
done
echo "$(date -u +%T) loop done"
