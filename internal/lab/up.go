package lab

import (
	"context"
	"errors"
	"fmt"
	"github.com/mpdetour/mpdetour/internal/lab/topology"
	"io/fs"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/mpdetour/mpdetour/internal/netnsx"
)

// Lab is a running lab: a set of named namespaces and the state that
// describes them.
type Lab struct {
	name string
	st   *state
	topo *topology.Topology
}

// Name returns the lab's name.
func (l *Lab) Name() string { return l.name }

// Topology returns the topology the lab was built from (with --set
// overrides applied). Callers must not modify it.
func (l *Lab) Topology() *topology.Topology { return l.topo }

// Nodes returns the node names in topology order.
func (l *Lab) Nodes() []string {
	var out []string
	for _, n := range l.topo.Nodes {
		out = append(out, n.Name)
	}
	return out
}

// NetnsName returns the name of node's namespace ("<lab>-<node>"), usable
// with `ip netns exec` and `ip -n`; "" for an unknown node.
func (l *Lab) NetnsName(node string) string {
	if l.topo.Node(node) == nil {
		return ""
	}
	return l.name + "-" + node
}

// NetnsPath returns the path of node's namespace under /run/netns; "" for
// an unknown node.
func (l *Lab) NetnsPath(node string) string {
	n := l.NetnsName(node)
	if n == "" {
		return ""
	}
	return filepath.Join(NetnsDir, n)
}

// Addr returns node's primary address (its address on the first link it
// is an endpoint of; client 10.0.1.1 in brennan2017): IPv4, or its IPv6
// twin in a lab of family 6. Invalid for an unknown or unconnected node.
func (l *Lab) Addr(node string) netip.Addr {
	a := l.topo.Primary(node)
	if a.IsValid() && !l.topo.Family().Has4() {
		return topology.V6(a)
	}
	return a
}

// Addr6 returns node's primary IPv6 address (topology.V6 of its IPv4
// one); invalid when the lab has no IPv6 (family 4) or the node is unknown.
func (l *Lab) Addr6(node string) netip.Addr {
	a := l.topo.Primary(node)
	if !a.IsValid() || !l.topo.Family().Has6() {
		return netip.Addr{}
	}
	return topology.V6(a)
}

// Family returns the address families the lab was built with.
func (l *Lab) Family() topology.Family { return l.topo.Family() }

// Iface describes one interface of a node.
type Iface struct {
	Name string         // interface name inside the node (= link name)
	Link *topology.Link // the link
	Addr netip.Prefix   // the node's address on it
	Peer string         // the node at the other end
	// PeerAddr is the other end's address (the gateway for routes over it).
	PeerAddr netip.Addr
}

// Ifaces returns node's interfaces in link order.
func (l *Lab) Ifaces(node string) []Iface {
	var out []Iface
	for _, k := range l.topo.Links {
		var i Iface
		switch node {
		case k.A.Node:
			i = Iface{Name: k.Name, Link: k, Addr: k.A.Addr, Peer: k.B.Node, PeerAddr: k.B.Addr.Addr()}
		case k.B.Node:
			i = Iface{Name: k.Name, Link: k, Addr: k.B.Addr, Peer: k.A.Node, PeerAddr: k.A.Addr.Addr()}
		default:
			continue
		}
		if !l.topo.Family().Has4() {
			i.Addr, i.PeerAddr = topology.V6Prefixed(i.Addr), topology.V6(i.PeerAddr)
		}
		out = append(out, i)
	}
	return out
}

// Emulation returns how each link is emulated on this kernel.
func (l *Lab) Emulation() []LinkEmu { return append([]LinkEmu(nil), l.st.Emulation...) }

// Down removes the lab (see Down).
func (l *Lab) Down() error { return Down(l.name) }

// Open returns a lab built earlier (by this or another process).
func Open(name string) (*Lab, error) {
	if err := topology.CheckLabName(name); err != nil {
		return nil, err
	}
	st, err := loadState(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("no lab named %s", name)
	}
	if err != nil {
		return nil, err
	}
	if !st.Complete {
		return nil, fmt.Errorf("lab %s is incomplete (being built, or its builder died): mpdetour-lab down %s", name, name)
	}
	t := topology.Restored(st.Topology, st.Source, st.Nodes, st.Links, st.Params)
	return &Lab{name: name, st: st, topo: t}, nil
}

// Up validates t completely, then builds it as lab name. On any error,
// and when ctx is cancelled before it returns, everything created so far
// is removed again.
func Up(ctx context.Context, t *topology.Topology, name string) (_ *Lab, err error) {
	if err := topology.CheckLabName(name); err != nil {
		return nil, err
	}
	if err := t.Validate(); err != nil {
		return nil, err
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("building a lab needs root (network namespaces)")
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := prepareNetnsDir(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(RunDir, 0o755); err != nil {
		return nil, err
	}
	if err := os.Mkdir(StateDir(name), 0o755); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("lab %s exists (remove it with: mpdetour-lab down %s)", name, name)
		}
		return nil, err
	}
	if left := listNetns(name); len(left) > 0 {
		os.Remove(StateDir(name))
		return nil, fmt.Errorf("namespaces of an earlier lab %s remain (%s): mpdetour-lab down %s", name, left[0], name)
	}
	st := &state{
		Name: name, Topology: t.Name, Source: t.Source, Params: t.Params(),
		Created: time.Now().UTC(), Builder: os.Getpid(),
		Nodes: t.Nodes, Links: t.Links,
	}
	b := &builder{ctx: ctx, t: t, st: st, handles: map[string]*netlink.Handle{}, nsfd: map[string]netns.NsHandle{}}
	defer func() {
		b.close()
		if err != nil {
			if derr := Down(name); derr != nil {
				err = fmt.Errorf("%w (and rolling back failed: %v)", err, derr)
			}
		}
	}()
	if err := st.save(); err != nil {
		return nil, err
	}
	if err := b.build(); err != nil {
		return nil, fmt.Errorf("lab %s: %w", name, err)
	}
	st.Complete = true
	if err := st.save(); err != nil {
		return nil, err
	}
	return &Lab{name: name, st: st, topo: t}, nil
}

// Down removes lab name: it stops the delay line, kills processes left in
// the lab's namespaces, deletes the namespaces (found from the state and
// by name prefix, so a builder killed half way is cleaned up too) and the
// state. Removing a lab that does not exist is not an error.
func Down(name string) error {
	if err := topology.CheckLabName(name); err != nil {
		return err
	}
	st, err := loadState(name)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		slog.Warn("lab state unreadable; cleaning up by name", "lab", name, "err", err)
	}
	names := map[string]bool{}
	for _, n := range listNetns(name) {
		names[n] = true
	}
	if st != nil {
		stopDelayLine(st.DelayLine)
		for _, n := range st.Namespaces {
			names[n] = true
		}
	}
	inos := map[uint64]bool{}
	for n := range names {
		if ino := netnsIno(n); ino != 0 {
			inos[ino] = true
		}
	}
	killNetnsProcs(inos)
	var errs []error
	for n := range names {
		if err := deleteNetns(n); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		if err := os.RemoveAll(StateDir(name)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// DownBuiltBy takes down every lab whose state names process pid as its
// builder (complete or not). A test binary interrupted by a signal runs no
// t.Cleanup; its handler calls this with its own pid so that the labs it
// built do not outlive it (labtest.DownOnInterrupt).
func DownBuiltBy(pid int) error {
	names, err := List()
	if err != nil {
		return err
	}
	var errs []error
	for _, name := range names {
		st, err := loadState(name)
		if err != nil || st.Builder != pid {
			continue
		}
		if err := Down(name); err != nil {
			errs = append(errs, fmt.Errorf("lab %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// builder holds what Up has opened while it builds.
type builder struct {
	ctx     context.Context
	t       *topology.Topology
	st      *state
	handles map[string]*netlink.Handle // by namespace name
	nsfd    map[string]netns.NsHandle
	netem   bool
}

func (b *builder) close() {
	for _, h := range b.handles {
		h.Close()
	}
	for _, f := range b.nsfd {
		f.Close()
	}
}

func (b *builder) nsName(x string) string { return b.st.Name + "-" + x }

// newNetns records, then creates, a namespace and opens a netlink handle in it.
func (b *builder) newNetns(x string) error {
	if err := b.ctx.Err(); err != nil {
		return err
	}
	ns := b.nsName(x)
	b.st.Namespaces = append(b.st.Namespaces, ns)
	if err := b.st.save(); err != nil {
		return err
	}
	if err := createNetns(ns); err != nil {
		return err
	}
	fd, err := netns.GetFromPath(filepath.Join(NetnsDir, ns))
	if err != nil {
		return err
	}
	b.nsfd[ns] = fd
	h, err := netlink.NewHandleAt(fd)
	if err != nil {
		return fmt.Errorf("netlink in %s: %w", ns, err)
	}
	b.handles[ns] = h
	lo, err := h.LinkByName("lo")
	if err == nil {
		err = h.LinkSetUp(lo)
	}
	if err != nil {
		return fmt.Errorf("%s: loopback up: %w", ns, err)
	}
	// IPv6 is off unless the topology's family asks for it (build turns
	// it on again in the nodes): it would only add router solicitations
	// and MLD reports to links whose loss and rate we measure.
	return b.sysctls(ns, []topology.Sysctl{
		{Key: "net.ipv6.conf.all.disable_ipv6", Value: "1"},
		{Key: "net.ipv6.conf.default.disable_ipv6", Value: "1"},
	}, false)
}

// sysctls writes keys under /proc/sys inside namespace ns. Optional keys
// that the kernel lacks are skipped.
func (b *builder) sysctls(ns string, kv []topology.Sysctl, optional bool) error {
	return netnsx.Do(filepath.Join(NetnsDir, ns), func() error {
		for _, s := range kv {
			path := sysctlPath(s.Key)
			if err := os.WriteFile(path, []byte(s.Value), 0); err != nil {
				if optional && errors.Is(err, fs.ErrNotExist) {
					continue
				}
				return fmt.Errorf("%s: sysctl %s=%s: %w", ns, s.Key, s.Value, err)
			}
		}
		return nil
	})
}

func sysctlPath(key string) string {
	p := []byte(key)
	for i, c := range p {
		if c == '.' {
			p[i] = '/'
		}
	}
	return "/proc/sys/" + string(p)
}

func (b *builder) build() error {
	for _, n := range b.t.Nodes {
		if err := b.newNetns(n.Name); err != nil {
			return err
		}
		ns := b.nsName(n.Name)
		// MPTCP is on by default in new namespaces; make it explicit so a
		// host that turned it off still gets an MPTCP lab.
		if err := b.sysctls(ns, []topology.Sysctl{{Key: "net.mptcp.enabled", Value: "1"}}, true); err != nil {
			return err
		}
		// No TCP metrics cache: the kernel would save a closed
		// connection's RTT, RTT variance, cwnd and reordering per
		// destination and seed the next connection to the same address
		// from them (its initial RTO, its reordering estimate; the cwnd
		// is not reused), so that a measurement inherits from the one
		// before it
		// (docs/results/design/aa; ssthresh is not saved while
		// net.ipv4.tcp_no_ssthresh_metrics_save is 1, the default).
		// Every lab connection starts from the kernel's defaults. Per
		// namespace; set before any link exists, so the cache stays
		// empty.
		if err := b.sysctls(ns, []topology.Sysctl{{Key: "net.ipv4.tcp_no_metrics_save", Value: "1"}}, false); err != nil {
			return err
		}
		fwd := "0"
		if n.Forward {
			fwd = "1"
		}
		if err := b.sysctls(ns, append([]topology.Sysctl{{Key: "net.ipv4.ip_forward", Value: fwd}}, n.Sysctls...), false); err != nil {
			return err
		}
		if b.t.Family().Has6() {
			if err := b.sysctls(ns, ipv6Sysctls(fwd), false); err != nil {
				return err
			}
		}
	}
	b.netem = b.detectNetem(b.nsName(b.t.Nodes[0].Name))
	for _, l := range b.t.Links {
		if err := b.link(l); err != nil {
			return fmt.Errorf("link %s: %w", l.Name, err)
		}
	}
	for _, n := range b.t.Nodes {
		h := b.handles[b.nsName(n.Name)]
		for _, r := range n.Routes {
			for _, r := range b.families(r) {
				dst := ipNet(r.Dst)
				rt := &netlink.Route{Dst: dst, Gw: r.Via.AsSlice()}
				if r.Src.IsValid() {
					rt.Src = r.Src.AsSlice()
				}
				if err := h.RouteAdd(rt); err != nil {
					return fmt.Errorf("node %s: route %s via %s: %w", n.Name, r.Dst, r.Via, err)
				}
			}
		}
	}
	if err := b.ctx.Err(); err != nil {
		return err
	}
	return b.startDelayLine()
}

// link creates one link: a veth pair between the endpoints, or two pairs
// through a hidden middle namespace when the delay line must carry it.
func (b *builder) link(l *topology.Link) error {
	if err := b.ctx.Err(); err != nil {
		return err
	}
	nsA, nsB := b.nsName(l.A.Node), b.nsName(l.B.Node)
	emu := LinkEmu{Link: l.Name}
	delayed := l.AB.Delay > 0 || l.BA.Delay > 0
	if delayed {
		emu.Delay = "delayline"
		if b.netem {
			emu.Delay = "netem"
		}
	}
	if l.AB.Loss > 0 || l.BA.Loss > 0 {
		emu.Loss = "nftables"
		if b.netem {
			emu.Loss = "netem"
		}
	}
	if l.AB.Rate > 0 || l.BA.Rate > 0 {
		emu.Rate = "tbf"
	}
	if emu.Delay == "delayline" {
		emu.Mid = b.nsName(l.Name)
		if err := b.newNetns(l.Name); err != nil {
			return err
		}
		hm := b.handles[emu.Mid]
		for _, side := range []struct{ mid, ns string }{{"a", nsA}, {"b", nsB}} {
			v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: side.mid}, PeerName: l.Name, PeerNamespace: netlink.NsFd(b.nsfd[side.ns])}
			if err := hm.LinkAdd(v); err != nil {
				return fmt.Errorf("veth %s/%s: %w", emu.Mid, side.mid, err)
			}
			if err := offloadsOff(filepath.Join(NetnsDir, emu.Mid), side.mid, true); err != nil {
				return err
			}
			ml, err := hm.LinkByName(side.mid)
			if err == nil {
				err = hm.LinkSetUp(ml)
			}
			if err != nil {
				return fmt.Errorf("%s/%s up: %w", emu.Mid, side.mid, err)
			}
		}
	} else {
		v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: l.Name}, PeerName: l.Name, PeerNamespace: netlink.NsFd(b.nsfd[nsB])}
		if err := b.handles[nsA].LinkAdd(v); err != nil {
			return fmt.Errorf("veth: %w", err)
		}
	}
	b.st.Emulation = append(b.st.Emulation, emu)
	for _, e := range []struct {
		ns     string
		addr   netip.Prefix
		egress topology.Shape
	}{{nsA, l.A.Addr, l.AB}, {nsB, l.B.Addr, l.BA}} {
		h := b.handles[e.ns]
		dev, err := h.LinkByName(l.Name)
		if err != nil {
			return fmt.Errorf("%s: %w", e.ns, err)
		}
		if l.AB.Emulated() || l.BA.Emulated() {
			// Per-segment loss and exact rates need MTU-sized packets; the
			// delay line cannot resend super-packets or finish partial checksums.
			if err := offloadsOff(filepath.Join(NetnsDir, e.ns), l.Name, emu.Mid != ""); err != nil {
				return err
			}
		}
		for _, a := range b.prefixes(e.addr) {
			// NODAD: the lab's addresses are unique by construction, and
			// a tentative address would refuse to bind for ~1 s.
			if err := h.AddrAdd(dev, &netlink.Addr{IPNet: ipNet(a), Flags: nodad(a)}); err != nil {
				return fmt.Errorf("%s: address %s: %w", e.ns, a, err)
			}
		}
		if err := b.shapeEgress(h, dev, e.egress, emu); err != nil {
			return fmt.Errorf("%s: %w", e.ns, err)
		}
		if err := h.LinkSetUp(dev); err != nil {
			return fmt.Errorf("%s: link up: %w", e.ns, err)
		}
	}
	if emu.Loss == "nftables" {
		// Drop at the receiver's ingress: a drop on the sender's own egress
		// is reported to its TCP as local congestion instead of being lost.
		if err := nftLoss(b.nsfd[nsB], l.Name, l.AB.Loss); err != nil {
			return fmt.Errorf("%s: loss: %w", nsB, err)
		}
		if err := nftLoss(b.nsfd[nsA], l.Name, l.BA.Loss); err != nil {
			return fmt.Errorf("%s: loss: %w", nsA, err)
		}
	}
	return nil
}

// ipv6Sysctls turn IPv6 on in a node of a family 6 or dual lab: no
// duplicate address detection (addresses are unique by construction and
// a tentative one cannot be bound), no router advertisements (routes are
// static), forwarding as for IPv4.
func ipv6Sysctls(fwd string) []topology.Sysctl {
	return []topology.Sysctl{
		{Key: "net.ipv6.conf.all.disable_ipv6", Value: "0"},
		{Key: "net.ipv6.conf.default.disable_ipv6", Value: "0"},
		{Key: "net.ipv6.conf.all.accept_dad", Value: "0"},
		{Key: "net.ipv6.conf.default.accept_dad", Value: "0"},
		{Key: "net.ipv6.conf.all.accept_ra", Value: "0"},
		{Key: "net.ipv6.conf.default.accept_ra", Value: "0"},
		{Key: "net.ipv6.conf.all.forwarding", Value: fwd},
	}
}

// prefixes returns an interface address in the lab's families (the IPv4
// one and/or its IPv6 twin).
func (b *builder) prefixes(p netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	f := b.t.Family()
	if f.Has4() {
		out = append(out, p)
	}
	if f.Has6() {
		out = append(out, topology.V6Prefixed(p))
	}
	return out
}

// families returns a route in the lab's families.
func (b *builder) families(r topology.Route) []topology.Route {
	var out []topology.Route
	f := b.t.Family()
	if f.Has4() {
		out = append(out, r)
	}
	if f.Has6() {
		r6 := r
		r6.Dst, r6.Via = topology.V6Prefixed(r.Dst), topology.V6(r.Via)
		if r.Src.IsValid() {
			r6.Src = topology.V6(r.Src)
		}
		out = append(out, r6)
	}
	return out
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func nodad(p netip.Prefix) int {
	if p.Addr().Is6() {
		return unix.IFA_F_NODAD
	}
	return 0
}
