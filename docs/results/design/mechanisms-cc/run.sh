#!/bin/bash
# Chunks of the paired design under the SHARED measurement lock (one runner),
# --budget 6m (a point takes ~3.5 min), so <= 10 min each, 20 s released between chunks; stops at 09:50 UTC or 45 min of lock.
# usage: BIN=dir LOCK=file run.sh ONLY (comma-separated point IDs)
cd "$(dirname "$0")"
BIN=${BIN:?set BIN to the directory holding the mpdetour and mpdetour-lab binaries}
LOCK=${LOCK:?set LOCK to the measurement lock file}
OUT=$PWD
ONLY=$1
used=$(awk '/held/ {s+=$NF} END {print s+0}' lock-log.txt 2>/dev/null || echo 0)
while :; do
  now=$(date -u +%H%M)
  if [ "$now" -ge 0950 ]; then echo "stop: 09:50"; break; fi
  if [ "$(echo "$used > 2160" | bc)" = 1 ]; then echo "stop: lock budget"; break; fi
  resume=; [ -f design.json ] && resume=--resume
  t0=$(date +%s)
  flock -s $LOCK bash -c "echo \"acquired \$(date -u +%FT%TZ) load \$(cut -d' ' -f1 /proc/loadavg)\" >> lock-log.txt; \
    $BIN/mpdetour-lab design --bin $BIN/mpdetour --points 200 --seed 1 --trials 3 \
    --procedures tcp-path1,tcp-path2,mptcp-static,mptcp-static+bbr,mptcp-static+stale4 \
    --only $ONLY --out $OUT $resume --budget 6m --name mcc; rc=\$?; echo \"released \$(date -u +%FT%TZ)\" >> lock-log.txt; exit \$rc" > chunk.log 2>&1
  rc=$?
  t1=$(date +%s)
  echo "held $((t1-t0))" >> lock-log.txt
  used=$((used + t1 - t0))
  cat chunk.log >> chunks.log
  grep -q "paired run complete" chunk.log && ! grep -q "budget" chunk.log && { echo done; break; }
  [ $rc -ne 0 ] && { echo "exit $rc, see chunk.log"; tail -5 chunk.log; break; }
  sleep 20
done
