#!/usr/bin/env bash
# Runs a command and reports what it leaked on this machine: network
# namespaces, links and nftables tables of the root namespace, mpdetour
# processes, the cgroup v2 directories the BPF tests, the lab, doctor and
# the deploy recipe make (mpd-*, mpdetour-lab-*, mpdetour-probe-*,
# mpdetour-deploy-*) and sock_ops programs attached at the cgroup v2 root
# that were not there before. It compares before and after the
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
    find "$root" -maxdepth 4 -type d \( -name 'mpd-*' -o -name 'mpdetour-lab-*' -o -name 'mpdetour-probe-*' -o -name 'mpdetour-deploy-*' \) 2>/dev/null | sed 's/^/cgroup /'
    # sock_ops programs attached at the cgroup v2 root (the agent's
    # default without bpf_cgroup: every namespace's sockets); tests and
    # labs must attach to cgroups of their own. No bpftool here: the
    # bpf(BPF_PROG_QUERY) syscall through python3's ctypes.
    python3 - "$root" <<'PY' 2>/dev/null
import ctypes, os, platform, struct, sys
nr = {"x86_64": 321, "aarch64": 280}.get(platform.machine())
if nr is None:
    sys.exit(0)
libc = ctypes.CDLL(None, use_errno=True)
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
ids = (ctypes.c_uint32 * 64)()
# union bpf_attr, query: target_fd, attach_type (BPF_CGROUP_SOCK_OPS = 3),
# query_flags, attach_flags, prog_ids (u64), prog_cnt.
attr = ctypes.create_string_buffer(struct.pack("=IIIIQI", fd, 3, 0, 0, ctypes.addressof(ids), 64), 120)
if libc.syscall(nr, 16, attr, 120) != 0:
    sys.exit(0)
for i in range(min(struct.unpack_from("=I", attr.raw, 24)[0], 64)):
    print("sock_ops program id %d attached at the cgroup v2 root %s" % (ids[i], sys.argv[1]))
PY
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
