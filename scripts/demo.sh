#!/usr/bin/env bash
# The main job: an emulated network with detours, showing the throughput gain.
set -euo pipefail
cd "$(dirname "$0")/.."
exec bin/mpdetour lab demo
