#!/usr/bin/env bash
# Idempotently installs what mpdetour needs on a Debian machine and checks the
# kernel's prerequisites. Prints one clear line for everything missing.
#   scripts/setup.sh          install + check
#   scripts/setup.sh --check  check only (no installs)
set -euo pipefail
cd "$(dirname "$0")/.."

check_only=false
[ "${1:-}" = "--check" ] && check_only=true

# Debian packages and the command each provides (package:command).
packages=(
  iproute2:ip nftables:nft iptables:iptables iperf3:iperf3 wireguard-tools:wg
  wireguard-go:wireguard-go openvpn:openvpn mptcpd:mptcpize tcpdump:tcpdump
  ethtool:ethtool procps:pgrep psmisc:killall curl:curl mptcpize:mptcpize python3:python3
  jq:jq openssl:openssl git:git
  # packages (make package-test) and the unit files' check (TestDeployUnits)
  mmdebstrap:mmdebstrap systemd:systemd-analyze
)
STATICCHECK_VERSION=v0.8.2 # staticcheck 2026.2.2, supports the Go release in go.mod

need=()
for pc in "${packages[@]}"; do
  command -v "${pc#*:}" >/dev/null 2>&1 || need+=("${pc%%:*}")
done
if [ ${#need[@]} -gt 0 ]; then
  if $check_only; then
    echo "missing packages: ${need[*]} (run scripts/setup.sh)" >&2
  elif [ "$(id -u)" -ne 0 ]; then
    echo "missing packages: ${need[*]}; run this script as root to install them" >&2
    exit 1
  else
    echo "setup: installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
fi

if ! command -v go >/dev/null 2>&1; then
  echo "go is not installed: mpdetour needs the Go toolchain named in go.mod" >&2
  exit 1
fi
gobin="$(go env GOPATH)/bin"
if ! $check_only; then
  go mod download
  if ! "$gobin/staticcheck" -version 2>/dev/null | grep -q "(${STATICCHECK_VERSION#v})"; then
    echo "setup: installing staticcheck $STATICCHECK_VERSION"
    go install "honnef.co/go/tools/cmd/staticcheck@$STATICCHECK_VERSION"
  fi
fi

# Kernel prerequisites: report every missing one, then fail.
fail=0
problem() { echo "kernel prerequisite missing: $*" >&2; fail=1; }
[ -e /proc/self/ns/net ] || problem "network namespaces (CONFIG_NET_NS)"
if [ "$(cat /proc/sys/net/mptcp/enabled 2>/dev/null)" != "1" ]; then
  problem "MPTCP (net.mptcp.enabled must be 1; CONFIG_MPTCP)"
fi
if [ "$(id -u)" -eq 0 ]; then
  ns="mpdetour-setup-$$"
  if ip netns add "$ns" 2>/dev/null; then
    ip netns exec "$ns" nft add table inet mpdetour_probe 2>/dev/null || problem "nftables (CONFIG_NF_TABLES)"
    ip netns exec "$ns" sysctl -qw net.mptcp.pm_type=1 2>/dev/null || problem "MPTCP userspace path manager (net.mptcp.pm_type, Linux 5.19+)"
    ip -n "$ns" link add mpdt0 type veth peer name mpdt1 2>/dev/null || problem "veth (CONFIG_VETH)"
    ip -n "$ns" link set mpdt0 up 2>/dev/null
    ip netns exec "$ns" tc qdisc add dev mpdt0 root tbf rate 10mbit burst 32k latency 50ms 2>/dev/null || problem "tbf qdisc (CONFIG_NET_SCH_TBF)"
    ip netns del "$ns"
  else
    problem "cannot create network namespaces"
  fi
fi
[ "$fail" -eq 0 ] || exit 1
echo "setup: ok"
