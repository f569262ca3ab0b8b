#!/bin/bash
# Reproduction without mpdetour attempt for the loadbalancer scenario's class B: an MPTCP upload
# with two subflows; mid-transfer a router resets the initial subflow towards the client only
# (like the balancer's other backend does after a route change: the server's side of the
# subflow never learns of it) and drops its packets. Does the server's MPTCP socket stop
# delivering data (receive stall), as in the lab's snapshots?
#
# Three namespaces: client (10.79.1.1, second address 10.79.1.3 as a `subflow` endpoint) -
# router (10 Mbit/s tbf towards the server) - server (10.79.2.1). Per trial: a 10 s upload; at
# 3 s the router's rule `ip saddr 10.79.1.1 tcp dport 5201 reject with tcp reset` (the initial
# subflow only; the join comes from 10.79.1.3). Printed per trial: bytes the receiver read, its
# longest gap between reads, whether the client got the receiver's answer, and the server's
# MPTCP socket (ss -M) when the client gives up.
#
# MODE=flap: before the reset the initial subflow's path is black-holed 0.8 s and restored
# 0.8 s three times (the anycast route moving away and back).
# N=20: 20 parallel uploads per trial (default 1).
# Usage: sudo bash subflow-reset-repro.sh   (needs ip, tc, nft, ss, python3)
set -eu
S=srr$$
C=$S-c R=$S-r V=$S-s
SRV=
cleanup() { [ -n "$SRV" ] && kill $SRV 2>/dev/null; for n in $C $R $V; do ip netns del $n 2>/dev/null || true; done; rm -f /tmp/$S-*.py /tmp/$S-*.out; }
trap cleanup EXIT INT TERM
for n in $C $R $V; do ip netns add $n; done
ip link add $S-cr type veth peer name $S-rc
ip link add $S-rs type veth peer name $S-sr
ip link set $S-cr netns $C; ip link set $S-rc netns $R
ip link set $S-rs netns $R; ip link set $S-sr netns $V
ip -n $C addr add 10.79.1.1/24 dev $S-cr; ip -n $C addr add 10.79.1.3/24 dev $S-cr
ip -n $R addr add 10.79.1.2/24 dev $S-rc; ip -n $R addr add 10.79.2.2/24 dev $S-rs
ip -n $V addr add 10.79.2.1/24 dev $S-sr
for n in $C $R $V; do ip -n $n link set lo up; done
ip -n $C link set $S-cr up; ip -n $R link set $S-rc up; ip -n $R link set $S-rs up; ip -n $V link set $S-sr up
ip -n $C route add default via 10.79.1.2
ip -n $V route add default via 10.79.2.2
ip netns exec $R sysctl -qw net.ipv4.ip_forward=1
for n in $C $V; do ip netns exec $n sysctl -qw net.mptcp.enabled=1; ip netns exec $n sysctl -qw net.mptcp.pm_type=0 2>/dev/null || true; done
ip netns exec $R ethtool -K $S-rs tso off gso off gro off >/dev/null 2>&1 || true
tc -n $R qdisc add dev $S-rs root tbf rate 10mbit burst 32kb latency 100ms
ip -n $V mptcp limits set subflows 2 add_addr_accepted 0
ip -n $C mptcp limits set subflows 2 add_addr_accepted 0
ip -n $C mptcp endpoint add 10.79.1.3 dev $S-cr id 5 subflow
cat > /tmp/$S-srv.py <<'PY'
import socket, threading, time
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("10.79.2.1", 5201)); s.listen(128)
def serve(c):
    c.settimeout(20)
    n, gap, last = 0, 0.0, time.monotonic()
    try:
        while True:
            b = c.recv(1 << 18)
            if not b: break
            t = time.monotonic(); gap = max(gap, t - last); last = t; n += len(b)
        c.send(b"ok"); how = "EOF"
    except OSError as e:
        how = "STALLED, receiver gave up: " + str(e)
    print(f"read {n} bytes, longest gap {gap:.2f} s, {how}", flush=True)
    c.close()
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
PY
cat > /tmp/$S-cli.py <<'PY'
import socket, sys, threading, time
res = []
def one():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262)
    s.settimeout(40)
    try:
        s.connect(("10.79.2.1", 5201))
        buf = bytes(1 << 14); end = time.monotonic() + 10
        while time.monotonic() < end: s.send(buf)
        s.shutdown(socket.SHUT_WR)
        res.append("answer" if s.recv(2) == b"ok" else "no answer")
    except OSError as e:
        res.append(str(e))
ts = [threading.Thread(target=one) for _ in range(int(sys.argv[1]))]
for t in ts: t.start(); time.sleep(0.02)
for t in ts: t.join()
print("client: " + ", ".join(f"{res.count(r)} x {r}" for r in sorted(set(res))))
PY
ip netns exec $V python3 /tmp/$S-srv.py >> /tmp/$S-srv.out &
SRV=$!
sleep 0.5
mib() { ip netns exec $1 cat /proc/net/netstat | awk '/^MPTcpExt:/{if(!h){for(i=1;i<=NF;i++)n[i]=$i;h=1}else{for(i=1;i<=NF;i++)if(n[i]==k)print $i}}' k=$2; }
echo "kernel $(uname -r), $(date -u +%FT%TZ)"
for t in $(seq ${TRIALS:-5}); do
  ip netns exec $C python3 /tmp/$S-cli.py ${N:-1} > /tmp/$S-cli.out &
  cli=$!
  sleep 3
  # MODE=flap: first the path of the initial subflow flaps (0.8 s black-holed,
  # 0.8 s back, 3 times, like the anycast route moving away and back), then the reset.
  if [ "${MODE:-reset}" = flap ]; then
    for f in 1 2 3; do
      ip netns exec $R nft -f - <<NFT
table inet $S-f {
  chain f {
    type filter hook forward priority 0; policy accept;
    ip saddr 10.79.1.1 tcp dport 5201 drop
  }
}
NFT
      sleep 0.8; ip netns exec $R nft delete table inet $S-f; sleep 0.8
    done
  fi
  ip netns exec $R nft -f - <<NFT
table inet $S {
  chain f {
    type filter hook forward priority 0; policy accept;
    ip saddr 10.79.1.1 tcp dport 5201 reject with tcp reset
  }
}
NFT
  sleep $([ "${MODE:-reset}" = flap ] && echo 4.2 || echo 9)
  msk=$(ip netns exec $V ss -HMn state all | grep -v LISTEN | tr -s ' ' | head -1)
  wait $cli || true
  ip netns exec $R nft delete table inet $S
  sleep 1
  echo "trial $t: receiver: $(grep -c EOF /tmp/$S-srv.out) complete, $(grep -c STALLED /tmp/$S-srv.out) stalled; $(cat /tmp/$S-cli.out); a server msk at 12 s: ${msk:-none}"
  : > /tmp/$S-srv.out
done
echo "server DuplicateData $(mib $V DuplicateData), client MPTCPRetrans $(mib $C MPTCPRetrans)"
