#!/bin/bash
# A/A check of the paired design instrument (docs/results/design/aa):
# three arms on the 4 points of mechanisms-bdp, interleaved point by point
# (one runner at a time, each invocation one point under the shared lock).
#   before        main's build: rotating order, TCP metrics cache on
#   after         this branch: balanced order, no TCP metrics cache
#   after-rotate  this branch with --order rotate: the old order, no cache
# OLD=dir with main's bin/, NEW=dir with this branch's bin/, LOCK=lock file.
set -u
OUT=${OUT:-docs/results/design/aa}
common=(design --points 4 --seed 1 --capacity 60:100 --rtt 200:400 --loss 0:0.005 --buffer 1:2 --trials 3
  --procedures tcp-path1,tcp-path2,mptcp-static,mptcp-static+stale4 --limit 1 --budget 9m --resume)
arm() { # name
  case $1 in
  before) flock -s "$LOCK" "$OLD/bin/mpdetour-lab" "${common[@]}" --out "$OUT/before" --name aab --bin "$OLD/bin/mpdetour" ;;
  after) flock -s "$LOCK" "$NEW/bin/mpdetour-lab" "${common[@]}" --out "$OUT/after" --name aaa --bin "$NEW/bin/mpdetour" ;;
  after-rotate) flock -s "$LOCK" "$NEW/bin/mpdetour-lab" "${common[@]}" --order rotate --out "$OUT/after-rotate" --name aar --bin "$NEW/bin/mpdetour" ;;
  esac
}
arms=(before after after-rotate)
for k in 0 1 2 3; do # point k of the run order; the arms' order rotates per point
  for j in 0 1 2; do
    a=${arms[$(((j + k) % 3))]}
    echo "=== $(date -u +%FT%TZ) point $((k + 1)) arm $a load $(cut -d' ' -f1 /proc/loadavg)"
    arm "$a" 2>&1 | sed "s/^/$a: /"
    echo "=== $(date -u +%FT%TZ) end $a"
  done
done
