#!/usr/bin/env bash
# Follows docs/deploy.md on three network namespaces standing in for the
# server, the relay and the client: every ```sh host=...``` block of the page
# runs, in page order, in its host's namespace. Only these directories are
# moved into a per-host scratch root: /etc/mpdetour, /etc/systemd/system,
# /etc/sysctl.d, /var/log/mpdetour, /run/mpdetour, /usr/local/bin (also inside
# the copies of deploy/ the blocks use); `systemctl enable --now UNIT` runs the
# unit file's ExecStartPre= and ExecStart= lines (no systemd in a namespace).
# Public keys the page says to hand over (member.pub, relay.pub) are copied
# between the hosts' /etc/mpdetour after each block.
#
# It checks at the end that an MPTCP transfer from the client got a subflow
# through the relay (NAT detour) and one through its WireGuard tunnel, then
# walks the missteps (a wrong relay key, an unreachable relay, a revoked
# member) and checks what the client says about each; it removes everything
# it created on exit (also on failure and Ctrl-C).
#
# Usage: scripts/deploy-recipe.sh [MPDETOUR_BINARY]   (root; default bin/mpdetour)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(realpath "${1:-bin/mpdetour}")
[ -x "$bin" ] || { echo "deploy-recipe: $bin is not an executable (make build)" >&2; exit 1; }
doc=docs/deploy.md
tag="dr$$"
ns_server="$tag-server" ns_relay="$tag-relay" ns_client="$tag-client"
work=$(mktemp -d /tmp/mpdetour-deploy.XXXXXX)

# The agent's BPF program (subflow_lowat, on by default) attaches to the
# cgroup v2 root unless bpf_cgroup names another: the client's config names
# a cgroup of this run's own (holding this script and so the daemons and
# transfers it starts), so that it could never reach the other sockets of
# the machine (other labs share these addresses). The blocks run under
# `ip netns exec`, which remounts /sys without the cgroup mount, so the
# agent does not see that directory: it takes the documented fallback (one
# warning, the limit off) and this recipe does not exercise the program
# (cmd/mpdetour TestDeployUnitCapabilities does). Removed at exit.
cgroot=$(findmnt -n -t cgroup2 -o TARGET | head -n 1)
[ -n "$cgroot" ] || { echo "deploy-recipe: no cgroup v2 mount" >&2; exit 1; }
cgback="$cgroot$(sed -n 's/^0:://p' /proc/self/cgroup)"
cg="$cgroot/mpdetour-deploy-$$"

cleanup() {
  local rc=$?
  for h in client relay server; do
    for pidf in "$work/$h"/*.pid; do
      [ -e "$pidf" ] || continue
      kill -TERM "$(cat "$pidf")" 2>/dev/null || true
    done
  done
  # The daemons remove their nftables tables and restore sysctls on SIGTERM.
  for _ in $(seq 50); do
    alive=0
    for pidf in "$work"/*/*.pid; do
      [ -e "$pidf" ] && kill -0 "$(cat "$pidf")" 2>/dev/null && alive=1
    done
    [ $alive = 0 ] && break
    sleep 0.1
  done
  for n in "$ns_server" "$ns_relay" "$ns_client"; do
    ip netns pids "$n" 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true
    ip netns del "$n" 2>/dev/null || true
  done
  if [ "$rc" != 0 ]; then
    echo "deploy-recipe: FAILED (rc $rc); daemon logs:" >&2
    for f in "$work"/*/*.log; do
      [ -e "$f" ] && { echo "--- $f" >&2; tail -n 20 "$f" >&2; }
    done
  fi
  rm -rf "$work"
  if [ -d "$cg" ]; then
    # Move this shell out, then end whatever is left inside (a process
    # killed above is still a member until it has exited: rmdir right away
    # can fail with EBUSY, which left this cgroup behind in CI once) and
    # wait until the cgroup is empty before removing it.
    echo $$ >"$cgback/cgroup.procs" 2>/dev/null || true
    if [ -e "$cg/cgroup.kill" ]; then
      echo 1 >"$cg/cgroup.kill" 2>/dev/null || true
    else
      xargs -r kill -KILL <"$cg/cgroup.procs" 2>/dev/null || true
    fi
    for _ in $(seq 100); do
      rmdir "$cg" 2>/dev/null && break
      sleep 0.1
    done
    if [ -d "$cg" ]; then
      echo "deploy-recipe: cgroup $cg not removed after 10 s (still: $(tr '\n' ' ' <"$cg/cgroup.procs" 2>/dev/null))" >&2
      [ "$rc" != 0 ] || rc=1
    fi
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir "$cg"
echo $$ >"$cg/cgroup.procs"

# Hosts: client -- server directly (default path), client -- relay -- server.
for n in "$ns_server" "$ns_relay" "$ns_client"; do
  ip netns add "$n"
  ip -n "$n" link set lo up
done
link() { # ns1 if1 addr1 ns2 if2 addr2
  ip link add "$tag-a" type veth peer name "$tag-b"
  ip link set "$tag-a" netns "$1" name "$2"
  ip link set "$tag-b" netns "$4" name "$5"
  ip -n "$1" addr add "$3" dev "$2"
  ip -n "$4" addr add "$6" dev "$5"
  ip -n "$1" link set "$2" up
  ip -n "$4" link set "$5" up
}
# Documentation addresses (RFC 5737) as in docs/deploy.md; they never leave
# these namespaces.
link "$ns_client" eth0 203.0.113.1/24 "$ns_server" eth0 203.0.113.10/24
link "$ns_client" eth1 192.0.2.1/24 "$ns_relay" eth0 192.0.2.2/24
link "$ns_relay" eth1 198.51.100.2/24 "$ns_server" eth1 198.51.100.10/24
# The relay forwards to the server's service address over its own link.
ip -n "$ns_relay" route add 203.0.113.0/24 via 198.51.100.10

for h in server relay client; do
  r="$work/$h"
  mkdir -p "$r/etc/mpdetour" "$r/etc/systemd/system" "$r/etc/sysctl.d" "$r/var/log/mpdetour" "$r/var/lib/mpdetour" "$r/run/mpdetour" "$r/usr/local/bin"
done

# rewrite moves the host directories of text on stdin into host $1's root.
rewrite() {
  local r="$work/$1"
  sed -e "s|/etc/mpdetour|$r/etc/mpdetour|g" \
      -e "s|/etc/systemd/system|$r/etc/systemd/system|g" \
      -e "s|/etc/sysctl.d|$r/etc/sysctl.d|g" \
      -e "s|/var/log/mpdetour|$r/var/log/mpdetour|g" \
      -e "s|/var/lib/mpdetour|$r/var/lib/mpdetour|g" \
      -e "s|/run/mpdetour|$r/run/mpdetour|g" \
      -e "s|/usr/local/bin/mpdetour|$r/usr/local/bin/mpdetour|g" \
      -e "s|0755 bin/mpdetour|0755 $bin|g" \
      -e "s|\bdeploy/|$r/deploy/|g"
}
for h in server relay client; do
  mkdir -p "$work/$h/deploy"
  for f in deploy/*; do rewrite "$h" <"$f" >"$work/$h/deploy/$(basename "$f")"; done
done
# The client's example config with this run's cgroup (above), first: the
# missteps below append relays to the servers list at its end.
sed -i "1i bpf_cgroup: $cg" "$work/client/deploy/agent.yaml"

# The prelude every block runs with: systemctl for unit files.
prelude() {
  local r="$work/$1"
  cat <<EOF
set -euo pipefail
systemctl() {
  case "\$1" in
  daemon-reload) return 0 ;;
  enable) shift; [ "\$1" = --now ] && shift; start_unit "\$1" ;;
  *) echo "systemctl \$*: not emulated by deploy-recipe.sh" >&2; return 1 ;;
  esac
}
start_unit() {
  local unit="$r/etc/systemd/system/\$1.service" line
  [ -f "\$unit" ] || { echo "no unit \$unit" >&2; return 1; }
  while IFS= read -r line; do
    case "\$line" in
    ExecStartPre=*) eval "\${line#ExecStartPre=}" ;;
    ExecStart=*)
      eval "\${line#ExecStart=}" >"$r/\$1.log" 2>&1 &
      echo \$! >"$r/\$1.pid"
      sleep 1
      kill -0 \$! || { echo "\$1 exited at start:" >&2; cat "$r/\$1.log" >&2; return 1; } ;;
    esac
  done <"\$unit"
}
EOF
}

# Blocks in page order: "hosts<TAB>line number" then the body, NUL-separated.
blocks=$(awk '
  /^```sh host=/ { hosts = substr($2, 6); start = NR; body = ""; inb = 1; next }
  /^```/ && inb { printf "%s\t%d\n%s%c", hosts, start, body, 0; inb = 0; next }
  inb { body = body $0 "\n" }
' "$doc" | tr '\0' '\036')
n=0
while IFS= read -r -d $'\036' block; do
  header=${block%%$'\n'*}
  body=${block#*$'\n'}
  hosts=${header%%$'\t'*} line=${header##*$'\t'}
  for h in ${hosts//,/ }; do
    n=$((n + 1))
    ns_var="ns_$h"
    echo "deploy-recipe: $doc:$line on $h"
    script="$work/$h/block$n.sh"
    { prelude "$h"; rewrite "$h" <<<"$body"; } >"$script"
    if ! ip netns exec "${!ns_var}" bash "$script"; then
      echo "deploy-recipe: the block at $doc:$line failed on $h" >&2
      exit 1
    fi
    # Hand over public keys as the page says.
    for f in "$work"/*/etc/mpdetour/*.pub; do
      [ -e "$f" ] || continue
      for o in server relay client; do cp -n "$f" "$work/$o/etc/mpdetour/" 2>/dev/null || true; done
    done
    # Stash the pids of background services started outside units too.
  done
done <<<"$blocks"
[ "$n" -ge 7 ] || { echo "deploy-recipe: only $n blocks found in $doc" >&2; exit 1; }

# The result: an MPTCP transfer with a subflow through the relay.
send="$work/client/run/mpdetour/send.json"
python3 - "$send" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
subs = r.get("subflows") or []
via = [s for s in subs if s["remote"].startswith("192.0.2.2:")]
# The tunnel detour: from the tunnel's address (the relay's default subnet
# 100.80.0.0/16) straight to the server.
tun = [s for s in subs if s["local"].startswith("100.80.")]
print(f"deploy-recipe: mptcp={r['mptcp']} goodput={r['goodput_mbps']:.1f} Mbit/s subflows={len(subs)} via relay={len(via)} via tunnel={len(tun)}")
if not r["mptcp"] or not via:
    sys.exit("deploy-recipe: no subflow through the relay")
if not tun:
    sys.exit("deploy-recipe: no subflow through the tunnel")
EOF

# Missteps, as the client sees them (docs/deploy.md, "When it does not work").
# The agent is restarted with the recipe's relay and two mistaken ones: a
# wrong relay public key and a relay address where nothing listens; then the
# relay drops the member from its config (SIGHUP): revoked.
c="$work/client" rl="$work/relay"
sock="$c/run/mpdetour/agent.sock"
# daemon_pids NS: the mpdetour processes in a namespace (the units' pid
# files name the shells that started them).
daemon_pids() {
  local p
  for p in $(ip netns pids "$1"); do
    [ "$(cat "/proc/$p/comm" 2>/dev/null)" = mpdetour ] && echo "$p"
  done
  return 0
}
pids=$(daemon_pids "$ns_client")
[ -n "$pids" ] || { echo "deploy-recipe: no agent runs on the client" >&2; exit 1; }
kill -TERM $pids
for _ in $(seq 100); do [ -z "$(daemon_pids "$ns_client")" ] && break; sleep 0.1; done
[ -z "$(daemon_pids "$ns_client")" ] || { echo "deploy-recipe: the agent did not stop" >&2; exit 1; }
wrongkey=$("$bin" relay genkey | "$bin" relay pubkey)
relaypub=$(cat "$c/etc/mpdetour/relay.pub")
printf '%s\n' "    - {name: wrongkey, address: 192.0.2.2:45673, public_key: $wrongkey}" \
  "    - {name: unreachable, address: 192.0.2.2:45999, public_key: $relaypub}" \
  "relay_ping: 1s" >>"$c/etc/mpdetour/agent.yaml"
{ prelude client; echo "systemctl enable --now mpdetour-agent"; } >"$c/missteps.sh"
ip netns exec "$ns_client" bash "$c/missteps.sh"
# The relays' states in `status --json` (NAME=STATE[:words of its detail]).
cat >"$work/states.py" <<'PY'
import json, sys
st = json.load(sys.stdin)
rel = {r["name"]: r for r in st.get("relays") or []}
ok = True
for want in sys.argv[1:]:
    name, _, rest = want.partition("=")
    state, _, words = rest.partition(":")
    r = rel.get(name, {})
    ok = ok and r.get("state") == state and words in r.get("detail", "")
print(("ok " if ok else "not yet ") + "; ".join("%s=%s (%s)" % (n, r.get("state"), r.get("detail", "")) for n, r in rel.items()))
PY
# expect waits up to 20 s for the states it is given.
expect() {
  local deadline=$((SECONDS + 20)) got
  while :; do
    got=$(ip netns exec "$ns_client" "$bin" status --json --socket "$sock" 2>/dev/null | python3 "$work/states.py" "$@") || got="not yet: no status"
    case "$got" in ok*) echo "deploy-recipe: client says: ${got#ok }"; return 0 ;; esac
    if [ $SECONDS -ge $deadline ]; then
      echo "deploy-recipe: want $*, status says: $got" >&2
      return 1
    fi
    sleep 0.3
  done
}
expect "relay1=ok" "wrongkey=no-answer:public_key" "unreachable=no-answer:UDP port"
# The relay operator removes the member (another one stays) and reloads.
other=$("$bin" relay genkey | "$bin" relay pubkey)
sed -i "s|name: alice, public_key: [^}]*|name: carol, public_key: $other|" "$rl/etc/mpdetour/relay.yaml"
grep -q "name: carol" "$rl/etc/mpdetour/relay.yaml" || { echo "deploy-recipe: no member entry to change in relay.yaml" >&2; exit 1; }
kill -HUP $(daemon_pids "$ns_relay")
expect "relay1=revoked"
for want in "relay trouble" "state=no-answer" "state=revoked"; do
  grep -q -- "$want" "$c/mpdetour-agent.log" || { echo "deploy-recipe: the agent log lacks \"$want\"" >&2; exit 1; }
done
echo "deploy-recipe: ok"
