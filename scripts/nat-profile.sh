#!/usr/bin/env bash
# Where the CPU goes when the relay NATs (issue 18): TCP goodput client ->
# relay -> server over unshaped veths, alternating per round between
#   bare    routing through the relay namespace with no table there (no
#           conntrack: a router without any netfilter state)
#   plain   routing through the relay namespace with the relay's table present
#           (conntrack active, as on any relay; no NAT for this connection)
#   nat     the relay's NAT: DNAT on a detour port, masquerade on the mark,
#           ct mark set (fast_path: true; attribution via conntrack accounting)
#   natacct the same plus the relay's per-packet accounting rules in forward
#           (fast_path: false: per-mapping nftables counters)
# each run under `perf record -a` (cpu-clock), reporting goodput and the
# share of busy CPU in netfilter + routing, in NAT-only functions and in the
# sender's/receiver's copies. The ruleset is the relay's (internal/relay/nft.go)
# written with nft for this profile; the relay itself never runs nft.
#
# Usage: scripts/nat-profile.sh [-d seconds] [-n rounds]   (root; perf, iperf3, nft)
# Creates namespaces nap<pid>-{c,r,s}; removes them and its processes on exit.
set -euo pipefail
DURATION=3
ROUNDS=3
while getopts d:n: o; do
  case $o in
    d) DURATION=$OPTARG ;;
    n) ROUNDS=$OPTARG ;;
    *) echo "usage: $0 [-d seconds] [-n rounds]" >&2; exit 2 ;;
  esac
done
for t in ip nft iperf3 perf python3; do
  command -v "$t" >/dev/null || { echo "nat-profile: $t not installed" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "nat-profile: must run as root" >&2; exit 1; }

P=nap$$
C=$P-c R=$P-r S=$P-s
TMP=$(mktemp -d)
PIDS=()
cleanup() {
  set +e
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
  for n in $C $R $S; do ip netns del "$n" 2>/dev/null; done
  rm -rf "$TMP"
}
trap cleanup EXIT

for n in $C $R $S; do ip netns add "$n"; ip -n "$n" link set lo up; done
ip link add c0 netns $C type veth peer r0 netns $R
ip link add r1 netns $R type veth peer s0 netns $S
ip -n $C addr add 10.0.1.1/24 dev c0; ip -n $C link set c0 up
ip -n $R addr add 10.0.1.2/24 dev r0; ip -n $R link set r0 up
ip -n $R addr add 10.0.2.1/24 dev r1; ip -n $R link set r1 up
ip -n $S addr add 10.0.2.2/24 dev s0; ip -n $S link set s0 up
ip -n $C route add default via 10.0.1.2
ip -n $S route add 10.0.1.0/24 via 10.0.2.1   # for plain routing
ip netns exec $R sysctl -qw net.ipv4.ip_forward=1
table_on() {
ip netns exec $R nft -f - <<'NFT'
table ip mpdetour_relay {
  map detours { type ipv4_addr . inet_service : ipv4_addr . inet_service; elements = { 10.0.1.1 . 40000 : 10.0.2.2 . 5201 } }
  set acct { type ipv4_addr . inet_service; counter; elements = { 10.0.1.1 . 5201 } }
  chain prerouting {
    type nat hook prerouting priority dstnat;
    meta l4proto tcp fib daddr type local meta mark set meta mark | 0x4d500000 ct mark set ct mark | 0x4d500000 dnat ip to ip saddr . tcp dport map @detours
  }
  chain postrouting {
    type nat hook postrouting priority srcnat;
    ct bytes 0xffffffffffffffff counter
    meta mark & 0x4d500000 == 0x4d500000 masquerade
  }
  chain forward {
    type filter hook forward priority filter;
  }
}
NFT
}
table_on
table_off() { ip netns exec $R nft delete table ip mpdetour_relay 2>/dev/null || true; }
# The relay keys its rules on "ct original proto-dst", which this nft CLI
# cannot put in a concatenation; th dport/sport (the server's port after
# DNAT) costs the same per packet (ct, payload, set lookup, element counter).
acct_on() {
  ensure_table
  acct_off
  ip netns exec $R nft add rule ip mpdetour_relay forward ct status dnat ct direction original ip saddr . th dport @acct
  ip netns exec $R nft add rule ip mpdetour_relay forward ct status dnat ct direction reply ip daddr . th sport @acct
}
acct_off() { ensure_table; ip netns exec $R nft flush chain ip mpdetour_relay forward; }
ensure_table() { ip netns exec $R nft list table ip mpdetour_relay >/dev/null 2>&1 || table_on; }

ip netns exec $S iperf3 -s -p 5201 >/dev/null 2>&1 &
PIDS+=($!)
sleep 0.5

run() { # mode
  local mode=$1 dst
  case $mode in
    bare) dst="10.0.2.2 -p 5201"; table_off ;;
    plain) dst="10.0.2.2 -p 5201"; acct_off ;;
    nat) dst="10.0.1.2 -p 40000"; acct_off ;;
    natacct) dst="10.0.1.2 -p 40000"; acct_on ;;
  esac
  # shellcheck disable=SC2086
  perf record -q -a -o "$TMP/$mode.data" -- ip netns exec $C iperf3 -c $dst -t "$DURATION" -C cubic -J >"$TMP/$mode.json" 2>/dev/null
  perf report -i "$TMP/$mode.data" --stdio --no-children --sort sym 2>/dev/null | grep -E '^ +[0-9]' >"$TMP/$mode.syms" || true
  python3 - "$mode" "$TMP/$mode.json" "$TMP/$mode.syms" <<'PY' >>"$TMP/rows"
import json, re, sys
mode, js, syms = sys.argv[1:]
g = json.load(open(js))["end"]["sum_received"]["bits_per_second"] / 1e9
d = {}
for l in open(syms):
    m = re.match(r"\s+([\d.]+)%\s+\[.\]\s+(\S+)", l)
    if m:
        d[m.group(2)] = d.get(m.group(2), 0) + float(m.group(1))
busy = 100 - sum(v for k, v in d.items() if "halt" in k or "idle" in k)
share = lambda rx: sum(v for k, v in d.items() if re.match(rx, k)) / busy * 100
nf = share(r"(nf_|nft_|__nf|ipv4_conntrack|l4proto_manip|inet_proto_csum|ip_route_input|fib_|ip_forward|__xfrm_decode|__skb_flow_dissect|ip_send_check)")
nat = share(r"(l4proto_manip|nf_nat_.*manip|nf_xfrm_me_harder|__xfrm_decode_session|__skb_flow_dissect|inet_proto_csum|ip_send_check)")
nft = share(r"(nft_|__nft)")
cp = share(r"_copy_(to|from)_iter")
print(f"{mode} {g:.2f} {busy:.1f} {nf:.2f} {nat:.2f} {nft:.2f} {cp:.1f}")
PY
}

run plain >/dev/null; : >"$TMP/rows"   # warm-up
for r in $(seq "$ROUNDS"); do
  case $((r % 3)) in
    1) order="bare plain nat natacct" ;;
    2) order="plain nat natacct bare" ;;
    0) order="nat natacct bare plain" ;;
  esac
  for m in $order; do run "$m"; done
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg); $ROUNDS rounds of ${DURATION}s, order rotated"
python3 - "$TMP/rows" <<'PY'
import sys, statistics as st
rows = [l.split() for l in open(sys.argv[1])]
by = {}
for r in rows:
    by.setdefault(r[0], []).append([float(x) for x in r[1:]])
print("| path | goodput Gbit/s (median; runs) | busy CPU % | netfilter + routing, % of busy | NAT-only functions | nft rule evaluation | copies |")
print("|---|---|---|---|---|---|---|")
for m in ("bare", "plain", "nat", "natacct"):
    v = by.get(m, [])
    col = lambda i: st.median(x[i] for x in v)
    runs = " ".join(f"{x[0]:.1f}" for x in v)
    print(f"| {m} | {col(0):.2f} ({runs}) | {col(1):.1f} | {col(2):.2f} | {col(3):.2f} | {col(4):.2f} | {col(5):.1f} |")
for m, base in (("nat", "plain"), ("natacct", "plain"), ("nat", "bare"), ("natacct", "bare"), ("plain", "bare")):
    rs = [a[0] / b[0] for a, b in zip(by[m], by[base])]
    print(f"{m} / {base} goodput, per round: " + " ".join(f"{x:.3f}" for x in rs) + f" (median {st.median(rs):.3f})")
PY
