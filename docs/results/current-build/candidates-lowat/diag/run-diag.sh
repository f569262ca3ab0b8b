#!/bin/bash
D=/work/wt-candlowat/docs/results/current-build/candidates-lowat/diag
B=/work/runs/bin-candlowat
for R in 1 2 3 4 5 6; do
  if [[ "$(date -u +%H:%M)" > "21:53" ]]; then echo "round $R not started"; exit 0; fi
  echo "diag round $R start $(date -u +%FT%TZ) load $(cut -d' ' -f1 /proc/loadavg)"
  $B/mpdetour-lab bench $D/scenario-round$R.yaml --interleave --trials $R --resume --out $D --name cndlwd --bin $B/mpdetour > /tmp/candlowat-diag$R.log 2>&1
  echo "diag round $R rc=$? end $(date -u +%FT%TZ)"
done
