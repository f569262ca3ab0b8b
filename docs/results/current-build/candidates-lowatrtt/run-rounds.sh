#!/bin/bash
# rttcand: rounds $1..$2 in holds of $3 rounds (one /work/runs/measure run per hold,
# MEASURE_TAG=rttcand-rA-B); no round starts after $4 (YYYY-MM-DDTHH:MM UTC). touch /tmp/rttcand-stop
# to stop before the next hold.
D=/work/wt-rttcand/docs/results/current-build/candidates-lowatrtt
A=$1
while [ $A -le $2 ]; do
  if [ -e /tmp/rttcand-stop ]; then echo "stop before round $A"; exit 0; fi
  if [[ "$(date -u +%FT%H:%M)" > "$4" ]]; then echo "round $A not queued: past $4"; exit 0; fi
  Z=$((A + $3 - 1)); [ $Z -gt $2 ] && Z=$2
  echo "hold $A-$Z queued $(date -u +%FT%TZ)"
  MEASURE_TAG=rttcand-r$A-$Z /work/runs/measure bash $D/run-chunk.sh $A $Z $4
  echo "hold $A-$Z rc=$? $(date -u +%FT%TZ)"
  A=$((Z + 1))
done
