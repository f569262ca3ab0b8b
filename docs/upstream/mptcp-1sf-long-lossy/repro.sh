#!/bin/bash
# MPTCP over ONE subflow vs plain TCP on the same long, slightly lossy path
# (design point p007 of the seed-2 design: 72.2 Mbit/s, 173 ms RTT, 0.118 %
# random loss per direction, 1.97 BDP tbf queue). No agent, no relay, no
# userspace path manager: the in-kernel PM with its defaults (no extra
# subflows). The path is the lab's emulated link C0 (tbf + nftables loss +
# the lab's user-space delay line); the transfers are `mpdetour bench send`
# (10 s upload, goodput from 1 s) to `mpdetour bench recv --mptcp`.
# Per trial: nstat deltas in the client (sender) and server (receiver).
# Variants change one host setting in both namespaces (per-netns sysctls).
#
# Usage: repro.sh [rounds] [variants...]
#   (root; MPDETOUR=path to mpdetour (bench send/recv), MPDETOUR_LAB=path to
#   mpdetour-lab (lab up/down); the 2026-11-26 run used one binary from before
#   the lab commands moved to mpdetour-lab)
#   variants: defaults rmem32 wmem32 both32 (default: all four)
set -u
R=${1:-3}; shift || true
VARIANTS=${*:-defaults rmem32 wmem32 both32}
M=${MPDETOUR:-mpdetour}
ML=${MPDETOUR_LAB:-mpdetour-lab}
L=k4r$$
RECV=""
cleanup() { [ -n "$RECV" ] && kill $RECV 2>/dev/null; $ML down $L >/dev/null 2>&1; rm -f /tmp/$L-*; }
trap cleanup EXIT INT TERM
$ML up detours --name $L --set detours=1 --set access.rate=0 --set access.delay=0 --set egress.rate=0 --set egress.delay=0 \
  --set C0.rate=72156kbit --set C0.delay=86421us --set C0.loss=0.118% --set C0.queue=2031 \
  --set C1.rate=25040kbit --set C1.delay=67917us --set C1.loss=1.307% --set C1.queue=448 >/dev/null || exit 1
SRV=$(ip -n $L-server -4 -o addr show | awk '$2!="lo"{split($4,a,"/");print a[1];exit}')
ip netns exec $L-server $M bench recv --mptcp --port 5301 >/dev/null 2>&1 &
RECV=$!
sleep 0.5
setv() { # variant -> sysctls in both namespaces
  local r="4096 131072 6291456" w="4096 16384 4194304"
  case $1 in rmem32) r="4096 131072 33554432";; wmem32) w="4096 16384 33554432";; both32) r="4096 131072 33554432"; w="4096 16384 33554432";; esac
  for n in client server; do ip netns exec $L-$n sysctl -qw net.ipv4.tcp_rmem="$r" net.ipv4.tcp_wmem="$w"; done
}
keys='MPTcpExt|TcpRetransSegs|TcpExtTCPOFOQueue|TcpExtTCPRcvQDrop|TcpExtTCPOFODrop|TcpExtPruneCalled|TcpExtTCPRcvCollapsed|TcpExtTCPToZeroWindowAdv|TcpExtTCPWantZeroWindowAdv|TcpExtTCPLossProbes|TcpExtTCPSackRecovery|TcpExtTCPTimeouts|TcpExtTCPSpuriousRTOs|TcpExtTCPDSACK'
echo "# $(date -u +%FT%TZ) $(uname -r) load $(cut -d' ' -f1-3 /proc/loadavg) server $SRV"
for v in $VARIANTS; do
  setv $v
  for r in $(seq 1 $R); do
    order="tcp mptcp"; [ $((r % 2)) -eq 0 ] && order="mptcp tcp"
    for p in $order; do
      flag=""; [ $p = mptcp ] && flag=--mptcp
      for n in client server; do NSTAT_HISTORY=/tmp/$L-$n ip netns exec $L-$n nstat -n; done
      out=$($M bench send $SRV:5301 --netns /run/netns/$L-client --cc cubic --duration 10s --json $flag 2>&1)
      c=$(NSTAT_HISTORY=/tmp/$L-client ip netns exec $L-client nstat | awk -v k="$keys" '$1~k{printf "%s=%s ",$1,$2}')
      s=$(NSTAT_HISTORY=/tmp/$L-server ip netns exec $L-server nstat | awk -v k="$keys" '$1~k{printf "%s=%s ",$1,$2}')
      g=$(printf '%s' "$out" | python3 -c '
import json,sys
try:
  j=json.load(sys.stdin)
except Exception as e:
  print("ERROR", sys.stdin.read()[:200]); sys.exit()
sf=j.get("subflows") or []
print("%.2f Mbit/s mptcp=%s maxgap=%.2fs sf=%s" % (j.get("goodput_mbps",0), j.get("mptcp"), j.get("max_gap_s",0),
  [(round(x.get("rtt_ms",0)), x.get("retransmits"), x.get("bytes_acked"), x.get("cwnd")) for x in sf]))')
      echo "$v round $r $p: $g | sender: $c| receiver: $s| load $(cut -d' ' -f1 /proc/loadavg)"
      sleep 0.5
    done
  done
done
