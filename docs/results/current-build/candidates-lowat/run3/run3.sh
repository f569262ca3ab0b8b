#!/bin/bash
# cand3: third run of candidates-lowat's main configuration, rounds $1..$2, one measured run each
# (same scenario files, same binaries 795e880a); no round starts after $3 (HH:MM UTC), checked
# both before queuing and again once the measurement slot is held.
D=/work/wt-cand3/docs/results/current-build/candidates-lowat/run3
B=/work/runs/bin-candlowat
for R in $(seq $1 $2); do
  if [[ "$(date -u +%H:%M)" > "$3" ]]; then echo "round $R not queued: past $3"; exit 0; fi
  echo "round $R queued $(date -u +%FT%TZ)"
  MEASURE_TAG=cand3-r$R /work/runs/measure bash -c '
    if [[ "$(date -u +%H:%M)" > "'$3'" ]]; then echo "round '$R' not started: past '$3'"; exit 3; fi
    echo "round '$R' start $(date -u +%FT%TZ) load $(cut -d" " -f1 /proc/loadavg)"
    exec '$B'/mpdetour-lab bench '$D'/scenario-round'$R'.yaml --interleave --trials '$R' --resume --out '$D' --name cnd3 --bin '$B'/mpdetour' > /tmp/cand3-round$R.log 2>&1
  rc=$?
  echo "round $R rc=$rc end $(date -u +%FT%TZ)"
  [ $rc = 3 ] && exit 0
done
