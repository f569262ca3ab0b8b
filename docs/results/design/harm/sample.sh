#!/bin/bash
# sample.sh NAME OUTDIR: every 0.2 s, while the lab NAME exists, record per-socket
# tcp_info and MPTCP info (ss -tinM) in the client and server nodes and the
# MPTcpExt/Tcp counters (nstat) of both, into OUTDIR/{client,server}.ss and .nstat.
# Lab tooling (checks state with CLI tools); not product code.
name=$1; out=$2; mkdir -p "$out"
while :; do
  for n in client server; do
    ns=$name-$n
    ip netns list | grep -qE "^$ns( |$)" || continue
    t=$(date +%s.%N)
    { echo "@ $t"; ip netns exec "$ns" ss -tinmHM state established 2>/dev/null; ip netns exec "$ns" ss -tinmH state established 2>/dev/null; } >> "$out/$n.ss"
    { echo "@ $t"; ip netns exec "$ns" nstat -asz 2>/dev/null | grep -E "MPTcpExt|TcpExt|TcpRetrans"; } >> "$out/$n.nstat"
  done
  [ -e "$out/stop" ] && exit 0
  sleep 0.2
done
