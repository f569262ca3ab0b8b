#!/usr/bin/env bash
# Tunnel detour in the lab (issue 6): brennan2017, core-limited profile.
# The relay side of mpdetour's tunnel runs on the lab's "detour" node, the
# client side on "client" (both from internal/lab/cmd/twbench, i.e. the
# shipped internal/tunnel code). Three measurements, interleaved, median of
# RUNS, iperf3 -C cubic, DURATION s each after OMIT s of ramp-up (iperf3 -O;
# the second subflow starts one handshake later than the first):
#   TCP            client -> server on the default path (L1, L2, L3)
#   TCP via tunnel the same from the tunnel address (L1, L4, L6 to the relay,
#                  then L6, L5, L3 to the server, masqueraded)
#   MPTCP + tunnel mptcpize'd iperf3; a second subflow from the tunnel
#                  address (in-kernel PM subflow endpoint: the data plane the
#                  agent's SUBFLOW_CREATE produces)
#   both           TCP and TCP via tunnel concurrently (sum): what two flows
#                  on these paths get together (they share the access link)
# Target: MPTCP + tunnel >= 0.97 x (TCP + TCP via tunnel).
#
# Usage: scripts/bench-tunnel-lab.sh [-d seconds] [-n runs] [-m tunnel-mtu]   (root)
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=10
OMIT=2 # seconds of slow start left out of every measurement (iperf3 -O)
RUNS=3
MTU=0 # tunnel MTU, 0 = the default 1420
while getopts d:n:m: o; do
  case $o in
    m) MTU=$OPTARG ;;
    d) DURATION=$OPTARG ;;
    n) RUNS=$OPTARG ;;
    *) echo "usage: $0 [-d seconds] [-n runs]" >&2; exit 2 ;;
  esac
done
for t in ip iperf3 mptcpize jq go wg; do
  command -v "$t" >/dev/null || { echo "bench-tunnel-lab: $t not installed (scripts/setup.sh)" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "bench-tunnel-lab: must run as root" >&2; exit 1; }

LAB=twlab$$
TMP=$(mktemp -d)
PIDS=()
cleanup() {
  set +e
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
  "$TMP/mpdetour-lab" down "$LAB" >/dev/null 2>&1
  rm -rf "$TMP"
}
trap cleanup EXIT

go build -o "$TMP/mpdetour-lab" ./cmd/mpdetour-lab
go build -o "$TMP/twbench" ./internal/lab/cmd/twbench
"$TMP/mpdetour-lab" up brennan2017 --name "$LAB" >"$TMP/lab.log" 2>&1 || { cat "$TMP/lab.log" >&2; exit 1; }
ns() { echo "$LAB-$1"; }
SERVER=10.0.3.2  # lab.Addr("server"); .1 is r2

wg genkey >"$TMP/tr.key"; wg genkey >"$TMP/tc.key"
ip netns exec "$(ns detour)" "$TMP/twbench" relay -key "$(cat "$TMP/tr.key")" -peer "$(wg pubkey <"$TMP/tc.key")" \
  -subnet 100.80.0.0/16 -mtu "$MTU" >"$TMP/twr.out" 2>"$TMP/twr.err" &
PIDS+=($!)
for _ in $(seq 50); do grep -q ready "$TMP/twr.out" 2>/dev/null && break; sleep 0.1; done
grep -q ready "$TMP/twr.out" || { cat "$TMP/twr.err" >&2; exit 1; }
TUNPREFIX=$(awk '/^address/{print $2}' "$TMP/twr.out")
TUNADDR=${TUNPREFIX%/*}
ip netns exec "$(ns client)" "$TMP/twbench" client -key "$(cat "$TMP/tc.key")" -address "$TUNPREFIX" \
  -relay-key "$(awk '/^key/{print $2}' "$TMP/twr.out")" -endpoint 10.0.6.2:51820 -mtu "$MTU" >"$TMP/twc.out" 2>"$TMP/twc.err" &
PIDS+=($!)
for _ in $(seq 50); do grep -q ready "$TMP/twc.out" 2>/dev/null && break; sleep 0.1; done
grep -q ready "$TMP/twc.out" || { cat "$TMP/twc.err" >&2; exit 1; }

ip netns exec "$(ns server)" mptcpize run iperf3 -s >/dev/null 2>&1 &
PIDS+=($!)
ip netns exec "$(ns server)" iperf3 -s -p 5202 >/dev/null 2>&1 &
PIDS+=($!)
ip -n "$(ns server)" mptcp limits set subflows 2
ip -n "$(ns client)" mptcp limits set subflows 2
ip -n "$(ns client)" mptcp endpoint add "$TUNADDR" dev mpdtc0 subflow
sleep 0.5

run() { # name, then the command prefix before iperf3 args
  local name=$1; shift
  "$@" -c $SERVER -t "$DURATION" -O "$OMIT" -C cubic -J >"$TMP/run.json" 2>"$TMP/run.err" || { cat "$TMP/run.err" >&2; return 1; }
  jq '.end.sum_received.bits_per_second' "$TMP/run.json" >>"$TMP/res.$name"
}
# both TCP flows at once: what the topology lets two flows on these two
# paths achieve together (they share the client's access link L1)
run_both() {
  ip netns exec "$(ns client)" iperf3 -c $SERVER -t "$DURATION" -O "$OMIT" -C cubic -J >"$TMP/b1.json" &
  local p1=$!
  ip netns exec "$(ns client)" iperf3 -c $SERVER -p 5202 -B "$TUNADDR" -t "$DURATION" -O "$OMIT" -C cubic -J >"$TMP/b2.json"
  wait $p1
  jq -s '.[0].end.sum_received.bits_per_second + .[1].end.sum_received.bits_per_second' "$TMP/b1.json" "$TMP/b2.json" >>"$TMP/res.both"
}
for _ in $(seq "$RUNS"); do
  run tcp ip netns exec "$(ns client)" iperf3
  run tunnel ip netns exec "$(ns client)" iperf3 -B "$TUNADDR"
  run mptcp ip netns exec "$(ns client)" mptcpize run iperf3
  run_both
done
med() { sort -g "$TMP/res.$1" | awk '{a[NR]=$1} END{printf "%.2f", a[int((NR+1)/2)]/1e6}'; }
all() { awk '{printf "%s%.2f", (NR>1?", ":""), $1/1e6}' "$TMP/res.$1"; }
T=$(med tcp) U=$(med tunnel) M=$(med mptcp) B=$(med both)
echo "# bench-tunnel-lab $(date -u +%FT%TZ) tunnel MTU ${MTU/#0/1420}, brennan2017 core-limited, ${DURATION}s (after ${OMIT}s omitted) x $RUNS interleaved, iperf3 -C cubic, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| measurement | median Mbit/s | runs |"
echo "|---|---|---|"
echo "| TCP (default path) | $T | $(all tcp) |"
echo "| TCP via tunnel detour | $U | $(all tunnel) |"
echo "| MPTCP + tunnel detour | $M | $(all mptcp) |"
echo "| TCP and TCP via tunnel at the same time (sum) | $B | $(all both) |"
echo
awk -v t="$T" -v u="$U" -v m="$M" -v b="$B" 'BEGIN{printf "MPTCP + tunnel / (TCP + TCP via tunnel) = %.3f (target >= 0.97); / concurrent sum = %.3f\n", m/(t+u), m/b}'
