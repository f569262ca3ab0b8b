#!/bin/bash
# Shard K's loop of design-chunk.sh chunks (lowat-fresh/loop.sh's shape) until the shard is done
# or a chunk is too late to start (the run's STOP). After each chunk the report is regenerated and
# the results directory committed (a lock between the shards). Usage: design-loop.sh RUN_ENV K
RUN_ENV=$(realpath "$1"); K=$2
. "$RUN_ENV" || exit 1
here=$(dirname "$(realpath "$0")")
cd "$WT" || exit 1
n() { cat $OUT/runs/paired.shard$K/trials.jsonl 2>/dev/null | wc -l; }
while :; do
  before=$(n)
  MEASURE_TAG=$NAME$K /work/runs/measure bash "$here/design-chunk.sh" "$RUN_ENV" $K
  rc=$?
  after=$(n)
  echo "$(date -u +%T) chunk end rc=$rc trials after $after"
  [ $rc -eq 3 ] && break
  ( flock 8
    $BIN/mpdetour-lab design --report --out $OUT >/dev/null 2>&1
    git add $OUT && git commit -q -m "$(basename $OUT): shard $K chunk ended $(date -u +%H:%M) UTC, $after trials in shard $K (partial results)" -- $OUT
  ) 8>/work/runs/$NAME-git.lock
  if [ "$after" -eq "$before" ]; then echo "$(date -u +%T) nothing run in this chunk: stop"; break; fi
  sleep 10
done
echo "$(date -u +%T) loop done"
