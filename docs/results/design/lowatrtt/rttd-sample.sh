#!/bin/bash
# load every 30 s, ss -tin of the two client namespaces every 1 s, until /work/runs/rttd-stop exists
OUT=/work/wt-rttdesign/docs/results/design/lowatrtt
i=0
while [ ! -e /work/runs/rttd-stop ]; do
  if [ $((i % 30)) -eq 0 ]; then echo "$(date -u +%FT%TZ) $(cut -d' ' -f1-3 /proc/loadavg)" >> $OUT/load.txt; fi
  for ns in rttd1-client rttd2-client; do
    [ -e /run/netns/$ns ] || continue
    t=$(date -u +%FT%T.%3NZ)
    ip netns exec $ns ss -tinH state established 2>/dev/null | awk -v t="$t" -v ns="$ns" '
      /^ *[0-9]/ || $1 ~ /^[0-9]/ {loc=$3; peer=$4; next}
      { nb=0; cw=0; un=0
        for (j=1;j<=NF;j++) { if ($j ~ /^notsent:/) {split($j,a,":"); nb=a[2]} if ($j ~ /^cwnd:/) {split($j,a,":"); cw=a[2]} if ($j ~ /^unacked:/) {split($j,a,":"); un=a[2]} }
        if (loc != "") print t, ns, loc, peer, nb, cw, un; loc="" }' >> $OUT/ss-notsent.txt
  done
  i=$((i+1)); sleep 1
done
