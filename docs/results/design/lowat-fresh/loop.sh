#!/bin/bash
# lowat-fresh: shard K's loop of chunks; no chunk starts after 04:12 UTC. After each chunk the
# report is regenerated and the directory committed (serialised by a lock between the shards);
# waits 10 s so another runner polling for a slot can take it. Usage: loop.sh K
K=$1
cd /work/wt-fresh || exit 1
OUT=docs/results/design/lowat-fresh
STOP_CHUNK=$(date -u -d '2026-11-28 04:12:00' +%s)
n() { cat $OUT/runs/paired.shard$K/trials.jsonl 2>/dev/null | wc -l; }
while [ "$(date +%s)" -lt "$STOP_CHUNK" ]; do
  before=$(n)
  echo "$(date -u +%T) waiting for a slot, trials before $before"
  MEASURE_TAG=fresh$K /work/runs/measure $OUT/chunk.sh $K
  rc=$?
  after=$(n)
  echo "$(date -u +%T) chunk end rc=$rc trials after $after"
  [ $rc -eq 3 ] && break
  ( flock 8
    /work/runs/bin-fresh/mpdetour-lab design --report --out $OUT >/dev/null 2>&1
    git add $OUT && git commit -q -m "lowat-fresh: shard $K chunk ended $(date -u +%H:%M) UTC, $after trials in shard $K (partial results)" -- $OUT
  ) 8>/work/runs/fresh-git.lock
  if [ "$after" -eq "$before" ]; then echo "$(date -u +%T) nothing run in this chunk: stop"; break; fi
  sleep 10
done
echo "$(date -u +%T) loop done"
