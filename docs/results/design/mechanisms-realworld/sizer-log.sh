#!/bin/bash
# Collects every "socket buffer maximum" line the agents logged in this run (MPDETOUR_BENCH_KEEP=1
# kept each point's daemon logs in the directory console.txt names after the point's "lab up"),
# per point and trial directory, into sizer-log.txt, and counts the trials whose agent changed the
# maxima. Run from the repository root while the kept directories exist: sizer-log.sh [DIR] (DIR:
# this directory, the default, or its acting/).
D=${1:-docs/results/design/mechanisms-realworld}
awk '/ lab up /{p=substr($1,2,4)} /daemon logs and configs kept in/{print p, $NF}' $D/console.txt |
while read -r point dir; do
  [ -d "$dir" ] || { echo "== $point $dir (gone)"; continue; }
  echo "== $point $dir"
  for t in "$dir"/mptcp-*; do
    [ -f "$t/agent.log" ] || continue
    n=$(grep -c 'msg="socket buffer maximum"' "$t/agent.log")
    echo "$point $(basename "$t") changes=$n"
    grep -h 'msg="socket buffer maximum"\|socket buffer sizing off\|not restored' "$t/agent.log" | sed "s|^|$point $(basename "$t"): |"
  done
done > $D/sizer-log.txt
echo "trials with at least one change, per procedure:"
grep -E '^p[0-9]+ [^ ]+ changes=' $D/sizer-log.txt | awk '{split($2,a,"."); n[a[1]]++; if ($3!="changes=0") c[a[1]]++} END {for (k in n) print k, c[k]+0, "of", n[k]}'
