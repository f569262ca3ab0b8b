#!/usr/bin/env bash
# Runs a command and reports what it leaked on this machine: network
# namespaces, links and nftables tables of the root namespace, and mpdetour
# processes that were not there before. It compares before and after the
# command (other namespaces on the machine are not this run's business).
# Usage: scripts/leakcheck.sh command [args...]
set -uo pipefail

snapshot() {
  ip netns list 2>/dev/null | awk '{print "netns " $1}'
  ip -o link show 2>/dev/null | awk -F': ' '{sub(/@.*/, "", $2); print "link " $2}'
  nft list tables 2>/dev/null | sed 's/^table /nft /'
  pgrep -x mpdetour 2>/dev/null | sed 's/^/process mpdetour pid /'
  pgrep -x mpdetour-lab 2>/dev/null | sed 's/^/process mpdetour-lab pid /'
  # The lab's helpers are re-executions of mpdetour-lab named by argv[0]
  # (delay line, namespace shim); their process name is "exe".
  pgrep -f '^mpdetour-lab-' 2>/dev/null | sed 's/^/process mpdetour-lab helper pid /'
}

before=$(mktemp) after=$(mktemp)
trap 'rm -f "$before" "$after"' EXIT
snapshot | sort >"$before"
"$@"
rc=$?
# Give processes stopped by the command's cleanup a moment to go away.
for _ in 1 2 3 4 5; do
  snapshot | sort >"$after"
  [ -z "$(comm -13 "$before" "$after")" ] && break
  sleep 1
done
leaked=$(comm -13 "$before" "$after")
if [ -n "$leaked" ]; then
  echo "leakcheck: this run left behind:" >&2
  sed 's/^/  /' <<<"$leaked" >&2
  [ "$rc" = 0 ] && rc=1
fi
exit "$rc"
