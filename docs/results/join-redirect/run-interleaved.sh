#!/bin/bash
# Before/after in one interleaved run: rounds of (main build, fixed build),
# one trial of each cell per round (the attack bench's join-redirect cell
# and its no-attack baseline, procedure mptcp-nat), while a poller logs the
# server's MPTcpExtDuplicateData. Usage (run under the heavy-measurement lock):
#   MAIN=path/to/mpdetour-main NEW=path/to/mpdetour-fixed LAB=path/to/mpdetour-lab bash run-interleaved.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
date -u; uptime
poll() {
  while true; do
    for ns in $(ip netns list | awk '{print $1}' | grep -E '^jr(main|new)-server$'); do
      v=$(ip netns exec $ns cat /proc/net/netstat 2>/dev/null | awk '/^MPTcpExt:/{if(!h){for(i=1;i<=NF;i++)n[i]=$i;h=1}else{for(i=1;i<=NF;i++)if(n[i]=="DuplicateData")print $i}}')
      echo "$(date +%s.%N) $ns DuplicateData=$v"
    done
    sleep 0.5
  done
}
poll > server-duplicatedata.log 2>&1 &
PP=$!
trap 'kill $PP' EXIT
for i in 1 2 3; do
  for b in main new; do
    bin=$MAIN; [ $b = new ] && bin=$NEW
    echo "round $i $b $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)"
    "$LAB" bench "$here/scenario.yaml" --name jr$b --bin "$bin" --trials $i --resume --out "$b" 2>&1 | tail -4
  done
done
date -u; uptime
