#!/usr/bin/env bash
# Tunnel benchmark (issue 6): TCP goodput A -> C through B over unshaped veths,
# side by side in one run: plain routing, mpdetour's embedded WireGuard
# (internal/tunnel, one process per end via internal/lab/cmd/twbench), OpenVPN 2.6 (Debian,
# default data cipher, TLS peer-to-peer with self-signed certificates pinned
# by fingerprint) and the Debian wireguard-go binary (configured with wg).
# The tunnel runs A <-> B, B forwards to C (the server), for every variant.
#
# iperf3 -C cubic, DURATION s per run (default 5), RUNS runs (default 3),
# median reported. CPU: utime+stime of the tunnel processes (both ends) over
# each run, from /proc/<pid>/stat, reported as cores per Gbit/s of goodput.
#
# Usage: scripts/bench-tunnel.sh [-d seconds] [-n runs]   (root; prints a
# markdown table). Creates namespaces twb<pid>-{a,b,c}; removes all on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=5
RUNS=3
while getopts d:n: o; do
  case $o in
    d) DURATION=$OPTARG ;;
    n) RUNS=$OPTARG ;;
    *) echo "usage: $0 [-d seconds] [-n runs]" >&2; exit 2 ;;
  esac
done
for t in ip iperf3 openvpn wireguard-go wg openssl jq go; do
  command -v "$t" >/dev/null || { echo "bench-tunnel: $t not installed (scripts/setup.sh)" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "bench-tunnel: must run as root" >&2; exit 1; }

P=twb$$
A=$P-a B=$P-b C=$P-c
WGA=${P}wa WGB=${P}wb   # wireguard-go socket names are global: unique per run
TMP=$(mktemp -d)
PIDS=()
cleanup() {
  set +e
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
  for n in $A $B $C; do ip netns del "$n" 2>/dev/null; done
  rm -f /var/run/wireguard/$WGA.sock /var/run/wireguard/$WGB.sock
  rm -rf "$TMP"
}
trap cleanup EXIT

go build -o "$TMP/twbench" ./internal/lab/cmd/twbench

for n in $A $B $C; do ip netns add "$n"; ip -n "$n" link set lo up; done
ip link add b0 netns $A type veth peer a0 netns $B
ip link add c0 netns $B type veth peer b0 netns $C
ip -n $A addr add 10.91.0.1/24 dev b0; ip -n $A link set b0 up
ip -n $B addr add 10.91.0.2/24 dev a0; ip -n $B link set a0 up
ip -n $B addr add 10.92.0.1/24 dev c0; ip -n $B link set c0 up
ip -n $C addr add 10.92.0.2/24 dev b0; ip -n $C link set b0 up
ip -n $C route add default via 10.92.0.1
ip netns exec $B sysctl -qw net.ipv4.ip_forward=1
SERVER=10.92.0.2

ip netns exec $C iperf3 -s >/dev/null 2>&1 &
PIDS+=($!)
sleep 0.5

TCK=$(getconf CLK_TCK)
cputicks() { # sum of utime+stime of the given pids
  local s=0 p
  for p in "$@"; do
    s=$((s + $(awk '{print $14 + $15}' "/proc/$p/stat")))
  done
  echo $s
}

# run_once IDX -> appends "bps cores_per_gbit mss" to $TMP/res.IDX
run_once() {
  local i=$1 t0=0 t1=0
  local args=${ARGS[$i]} pids=${CPIDS[$i]}
  # shellcheck disable=SC2086
  [ -n "$pids" ] && t0=$(cputicks $pids)
  # shellcheck disable=SC2086
  ip netns exec $A iperf3 -c ${DST[$i]} -t "$DURATION" -C cubic -J $args >"$TMP/run.json"
  # shellcheck disable=SC2086
  [ -n "$pids" ] && t1=$(cputicks $pids)
  local bps mss
  bps=$(jq '.end.sum_received.bits_per_second' "$TMP/run.json")
  mss=$(jq '.start.tcp_mss_default // 0' "$TMP/run.json")
  # cores per Gbit/s = (cpu seconds / duration) / (Gbit/s)
  awk -v d=$((t1 - t0)) -v tck="$TCK" -v dur="$DURATION" -v b="$bps" -v m="$mss" -v p="$pids" \
    'BEGIN{printf "%s %s %s\n", b, (p == "" ? "-" : sprintf("%.3f", (d/tck/dur)/(b/1e9))), m}' >>"$TMP/res.$i"
}

NAMES=() DST=() ARGS=() CPIDS=()
add_variant() { NAMES+=("$1"); DST+=("$2"); ARGS+=("$3"); CPIDS+=("$4"); }

# Every variant is set up first and the runs are interleaved (run 1 of each,
# then run 2 of each, ...): the machine is shared, so load changes hit all
# variants alike. Each variant has its own server address in C.
ip -n $C addr add 10.92.0.3/24 dev b0
ip -n $C addr add 10.92.0.4/24 dev b0

# 1. plain routing A -> B -> C
ip -n $A route add 10.92.0.0/24 via 10.91.0.2
add_variant "plain routing (veth, forwarded by B)" $SERVER "" ""

# 2. mpdetour WireGuard as shipped: internal/tunnel's Server in B and Client
#    in A, each in its own process and namespace (as mpdetour relay / agent);
#    only packets from the tunnel address use the tunnel (policy routing).
wg genkey >"$TMP/tr.key"; wg genkey >"$TMP/tc.key"
ip netns exec $B "$TMP/twbench" relay -key "$(cat "$TMP/tr.key")" -peer "$(wg pubkey <"$TMP/tc.key")" \
  >"$TMP/twr.out" 2>"$TMP/twr.err" &
TWR=$!; PIDS+=($TWR)
for _ in $(seq 50); do grep -q ready "$TMP/twr.out" 2>/dev/null && break; sleep 0.1; done
grep -q ready "$TMP/twr.out" || { cat "$TMP/twr.err" >&2; exit 1; }
TUNPREFIX=$(awk '/^address/{print $2}' "$TMP/twr.out")
TUNADDR=${TUNPREFIX%/*}
BACKEND=$(awk '/^backend/{print $2}' "$TMP/twr.out")
ip netns exec $A "$TMP/twbench" client -key "$(cat "$TMP/tc.key")" -address "$TUNPREFIX" \
  -relay-key "$(awk '/^key/{print $2}' "$TMP/twr.out")" -endpoint 10.91.0.2:51820 >"$TMP/twc.out" 2>"$TMP/twc.err" &
TWC=$!; PIDS+=($TWC)
for _ in $(seq 50); do grep -q ready "$TMP/twc.out" 2>/dev/null && break; sleep 0.1; done
grep -q ready "$TMP/twc.out" || { cat "$TMP/twc.err" >&2; exit 1; }
add_variant "mpdetour WireGuard ($BACKEND, as shipped)" $SERVER "-B $TUNADDR" "$TWC $TWR"

# 3. OpenVPN 2.6, TLS peer-to-peer, default data ciphers (negotiates AES-256-GCM)
for s in a b; do
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -subj "/CN=$s" -keyout "$TMP/$s.key" -out "$TMP/$s.crt" 2>/dev/null
done
fp() { openssl x509 -in "$1" -noout -fingerprint -sha256 | cut -d= -f2; }
ip netns exec $B openvpn --dev ${P}ob --dev-type tun --local 10.91.0.2 --lport 1194 --proto udp \
  --ifconfig 10.93.0.2 10.93.0.1 --tls-server --dh none --cert "$TMP/b.crt" --key "$TMP/b.key" \
  --peer-fingerprint "$(fp "$TMP/a.crt")" --verb 3 >"$TMP/ovpn-b.log" 2>&1 &
OVB=$!; PIDS+=($OVB)
ip netns exec $A openvpn --dev ${P}oa --dev-type tun --remote 10.91.0.2 1194 --proto udp --nobind \
  --ifconfig 10.93.0.1 10.93.0.2 --tls-client --cert "$TMP/a.crt" --key "$TMP/a.key" \
  --peer-fingerprint "$(fp "$TMP/b.crt")" --verb 3 >"$TMP/ovpn-a.log" 2>&1 &
OVA=$!; PIDS+=($OVA)
for _ in $(seq 100); do grep -qs "Initialization Sequence Completed" "$TMP/ovpn-a.log" && break; sleep 0.1; done
grep -qs "Initialization Sequence Completed" "$TMP/ovpn-a.log" || { cat "$TMP/ovpn-a.log" "$TMP/ovpn-b.log" >&2; exit 1; }
CIPHER=$(grep -o "Data Channel: cipher '[^']*'" "$TMP/ovpn-a.log" | head -1 | cut -d"'" -f2 || true)
ip -n $A route add 10.92.0.3/32 dev ${P}oa
add_variant "OpenVPN $(openvpn --version | awk 'NR==1{print $2}') (${CIPHER:-default cipher})" 10.92.0.3 "" "$OVA $OVB"

# 4. Debian wireguard-go binary, configured with wg
wg genkey >"$TMP/wa.key"; wg genkey >"$TMP/wb.key"
ip netns exec $A env WG_PROCESS_FOREGROUND=1 wireguard-go $WGA >"$TMP/wga.log" 2>&1 &
WPA=$!; PIDS+=($WPA)
ip netns exec $B env WG_PROCESS_FOREGROUND=1 wireguard-go $WGB >"$TMP/wgb.log" 2>&1 &
WPB=$!; PIDS+=($WPB)
for _ in $(seq 50); do [ -S /var/run/wireguard/$WGA.sock ] && [ -S /var/run/wireguard/$WGB.sock ] && break; sleep 0.1; done
ip netns exec $B wg set $WGB private-key "$TMP/wb.key" listen-port 51821 \
  peer "$(wg pubkey <"$TMP/wa.key")" allowed-ips 10.94.0.1/32
ip netns exec $A wg set $WGA private-key "$TMP/wa.key" \
  peer "$(wg pubkey <"$TMP/wb.key")" allowed-ips 0.0.0.0/0 endpoint 10.91.0.2:51821
ip -n $A addr add 10.94.0.1/24 dev $WGA; ip -n $A link set $WGA mtu 1420 up
ip -n $B addr add 10.94.0.2/24 dev $WGB; ip -n $B link set $WGB mtu 1420 up
ip -n $A route add 10.92.0.4/32 dev $WGA
add_variant "wireguard-go (Debian $(dpkg-query -W -f='${Version}' wireguard-go 2>/dev/null || echo '?'))" 10.92.0.4 "" "$WPA $WPB"

LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
for r in $(seq "$RUNS"); do
  for i in "${!NAMES[@]}"; do run_once "$i"; done
done
LOAD1=$(cut -d' ' -f1-3 /proc/loadavg)

echo "# bench-tunnel $(date -u +%FT%TZ) kernel $(uname -r), $(nproc) CPUs, ${DURATION}s x $RUNS interleaved, iperf3 -C cubic"
echo "# load average before: $LOAD0, after: $LOAD1 (other jobs share the CPUs; compare rows of one run)"
echo
echo "| path | median Mbit/s | runs Mbit/s | MSS | tunnel CPU, cores per Gbit/s (median) |"
echo "|---|---|---|---|---|"
for i in "${!NAMES[@]}"; do
  f="$TMP/res.$i"
  med=$(sort -g "$f" | awk '{a[NR]=$1} END{printf "%.0f", a[int((NR+1)/2)]/1e6}')
  runs=$(awk '{printf "%s%.0f", (NR>1?", ":""), $1/1e6}' "$f")
  cpu=$(awk '{print $2}' "$f" | sort -g | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}')
  mss=$(awk 'END{print $3}' "$f")
  printf '| %s | %s | %s | %s | %s |\n' "${NAMES[$i]}" "$med" "$runs" "$mss" "$cpu"
done
