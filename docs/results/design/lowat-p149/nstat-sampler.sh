#!/bin/bash
# nstat-sampler.sh PREFIX OUT: once a second, the absolute MPTCP/TCP drop, prune, out-of-order and
# retransmission counters of the lab namespaces PREFIX-server and PREFIX-client, one line per
# namespace and second: "TIME NS NAME=VALUE ...".
prefix=$1 out=$2
while :; do
  t=$(date -u +%FT%T.%3NZ)
  for ns in $prefix-server $prefix-client; do
    ip netns exec $ns true 2>/dev/null || continue
    echo "$t $ns $(ip netns exec $ns nstat -asz 2>/dev/null | awk '$1 ~ /MPTcp|Drop|Prune|Retrans|OFO|Collapse/ && $2 != 0 {printf "%s=%s ", $1, $2}')" >>$out
  done
  sleep 1
done
