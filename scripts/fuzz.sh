#!/usr/bin/env bash
# Runs every Fuzz* target in the module for a bounded time each.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime="${1:-10s}"
found=0
while IFS= read -r file; do
  pkg="./$(dirname "$file")"
  for target in $(grep -oE '^func (Fuzz[A-Za-z0-9_]+)' "$file" | awk '{print $2}'); do
    found=$((found + 1))
    echo "fuzz: $pkg $target ($fuzztime)"
    go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "$pkg"
  done
done < <(grep -rlE '^func Fuzz' --include='*_test.go' . | sort)
echo "fuzz: $found targets"
