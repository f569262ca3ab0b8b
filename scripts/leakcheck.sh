#!/usr/bin/env bash
# Runs a command and reports what it leaked on this machine: network
# namespaces, links and nftables tables of the root namespace, mpdetour
# processes, and the cgroup v2 directories the BPF tests and the lab make
# (mpd-*, mpdetour-lab-*) that were not there before. It compares before and after the
# command (other namespaces on the machine are not this run's business).
# Usage: scripts/leakcheck.sh command [args...]
# LEAKCHECK_TRIES (default 5): how many times, a second apart, it looks
# again before it reports something left.
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
  # Cgroup v2 directories of the BPF tests (mpd-*) and of lab runners
  # (mpdetour-lab-PID), at the mount's root or below this process's own
  # cgroup.
  local root
  # mountinfo: "... mount-point options [optional fields] - fstype ...".
  root=$(awk '{for (i = 7; i < NF; i++) if ($i == "-") {if ($(i + 1) == "cgroup2") {print $5; exit}; break}}' /proc/self/mountinfo 2>/dev/null)
  if [ -n "$root" ]; then
    find "$root" -maxdepth 4 -type d \( -name 'mpd-*' -o -name 'mpdetour-lab-*' \) 2>/dev/null | sed 's/^/cgroup /'
  fi
}

before=$(mktemp) after=$(mktemp)
trap 'rm -f "$before" "$after"' EXIT
snapshot | sort >"$before"
"$@"
rc=$?
# Give processes stopped by the command's cleanup a moment to go away.
for ((try = 1; try <= ${LEAKCHECK_TRIES:-5}; try++)); do
  snapshot | sort >"$after"
  [ -z "$(comm -13 "$before" "$after")" ] && break
  [ "$try" -lt "${LEAKCHECK_TRIES:-5}" ] && sleep 1
done
leaked=$(comm -13 "$before" "$after")
if [ -n "$leaked" ]; then
  echo "leakcheck: this run left behind:" >&2
  sed 's/^/  /' <<<"$leaked" >&2
  [ "$rc" = 0 ] && rc=1
fi
exit "$rc"
