#!/bin/bash
# Reproduction without mpdetour of the loadbalancer scenario's "never got
# an ADD_ADDR" connections: when the client's third ACK and its first data
# segment (the two packets that carry MP_CAPABLE after the SYN) do not
# reach the server, the server completes the handshake with a later data
# segment, which carries no MP_CAPABLE, and falls back to plain TCP
# (net/mptcp/subflow.c, subflow_syn_recv_sock: "Even OoO DSS packets coming
# legitly after dropped or reordered MPC will cause fallback, but we don't
# have other options"; counter MPTcpExtMPCapableFallbackACK). The client
# then falls back too (MPCapableDataFallback). A TCP connection gets no
# ADD_ADDR, so it keeps its only subflow, through the balancer, and a
# route change resets it.
#
# Three namespaces: client - router - server; the server's in-kernel PM
# announces a second address (a `signal` endpoint), the client's accepts
# it (add_addr_accepted 2) and joins. Runs, each printing the counters'
# increase:
#   control  one 3 s MPTCP upload: the server announces, the client joins.
#   mpc-lost the same with the router dropping the client's non-SYN packets
#            that carry MP_CAPABLE (the loss made deterministic).
#   burst    N (default 100) 4 s uploads started over 1.7 s through a 10 Mbit/s
#            tbf on the router's link to the server (like the lab's 100
#            connections over its 10 Mbit/s core link): no rule, only
#            congestion drops. Prints how many fell back.
#
# Usage: sudo bash fallback-repro.sh   (needs ip, tc, nft >= 1.0, python3)
set -eu
S=fbr$$
C=$S-c R=$S-r V=$S-s
SRV=
cleanup() { [ -n "$SRV" ] && kill $SRV 2>/dev/null; for n in $C $R $V; do ip netns del $n 2>/dev/null || true; done; rm -f /tmp/$S-*.py; }
trap cleanup EXIT INT TERM
for n in $C $R $V; do ip netns add $n; done
ip link add $S-cr type veth peer name $S-rc
ip link add $S-rs type veth peer name $S-sr
ip link set $S-cr netns $C; ip link set $S-rc netns $R
ip link set $S-rs netns $R; ip link set $S-sr netns $V
ip -n $C addr add 10.78.1.1/24 dev $S-cr
ip -n $R addr add 10.78.1.2/24 dev $S-rc; ip -n $R addr add 10.78.2.2/24 dev $S-rs
ip -n $V addr add 10.78.2.1/24 dev $S-sr; ip -n $V addr add 10.78.2.3/24 dev $S-sr
for n in $C $R $V; do ip -n $n link set lo up; done
ip -n $C link set $S-cr up; ip -n $R link set $S-rc up; ip -n $R link set $S-rs up; ip -n $V link set $S-sr up
ip -n $C route add default via 10.78.1.2
ip -n $V route add default via 10.78.2.2
ip netns exec $R sysctl -qw net.ipv4.ip_forward=1
for n in $C $V; do ip netns exec $n sysctl -qw net.mptcp.enabled=1; ip netns exec $n sysctl -qw net.mptcp.pm_type=0 2>/dev/null || true; done
ip netns exec $R ethtool -K $S-rs tso off gso off gro off >/dev/null 2>&1 || true
ip netns exec $C ethtool -K $S-cr tso off gso off >/dev/null 2>&1 || true
# The server announces 10.78.2.3; the client accepts announcements and joins.
ip -n $V mptcp limits set subflows 2 add_addr_accepted 0
ip -n $V mptcp endpoint add 10.78.2.3 dev $S-sr id 1 signal
ip -n $C mptcp limits set subflows 2 add_addr_accepted 2
cat > /tmp/$S-srv.py <<'PY'
import socket, threading
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 5201)); s.listen(512)
def serve(c):
    try:
        while c.recv(1 << 18): pass
        c.send(b"ok")
    except OSError: pass
    c.close()
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
PY
cat > /tmp/$S-cli.py <<'PY'
import socket, sys, threading, time
n, dur, spread = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
ok, failed, why = [0], [0], {}
def one(i):
    time.sleep(spread * i / n)
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262)
        # Small buffer: each sender stops about when its time is up
        # instead of draining megabytes through the shared 10 Mbit/s.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 << 10)
        s.settimeout(60)
        s.connect(("10.78.2.1", 5201))
        buf = bytes(1 << 14); end = time.monotonic() + dur
        while time.monotonic() < end: s.send(buf)
        s.shutdown(socket.SHUT_WR); s.recv(2); s.close(); ok[0] += 1
    except OSError as e:
        failed[0] += 1; why[str(e)] = why.get(str(e), 0) + 1
ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
for t in ts: t.start()
for t in ts: t.join()
print(f"transfers ok {ok[0]}, failed {failed[0]}" + "".join(f" ({k} x {v})" for v, k in why.items()))
PY
mib() { ip netns exec $1 cat /proc/net/netstat | awk '/^MPTcpExt:/{if(!h){for(i=1;i<=NF;i++)n[i]=$i;h=1}else{for(i=1;i<=NF;i++)if(n[i]==k)print $i}}' k=$2; }
SRVC="MPCapableSYNRX MPCapableACKRX MPCapableFallbackACK AddAddrTx MPJoinSynRx"
CLIC="MPCapableSYNACKRX MPCapableDataFallback AddAddr MPJoinSynTx"
snap() { for k in $SRVC; do echo "server.$k $(mib $V $k)"; done; for k in $CLIC; do echo "client.$k $(mib $C $k)"; done; }
ip netns exec $V python3 /tmp/$S-srv.py >/dev/null &
SRV=$!
sleep 0.5
run() { # $1 label, $2 connections, $3 seconds, $4 spread
  local before after
  before=$(snap)
  local out
  out=$(ip netns exec $C python3 /tmp/$S-cli.py $2 $3 $4)
  sleep 1
  after=$(snap)
  printf '%-9s %3d connection(s): %s;' "$1" "$2" "$out"
  join <(echo "$before" | sort) <(echo "$after" | sort) | sort -k1,1 -s | awk '{printf " %s %d", $1, $3-$2}'
  echo
}
echo "kernel $(uname -r), $(date -u +%FT%TZ)"
run control 1 3 0
ip netns exec $R nft -f - <<NFT
table inet $S {
  chain forward_mpc {
    type filter hook forward priority 0; policy accept;
    iifname "$S-rc" tcp flags & syn == 0 tcp option mptcp subtype 0 counter drop
  }
}
NFT
run mpc-lost 1 3 0
echo "          router dropped: $(ip netns exec $R nft list table inet $S | grep -o 'packets [0-9]*')"
ip netns exec $R nft delete table inet $S
tc -n $R qdisc add dev $S-rs root tbf rate 10mbit burst 32kb latency 50ms
for r in $(seq ${ROUNDS:-3}); do run burst ${N:-100} 4 1.7; done
kill $SRV 2>/dev/null || true
