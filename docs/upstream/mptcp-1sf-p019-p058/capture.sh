#!/bin/bash
# One TCP and one MPTCP trial at p058's path (as repro.sh) with the receiver's
# ACKs captured (headers only) at the server, then: how many SACK blocks the
# ACKs that carry SACK have, TCP vs MPTCP. MPTCP's DSS option takes TCP option
# space first (tcp_established_options: "MPTCP options have precedence over
# SACK"), leaving room for fewer SACK blocks.
# Usage: capture.sh [OUTDIR]   (root; MPDETOUR, MPDETOUR_LAB as for repro.sh)
set -u
OUT=${1:-.}
M=${MPDETOUR:-mpdetour}
ML=${MPDETOUR_LAB:-mpdetour-lab}
L=k1c$$
RECV=""; DUMP=""
cleanup() { [ -n "$DUMP" ] && kill $DUMP 2>/dev/null; [ -n "$RECV" ] && kill $RECV 2>/dev/null; wait 2>/dev/null; $ML down $L >/dev/null 2>&1; }
trap cleanup EXIT
trap 'exit 130' INT TERM
$ML up detours --name $L --set detours=1 --set access.rate=0 --set access.delay=0 --set egress.rate=0 --set egress.delay=0 \
  --set C0.rate=99545kbit --set C0.delay=120182us --set C0.loss=0.361% --set C0.queue=938 \
  --set C1.rate=6223kbit --set C1.delay=56364us --set C1.loss=1.886% --set C1.queue=34 >/dev/null || exit 1
SRV=$(ip -n $L-server -4 -o addr show dev A2 | awk '{split($4,a,"/");print a[1];exit}')
ip netns exec $L-server $M bench recv --mptcp --port 5301 >/dev/null 2>&1 &
RECV=$!
sleep 0.5
for p in tcp mptcp; do
  flag=""; [ $p = mptcp ] && flag=--mptcp
  ip netns exec $L-server tcpdump -i A2 -s 128 -w $OUT/capture-p058-$p.pcap "src host $SRV and tcp src port 5301" 2>/dev/null &
  DUMP=$!
  sleep 1
  g=$($M bench send $SRV:5301 --netns /run/netns/$L-client --cc cubic --duration 10s --json $flag 2>&1 | python3 -c 'import json,sys; print("%.2f" % json.load(sys.stdin)["goodput_mbps"])')
  sleep 1; kill $DUMP; wait $DUMP 2>/dev/null; DUMP=""
  tcpdump -nr $OUT/capture-p058-$p.pcap 2>/dev/null | python3 -c '
import re, sys, collections
acks = sackacks = 0; blocks = collections.Counter()
for l in sys.stdin:
    acks += 1
    m = re.search(r"sack (\d+)", l)
    if m:
        sackacks += 1; blocks[int(m.group(1))] += 1
print("'$p' goodput '$g' Mbit/s: %d ACKs, %d with SACK; SACK blocks per such ACK: %s" % (acks, sackacks, dict(sorted(blocks.items()))))'
  sleep 0.5
done
