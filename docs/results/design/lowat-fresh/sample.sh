#!/bin/bash
# lowat-fresh: the 1-min load every 30 s (load30.txt) until /work/runs/fresh-stop exists
OUT=/work/wt-fresh/docs/results/design/lowat-fresh
while [ ! -e /work/runs/fresh-stop ]; do
  echo "$(date -u +%FT%TZ) $(cut -d' ' -f1-3 /proc/loadavg)" >> $OUT/load30.txt
  sleep 30
done
