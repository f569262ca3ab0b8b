#!/bin/bash
# Reproduction without mpdetour of the loadbalancer scenario's class B
# ("the server's MPTCP receive path stops after the balanced subflow's
# reset"): many MPTCP uploads, each with three subflows over two congested
# 10 Mbit/s links; mid-transfer a router resets every initial subflow (as
# the other balancer's backend does after a route change). No mpdetour,
# no userspace path manager: both ends use the in-kernel PM.
#
# Three namespaces: client (10.81.1.1, and 10.81.1.3 as a `subflow`
# endpoint) - router - server (10.81.2.1, and 10.81.4.1 as a `signal`
# endpoint: the kernel announces it, like the server role announces the
# detour). The router has two RATE links to the server, like the lab's two
# core links: L2 carries the initial subflow and the join from 10.81.1.3
# (the lab's balanced path and the join to the backend's own address), L4
# the join to 10.81.4.1 (the lab's detour path). Each connection gets three
# subflows: 10.81.1.1->10.81.2.1 (initial), 10.81.1.3->10.81.2.1,
# 10.81.1.1->10.81.4.1.
# Per trial: N uploads start over 1.7 s and write for DUR s; at RESET_AT s
# the router answers every packet of an initial subflow with a TCP reset
# (and drops it); the other subflows are untouched. The receiver reads
# without pause and logs each connection's outcome ("stalled": no byte for
# 40 s, it then gives up). Printed per trial: the outcomes, the peak of
# (MPTCP-level receive memory / receive buffer) over the server's sockets
# (0.5 s samples), counters, and the server's MPTCP sockets whose receive
# path is frozen: ESTABLISHED with the same rcv_nxt at DUR+3 s and DUR+15 s
# (`ss -tnmiM`). One that holds data (Recv-Q > 0, the receiver reads
# without pause) has a hole in its sequence space; rmem above rcvbuf is the
# deadlock of net/mptcp 6.18 (see ../../upstream/mptcp-rcvbuf-ofo-deadlock).
#
# Usage: sudo bash rcvbuf-stall-repro.sh   (needs ip, tc, nft, ss, nstat, python3)
# Env: N (100) TRIALS (3) DUR (15) RESET_AT (4) RATE (10mbit) FLAPS (0) RMEM_MAX (unset) LINEAR (0)
#      CUT="drop": the initial subflows are black-holed instead of reset
#      KEEP=DIR keeps the ss snapshots there.
set -eu
S=rsr$$
C=$S-c R=$S-r V=$S-s
SRV= CLI= SMP=
cleanup() { for p in $SRV $CLI $SMP; do kill $p 2>/dev/null || true; done; for n in $C $R $V; do ip netns del $n 2>/dev/null || true; done; rm -f /tmp/$S-*; }
trap cleanup EXIT INT TERM
N=${N:-100} TRIALS=${TRIALS:-3} DUR=${DUR:-15} RESET_AT=${RESET_AT:-4} RATE=${RATE:-10mbit}
for n in $C $R $V; do ip netns add $n; done
ip link add $S-cr type veth peer name $S-rc
ip link add $S-r2 type veth peer name $S-s2
ip link add $S-r4 type veth peer name $S-s4
ip link set $S-cr netns $C; ip link set $S-rc netns $R
ip link set $S-r2 netns $R; ip link set $S-s2 netns $V
ip link set $S-r4 netns $R; ip link set $S-s4 netns $V
ip -n $C addr add 10.81.1.1/24 dev $S-cr
ip -n $C addr add 10.81.1.3/24 dev $S-cr
ip -n $R addr add 10.81.1.2/24 dev $S-rc
ip -n $R addr add 10.81.2.2/24 dev $S-r2; ip -n $V addr add 10.81.2.1/24 dev $S-s2
ip -n $R addr add 10.81.4.2/24 dev $S-r4; ip -n $V addr add 10.81.4.1/24 dev $S-s4
for n in $C $R $V; do ip -n $n link set lo up; done
ip -n $C link set $S-cr up; ip -n $R link set $S-rc up
for i in r2 r4; do ip -n $R link set $S-$i up; done
for i in s2 s4; do ip -n $V link set $S-$i up; done
ip -n $C route add default via 10.81.1.2
ip -n $V route add default via 10.81.2.2
ip -n $V route add default via 10.81.4.2 table 104; ip -n $V rule add from 10.81.4.1 lookup 104
ip netns exec $R sysctl -qw net.ipv4.ip_forward=1
for n in $C $V; do ip netns exec $n sysctl -qw net.mptcp.enabled=1; ip netns exec $n sysctl -qw net.mptcp.pm_type=0 2>/dev/null || true; done
for i in $S-rc $S-r2 $S-r4; do ip netns exec $R ethtool -K $i tso off gso off gro off >/dev/null 2>&1 || true; done
# LINEAR=1: the router sends every frame to the server as one linear buffer
# (scatter-gather off), as the lab's user-space delay line does (it copies
# each frame through an AF_PACKET socket): a short segment then costs the
# receiver nearly as much buffer memory as a full one.
if [ "${LINEAR:-0}" = 1 ]; then for i in $S-r2 $S-r4; do ip netns exec $R ethtool -K $i sg off >/dev/null; done; fi
# Two 10 Mbit/s links towards the server: L2 carries the initial subflows
# (10.81.1.1 -> 10.81.2.1) and the joins from 10.81.1.3 (the "direct" join
# of the lab, on the balanced path's core link); L4 carries the joins to the
# server's announced 10.81.4.1 (the lab's detour path, another core link).
tc -n $R qdisc add dev $S-r2 root tbf rate $RATE burst 32kb latency 200ms
tc -n $R qdisc add dev $S-r4 root tbf rate $RATE burst 32kb latency 200ms
# RMEM_MAX=n: the server's tcp_rmem maximum (autotuning cap); 131072, the
# initial buffer, keeps every socket at 128 KiB as the lab's stalled
# sockets were (their Recv-Q 132608 just above 131072). Unset: the default.
if [ -n "${RMEM_MAX:-}" ]; then ip netns exec $V sysctl -qw net.ipv4.tcp_rmem="4096 131072 $RMEM_MAX"; fi
ip -n $V mptcp limits set subflows 4 add_addr_accepted 0
ip -n $V mptcp endpoint add 10.81.4.1 dev $S-s4 id 1 signal
ip -n $C mptcp limits set subflows 2 add_addr_accepted 1
ip -n $C mptcp endpoint add 10.81.1.3 dev $S-cr id 3 subflow
cat > /tmp/$S-srv.py <<'PY'
import socket, threading, time, sys
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 5201)); s.listen(512)
def serve(c, peer):
    c.settimeout(40)
    n = 0
    try:
        while True:
            b = c.recv(1 << 18)
            if not b: break
            n += len(b)
        c.send(b"ok"); how = "EOF"
    except OSError as e:
        how = "STALLED (" + str(e) + ")"
    print(f"{peer[1]} read {n} {how}", flush=True)
    c.close()
while True:
    c, peer = s.accept()
    threading.Thread(target=serve, args=(c, peer), daemon=True).start()
PY
cat > /tmp/$S-cli.py <<'PY'
import socket, sys, threading, time
n, dur = int(sys.argv[1]), float(sys.argv[2])
res = []
start = time.monotonic()
def one(i):
    time.sleep(1.7 * i / n)
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, b"cubic")
    s.settimeout(30)
    try:
        s.connect(("10.81.2.1", 5201))
        buf = bytes(1 << 14); end = start + dur
        while time.monotonic() < end: s.send(buf)
        s.shutdown(socket.SHUT_WR)
        res.append("answer" if s.recv(2) == b"ok" else "no answer")
    except OSError as e:
        res.append(type(e).__name__ + ": " + str(e))
ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
for t in ts: t.start()
for t in ts: t.join()
print("client: " + ", ".join(f"{res.count(r)} x {r}" for r in sorted(set(res))))
PY
ip netns exec $V python3 /tmp/$S-srv.py > /tmp/$S-srv.out &
SRV=$!
sleep 0.5
mib() { ip netns exec $1 nstat -az 2>/dev/null | awk -v k=MPTcpExt$2 '$1==k{print $2}'; }
echo "kernel $(uname -r), $(date -u +%FT%TZ), N=$N DUR=$DUR RESET_AT=$RESET_AT FLAPS=${FLAPS:-0} RATE=$RATE RMEM_MAX=${RMEM_MAX:-default} LINEAR=${LINEAR:-0}, load $(cut -d' ' -f1-3 /proc/loadavg)"
for t in $(seq $TRIALS); do
  : > /tmp/$S-srv.out
  d0=$(mib $V DuplicateData); fb0=$(mib $V MPCapableFallbackACK); js0=$(mib $C MPJoinSynTx); ja0=$(mib $V MPJoinAckRx); st0=$(mib $C SubflowStale); rt0=$(mib $C MPTCPRetrans)
  ip netns exec $C python3 /tmp/$S-cli.py $N $DUR > /tmp/$S-cli.out &
  cli=$! CLI=$!
  # Every 0.5 s: the largest MPTCP-level receive memory (rmem) of a server
  # socket relative to its receive buffer, over the trial.
  ( end=$(( $(date +%s) + DUR + 3 )); while [ $(date +%s) -lt $end ]; do
      ip netns exec $V ss -tnmM 2>/dev/null | awk '/^mptcp/{m=1; next} m && /skmem/ {match($0,/r[0-9]+,rb[0-9]+/); split(substr($0,RSTART,RLENGTH),a,/,rb|r/); if (a[3]>0 && a[2]/a[3]>mx) mx=a[2]/a[3]} {m=0} END{printf "%.3f\n", mx}'
      sleep 0.5; done | sort -n | tail -1 > /tmp/$S-peak.out ) &
  SMP=$!
  sleep $RESET_AT
  # FLAPS=k: first k times 0.8 s of black-hole for the initial subflows
  # (their packets dropped, no reset) and 0.8 s back.
  for f in $(seq ${FLAPS:-0}); do
    ip netns exec $R nft -f - <<NFT
table inet $S-f {
  chain f {
    type filter hook forward priority 0; policy accept;
    ip saddr 10.81.1.1 ip daddr 10.81.2.1 tcp dport 5201 drop
  }
}
NFT
    sleep 0.8; ip netns exec $R nft delete table inet $S-f; sleep 0.8
  done
  ip netns exec $R nft -f - <<NFT
table inet $S {
  chain f {
    type filter hook forward priority 0; policy accept;
    ip saddr 10.81.1.1 ip daddr 10.81.2.1 tcp dport 5201 ${CUT:-reject with tcp reset}
  }
}
NFT
  sleep $(python3 -c "print(max(0.1, $DUR - 2 - $RESET_AT - 1.6 * ${FLAPS:-0}))")
  [ -n "${KEEP:-}" ] && ip netns exec $C ss -tnmiM > "$KEEP/ss-client-trial$t.txt"
  sleep 5
  ip netns exec $V ss -tnmiM > /tmp/$S-ss1.txt
  sleep 12
  ip netns exec $V ss -tnmiM > /tmp/$S-ss2.txt
  [ -n "${KEEP:-}" ] && cp /tmp/$S-ss1.txt "$KEEP/ss-server-trial$t-a.txt" && cp /tmp/$S-ss2.txt "$KEEP/ss-server-trial$t-b.txt"
  wait $cli || true
  ip netns exec $R nft delete table inet $S
  sleep 1
  echo "trial $t: receiver: $(grep -c EOF /tmp/$S-srv.out) complete, $(grep -c STALLED /tmp/$S-srv.out) stalled; $(cat /tmp/$S-cli.out)"
  echo "  peak MPTCP receive memory / receive buffer of a server socket (0.5 s samples): $(cat /tmp/$S-peak.out)"
  echo "  counters: server MPCapableFallbackACK +$(( $(mib $V MPCapableFallbackACK) - fb0 )), DuplicateData +$(( $(mib $V DuplicateData) - d0 )); client MPJoinSynTx +$(( $(mib $C MPJoinSynTx) - js0 )), server MPJoinAckRx +$(( $(mib $V MPJoinAckRx) - ja0 )); client SubflowStale +$(( $(mib $C SubflowStale) - st0 )), MPTCPRetrans +$(( $(mib $C MPTCPRetrans) - rt0 ))"
  # The MPTCP sockets (not fallen back: they have an rcv_nxt) whose rcv_nxt did
  # not move between DUR+3 s and DUR+15 s although they hold data (Recv-Q > 0)
  # that the receiver, which reads without pause, cannot read: frozen.
  python3 - /tmp/$S-ss1.txt /tmp/$S-ss2.txt /tmp/$S-srv.out <<'PY'
import re, sys
def msks(path):
    out, lines = {}, open(path).read().split("\n")
    for i, l in enumerate(lines):
        f = l.split()
        if len(f) >= 6 and f[0] == "mptcp":
            info = lines[i + 1] if i + 1 < len(lines) else ""
            m = re.search(r"rcv_nxt:([0-9a-f]+)", info)
            rb = re.search(r"\brb(\d+)", info)
            sf = re.search(r"subflows:(\d+)", info)
            out[f[5].rsplit(":", 1)[1]] = (int(f[2]), m and m.group(1), rb and int(rb.group(1)), sf and int(sf.group(1)), f[1])
    return out
a, b = msks(sys.argv[1]), msks(sys.argv[2])
stalled = {l.split()[0] for l in open(sys.argv[3]) if "STALLED" in l}
frozen = [p for p in a if p in b and a[p][1] and a[p][1] == b[p][1] and b[p][4] == "ESTAB"]
held = [p for p in frozen if b[p][0] > 0]
over = [p for p in held if b[p][2] and b[p][0] > b[p][2]]
print(f"  MPTCP receive paths frozen (ESTAB, rcv_nxt unchanged over 12 s): {len(frozen)}; holding data the receiver cannot read: {len(held)}, "
      f"of which rmem > rcvbuf (deadlock): {len(over)}; receiver's stalled among the frozen: {len(set(frozen) & stalled)}")
for p in frozen:
    q, nxt, rb, sf, st = b[p]
    print(f"    port {p}: Recv-Q (rmem) {q}, rcvbuf {rb}, extra subflows {sf}, rcv_nxt {nxt}")
PY
done
