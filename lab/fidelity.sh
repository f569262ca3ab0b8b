#!/usr/bin/env bash
# Fidelity benchmark of the lab's link emulation (results: docs/lab.md).
# Builds brennan2017 in several configurations and runs `lab check` on
# each: RTT, TCP goodput and loss of every link direction against spec.
#   lab/fidelity.sh [OUTDIR]     (default /tmp/lab-fidelity; needs root, bin/mpdetour-lab)
set -uo pipefail
cd "$(dirname "$0")/.."
bin="$PWD/bin/mpdetour-lab"
out="${1:-/tmp/lab-fidelity}"
mkdir -p "$out"
name="fid$$"
trap '"$bin" down "$name" 2>/dev/null' EXIT

run() { # label, check flags..., --, up flags...
  local label="$1"; shift
  local checkargs=()
  while [ "$1" != "--" ]; do checkargs+=("$1"); shift; done
  shift
  "$bin" up brennan2017 --name "$name" "$@" >/dev/null || return 1
  echo "== $label (load: $(cut -d' ' -f1-3 /proc/loadavg))"
  "$bin" check "$name" "${checkargs[@]}" --save "$out/$label.json" 2>&1 | tee "$out/$label.txt"
  "$bin" down "$name"
}

run core-limited --duration 10s -- --set profile=core-limited
run core-limited-sequential --duration 10s --sequential -- --set profile=core-limited
run core-limited-all-at-once --duration 10s --all-at-once -- --set profile=core-limited
run symmetric --duration 10s -- --set profile=symmetric
run lossy-1pct --samples 20000 --no-rate -- --set variant=lossy
run delayed-100ms --duration 10s -- --set variant=delayed
run rate-100mbit --duration 10s -- --set all.rate=100mbit
run rate-100mbit-sequential --duration 10s --sequential -- --set all.rate=100mbit
