#!/bin/bash
# tc-sampler.sh PREFIX OUT: once a second, the tbf counters (sent packets, dropped, overlimits) of
# every device in the lab namespaces PREFIX-r1 and PREFIX-r2 (the core links' forward and reverse
# bottlenecks): "TIME NS DEV sent=N dropped=N overlimits=N".
prefix=$1 out=$2
while :; do
  t=$(date -u +%FT%T.%3NZ)
  for ns in $prefix-r1 $prefix-r2 $prefix-detour1; do
    ip netns exec $ns tc -s qdisc show 2>/dev/null | awk -v t="$t" -v ns="$ns" '
      /^qdisc tbf/ {dev=$5}
      /Sent/ && dev != "" {gsub(/[(),]/," "); printf "%s %s %s sent=%s dropped=%s overlimits=%s\n", t, ns, dev, $4, $7, $9; dev=""}' >>$out
  done
  sleep 1
done
