#!/bin/bash
# One chunk of a paired design run's shard K, run under /work/runs/measure: up to 20 minutes,
# none after the run's STOP. Records the 1-min load at the chunk's start and end (OUT/load.txt).
# Exit 3: too late to start. The run's parameters come from RUN_ENV (a run.env beside its
# results): WT (worktree), OUT (results directory), STOP (UTC time), NAME (lab name prefix),
# BIN (binaries directory), PROCS (procedures), SEED (the design's seed, default 1), POINTS (the
# design's size, default 200), PATHS (default 2), TRIALS (default 3); OUT/only.txt, if present,
# the points to run.
# Usage: design-chunk.sh RUN_ENV K
. "$1" || exit 1
K=$2
cd "$WT" || exit 1
STOPS=$(date -u -d "$STOP" +%s)
B=$(( STOPS - $(date +%s) )); [ $B -gt 1200 ] && B=1200
[ $B -le 30 ] && { echo "$(date -u +%T) budget $B s: not started"; exit 3; }
echo "$(date -u +%FT%TZ) $NAME$K chunk-start $(cut -d' ' -f1 /proc/loadavg) budget ${B}s" >> $OUT/load.txt
$BIN/mpdetour-lab design --bin $BIN/mpdetour \
    --points ${POINTS:-200} --paths ${PATHS:-2} --seed ${SEED:-1} --trials ${TRIALS:-3} \
    --procedures $PROCS \
    $([ -f $OUT/only.txt ] && echo --only $(cat $OUT/only.txt)) --out $OUT --resume --budget ${B}s --shard $K/2 --name $NAME$K
rc=$?
echo "$(date -u +%FT%TZ) $NAME$K chunk-end $(cut -d' ' -f1 /proc/loadavg) rc=$rc" >> $OUT/load.txt
exit $rc
