#!/bin/bash
# The session's chunks in order (PLAN.md); a chunk starts only if it can end before 07:12 UTC
# (estimate: p174 40 s a round, p197 25 s).
here=$(cd "$(dirname "$0")" && pwd)
while read -r pt r v tag; do
  per=25; [ $pt = p174 ] && per=40
  end=$(( $(date +%s) + r * per + 30 ))
  if [ $end -gt $(date -d '07:12' +%s) ]; then echo "skip $pt $v $tag (would end $(date -u -d @$end +%T))"; continue; fi
  echo "start $pt $r $v $tag $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)"
  "$here/run.sh" $pt $r $v $tag
  echo "end $pt $tag $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)"
done <<'LIST'
p197 10 defaults d1
p174 10 defaults d1
p197 10 defaults d2
p174 10 defaults d2
p197 10 nots v1
p197 10 lowat v1
p174 10 lowat v1
LIST
