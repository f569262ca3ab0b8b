#!/usr/bin/env bash
# Builds the Debian packages with dpkg-deb (make package runs this):
#   mpdetour        the product binary (cmd/mpdetour; the lab is not packaged), the agent's unit
#                   and example config; makes the member key on first install
#   mpdetour-relay  the relay's unit, example config and sysctl drop-in
#                   (IPv4 forwarding); makes the relay key on first install
# The example configs are conffiles: dpkg never overwrites one the operator
# changed. Keys are made by the maintainer scripts, mode 0600, never replaced.
#
#   packaging/build-deb.sh OUTDIR            build the binary here (GOARCH picks the architecture)
#   BINARY=path packaging/build-deb.sh OUTDIR  package an existing binary instead
# PKGVERSION overrides the package version (default: from git, see below).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: packaging/build-deb.sh OUTDIR}
command -v dpkg-deb >/dev/null || { echo "build-deb: dpkg-deb not found (apt-get install dpkg-dev, or run scripts/setup.sh)" >&2; exit 1; }

goarch=${GOARCH:-$(go env GOARCH)}
case "$goarch" in
  amd64|arm64|riscv64|loong64|s390x) arch=$goarch ;;
  386) arch=i386 ;;
  arm) arch=armhf ;;
  ppc64le) arch=ppc64el ;;
  *) echo "build-deb: no Debian architecture for GOARCH=$goarch" >&2; exit 1 ;;
esac

# Package version: a release tag vX.Y.Z gives X.Y.Z; otherwise
# 0.0~git<commit time>.<commit> (sorts by commit time, so upgrades between
# snapshots go forward), +dirty when the tree has uncommitted changes.
if [ -z "${PKGVERSION:-}" ]; then
  if tag=$(git describe --tags --exact-match --match 'v[0-9]*' 2>/dev/null) && git diff --quiet HEAD; then
    PKGVERSION=${tag#v}
  elif rev=$(git rev-parse --short=12 HEAD 2>/dev/null); then
    PKGVERSION="0.0~git$(TZ=UTC git log -1 --format=%cd --date=format-local:%Y%m%d%H%M%S).$rev"
    git diff --quiet HEAD 2>/dev/null || PKGVERSION+="+dirty"
  else
    PKGVERSION=0.0~unknown
  fi
fi
binversion=$(git describe --always --dirty 2>/dev/null || echo "$PKGVERSION")

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bin=${BINARY:-}
if [ -z "$bin" ]; then
  bin=$work/bin/mpdetour
  # Static (no cgo): the package depends on nothing, and cross-builds for
  # routers (GOARCH=arm64 or arm) need no C toolchain.
  CGO_ENABLED=0 GOARCH=$goarch go build -trimpath -buildvcs=auto \
    -ldflags "-s -w -X github.com/mpdetour/mpdetour/internal/version.Version=$binversion" \
    -o "$bin" ./cmd/mpdetour
fi

maintainer="mpdetour maintainers <maintainers@users.noreply.github.com>"
homepage="https://github.com/mpdetour/mpdetour"

# unit FILE: the deploy/ unit with the packaged binary's path.
unit() { sed 's|/usr/local/bin/mpdetour|/usr/bin/mpdetour|g' "deploy/$1"; }

postinst() { # postinst NAME: the script with the shared key functions inlined
  sed -e '/^#KEYS#$/{r packaging/deb/keys.sh' -e 'd}' "packaging/deb/$1.postinst.in" > "$work/$1/DEBIAN/postinst"
  chmod 0755 "$work/$1/DEBIAN/postinst"
}

stage() { # stage NAME: an empty package tree
  local d=$work/$1
  mkdir -p "$d/DEBIAN" "$d/lib/systemd/system" "$d/etc/mpdetour" "$d/usr/share/doc/$1"
  chmod 0750 "$d/etc/mpdetour"
  echo "$d"
}

build() { # build NAME: control fields from the environment of the caller
  local d=$work/$1
  (cd "$d" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum) > "$d/DEBIAN/md5sums"
  local size
  size=$(du -sk --exclude=DEBIAN "$d" | cut -f1)
  sed -i "s/^Installed-Size: .*/Installed-Size: $size/" "$d/DEBIAN/control"
  mkdir -p "$out"
  dpkg-deb --root-owner-group -Zxz --build "$d" "$out/${1}_${PKGVERSION}_${arch}.deb" >/dev/null
  echo "$out/${1}_${PKGVERSION}_${arch}.deb"
}

# --- mpdetour: binary, agent ---
d=$(stage mpdetour)
install -D -m 0755 "$bin" "$d/usr/bin/mpdetour"
unit mpdetour-agent.service > "$d/lib/systemd/system/mpdetour-agent.service"
install -m 0640 deploy/agent.yaml "$d/etc/mpdetour/agent.yaml"
install -m 0644 docs/deploy.md README.md "$d/usr/share/doc/mpdetour/"
install -D -m 0644 deploy/grafana-mpdetour.json "$d/usr/share/doc/mpdetour/examples/grafana-mpdetour.json"
install -m 0644 packaging/deb/copyright "$d/usr/share/doc/mpdetour/copyright"
echo /etc/mpdetour/agent.yaml > "$d/DEBIAN/conffiles"
postinst mpdetour
cat > "$d/DEBIAN/control" <<CTRL
Package: mpdetour
Version: $PKGVERSION
Architecture: $arch
Maintainer: $maintainer
Installed-Size: 0
Recommends: nftables, iproute2
Section: net
Priority: optional
Homepage: $homepage
Description: multipath TCP through detour hosts (client agent and tools)
 mpdetour lets any TCP application on a single-homed Linux host use several
 Internet paths at once: it adds MPTCP subflows through detour hosts (one-hop
 relays). This package has the mpdetour command (agent, run, status, doctor,
 relay, bench and collective tools) and the agent's systemd unit. The relay's unit and
 configuration are in mpdetour-relay.
CTRL
build mpdetour

# --- mpdetour-relay: relay unit, config, sysctl ---
d=$(stage mpdetour-relay)
unit mpdetour-relay.service > "$d/lib/systemd/system/mpdetour-relay.service"
install -m 0640 deploy/relay.yaml "$d/etc/mpdetour/relay.yaml"
install -D -m 0644 packaging/deb/60-mpdetour-relay.conf "$d/usr/lib/sysctl.d/60-mpdetour-relay.conf"
install -m 0644 packaging/deb/copyright "$d/usr/share/doc/mpdetour-relay/copyright"
echo /etc/mpdetour/relay.yaml > "$d/DEBIAN/conffiles"
postinst mpdetour-relay
cat > "$d/DEBIAN/control" <<CTRL
Package: mpdetour-relay
Version: $PKGVERSION
Architecture: $arch
Maintainer: $maintainer
Installed-Size: 0
Depends: mpdetour (= $PKGVERSION), procps
Recommends: nftables
Section: net
Priority: optional
Homepage: $homepage
Description: multipath TCP through detour hosts (relay)
 The detour host of mpdetour: authenticated NAT grants on nftables and
 WireGuard tunnel detours for the members it lists. This package has the
 relay's systemd unit, its example configuration and a sysctl drop-in that
 turns on IPv4 forwarding.
CTRL
build mpdetour-relay
