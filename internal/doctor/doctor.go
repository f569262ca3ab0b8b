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

	"github.com/mpdetour/mpdetour/internal/mptcppm"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relayclient"
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
		c, err := relayclient.Dial(rel, cfg.Source.PrivateKey, cfg.Source.Options)
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
				"check the address, that the relay runs, and that UDP port "+fmt.Sprint(rel.Addr.Port())+" is open on its firewall")
		case err != nil:
			r.add("client", "relay "+rel.Name, Fail, err.Error(), fixFor(err))
		case rep.Reason != proto.OK:
			r.add("client", "relay "+rel.Name, Fail, "ping refused: "+rep.Reason.String(), "")
		default:
			r.add("client", "relay "+rel.Name, OK, fmt.Sprintf("handshake and ping in %s", time.Since(start).Round(time.Millisecond)), "")
			if cfg.Server.IsValid() {
				r.detourPath(ctx, c, rel.Name, cfg.Server, to)
			}
		}
		c.Close()
	}
	// Direct last: a running agent reacts to this connection by asking the
	// relays for the same server, and grants are shared per member and
	// server; the detour checks above are done by then.
	if cfg.Server.IsValid() {
		r.mptcpPath(ctx, "direct", cfg.Server, to)
	}
	return r
}

func fixFor(err error) string {
	s := err.Error()
	switch {
	case strings.Contains(s, "unauthorized"):
		return "the relay does not know this member key (members in its config), or the agent has a wrong relay public_key"
	case strings.Contains(s, "policy-denied"):
		return "the relay refuses this destination (private ranges, port 25, deny lists): see docs/relay.md"
	}
	return ""
}

func (r *Report) detourPath(ctx context.Context, c *relayclient.Conn, name string, server netip.AddrPort, to time.Duration) {
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
	r.mptcpPath(ctx, "detour via "+name, d, to)
}

// mptcpPath opens an MPTCP connection to dst and reports whether it stayed
// MPTCP (a middlebox stripping options makes the kernel fall back to TCP).
func (r *Report) mptcpPath(ctx context.Context, label string, dst netip.AddrPort, to time.Duration) {
	var d net.Dialer
	d.Timeout = to
	d.SetMultipathTCP(true)
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
	case !mp:
		r.add("client", label, Fail, "connected to "+dst.String()+" but fell back to plain TCP",
			"the server does not speak MPTCP (run it under `mpdetour run`), or a middlebox on this path strips MPTCP options (compare with the direct check)")
	default:
		r.add("client", label, OK, "MPTCP options survive the path to "+dst.String(), "")
	}
}
