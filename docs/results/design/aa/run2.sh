#!/bin/bash
# Block 2 of the A/A check (docs/results/design/aa): the default space
# (d200's design: 200 points, seed 1), its first 2 points in the run's
# seeded order, arms before (main's build) and after (this branch),
# interleaved point by point as in run.sh.
set -u
OUT=${OUT:-docs/results/design/aa}
common=(design --points 200 --seed 1 --trials 3
  --procedures tcp-path1,tcp-path2,mptcp-static,mptcp-static+stale4 --limit 1 --budget 9m --resume)
arm() {
  case $1 in
  before) flock -s "$LOCK" "$OLD/bin/mpdetour-lab" "${common[@]}" --out "$OUT/default-before" --name aab --bin "$OLD/bin/mpdetour" ;;
  after) flock -s "$LOCK" "$NEW/bin/mpdetour-lab" "${common[@]}" --out "$OUT/default-after" --name aaa --bin "$NEW/bin/mpdetour" ;;
  esac
}
for a in before after after before; do
  echo "=== $(date -u +%FT%TZ) arm $a load $(cut -d' ' -f1 /proc/loadavg)"
  arm "$a" 2>&1 | sed "s/^/$a: /"
  echo "=== $(date -u +%FT%TZ) end $a"
done
