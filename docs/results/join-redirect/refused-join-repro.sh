#!/bin/bash
# Reproduction without mpdetour: a refused MP_JOIN costs a running MPTCP
# connection a window of duplicate data (kernel net/mptcp: closing a subflow
# re-sends the connection's unacknowledged data on the others).
#
# Three namespaces: client - router - server, 10 Mbit/s tbf on the router's
# link to the server (the bottleneck). A 12 s bulk MPTCP upload (Python,
# IPPROTO_MPTCP). The client has a second address; the server rejects SYNs
# from it with a TCP reset. In the "refused" run the client's in-kernel PM
# is made to join from that address at 2, 4, 6, 8 and 10 s (adding a
# `subflow` endpoint opens a join on every running connection; deleting it
# readies the next round): five refused joins mid-transfer. The control
# run is the same transfer without the endpoint (no join). Printed per run:
# the server's MPTcpExtDuplicateData (MPTCP-level duplicate bytes
# received), the client's MPJoinSynTx, the receiver's longest gap between
# reads that delivered data, and its goodput.
#
# Usage: sudo bash refused-join-repro.sh   (needs ip, tc, nft, python3)
set -eu
S=rjr$$
C=$S-c R=$S-r V=$S-s
cleanup() { for n in $C $R $V; do ip netns del $n 2>/dev/null || true; done; rm -f /tmp/$S-*.py; }
trap cleanup EXIT INT TERM
for n in $C $R $V; do ip netns add $n; done
ip link add $S-cr type veth peer name $S-rc
ip link add $S-rs type veth peer name $S-sr
ip link set $S-cr netns $C; ip link set $S-rc netns $R
ip link set $S-rs netns $R; ip link set $S-sr netns $V
ip -n $C addr add 10.77.1.1/24 dev $S-cr; ip -n $C addr add 10.77.1.3/24 dev $S-cr
ip -n $R addr add 10.77.1.2/24 dev $S-rc; ip -n $R addr add 10.77.2.2/24 dev $S-rs
ip -n $V addr add 10.77.2.1/24 dev $S-sr
for n in $C $R $V; do ip -n $n link set lo up; done
ip -n $C link set $S-cr up; ip -n $R link set $S-rc up; ip -n $R link set $S-rs up; ip -n $V link set $S-sr up
ip -n $C route add default via 10.77.1.2
ip -n $V route add default via 10.77.2.2
ip netns exec $R sysctl -qw net.ipv4.ip_forward=1
for n in $C $V; do ip netns exec $n sysctl -qw net.mptcp.enabled=1; ip netns exec $n sysctl -qw net.mptcp.pm_type=0 2>/dev/null || true; done
# Bottleneck: 10 Mbit/s, 20 ms worth of burst, 100 ms queue; offloads off.
for d in $S-rs; do ip netns exec $R ethtool -K $d tso off gso off gro off >/dev/null 2>&1 || true; done
tc -n $R qdisc add dev $S-rs root tbf rate 10mbit burst 32kb latency 100ms
ip -n $C mptcp limits set subflows 2 add_addr_accepted 0
ip -n $V mptcp limits set subflows 2 add_addr_accepted 0
# The server refuses every SYN from the client's second address with a reset.
ip netns exec $V nft -f - <<NFT
table inet $S {
  chain in {
    type filter hook input priority 0; policy accept;
    ip saddr 10.77.1.3 tcp flags & (syn | ack) == syn reject with tcp reset
  }
}
NFT
cat > /tmp/$S-srv.py <<'PY'
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("10.77.2.1", 5201)); s.listen(4)
while True:
    c, _ = s.accept()
    n, gap, last, first = 0, 0.0, None, None
    while True:
        b = c.recv(1 << 18)
        if not b: break
        t = time.monotonic()
        if first is None: first = t
        if last is not None: gap = max(gap, t - last)
        last = t; n += len(b)
    print(f"bytes={n} goodput_mbps={n*8/(last-first)/1e6:.2f} longest_gap_s={gap:.3f}", flush=True)
    c.close()
PY
cat > /tmp/$S-cli.py <<'PY'
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, b"cubic")
s.connect(("10.77.2.1", 5201))
buf = bytes(1 << 16); end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end: s.send(buf)
s.shutdown(socket.SHUT_WR); s.recv(1); s.close()
PY
mib() { ip netns exec $1 cat /proc/net/netstat | awk '/^MPTcpExt:/{if(!h){for(i=1;i<=NF;i++)n[i]=$i;h=1}else{for(i=1;i<=NF;i++)if(n[i]==k)print $i}}' k=$2; }
ip netns exec $V python3 /tmp/$S-srv.py > /tmp/$S-srv.out &
SRV=$!
sleep 0.5
run() { # $1 = label, $2 = refuse (1/0)
  local d0=$(mib $V DuplicateData) j0=$(mib $C MPJoinSynTx)
  ip netns exec $C python3 /tmp/$S-cli.py 12 &
  local cli=$!
  for t in 2 4 6 8 10; do
    sleep 2
    if [ "$2" = 1 ]; then
      ip -n $C mptcp endpoint add 10.77.1.3 dev $S-cr id 5 subflow
      sleep 0.3
      ip -n $C mptcp endpoint delete id 5
    fi
  done
  wait $cli; sleep 1
  echo "$1: server DuplicateData +$(( $(mib $V DuplicateData) - d0 )) segments, client MPJoinSynTx +$(( $(mib $C MPJoinSynTx) - j0 )); $(tail -1 /tmp/$S-srv.out)"
}
for r in $(seq ${ROUNDS:-2}); do run "control (no join)                  " 0; run "refused (joins refused at 2-10 s)" 1; done
kill $SRV 2>/dev/null || true
