#!/bin/bash
# Minimal reproduction of the converter-speed stalls WITHOUT mpdetour (issue 14):
# an MPTCP bulk sender (iperf3 under mptcpize) to an MPTCP sink one veth hop
# away, in a namespace with no nftables table (so no conntrack) and no relay.
# Usage: repro.sh [trials] [client-cpu] [server-cpu]   (root; iperf3, mptcpize)
# e.g.  repro.sh 4          -> client and sink float over both CPUs: stalls
#       repro.sh 3 0 0      -> both pinned to CPU 0: no stall
set -e
n=${1:-4}; tc=${2:-}; ts=${3:-}
P=cvsr
cleanup() { for x in c r; do ip netns pids $P-$x 2>/dev/null | xargs -r kill 2>/dev/null || true; ip netns del $P-$x 2>/dev/null || true; done; rm -f /tmp/$P-*; }
trap cleanup EXIT
for x in c r; do ip netns add $P-$x; ip -n $P-$x link set lo up; ip netns exec $P-$x sysctl -qw net.mptcp.enabled=1; done
ip link add $P-c0 netns $P-c type veth peer name $P-r0 netns $P-r
ip -n $P-c addr add 10.91.1.1/24 dev $P-c0; ip -n $P-c link set $P-c0 up
ip -n $P-r addr add 10.91.1.2/24 dev $P-r0; ip -n $P-r link set $P-r0 up
pc=""; ps=""; [ -n "$tc" ] && pc="taskset -c $tc"; [ -n "$ts" ] && ps="taskset -c $ts"
for i in $(seq 1 $n); do
  ip netns exec $P-r $ps mptcpize run iperf3 -s -1 -p 5201 -D >/dev/null 2>&1; sleep 0.3
  NSTAT_HISTORY=/tmp/$P-c ip netns exec $P-c nstat -n; NSTAT_HISTORY=/tmp/$P-r ip netns exec $P-r nstat -n
  ip netns exec $P-c $pc mptcpize run iperf3 -c 10.91.1.2 -p 5201 -t 5 -J -C cubic > /tmp/$P-out.json 2>/dev/null
  c=$(NSTAT_HISTORY=/tmp/$P-c ip netns exec $P-c nstat | awk '/MPTcpExtMPTCPRetrans|TcpRetransSegs|TCPSACKReorder/{printf "%s=%s ",$1,$2}')
  d=$(NSTAT_HISTORY=/tmp/$P-r ip netns exec $P-r nstat | awk '/DuplicateData|TCPOFOQueue|OFODrop|RcvQDrop|BacklogDrop/{printf "%s=%s ",$1,$2}')
  python3 -c "
import json
j=json.load(open('/tmp/$P-out.json'));e=j['end']
print('%5.2f Gbit/s'%(e['sum_received']['bits_per_second']/1e9), [round(i['sum']['bits_per_second']/1e9,1) for i in j['intervals']], end=' ')"
  echo " | sender: $c| sink: $d"
done
