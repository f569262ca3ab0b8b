#!/bin/bash
# MPTCP over ONE subflow vs plain TCP on the same path, at points of the
# paired design (seed 1, default space; docs/results/design/paired-main2) where
# mptcp-1sf was well below TCP on the best path: p019 (0.51) and p058 (0.53);
# p174 (0.53) and p197 (0.72) pooled over paired-main2 + lowat (used by
# ../mptcp-1sf-p174-p197). Adapted from ../mptcp-1sf-long-lossy/repro.sh.
#
# The lab is the design's own `detours` lab with the point's parameters on both
# links (tbf + nftables random loss per direction + the lab's user-space delay
# line); no agent, no relay daemon, no userspace path manager (in-kernel PM,
# defaults: no extra subflow). The transfer runs over the point's best path,
# as the design's tcp-pathK / mptcp-1sf did:
#   p019: path 2 (link C1 through node detour1; 35.4 Mbit/s, 272 ms, 0.178 %,
#         queue 754 packets). The design reached it through the relay's NAT
#         port; here one nftables DNAT + masquerade rule in detour1 does the same.
#   p058: path 1 (link C0, direct; 99.5 Mbit/s, 240 ms, 0.361 %, queue 938).
#   p174: path 1 (C0, direct; 45.6 Mbit/s, 315 ms, 0.497 %, queue 2242).
#   p197: path 1 (C0, direct; 29.7 Mbit/s, 47 ms, 0.012 %, queue 25 = 0.21 BDP).
# Transfers: `mpdetour bench send` (10 s upload, goodput from 1 s, cubic unless
# the variant says otherwise) to `mpdetour bench recv --mptcp`; TCP and MPTCP
# alternate first per round. Per trial: nstat deltas in the client (sender)
# and the server (receiver), and `ss -tinmM` of both ends 9 s into the trial
# (raw, to $SSLOG), and the forward path's own counters: packets the bottleneck
# sent (tx), tbf drops (queue overflow), random-loss drops (nftables counter)
# and packets the delay line lost (tx - rx at the far end of the link; rx
# counts packets before the loss rule drops them).
#
# Usage: repro.sh POINT [rounds] [variants...]   (root)
#   POINT: p019 | p058 | p174 | p197
#   variants (each changes one setting, in client and server namespaces):
#     defaults   the lab's (tcp_rmem max 32 MB, tcp_wmem max 4 MB, cubic)
#     wmem32     tcp_wmem max 32 MB
#     rmem6      tcp_rmem max 6 MB
#     bbr        the sender's congestion control bbr (TCP and MPTCP alike)
#     nooffload  GSO/TSO/GRO off on the client's and server's interfaces
#     stale1     net.mptcp.stale_loss_cnt=1 (client)  [MPTCP only setting]
#     lowat      net.ipv4.tcp_notsent_lowat=131072 in the client (the sender): the
#                namespace default that a TCP socket (the MPTCP subflow too) uses
#                when the socket sets none; the bench sets 128 KB on its socket
#                (TCP: the connection; MPTCP: the MPTCP socket only)
#     nots       net.ipv4.tcp_timestamps=0 (client and server): frees the 12 option
#                bytes that leave an MPTCP ACK room for one SACK block only (two
#                without timestamps; TCP goes from three to four)
#   MPDETOUR=path to mpdetour (bench), MPDETOUR_LAB=path to mpdetour-lab (up/down),
#   SSLOG=file for the raw ss samples (default /dev/null), LABNAME=lab name
#   (default k1s<pid>; must be unique among labs running at the same time).
set -u
PT=${1:?usage: repro.sh p019|p058|p174|p197 [rounds] [variants...]}; shift
R=${1:-8}; shift || true
VARIANTS=${*:-defaults}
M=${MPDETOUR:-mpdetour}
ML=${MPDETOUR_LAB:-mpdetour-lab}
SSLOG=${SSLOG:-/dev/null}
L=${LABNAME:-k1s$$}
RECV=""
cleanup() { [ -n "$RECV" ] && kill $RECV 2>/dev/null; wait 2>/dev/null; $ML down $L >/dev/null 2>&1; rm -f /tmp/$L-*; }
trap cleanup EXIT
trap 'exit 130' INT TERM
case $PT in
p019) SET="--set C0.rate=26002kbit --set C0.delay=71718us --set C0.loss=1.469% --set C0.queue=339
           --set C1.rate=35411kbit --set C1.delay=136090us --set C1.loss=0.178% --set C1.queue=754";;
p058) SET="--set C0.rate=99545kbit --set C0.delay=120182us --set C0.loss=0.361% --set C0.queue=938
           --set C1.rate=6223kbit --set C1.delay=56364us --set C1.loss=1.886% --set C1.queue=34";;
p174) SET="--set C0.rate=45599kbit --set C0.delay=157278us --set C0.loss=0.497% --set C0.queue=2242
           --set C1.rate=88976kbit --set C1.delay=194581us --set C1.loss=1.918% --set C1.queue=5312";;
p197) SET="--set C0.rate=29709kbit --set C0.delay=23487us --set C0.loss=0.012% --set C0.queue=25
           --set C1.rate=9547kbit --set C1.delay=67180us --set C1.loss=0.695% --set C1.queue=17";;
*) echo "unknown point $PT (p019, p058, p174 or p197)" >&2; exit 2;;
esac
$ML up detours --name $L --set detours=1 --set access.rate=0 --set access.delay=0 --set egress.rate=0 --set egress.delay=0 $SET >/dev/null || exit 1
addr() { ip -n $L-$1 -4 -o addr show dev $2 | awk '{split($4,a,"/");print a[1];exit}'; }
SRV=$(addr server A2)
DST=$SRV:5301
if [ $PT = p019 ]; then # the best path is path 2: through detour1, DNAT as the relay's NAT port
  D=$(addr detour1 C1)
  ip netns exec $L-detour1 nft -f - <<NFT || exit 1
table ip k1sf {
  chain pre { type nat hook prerouting priority dstnat; policy accept; ip daddr $D tcp dport 5302 dnat to $SRV:5301; }
  chain post { type nat hook postrouting priority srcnat; policy accept; ip daddr $SRV tcp dport 5301 masquerade; }
}
NFT
  DST=$D:5302
fi
LINK=C0; FAR=r2; [ $PT = p019 ] && { LINK=C1; FAR=detour1; }
pathc() { # tx tbfdrops nftdrops rx on the forward direction of the best path
  local tx drops nft rx
  tx=$(ip netns exec $L-r1 cat /sys/class/net/$LINK/statistics/tx_packets)
  drops=$(ip netns exec $L-r1 tc -s qdisc show dev $LINK | awk '/dropped/{sub(",","",$7); print $7; exit}')
  nft=$(ip netns exec $L-$FAR nft list chain netdev mpdetour_lab loss_$LINK | awk '/counter/{for(i=1;i<=NF;i++) if($i=="packets") print $(i+1)}')
  rx=$(ip netns exec $L-$FAR cat /sys/class/net/$LINK/statistics/rx_packets)
  echo "$tx $drops $nft $rx"
}
ip netns exec $L-server $M bench recv --mptcp --port 5301 >/dev/null 2>&1 &
RECV=$!
sleep 0.5
defaults() {
  for n in client server; do
    ip netns exec $L-$n sysctl -qw net.ipv4.tcp_rmem="4096 131072 33554432" net.ipv4.tcp_wmem="4096 16384 4194304"
    ip netns exec $L-$n sysctl -qw net.mptcp.stale_loss_cnt=4 net.ipv4.tcp_notsent_lowat=4294967295 net.ipv4.tcp_timestamps=1
  done
  ip netns exec $L-client ethtool -K A1 gso on tso on gro on >/dev/null 2>&1
  ip netns exec $L-server ethtool -K A2 gso on tso on gro on >/dev/null 2>&1
  CC=cubic
}
setv() { # variant -> settings
  defaults
  case $1 in
  defaults) ;;
  wmem32) for n in client server; do ip netns exec $L-$n sysctl -qw net.ipv4.tcp_wmem="4096 16384 33554432"; done;;
  rmem6) for n in client server; do ip netns exec $L-$n sysctl -qw net.ipv4.tcp_rmem="4096 131072 6291456"; done;;
  bbr) CC=bbr;;
  nooffload) ip netns exec $L-client ethtool -K A1 gso off tso off gro off >/dev/null
             ip netns exec $L-server ethtool -K A2 gso off tso off gro off >/dev/null;;
  stale1) ip netns exec $L-client sysctl -qw net.mptcp.stale_loss_cnt=1;;
  lowat) ip netns exec $L-client sysctl -qw net.ipv4.tcp_notsent_lowat=131072;;
  nots) for n in client server; do ip netns exec $L-$n sysctl -qw net.ipv4.tcp_timestamps=0; done;;
  *) echo "unknown variant $1" >&2; exit 2;;
  esac
}
keys='MPTcpExt|TcpRetransSegs|TcpExtTCPOFOQueue|TcpExtTCPRcvQDrop|TcpExtTCPOFODrop|TcpExtPruneCalled|TcpExtTCPRcvCollapsed|TcpExtTCPToZeroWindowAdv|TcpExtTCPWantZeroWindowAdv|TcpExtTCPLossProbes|TcpExtTCPSackRecovery|TcpExtTCPTimeouts|TcpExtTCPSpuriousRTOs|TcpExtTCPDSACK|TcpExtTCPLostRetransmit|TcpExtTCPFastRetrans|TcpExtTCPSlowStartRetrans|TcpExtTCPBacklogCoalesce|TcpExtTCPRcvCoalesce|TcpExtTCPHystart|TcpOutSegs|TcpExtTCPOrigDataSent|TcpExtTCPLoss|TcpExtTCPSACKReorder|TcpExtTCPTSReorder|TcpExtTCPFullUndo|TcpExtTCPPartialUndo|TcpExtTCPDSACKUndo|TcpExtTCPSpuriousRtxHostQueues|TcpExtTCPSACKDiscard|TcpExtTCPSackMerged'
echo "# $(date -u +%FT%TZ) $(uname -r) point $PT lab $L dst $DST load $(cut -d' ' -f1-3 /proc/loadavg) build $($M version 2>/dev/null | head -1)"
for v in $VARIANTS; do
  setv $v
  for r in $(seq 1 $R); do
    order="tcp mptcp"; [ $((r % 2)) -eq 0 ] && order="mptcp tcp"
    for p in $order; do
      flag=""; [ $p = mptcp ] && flag=--mptcp
      for n in client server; do NSTAT_HISTORY=/tmp/$L-$n ip netns exec $L-$n nstat -n; done
      read tx0 dr0 nf0 rx0 < <(pathc)
      ( sleep 9; { echo "## $PT $v round $r $p client $(date -u +%T)"; ip netns exec $L-client ss -tinmM "( dport = :5301 or dport = :5302 )";
                   echo "## $PT $v round $r $p server"; ip netns exec $L-server ss -tinmM "( sport = :5301 )"; } >>$SSLOG 2>&1 ) &
      ssp=$!
      out=$($M bench send $DST --netns /run/netns/$L-client --cc $CC --duration 10s --json $flag 2>&1)
      wait $ssp
      sleep 0.3
      read tx1 dr1 nf1 rx1 < <(pathc)
      pc="path: tx=$((tx1-tx0)) tbfdrop=$((dr1-dr0)) lossdrop=$((nf1-nf0)) delaylinelost=$((tx1-tx0-rx1+rx0))"
      c=$(NSTAT_HISTORY=/tmp/$L-client ip netns exec $L-client nstat | awk -v k="$keys" '$1~k{printf "%s=%s ",$1,$2}')
      s=$(NSTAT_HISTORY=/tmp/$L-server ip netns exec $L-server nstat | awk -v k="$keys" '$1~k{printf "%s=%s ",$1,$2}')
      g=$(printf '%s' "$out" | python3 -c '
import json,sys
raw=sys.stdin.read()
try:
  j=json.loads(raw)
except Exception as e:
  print("ERROR", raw[:200].replace("\n"," ")); sys.exit()
sf=j.get("subflows") or []
print("%.3f Mbit/s mptcp=%s fallback=%s maxgap=%.2fs persec=%s sf=%s" % (j.get("goodput_mbps",0), j.get("mptcp"), j.get("fallback"), j.get("max_gap_s",0),
  [round(x.get("mbps",0),1) for x in j.get("samples") or []],
  [(round(x.get("rtt_ms",0)), x.get("retransmits"), x.get("bytes_acked"), x.get("cwnd"), x.get("mss")) for x in sf]))')
      echo "$PT $v round $r $p: $g | sender: $c| receiver: $s| $pc | load $(cut -d' ' -f1 /proc/loadavg) $(date -u +%T)"
      sleep 0.5
    done
  done
done
echo "# end $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)"
