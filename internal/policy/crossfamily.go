package policy

import (
	"fmt"
	"net/netip"

	"github.com/mpdetour/mpdetour/internal/detour"
)

// Cross-family detours: a connection of one family (IPv4 or IPv6) may take
// detour subflows of the other when the server has an address of that
// family. The server's other address comes, in this order, from the
// server's own ADD_ADDR (it says the address reaches this connection's
// listener) or from the configured mapping (Config.OtherFamily, the
// operator's assertion); never from a DNS lookup of the agent's own (it sees
// addresses, not names; a lookup could reach another host of a content
// network than the one the application chose).
//
// Measured limit (kernel 6.18, TestCrossFamilySubflow in internal/mptcppm):
// an IPv6 subflow on a connection started over IPv4 works only when the
// MPTCP socket is AF_INET6 (its events carry IPv4-mapped addresses,
// Conn.Inet6); an AF_INET socket refuses it ("families mismatch"). An IPv6
// connection's socket is always AF_INET6 and takes IPv4 subflows.

// altServer is an address of the server's other family.
type altServer struct {
	addr netip.AddrPort
	from string // "ADD_ADDR" or "mapping"
}

// FamilyName names an address's family ("IPv4", IPv4-mapped included, or
// "IPv6") for logs and status.
func FamilyName(a netip.Addr) string {
	if a.Unmap().Is4() {
		return "IPv4"
	}
	return "IPv6"
}

// sameFamily: both addresses are IPv4 (mapped or not) or both IPv6.
func sameFamily(a, b netip.Addr) bool { return a.Unmap().Is4() == b.Unmap().Is4() }

// detourFamily is the family a subflow through d has: its source address
// for a tunnel detour, the relay's for a NAT detour.
func detourFamily(d detour.Detour) netip.Addr {
	if d.Local.IsValid() {
		return d.Local
	}
	return d.Remote.Addr()
}

// crossOK says whether the connection can take subflows of the other
// family, and why not.
func crossOK(k *kconn) (bool, string) {
	if k.c.Inet6 {
		return true, ""
	}
	return false, fmt.Sprintf("the connection's socket is AF_INET: the kernel takes %s subflows only on an AF_INET6 socket (IPv4-mapped); measured limit, docs/agent.md",
		FamilyName(otherOf(k.c.Remote.Addr())))
}

// otherOf returns an address of the other family (only its family matters).
func otherOf(a netip.Addr) netip.Addr {
	if a.Unmap().Is4() {
		return netip.IPv6Unspecified()
	}
	return netip.IPv4Unspecified()
}

// mapped returns the configured other-family addresses of the server.
func (p *Engine) mapped(server netip.AddrPort) []netip.AddrPort {
	var out []netip.AddrPort
	for _, a := range p.cfg.OtherFamily[server.Addr()] {
		if !sameFamily(a, server.Addr()) {
			out = append(out, netip.AddrPortFrom(a.Unmap(), server.Port()))
		}
	}
	return out
}

// addAlt records an address of the server's other family for k. If the
// connection can use it, its sources are asked to prepare detours toward
// it when prepare is set (else with the server's own address, in Created
// or Adopt), and to release them when the connection ends; if not, why is logged
// once for the connection.
func (p *Engine) addAlt(k *kconn, addr netip.AddrPort, from string, prepare bool) bool {
	if !k.selected || len(k.alts) >= 4 {
		return false
	}
	for _, a := range k.alts {
		if a.addr == addr {
			return false
		}
	}
	if ok, why := crossOK(k); !ok {
		p.noteCross(k, why, "server_"+FamilyName(addr.Addr()), addr, "from", from)
		return false
	}
	k.alts = append(k.alts, altServer{addr: addr, from: from})
	p.servers[addr]++
	if prepare {
		for _, s := range p.sources {
			s.Prepare(addr)
		}
	}
	k.cross = fmt.Sprintf("%s detours toward %s (from %s)", FamilyName(addr.Addr()), addr, from)
	p.cfg.Log.Debug("cross-family candidates", "token", fmt.Sprintf("%08x", k.c.Token), "server", k.c.Remote, "other", addr, "from", from)
	return true
}

// dropAlt forgets an other-family address the server withdrew (REMOVE_ADDR):
// no new detour leads there, and grants toward it are released when no
// other connection uses it. A configured mapping is the operator's
// assertion and stays, and so does an address the server still
// announces under another id.
func (p *Engine) dropAlt(k *kconn, addr netip.AddrPort) {
	for _, a := range k.announced {
		if a == addr {
			return
		}
	}
	for i, a := range k.alts {
		if a.addr != addr || a.from != "ADD_ADDR" {
			continue
		}
		k.alts = append(k.alts[:i:i], k.alts[i+1:]...)
		if p.servers[addr]--; p.servers[addr] <= 0 {
			delete(p.servers, addr)
			p.release(addr)
		}
		k.cross = fmt.Sprintf("%s address %s withdrawn by the server (REMOVE_ADDR)", FamilyName(addr.Addr()), addr)
		p.cfg.Log.Debug("cross-family address withdrawn", "token", fmt.Sprintf("%08x", k.c.Token), "server", k.c.Remote, "other", addr)
		return
	}
}

// noteCross logs, once per connection, why it gets no cross-family detour.
func (p *Engine) noteCross(k *kconn, why string, args ...any) {
	if k.crossNoted {
		return
	}
	k.crossNoted = true
	k.cross = "no cross-family detour: " + why
	p.cfg.Log.Info("no cross-family detour", append([]any{"token", fmt.Sprintf("%08x", k.c.Token), "server", k.c.Remote, "reason", why}, args...)...)
}

// crossCandidates returns the detours toward the server's other-family
// addresses, with a NAT detour's source set to the client's own address of
// that family (a NAT detour's zero Local means "the connection's own
// address", which is of the wrong family here).
func (p *Engine) crossCandidates(k *kconn) []detour.Detour {
	var out []detour.Detour
	for _, alt := range k.alts {
		var ds []detour.Detour
		for _, d := range p.detours(alt.addr) {
			if !d.Local.IsValid() {
				if p.cfg.SourceFor == nil {
					p.noteCross(k, "no route lookup configured for the client's own "+FamilyName(alt.addr.Addr())+" address")
					continue
				}
				src, err := p.cfg.SourceFor(d.Remote.Addr().Unmap())
				if err != nil {
					p.noteCross(k, fmt.Sprintf("no %s source address toward %s: %v", FamilyName(alt.addr.Addr()), d.Remote.Addr(), err))
					continue
				}
				d.Local = src.Unmap()
			}
			ds = append(ds, d)
		}
		out = append(out, p.usable(k, alt.addr, ds)...)
	}
	return out
}

// usable filters a server's detours by family: a subflow's two ends must
// be of one family (the kernel refuses a mix), and one of the other family
// than the connection needs an AF_INET6 socket.
func (p *Engine) usable(k *kconn, server netip.AddrPort, ds []detour.Detour) []detour.Detour {
	out := ds[:0:0]
	for _, d := range ds {
		f := detourFamily(d)
		if !sameFamily(f, server.Addr()) || (d.Local.IsValid() && !sameFamily(d.Local, d.Remote.Addr())) {
			continue
		}
		if !sameFamily(f, k.c.Remote.Addr()) {
			if ok, why := crossOK(k); !ok {
				p.noteCross(k, why, "detour", d.String())
				continue
			}
		}
		out = append(out, d)
	}
	return out
}

// altAddrs lists the other-family addresses k's sources were asked for.
func altAddrs(k *kconn) []netip.AddrPort {
	out := make([]netip.AddrPort, len(k.alts))
	for i, a := range k.alts {
		out[i] = a.addr
	}
	return out
}
