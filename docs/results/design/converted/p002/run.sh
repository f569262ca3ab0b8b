#!/bin/bash
B=/work/runs/bin/conv-design-mpdetour
cd /tmp/cvd/p002
while [ -e /work/runs/ci-running ]; do sleep 10; done
sample() { # $1 = namespace suffix, $2 = file
  while :; do
    if ip netns list | grep -q "^cvdp-$1"; then
      { echo "=== $(date -u +%T.%N)"; ip netns exec cvdp-$1 ss -Mmi 2>/dev/null; ip netns exec cvdp-$1 ss -tmi state established 2>/dev/null; } >> $2
    fi
    sleep 0.5
  done
}
echo "native start $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)"
sample server ss-native-server.txt & S=$!
timeout -s INT 200 $B lab bench /tmp/cvd/p002/native.yaml --out /tmp/cvd/p002/native --name cvdp > native.log 2>&1
kill $S
echo "converted start $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)"
sample r2 ss-converted-r2.txt & S=$!
timeout -s INT 260 $B lab bench /tmp/cvd/p002/converted.yaml --out /tmp/cvd/p002/converted --name cvdp > converted.log 2>&1
kill $S
echo "end $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)"
