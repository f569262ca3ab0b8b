#!/bin/bash
# rttcand: rounds $1..$2 of docs/results/current-build/candidates-lowatrtt, each its own
# `bench --resume` run, all inside one measurement slot (run through /work/runs/measure by
# run-rounds.sh); no round starts after $3 (YYYY-MM-DDTHH:MM UTC).
D=/work/wt-rttcand/docs/results/current-build/candidates-lowatrtt
B=/work/runs/bin-rtt
for R in $(seq $1 $2); do
  if [[ "$(date -u +%FT%H:%M)" > "$3" ]]; then echo "round $R not started: past $3"; exit 0; fi
  echo "round $R start $(date -u +%FT%TZ) load $(cut -d' ' -f1 /proc/loadavg)"
  MPDETOUR_BENCH_KEEP=1 $B/mpdetour-lab bench $D/scenario-round$R.yaml \
    --interleave --trials $R --resume --out $D --name rttcand --bin $B/mpdetour > /tmp/rttcand-round$R.log 2>&1
  echo "round $R rc=$? end $(date -u +%FT%TZ)"
  tmp=$(grep -o 'daemon logs and configs kept in [^ ]*' /tmp/rttcand-round$R.log | tail -1 | awk '{print $NF}')
  if [ -n "$tmp" ] && [ -d "$tmp" ]; then
    mkdir -p $D/agent-logs/round$R
    for c in "$tmp"/*/; do n=$(basename "$c"); [ -f "$c/agent.log" ] && cp "$c/agent.log" "$D/agent-logs/round$R/$n.agent.log" && cp "$c/agent.yaml" "$D/agent-logs/round$R/$n.agent.yaml"; done
    echo "round $R logs $tmp -> agent-logs/round$R"
  fi
  echo $R > /tmp/rttcand-last-round
done
