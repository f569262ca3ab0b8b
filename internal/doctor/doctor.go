// Package doctor checks a host for what mpdetour needs and says what to fix:
// kernel features (MPTCP, its path-manager netlink family, limits), a relay's
// data plane (forwarding, nftables, WireGuard), a client's relays (a real
// handshake with each) and, given a server, whether MPTCP options survive
// the path through each relay. It only reads state and opens short-lived
// connections; it changes nothing on the host. A test detour it asks a relay
// for is not released (a running agent of the same member may share it: a
// relay hands one mapping per member and server); it lapses with its lease.
package doctor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/nftables"
	"github.com/mdlayher/genetlink"
	"golang.org/x/sys/unix"

	"github.com/mpdetour/mpdetour/internal/agent"
	"github.com/mpdetour/mpdetour/internal/bpfclamp"
	"github.com/mpdetour/mpdetour/internal/mptcppm"
	"github.com/mpdetour/mpdetour/internal/policy"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relayclient"
	"github.com/mpdetour/mpdetour/internal/relayconn"
)

// Status is a check's outcome.
type Status int

// Outcomes, from good to bad.
const (
	OK Status = iota
	Info
	Warn
	Fail
)

func (s Status) String() string {
	return [...]string{"ok", "info", "warn", "FAIL"}[s]
}

// Result is one check.
type Result struct {
	Area   string // kernel, relay, client
	Check  string
	Status Status
	Detail string // what was found
	Fix    string // what to do about it (empty when nothing)
}

// Report is the list of results.
type Report []Result

func (r *Report) add(area, check string, st Status, detail, fix string) {
	*r = append(*r, Result{Area: area, Check: check, Status: st, Detail: detail, Fix: fix})
}

// Failed says whether any check failed.
func (r Report) Failed() bool {
	for _, x := range r {
		if x.Status == Fail {
			return true
		}
	}
	return false
}

// Print writes the report as a table, fixes indented under their check.
func (r Report) Print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, x := range r {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", x.Status, x.Area, x.Check, x.Detail)
		if x.Fix != "" {
			fmt.Fprintf(tw, "\t\t\t-> %s\n", x.Fix)
		}
	}
	tw.Flush()
}

// Paths are the files the checks read; tests point them elsewhere.
type Paths struct {
	Proc string // default /proc
	Dev  string // default /dev
}

func (p Paths) proc(rel string) string {
	if p.Proc == "" {
		p.Proc = "/proc"
	}
	return p.Proc + "/" + rel
}

func (p Paths) dev(rel string) string {
	if p.Dev == "" {
		p.Dev = "/dev"
	}
	return p.Dev + "/" + rel
}

func readSysctl(p Paths, name string) (string, error) {
	b, err := os.ReadFile(p.proc("sys/" + strings.ReplaceAll(name, ".", "/")))
	return strings.TrimSpace(string(b)), err
}

// Kernel checks MPTCP: the sysctl, an MPTCP socket, the path-manager netlink
// family and the namespace's limits. minSubflows is the subflow limit this
// host needs (a server: detours per client + 1; 0 = do not judge).
func Kernel(p Paths, minSubflows int) Report {
	var r Report
	switch v, err := readSysctl(p, "net.mptcp.enabled"); {
	case err != nil:
		r.add("kernel", "MPTCP", Fail, "no net.mptcp.enabled: kernel without MPTCP", "use Linux 5.19+ built with CONFIG_MPTCP=y")
		return r
	case v != "1":
		r.add("kernel", "MPTCP", Fail, "net.mptcp.enabled = "+v, "sysctl -w net.mptcp.enabled=1 (and in /etc/sysctl.d)")
	default:
		r.add("kernel", "MPTCP", OK, "net.mptcp.enabled = 1", "")
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_MPTCP)
	if err != nil {
		r.add("kernel", "MPTCP socket", Fail, "socket(IPPROTO_MPTCP): "+err.Error(), "MPTCP disabled or blocked (seccomp, LSM)")
	} else {
		unix.Close(fd)
		r.add("kernel", "MPTCP socket", OK, "an MPTCP socket opens", "")
	}
	if v, err := readSysctl(p, "net.mptcp.pm_type"); err == nil {
		detail := "net.mptcp.pm_type = " + v + " (0 in-kernel, 1 userspace)"
		r.add("kernel", "path manager", Info, detail+"; the agent switches it to 1 while it runs and restores it", "")
	}
	c, err := mptcppm.Dial(mptcppm.Options{})
	if err != nil {
		r.add("kernel", "mptcp_pm netlink", Fail, err.Error(), "the agent needs the mptcp_pm generic netlink family (Linux 5.19+)")
		return r
	}
	defer c.Close()
	r.add("kernel", "mptcp_pm netlink", OK, "family "+mptcppm.FamilyName+" present", "")
	l, err := c.GetLimits()
	switch {
	case err != nil:
		r.add("kernel", "MPTCP limits", Warn, "GET_LIMITS: "+err.Error(), "")
	case minSubflows > 0 && int(l.Subflows) < minSubflows:
		r.add("kernel", "MPTCP limits", Fail, fmt.Sprintf("subflows %d, add_addr_accepted %d", l.Subflows, l.AddAddrAccepted),
			fmt.Sprintf("a server refuses joins beyond its limit: ip mptcp limits set subflows %d add_addr_accepted %d", minSubflows, max(l.AddAddrAccepted, uint32(minSubflows))))
	default:
		r.add("kernel", "MPTCP limits", OK, fmt.Sprintf("subflows %d, add_addr_accepted %d", l.Subflows, l.AddAddrAccepted), "")
	}
	return r
}

// Blackhole checks the kernel's MPTCP blackhole fallback: from the MPTcpExt counters of p (disables since boot) and, when
// an agent runs, its view (agentSt: whether the disable is in force now,
// which counters read once cannot tell).
func Blackhole(p Paths, agentSt *agent.BlackholeStatus) Report {
	var r Report
	const check = "MPTCP blackhole fallback"
	v, err := readSysctl(p, "net.mptcp.blackhole_timeout")
	if err != nil {
		r.add("kernel", check, Info, "no net.mptcp.blackhole_timeout: this kernel has no blackhole fallback (before 6.12)", "")
		return r
	}
	to, _ := strconv.Atoi(v)
	if agentSt != nil && agentSt.State == agent.BlackholeDisabled {
		r.add("kernel", check, Fail, fmt.Sprintf("the kernel disabled MPTCP for new connections (the agent saw it at %s): they are plain TCP and get no detours; %d connections made plain TCP since boot",
			agentSt.Since.Format("15:04:05"), agentSt.Fallbacks), agent.BlackholeFix(to))
		return r
	}
	if to == 0 {
		r.add("kernel", check, Info, "net.mptcp.blackhole_timeout = 0: the kernel never disables MPTCP after dropped MP_CAPABLE SYNs", "")
		return r
	}
	b, err := os.ReadFile(p.proc("net/netstat"))
	var mib map[string]uint64
	if err == nil {
		mib, err = mptcppm.ParseMIB(b, "MPTcpExt")
	}
	switch {
	case err != nil:
		r.add("kernel", check, Warn, "cannot read the MPTCP counters: "+err.Error(), "")
	case mib["Blackhole"] == 0:
		r.add("kernel", check, OK, "the kernel has not disabled MPTCP since boot", "")
	default:
		state := "no agent runs to tell whether it is in force now"
		if agentSt != nil {
			state = "not in force now (agent)"
		}
		st := Warn
		if agentSt != nil {
			st = Info
		}
		r.add("kernel", check, st, fmt.Sprintf("the kernel disabled MPTCP for new connections %d times since boot (MP_CAPABLE SYNs dropped on a path; each time for %d s or more); %d connections made plain TCP; %s",
			mib["Blackhole"], to, mib["MPCapableSYNTXDisabled"], state), agent.BlackholeFix(to))
	}
	return r
}

// RunningAgent checks what a running agent (st, from its status socket)
// depends on in this namespace: pm_type must stay 1 while it runs; a value
// changed by another program is flagged, and restorations the agent made
// are reported.
func RunningAgent(p Paths, st *agent.Status) Report {
	var r Report
	if st == nil {
		r.add("client", "agent", Info, "no agent answers on its status socket (checks of a running agent skipped)", "")
		return r
	}
	r.add("client", "agent", OK, fmt.Sprintf("running since %s, policy %s", st.Started.Format("2006-01-02 15:04:05"), st.Policy), "")
	v, err := readSysctl(p, "net.mptcp.pm_type")
	g := st.PMTypeGuard
	switch {
	case err != nil:
	case v != "1":
		r.add("client", "pm_type under the agent", Fail, "net.mptcp.pm_type = "+v+" while the agent runs: another program changed it; the kernel's own path manager decides and the agent's commands fail",
			"the agent sets it back within 5 s; find what changes it (mptcpd, NetworkManager, a sysctl.d file applied by systemd-sysctl) and stop it")
	case g != nil && g.Restores > 0:
		r.add("client", "pm_type under the agent", Warn, fmt.Sprintf("net.mptcp.pm_type was changed under the agent %d times (last: %s at %s) and set back to 1",
			g.Restores, g.LastFound, g.LastRestore.Format("15:04:05")), "find what changes it (mptcpd, NetworkManager, a sysctl.d file applied by systemd-sysctl) and stop it")
	default:
		r.add("client", "pm_type under the agent", OK, "net.mptcp.pm_type = 1 (userspace, the agent's)", "")
	}
	// The limit as the running agent has it: doctor's own probe runs
	// with this shell's privileges, the agent with its unit's.
	const lw = "subflow lowat of the agent"
	switch l := st.SubflowLowat; {
	case l == nil:
		r.add("client", lw, Info, "off in the running agent (subflow_lowat: 0, or a server-role-only agent)", "")
	case l.State == "failed":
		fix := ""
		if strings.Contains(l.Error, "CAP_") {
			fix = "give the agent CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN (deploy/mpdetour-agent.service: CapabilityBoundingSet and AmbientCapabilities) and restart it"
		}
		msg := "the running agent could not load or attach its BPF program and runs without the limit: " + l.Error
		if l.Default {
			msg += " (the limit is on by default; subflow_lowat: 0 turns it off)"
		}
		r.add("client", lw, Warn, msg, fix)
	case l.State == "refused":
		r.add("client", lw, Warn, "the kernel refused the running agent's limit: "+l.Refused, "")
	case l.Scale == "rtt":
		r.add("client", lw, OK, fmt.Sprintf("%s, scaled to the subflows' RTTs (subflow_lowat_scale: rtt), %d-%d bytes unsent at most per subflow%s", l.State, l.Bytes, l.Ceil, l.Where()), "")
	default:
		r.add("client", lw, OK, fmt.Sprintf("%s, %d bytes unsent at most per subflow%s", l.State, l.Bytes, l.Where()), "")
	}
	return r
}

// Tunnels checks a running agent's tunnel detours end to end (a closed
// WireGuard port used to show `ok` everywhere): the latest
// handshake of each relay's tunnel, and, given a server, a TCP connection
// from the tunnel's address (the agent's policy routing sends it through
// the tunnel). The probe is plain TCP on purpose: the agent manages MPTCP
// connections only, so it does not take the probe for one of its own.
func Tunnels(ctx context.Context, st *agent.Status, server netip.AddrPort, to time.Duration) Report {
	var r Report
	if st == nil {
		return r
	}
	now := time.Now()
	for _, rel := range st.Relays {
		if !rel.Tunnel {
			continue
		}
		check := "tunnel via " + rel.Name
		switch {
		case rel.LastHandshake.IsZero():
			r.add("client", check, Fail, "the tunnel has had no WireGuard handshake",
				"open the relay's WireGuard UDP port (tunnel.listen, 51820 by default) on every firewall on the way; check the relay's tunnel section")
			continue
		case now.Sub(rel.LastHandshake) > 3*time.Minute:
			r.add("client", check, Fail, fmt.Sprintf("latest WireGuard handshake %s ago (WireGuard hand shakes every 2 minutes while it sends)", now.Sub(rel.LastHandshake).Round(time.Second)),
				"the relay's WireGuard UDP port is closed now, or the relay lost the tunnel (restart without state): the agent re-asks after its watchdog")
			continue
		}
		detail := fmt.Sprintf("latest WireGuard handshake %s ago", now.Sub(rel.LastHandshake).Round(time.Second))
		local := tunnelLocal(st, rel.Name)
		if !server.IsValid() || !local.IsValid() {
			if !server.IsValid() {
				detail += " (give --server to probe a connection through it)"
			}
			r.add("client", check, OK, detail, "")
			continue
		}
		d := net.Dialer{Timeout: to, LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(local, 0))}
		d.SetMultipathTCP(false)
		c, err := d.DialContext(ctx, "tcp", server.String())
		if err != nil {
			r.add("client", check, Fail, detail+"; but no TCP connection from "+local.String()+" to "+server.String()+" through it: "+err.Error(),
				"the relay's tunnel section refuses this destination (its allow_destinations, inherited from the relay's unless it says otherwise) or the server refuses it; the relay logs policy drops")
			continue
		}
		c.Close()
		r.add("client", check, OK, detail+"; a TCP connection from "+local.String()+" to "+server.String()+" went through it", "")
	}
	return r
}

// tunnelLocal is the local address of relay's tunnel detour in st.
func tunnelLocal(st *agent.Status, relay string) netip.Addr {
	for _, d := range st.Detours {
		if d.Kind == "tunnel" && d.Relay == relay {
			if a, err := netip.ParseAddr(d.Local); err == nil {
				return a
			}
		}
	}
	return netip.Addr{}
}

// RelayHost checks what a relay's data plane needs: forwarding, nftables
// through netlink, whether a relay's table is already installed (one relay
// per namespace), WireGuard (kernel module, or TUN for the embedded one),
// and for the convert role TCP Fast Open on the server side.
func RelayHost(p Paths, table string, tunnels, convert bool) Report {
	var r Report
	switch v, err := readSysctl(p, "net.ipv4.ip_forward"); {
	case err != nil:
		r.add("relay", "forwarding", Fail, err.Error(), "")
	case v != "1":
		r.add("relay", "forwarding", Fail, "net.ipv4.ip_forward = "+v+": NAT detours will not forward",
			"echo 'net.ipv4.ip_forward = 1' > /etc/sysctl.d/90-mpdetour.conf; sysctl -p /etc/sysctl.d/90-mpdetour.conf")
	default:
		r.add("relay", "forwarding", OK, "net.ipv4.ip_forward = 1", "")
	}
	if convert {
		v, err := readSysctl(p, "net.ipv4.tcp_fastopen")
		n, perr := strconv.Atoi(v)
		switch {
		case err != nil:
			r.add("relay", "converter TCP Fast Open", Warn, err.Error(), "")
		case perr != nil || n&2 == 0:
			r.add("relay", "converter TCP Fast Open", Warn, "net.ipv4.tcp_fastopen = "+v+": the converter cannot take data in the SYN, each converted connection costs one round trip more",
				"echo 'net.ipv4.tcp_fastopen = 3' >> /etc/sysctl.d/90-mpdetour.conf; sysctl -p /etc/sysctl.d/90-mpdetour.conf")
		default:
			r.add("relay", "converter TCP Fast Open", OK, "net.ipv4.tcp_fastopen = "+v, "")
		}
	}
	nc, err := nftables.New()
	if err == nil {
		var tabs []*nftables.Table
		tabs, err = nc.ListTablesOfFamily(nftables.TableFamilyIPv4)
		if err == nil {
			r.add("relay", "nftables", OK, fmt.Sprintf("netlink answers (%d IPv4 tables)", len(tabs)), "")
			for _, t := range tabs {
				if t.Name == table {
					r.add("relay", "running relay", Info, "table ip "+table+" exists: a relay runs in this namespace (or one crashed; the next start replaces it)", "")
				}
			}
		}
		nc.CloseLasting()
	}
	if err != nil {
		r.add("relay", "nftables", Fail, err.Error(), "the relay needs nf_tables with nat (modprobe nf_tables nft_nat nft_ct) and CAP_NET_ADMIN")
	}
	if !tunnels {
		return r
	}
	gc, err := genetlink.Dial(nil)
	if err == nil {
		_, err = gc.GetFamily("wireguard")
		gc.Close()
	}
	if err == nil {
		r.add("relay", "WireGuard", OK, "kernel module available", "")
		return r
	}
	if _, terr := os.Stat(p.dev("net/tun")); terr == nil {
		r.add("relay", "WireGuard", OK, "no kernel module ("+err.Error()+"); the embedded wireguard-go runs on /dev/net/tun", "")
	} else {
		r.add("relay", "WireGuard", Fail, "no kernel module and no /dev/net/tun", "modprobe wireguard, or make /dev/net/tun available (modprobe tun)")
	}
	return r
}

// ClientConfig is what the client checks need.
type ClientConfig struct {
	Source  relayclient.SourceConfig
	Server  netip.AddrPort // zero: skip the per-relay MPTCP path check
	Timeout time.Duration  // per relay (default 3 s)
	// ProbeDir marks the test connections for a running agent, which
	// leaves them alone (default agent.ProbeDir).
	ProbeDir string
}

// Client checks each relay with a real handshake and, given a server, asks
// each relay for a detour to it and opens an MPTCP connection through it to
// see whether MPTCP options survive that path (and, for comparison, the
// direct path).
func Client(ctx context.Context, cfg ClientConfig) Report {
	var r Report
	to := cfg.Timeout
	if to <= 0 {
		to = 3 * time.Second
	}
	for _, rel := range cfg.Source.Relays {
		c, err := relayconn.Dial(rel, cfg.Source.PrivateKey, cfg.Source.Options)
		if err != nil {
			r.add("client", "relay "+rel.Name, Fail, err.Error(), "")
			continue
		}
		start := time.Now()
		pctx, cancel := context.WithTimeout(ctx, to)
		rep, err := c.Do(pctx, proto.NewRequest(0, &proto.PingRequest{}))
		cancel()
		switch {
		case err != nil && errors.Is(err, context.DeadlineExceeded):
			r.add("client", "relay "+rel.Name, Fail, fmt.Sprintf("no answer from %s within %s", rel.Addr, to),
				"check the address, that the relay runs, that UDP port "+fmt.Sprint(rel.Addr.Port())+" is open on its firewall, and the relay's public_key in the agent config (a relay cannot answer a handshake made for another key)")
		case err != nil:
			r.add("client", "relay "+rel.Name, Fail, err.Error(), fixFor(err))
		case rep.Reason != proto.OK:
			r.add("client", "relay "+rel.Name, Fail, "ping refused: "+rep.Reason.String(), "")
		default:
			r.add("client", "relay "+rel.Name, OK, fmt.Sprintf("handshake and ping in %s", time.Since(start).Round(time.Millisecond)), "")
			if cfg.Server.IsValid() {
				r.detourPath(ctx, c, rel.Name, cfg.Server, to, cfg.probeDir())
			}
		}
		c.Close()
	}
	// Direct last: a running agent reacts to this connection by asking the
	// relays for the same server, and grants are shared per member and
	// server; the detour checks above are done by then.
	if cfg.Server.IsValid() {
		r.mptcpPath(ctx, "direct", cfg.Server, to, cfg.probeDir())
	}
	return r
}

func fixFor(err error) string {
	s := err.Error()
	switch {
	case strings.Contains(s, "unauthorized"):
		return "the relay does not know this member key (members in its config), or no longer: removed or certificate revoked"
	case strings.Contains(s, "policy-denied"):
		return "the relay refuses this destination (private ranges, port 25, deny lists): see docs/relay.md"
	}
	return ""
}

func (cfg ClientConfig) probeDir() string {
	if cfg.ProbeDir == "" {
		return agent.ProbeDir
	}
	return cfg.ProbeDir
}

func (r *Report) detourPath(ctx context.Context, c *relayconn.Conn, name string, server netip.AddrPort, to time.Duration, probes string) {
	if fam := policy.FamilyName(c.Relay().Addr.Addr()); fam != policy.FamilyName(server.Addr()) {
		// A relay grants only within its session's family: asking would
		// only bring policy-denied, which is no fault of the relay's.
		r.add("client", "detour via "+name, Info, "not checked: an "+fam+" session grants toward "+fam+" servers only, "+server.String()+" is not one", "")
		return
	}
	gctx, cancel := context.WithTimeout(ctx, to)
	defer cancel()
	d, _, err := c.Grant(gctx, server, 0)
	if err != nil {
		r.add("client", "detour via "+name, Fail, "grant to "+server.String()+": "+err.Error(), fixFor(err))
		return
	}
	// Not released: a relay returns the same mapping to every request of a
	// member for a server, so a running agent may be using this very one;
	// it lapses with its lease if nobody renews it.
	r.mptcpPath(ctx, "detour via "+name, d, to, probes)
}

// mptcpPath opens an MPTCP connection to dst and reports whether it stayed
// MPTCP (a middlebox stripping options makes the kernel fall back to TCP).
func (r *Report) mptcpPath(ctx context.Context, label string, dst netip.AddrPort, to time.Duration, probes string) {
	var d net.Dialer
	d.Timeout = to
	d.SetMultipathTCP(true)
	// Marked as a test connection: a running agent leaves it alone.
	var unmark func()
	d.Control, unmark = agent.MarkProbe(probes)
	defer unmark()
	before := fallbacks()
	conn, err := d.DialContext(ctx, "tcp", dst.String())
	if err != nil {
		r.add("client", label, Fail, "connect "+dst.String()+": "+err.Error(), "the server (or the relay's NAT toward it) does not accept connections on that port")
		return
	}
	defer conn.Close()
	mp, err := conn.(*net.TCPConn).MultipathTCP()
	switch {
	case err != nil:
		r.add("client", label, Warn, "cannot tell whether the connection is MPTCP: "+err.Error(), "")
	case !mp && fallbacks() > before:
		r.add("client", label, Fail, "connected to "+dst.String()+" as plain TCP: the kernel has MPTCP disabled for new connections (blackhole detection)",
			agent.BlackholeFix(blackholeTimeout()))
	case !mp:
		r.add("client", label, Fail, "connected to "+dst.String()+" but fell back to plain TCP",
			"the server does not speak MPTCP (run it under `mpdetour run`), or a middlebox on this path strips MPTCP options (compare with the direct check)")
	default:
		r.add("client", label, OK, "MPTCP options survive the path to "+dst.String(), "")
	}
}

// fallbacks reads MPCapableSYNTXDisabled of this process's namespace: it
// rises for each connection the kernel makes plain TCP because of a
// blackhole disable (0 when unreadable); the caller keeps its thread.
func fallbacks() uint64 {
	// thread-self: the namespace of this (possibly switched) thread.
	b, err := os.ReadFile("/proc/thread-self/net/netstat")
	if err != nil {
		return 0
	}
	mib, err := mptcppm.ParseMIB(b, "MPTcpExt")
	if err != nil {
		return 0
	}
	return mib["MPCapableSYNTXDisabled"]
}

func blackholeTimeout() int {
	v, _ := readSysctl(Paths{}, "net.mptcp.blackhole_timeout")
	n, _ := strconv.Atoi(v)
	return n
}

// BPF checks that the agent's BPF sock_ops program (the per-subflow
// unsent limit, subflow_lowat, and cwnd_clamp) can load and attach under
// cgroup v2 directory dir ("" = the cgroup v2 root, the agent's default;
// bpf_cgroup otherwise): probe is bpfclamp.Probe outside tests (a fresh
// child cgroup, removed again; it answers the directory it used). When
// it cannot, the agent runs without them: a warning, not a failure, one
// line that says why and what the agent does.
func BPF(dir string, probe func(string) (string, error)) Report {
	var r Report
	const check = "BPF program"
	at, err := probe(dir)
	if err == nil {
		r.add("kernel", check, OK, "the agent's sock_ops program (subflow_lowat, cwnd_clamp) loads and attaches under "+at+bpfWhere(dir, at), "")
		return r
	}
	var notTried *bpfclamp.AttachNotTriedError
	if errors.As(err, &notTried) {
		r.add("kernel", check, Info, "the agent's sock_ops program loads; attaching under "+at+" was not tried ("+notTried.Err.Error()+"): the agent attaches to the directory itself, which needs only read access", "")
		return r
	}
	var fix string
	switch {
	case errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES):
		fix = "the agent needs CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN (deploy/mpdetour-agent.service grants them: keep CAP_BPF and CAP_PERFMON in CapabilityBoundingSet and AmbientCapabilities); this check also needs write access to the cgroup: run it as root"
	case strings.Contains(err.Error(), "cannot use helper"):
		fix = "bpf_skc_to_mptcp_sock needs CAP_PERFMON (deploy/mpdetour-agent.service grants it) and Linux 5.19+"
	case strings.Contains(err.Error(), "cgroup v2"):
		fix = "mount cgroup v2 (systemd.unified_cgroup_hierarchy=1) or set bpf_cgroup to a cgroup v2 directory"
	case strings.Contains(err.Error(), "BTF"):
		fix = "use a kernel with BTF (CONFIG_DEBUG_INFO_BTF=y, Linux 5.19+)"
	}
	r.add("kernel", check, Warn, "cannot load or attach the agent's sock_ops program ("+err.Error()+"): the agent runs without the per-subflow unsent limit (subflow_lowat) and cwnd_clamp", fix)
	return r
}

// bpfWhere says, for the agent's default cgroup (dir "": the cgroup v2
// root at), what attaching there means on this host.
func bpfWhere(dir, at string) string {
	if dir != "" {
		return ""
	}
	return " (no bpf_cgroup: the agent attaches it to the cgroup v2 root " + at + ", so every MPTCP subflow on this host, in every namespace and container, runs it at each ACK; it limits only the agent's own managed subflows; bpf_cgroup narrows it to one cgroup, but then only the processes in that cgroup get the limit)"
}
