#!/bin/bash
# candlowat: rounds $1..$2 of docs/results/current-build/candidates-lowat, one measured run each.
D=/work/wt-candlowat/docs/results/current-build/candidates-lowat
B=/work/runs/bin-candlowat
for R in $(seq $1 $2); do
  if [ -e /tmp/candlowat-stop ]; then echo "stop before round $R"; exit 0; fi
  echo "round $R queued $(date -u +%FT%TZ)"
  MPDETOUR_BENCH_KEEP=1 MEASURE_TAG=candlowat-r$R /work/runs/measure $B/mpdetour-lab bench $D/scenario-round$R.yaml \
    --interleave --trials $R --resume --out $D --name cndlw --bin $B/mpdetour > /tmp/candlowat-round$R.log 2>&1
  echo "round $R rc=$? $(date -u +%FT%TZ)"
  tmp=$(grep -o 'daemon logs and configs kept in [^ ]*' /tmp/candlowat-round$R.log | tail -1 | awk '{print $NF}')
  echo "round $R logs $tmp"
  if [ -n "$tmp" ] && [ -d "$tmp" ]; then mkdir -p $D/agent-logs/round$R && cp -r $tmp/. $D/agent-logs/round$R/; fi
done
