#!/usr/bin/env bash
# The main job: build the reference topology (brennan2017, core-limited:
# two disjoint 10 Mbit/s core paths) in network namespaces, start a relay on
# the detour host and the agent on the client, and measure plain TCP
# against MPTCP with a NAT detour and with a WireGuard tunnel detour (3
# short trials each, cubic). Prints a table, writes a plot, and tears
# everything down, also on Ctrl-C or failure. Scenario: lab/scenarios/demo.yaml.
set -euo pipefail
cd "$(dirname "$0")/.."
# The lab binary runs the measurement and starts bin/mpdetour (the product)
# in the lab nodes.
lab="$PWD/bin/mpdetour-lab"
{ [ -x "$lab" ] && [ -x "$PWD/bin/mpdetour" ]; } || make build
out="${DEMO_OUT:-$PWD/bench-results/demo}"
name="demo$$"
log="$(mktemp)"
cleanup() {
  rm -f "$log"
  # The runner takes its lab down itself; this covers a kill -9 of it.
  "$lab" down "$name" >/dev/null 2>&1 || true
}
trap cleanup EXIT
rm -rf "$out"

"$lab" bench demo --name "$name" --out "$out" | tee "$log"
echo
echo "report: $out/report.md"
echo "plot:   $out/plot-core-limited.png (and .svg)"
if line="$(grep '^aggregation: MPTCP+NAT detour' "$log" | tail -n 1)" && [ -n "$line" ]; then
  echo "$line"
else
  echo "aggregation: MPTCP+NAT detour not measured (see $out/report.md)"
  exit 1
fi
