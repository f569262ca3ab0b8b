#!/usr/bin/env bash
# Installs the packages of DIR (make package) into a clean Debian root made
# with mmdebstrap from the host's apt sources, inside fresh network, mount
# and PID namespaces (the relay's sysctl drop-in applies to that network
# namespace only, never to the host), and checks what docs/deploy.md
# promises: binary, units (systemd-analyze verify), configs and keys with
# safe modes; `mpdetour version`, `relay --check`, `agent --check` and
# `doctor`; a second install keeps a changed config and the keys; removal.
#   packaging/test-deb.sh DIR
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(cd "${1:?usage: packaging/test-deb.sh DIR (the .deb files)}" && pwd)
for t in mmdebstrap unshare systemd-analyze; do
  command -v "$t" >/dev/null || { echo "test-deb: $t not installed (run scripts/setup.sh)" >&2; exit 1; }
done
debs=("$dir"/mpdetour_*.deb "$dir"/mpdetour-relay_*.deb)
for f in "${debs[@]}"; do [ -f "$f" ] || { echo "test-deb: no package $f (run make package)" >&2; exit 1; }; done
suite=$(. /etc/os-release && echo "${VERSION_CODENAME:?}")

root=$(mktemp -d /tmp/mpdetour-debroot.XXXXXX)
cleanup() { rm -rf --one-file-system "$root"; }
trap cleanup EXIT INT TERM
t0=$(date +%s)
# --variant=apt: the Essential packages and apt, plus what the packages
# depend on (the checks run without network, so apt cannot fetch it); no
# mirror argument, so the host's apt sources are used.
# mmdebstrap's apt gets only fds 0-2: with other descriptors inherited (four
# open at 6-9, as a flock wrapper around make test leaves them) its download
# step fails ("E: apt download failed") while the same command passes without
# them (found on 2026-11-27).
debroot() {
  (
    for fd in /proc/self/fd/*; do
      fd=${fd##*/}
      if [ "$fd" -gt 2 ] && [ "$fd" != 255 ]; then eval "exec $fd>&-" 2>/dev/null || true; fi
    done
    exec mmdebstrap --mode=root --variant=apt --include=procps --quiet "$suite" "$root"
  ) >"$root.log" 2>&1
}
if ! debroot; then
  cat "$root.log" >&2; rm -f "$root.log"
  echo "test-deb: mmdebstrap $suite failed" >&2; exit 1
fi
rm -f "$root.log"
t1=$(date +%s)
mkdir -p "$root/tmp/debs"
cp "${debs[@]}" "$root/tmp/debs/"

# The checks run inside the root, in one set of fresh namespaces.
cat > "$root/tmp/check.sh" <<'CHECK'
#!/bin/bash
set -euo pipefail
fail() { echo "test-deb: FAIL: $*" >&2; exit 1; }
mode() { stat -c %a "$1"; }
export DEBIAN_FRONTEND=noninteractive
ip_forward() { cat /proc/sys/net/ipv4/ip_forward; }
[ "$(ip_forward)" = 0 ] || fail "a fresh network namespace should start without forwarding"

apt-get install -y -q --no-install-recommends /tmp/debs/*.deb > /tmp/install.log 2>&1 || { cat /tmp/install.log; fail "apt-get install"; }
grep -q "created /etc/mpdetour/relay.key" /tmp/install.log || fail "postinst did not report the relay key"
for f in /usr/bin/mpdetour /lib/systemd/system/mpdetour-agent.service /lib/systemd/system/mpdetour-relay.service \
         /etc/mpdetour/agent.yaml /etc/mpdetour/relay.yaml /usr/lib/sysctl.d/60-mpdetour-relay.conf; do
  [ -f "$f" ] || fail "$f not installed"
done
[ "$(mode /etc/mpdetour)" = 750 ] || fail "/etc/mpdetour has mode $(mode /etc/mpdetour), want 750"
for k in relay member; do
  [ "$(mode /etc/mpdetour/$k.key)" = 600 ] || fail "$k.key has mode $(mode /etc/mpdetour/$k.key), want 600"
  [ "$(stat -c %U /etc/mpdetour/$k.key)" = root ] || fail "$k.key not owned by root"
  [ "$(mpdetour relay pubkey < /etc/mpdetour/$k.key)" = "$(cat /etc/mpdetour/$k.pub)" ] || fail "$k.pub is not $k.key's public key"
done
[ "$(ip_forward)" = 1 ] || fail "the sysctl drop-in was not applied (ip_forward $(ip_forward))"
mpdetour version | tee /tmp/version
grep -Eq '^mpdetour [^ ]+ \(.*go1' /tmp/version || fail "mpdetour version printed $(cat /tmp/version)"
grep -q '^mpdetour dev ' /tmp/version && fail "the packaged binary is not stamped"

# The example configs need the operator's values: fill them in as
# docs/deploy.md says, then the daemons' checks pass.
sed -i "s|MEMBER_PUBLIC_KEY|$(cat /etc/mpdetour/member.pub)|" /etc/mpdetour/relay.yaml
sed -i -e "s|RELAY_ADDRESS|192.0.2.2|" -e "s|RELAY_PUBLIC_KEY|$(cat /etc/mpdetour/relay.pub)|" /etc/mpdetour/agent.yaml
echo "# local change kept across reinstalls" >> /etc/mpdetour/relay.yaml
mpdetour relay --check --config /etc/mpdetour/relay.yaml || fail "relay --check"
mpdetour agent --check --config /etc/mpdetour/agent.yaml || fail "agent --check"
# A key others can read is refused by the daemons' checks, naming the chmod.
chmod 0644 /etc/mpdetour/relay.key
if mpdetour relay --check --config /etc/mpdetour/relay.yaml 2>/tmp/err; then fail "relay --check accepted a 0644 key"; fi
grep -q "chmod 600 /etc/mpdetour/relay.key" /tmp/err || fail "0644 key: $(cat /tmp/err)"
chmod 0600 /etc/mpdetour/relay.key
# doctor: the kernel and relay checks of this (namespaced) host; exit 1
# means a check failed, which it must say.
rc=0; mpdetour doctor --relay-config /etc/mpdetour/relay.yaml > /tmp/doctor 2>&1 || rc=$?
cat /tmp/doctor
[ "$rc" -le 1 ] || fail "doctor exited $rc"
grep -q "relay.*config.*is valid" /tmp/doctor || fail "doctor did not validate the relay config"
grep -q "forwarding" /tmp/doctor || fail "doctor did not check forwarding"

# Second install (same version, then as an upgrade would): the changed
# config and the keys stay.
keys_before=$(cat /etc/mpdetour/relay.pub /etc/mpdetour/member.pub)
cp /etc/mpdetour/relay.yaml /tmp/relay.yaml.changed
apt-get install -y -q --reinstall --no-install-recommends /tmp/debs/*.deb > /tmp/reinstall.log 2>&1 || { cat /tmp/reinstall.log; fail "reinstall"; }
dpkg -i /tmp/debs/*.deb > /tmp/dpkg.log 2>&1 </dev/null || { cat /tmp/dpkg.log; fail "dpkg -i"; }
cmp -s /etc/mpdetour/relay.yaml /tmp/relay.yaml.changed || fail "reinstall changed the edited relay.yaml"
[ "$keys_before" = "$(cat /etc/mpdetour/relay.pub /etc/mpdetour/member.pub)" ] || fail "reinstall replaced a key"
grep -q "created /etc/mpdetour" /tmp/reinstall.log /tmp/dpkg.log && fail "reinstall created a key"
mpdetour relay --check --config /etc/mpdetour/relay.yaml || fail "relay --check after reinstall"

# Removal takes the program away and leaves config and keys (purge takes
# the conffiles).
apt-get remove -y -q mpdetour-relay mpdetour > /tmp/remove.log 2>&1 || { cat /tmp/remove.log; fail "remove"; }
[ ! -e /usr/bin/mpdetour ] || fail "remove left /usr/bin/mpdetour"
[ -f /etc/mpdetour/relay.yaml ] && [ -f /etc/mpdetour/relay.key ] || fail "remove took config or keys"
echo "test-deb: checks inside the root passed"
CHECK
chmod +x "$root/tmp/check.sh"
unshare --net --mount --pid --fork --mount-proc="$root/proc" chroot "$root" /tmp/check.sh
t2=$(date +%s)

# The units as installed, against the installed binary (root= so that
# ExecStart's /usr/bin/mpdetour is the packaged one).
mkdir -p "$root/tmp/units"
ar p "${debs[0]}" data.tar.xz | tar -xJ -C "$root/tmp/units" ./lib/systemd/system ./usr/bin/mpdetour
ar p "${debs[1]}" data.tar.xz | tar -xJ -C "$root/tmp/units" ./lib/systemd/system
for u in mpdetour-agent.service mpdetour-relay.service; do
  f=$root/tmp/units/lib/systemd/system/$u
  sed -i "s|/usr/bin/mpdetour|$root/tmp/units/usr/bin/mpdetour|g" "$f"
  out=$(systemd-analyze verify "$f" 2>&1) || { echo "$out" >&2; echo "test-deb: FAIL: systemd-analyze verify $u" >&2; exit 1; }
  [ -z "$out" ] || { echo "$out" >&2; echo "test-deb: FAIL: systemd-analyze verify $u warns" >&2; exit 1; }
done
echo "test-deb: ok (root $((t1 - t0)) s, install and checks $((t2 - t1)) s, units verified)"
