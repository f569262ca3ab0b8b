#!/bin/bash
# rttdesign: one shard's loop of chunks (second version: waits 10 s after each chunk so the other
# shard's runner, polling for a slot every 5 s, can take it). Usage: rttd-loop2.sh K [PID to wait for]
K=$1
[ -n "${2:-}" ] && while kill -0 "$2" 2>/dev/null; do sleep 2; done
cd /work/wt-rttdesign || exit 1
OUT=docs/results/design/lowatrtt
STOP_CHUNK=$(date -u -d '2026-11-28 01:22:00' +%s)
n() { cat $OUT/runs/paired.shard$K/trials.jsonl 2>/dev/null | wc -l; }
while [ "$(date +%s)" -lt "$STOP_CHUNK" ]; do
  before=$(n)
  echo "$(date -u +%T) waiting for a slot, trials before $before"
  MEASURE_TAG=rttd$K /work/runs/measure /work/runs/rttd-chunk.sh $K
  rc=$?
  after=$(n)
  echo "$(date -u +%T) chunk end rc=$rc trials after $after"
  [ $rc -eq 3 ] && break
  if [ "$after" -eq "$before" ]; then echo "$(date -u +%T) nothing run in this chunk: stop"; break; fi
  sleep 10
done
echo "$(date -u +%T) loop done"
