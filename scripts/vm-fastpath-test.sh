#!/usr/bin/env bash
# Runs the relay's fast-path tests (or any relay test/benchmark) inside a VM
# booting Debian's kernel, which has nf_flow_table (this machine's kernel
# does not, so the flowtable offload cannot be exercised on it). The VM's
# root file system is this machine's / over virtio-9p, read-only, so the
# test binary, ip, nft and iperf3 are the host's. KVM does not boot here
# (nested virtualisation), so the VM runs under TCG: fine for behaviour,
# meaningless for speed.
#
# Needs (root): apt-get install qemu-system-x86 linux-image-amd64 initramfs-tools
# The script adds an initramfs "boot=ninep" script and the 9p modules to
# /etc/initramfs-tools and regenerates the Debian kernel's initrd once.
#
# Usage: scripts/vm-fastpath-test.sh [go test flags for the relay test binary]
#   default: -test.v -test.count=1 -test.run 'TestNFTFastPath|TestRelayFastPathAttribution'
#   MPDETOUR_BENCH_* variables (MPDETOUR_BENCH_ROUNDS, ...) are passed into the VM, e.g.
#   MPDETOUR_BENCH_ROUNDS=5 scripts/vm-fastpath-test.sh -test.run '^$' -test.bench RelayFastPath -test.benchtime 1x -test.v
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "vm-fastpath-test: must run as root" >&2; exit 1; }
command -v qemu-system-x86_64 >/dev/null || { echo "vm-fastpath-test: apt-get install qemu-system-x86 linux-image-amd64 initramfs-tools" >&2; exit 1; }
KVER=$(ls /boot/vmlinuz-*-amd64 2>/dev/null | sed 's|/boot/vmlinuz-||' | sort -V | tail -1)
[ -n "$KVER" ] || { echo "vm-fastpath-test: no Debian kernel in /boot (apt-get install linux-image-amd64)" >&2; exit 1; }
grep -q '^CONFIG_NF_FLOW_TABLE=[my]' "/boot/config-$KVER" || { echo "vm-fastpath-test: $KVER has no nf_flow_table" >&2; exit 1; }

if [ ! -f /etc/initramfs-tools/scripts/ninep ]; then
  mkdir -p /etc/initramfs-tools/scripts
  cat >/etc/initramfs-tools/scripts/ninep <<'EOS'
# boot=ninep: mount the host's / over virtio-9p (mount tag "host"), read-only.
mountroot()
{
	modprobe virtio_pci
	modprobe 9pnet_virtio
	modprobe 9p
	mount -t 9p -o ro,trans=virtio,version=9p2000.L,msize=262144 host "${rootmnt}" || panic "9p mount failed"
}
EOS
  printf "virtio_pci\n9p\n9pnet_virtio\nnetfs\n" >>/etc/initramfs-tools/modules
  update-initramfs -u -k "$KVER"
fi

# The VM sees the host's / read-only: the binary and the init script live
# in a directory of the host that is not covered by the VM's tmpfs mounts.
DIR=$(mktemp -d /var/tmp/vmfp.XXXXXX)
trap 'rm -rf "$DIR"' EXIT
CGO_ENABLED=0 go test -c -o "$DIR/relay.test" ./internal/relay
ARGS=("$@")
[ ${#ARGS[@]} -gt 0 ] || ARGS=(-test.v -test.count=1 -test.run 'TestNFTFastPath|TestRelayFastPathAttribution')
{
  echo '#!/bin/sh'
  echo 'export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/tmp'
  for v in $(compgen -e | grep '^MPDETOUR_BENCH_' || true); do printf 'export %s=%q\n' "$v" "${!v}"; done
  echo 'mount -t proc proc /proc; mount -t sysfs sys /sys 2>/dev/null'
  echo 'mount -t tmpfs tmpfs /run; mount -t tmpfs tmpfs /tmp; mkdir -p /run/netns'
  # Load the modules the tests need up front: loading them on first use over
  # 9p under TCG takes longer than a relay subprocess is given to start.
  echo 'modprobe -a veth nf_tables nf_conntrack nf_nat nft_ct nft_nat nft_masq nft_fib_ipv4 nft_chain_nat nf_flow_table nf_flow_table_inet nft_flow_offload 2>/dev/null'
  echo 'ip link set lo up; echo "VM kernel: $(uname -r)"; cd /tmp'
  printf '%q ' "$DIR/relay.test" "${ARGS[@]}"; echo '2>&1'
  echo 'echo "VM test exit: $?"; poweroff -f'
} >"$DIR/init.sh"
chmod +x "$DIR/init.sh"
qemu-system-x86_64 -accel tcg,thread=multi -cpu max -m 2G -smp 2 -nographic -no-reboot \
  -kernel "/boot/vmlinuz-$KVER" -initrd "/boot/initrd.img-$KVER" \
  -append "console=ttyS0 boot=ninep ro init=$DIR/init.sh panic=-1 edd=off quiet" \
  -fsdev local,id=root,path=/,security_model=none,readonly=on -device virtio-9p-pci,fsdev=root,mount_tag=host \
  2>&1 | tr -d '\r' | sed -n '/VM kernel/,/VM test exit/p' | grep -v ADDRCONF
