#!/bin/bash
# Interleaved: before/after (order alternating per round), two restart tests each.
cd "$(dirname "$0")"   # the four test binaries beside it
for r in 1 2 3 4 5 6; do
  if [ $((r % 2)) = 1 ]; then order="before after"; else order="after before"; fi
  for b in $order; do
    echo "round=$r build=$b load=$(cut -d' ' -f1-3 /proc/loadavg)"
    ./$b.test -test.run '^TestRelayRestartReadmits$' -test.v -test.count=1 2>&1 | grep -E 'tunnel back|^--- |^FAIL' | sed "s/^/round=$r build=$b readmits: /"
    ./$b-tunnel.test -test.run '^TestRelayCrashRestart$' -test.v -test.count=1 2>&1 | grep -E 'tunnel restored|^--- |^FAIL' | sed "s/^/round=$r build=$b crash: /"
  done
done
