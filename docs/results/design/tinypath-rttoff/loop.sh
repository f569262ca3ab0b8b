#!/bin/bash
# tinypath-rttoff: shard K's loop of chunks (lowat-fresh/loop.sh's shape); no chunk starts after
# 07:10 UTC. After each chunk the report is regenerated and the directory committed (a lock
# between the shards). Usage: loop.sh K
K=$1
cd /work/wt-rttoff || exit 1
OUT=docs/results/design/tinypath-rttoff
n() { cat $OUT/runs/paired.shard$K/trials.jsonl 2>/dev/null | wc -l; }
while :; do
  before=$(n)
  MEASURE_TAG=rtt$K /work/runs/measure bash $OUT/chunk.sh $K
  rc=$?
  after=$(n)
  echo "$(date -u +%T) chunk end rc=$rc trials after $after"
  [ $rc -eq 3 ] && break
  ( flock 8
    /work/runs/bin-rttoff/mpdetour-lab design --report --out $OUT >/dev/null 2>&1
    git add $OUT && git commit -q -m "tinypath-rttoff: shard $K chunk ended $(date -u +%H:%M) UTC, $after trials in shard $K (partial results)" -- $OUT
  ) 8>/work/runs/rtt-git.lock
  if [ "$after" -eq "$before" ]; then echo "$(date -u +%T) nothing run in this chunk: stop"; break; fi
  sleep 10
done
echo "$(date -u +%T) loop done"
