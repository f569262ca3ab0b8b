#!/bin/bash
# One chunk of the p174/p197 measurement: ../mptcp-1sf-p019-p058/repro.sh with
# this session's binaries (build 32c0dd1a, copied out of the worktree) and a
# unique lab name, under the shared measurement lock.
# Usage: run.sh POINT ROUNDS VARIANT TAG   -> run-TAG-POINT.txt, ss-TAG-POINT.txt
set -u
here=$(cd "$(dirname "$0")" && pwd)
PT=$1 R=$2 V=$3 TAG=$4
MEASURE_TAG=kernel MPDETOUR=/work/runs/bin-kernel/mpdetour MPDETOUR_LAB=/work/runs/bin-kernel/mpdetour-lab \
  LABNAME=kern$TAG$PT SSLOG=$here/ss-$TAG-$PT.txt \
  /work/runs/measure "$here/../mptcp-1sf-p019-p058/repro.sh" "$PT" "$R" "$V" >"$here/run-$TAG-$PT.txt" 2>&1
