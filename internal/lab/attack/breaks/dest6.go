package breaks

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/mpdetour/mpdetour/internal/lab"
	"github.com/mpdetour/mpdetour/internal/lab/topology"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relayconn"
)

// destCheck is one grant the destinations-v6 case asks for.
type destCheck struct {
	relay string // "strict" or "wide"
	what  string
	addr  string // as given to the client library (may carry a zone or be IPv4-mapped)
	// raw: sent with a handshake of the case's own and the address bytes
	// written as family 6 (the client library would send a mapped address
	// as family 4): the wire form an attacker can write.
	raw bool
	// control: a destination the relay must grant (without controls a
	// relay that refuses everything would pass).
	control bool
}

// destChecks are the case's grants; NODE4/NODE6 stand for a lab node's
// IPv4/IPv6 address, V4IN6(NODE) for an IPv6 address embedding node's IPv4
// address under the NAT64 well-known prefix. The strict relay allows the
// server's two addresses only; the wide one allows the lab's whole ULA
// prefix (so its own network is allowed) and the NAT64 well-known prefix
// (so the IPv4 address a NAT64 address stands for is what is judged).
var destChecks = []destCheck{
	{relay: "strict", what: "control: the server's IPv6 address (allowed)", addr: "server6", control: true},
	{relay: "strict", what: "control: the server's IPv4 address (allowed)", addr: "server4", control: true},
	{relay: "strict", what: "loopback", addr: "::1"},
	{relay: "strict", what: "unspecified", addr: "::"},
	{relay: "strict", what: "link-local", addr: "fe80::1"},
	{relay: "strict", what: "link-local with a scope id", addr: "fe80::1%eth0"},
	{relay: "strict", what: "unique local (ULA), not allowed", addr: "fd00::1"},
	{relay: "strict", what: "unique local of a lab node (the client), not allowed", addr: "client6"},
	{relay: "strict", what: "the relay's own IPv6 address", addr: "detour2_6"},
	{relay: "strict", what: "multicast, link scope", addr: "ff02::1"},
	{relay: "strict", what: "multicast, global scope", addr: "ff0e::1"},
	{relay: "strict", what: "documentation", addr: "2001:db8::1"},
	{relay: "strict", what: "documentation (3fff::/20)", addr: "3fff::1"},
	{relay: "strict", what: "site-local (deprecated)", addr: "fec0::1"},
	{relay: "strict", what: "IPv4-compatible (deprecated)", addr: "::7f00:1"},
	{relay: "strict", what: "6to4 toward loopback", addr: "2002:7f00:1::1"},
	{relay: "strict", what: "Teredo", addr: "2001:0:4136:e378:8000:63bf:80ff:fffe"},
	{relay: "strict", what: "NAT64 well-known prefix, not allowed", addr: "64:ff9b::7f00:1"},
	{relay: "strict", what: "NAT64 of the allowed server, prefix not allowed", addr: "V4IN6(server)"},
	{relay: "strict", what: "NAT64 local-use prefix, not allowed", addr: "64:ff9b:1::a00:1"},
	{relay: "strict", what: "IPv4-mapped loopback (library form)", addr: "::ffff:127.0.0.1"},
	{relay: "strict", what: "IPv4-mapped private 10.x (library form)", addr: "::ffff:10.9.9.9"},
	{relay: "strict", what: "IPv4-mapped loopback, family 6 on the wire", addr: "::ffff:127.0.0.1", raw: true},
	{relay: "strict", what: "IPv4-mapped private 10.x, family 6 on the wire", addr: "::ffff:10.9.9.9", raw: true},
	{relay: "strict", what: "IPv4-mapped allowed server, family 6 on the wire", addr: "::ffff:SERVER4", raw: true},
	{relay: "strict", what: "IPv4 loopback (baseline)", addr: "127.0.0.1"},
	{relay: "strict", what: "IPv4 link-local (baseline)", addr: "169.254.1.1"},
	{relay: "strict", what: "IPv4 private, not allowed (baseline)", addr: "10.9.9.9"},
	{relay: "strict", what: "IPv4 multicast (baseline)", addr: "224.0.0.1"},
	{relay: "strict", what: "the relay's own IPv4 address (baseline)", addr: "detour2_4"},
	{relay: "wide", what: "control: the server's IPv6 address (in the allowed ULA prefix)", addr: "server6", control: true},
	{relay: "wide", what: "control: NAT64 of the allowed server's IPv4 address", addr: "V4IN6(server)", control: true},
	{relay: "wide", what: "the relay's own IPv6 address (its prefix allowed)", addr: "detour1_6"},
	{relay: "wide", what: "unique local outside the allowed prefix", addr: "fd00::1"},
	{relay: "wide", what: "loopback", addr: "::1"},
	{relay: "wide", what: "link-local", addr: "fe80::1"},
	{relay: "wide", what: "multicast", addr: "ff05::2"},
	{relay: "wide", what: "documentation", addr: "2001:db8::1"},
	{relay: "wide", what: "NAT64 (prefix allowed) toward loopback", addr: "64:ff9b::7f00:1"},
	{relay: "wide", what: "NAT64 (prefix allowed) toward private 10.9.9.9", addr: "64:ff9b::a09:909"},
	{relay: "wide", what: "NAT64 (prefix allowed) toward the relay's own IPv4 address", addr: "V4IN6(detour1)"},
	{relay: "wide", what: "NAT64 (prefix allowed) toward IPv4 link-local", addr: "64:ff9b::a9fe:101"},
	{relay: "wide", what: "NAT64 (prefix allowed) toward IPv4 multicast", addr: "64:ff9b::e000:1"},
	{relay: "wide", what: "IPv4-mapped loopback, family 6 on the wire", addr: "::ffff:127.0.0.1", raw: true},
}

// destinationsV6 (issue 31, the attack suite's address checks for IPv6):
// two relays in a dual-stack lab, each with an IPv4 and an IPv6 control
// socket; a member asks each for NAT grants toward every special-use IPv6
// range (and a few IPv4 baselines), over the session of the destination's
// family, and toward controls that must be granted. Target: 0 forbidden
// destinations granted, every control granted.
func destinationsV6(ctx context.Context, o Options) Result {
	r := Result{Metric: "forbidden destinations granted", Target: "0 (and every control granted)"}
	t, err := topology.Builtin("detours")
	if err == nil {
		err = t.Set("family", "dual")
	}
	if err != nil {
		return r.failed(err)
	}
	ll, err := lab.Up(ctx, t, o.LabName+"6")
	if err != nil {
		return r.failed(err)
	}
	l := &caseLab{Lab: ll}
	defer l.close()
	keys := make([]proto.Key, 3)
	for i := range keys {
		if keys[i], err = proto.GenerateKey(); err != nil {
			return r.failed(err)
		}
	}
	memberKey := keys[2]
	server4, server6 := l.Addr("server"), l.Addr6("server")
	relays := map[string]struct {
		node string
		key  proto.Key
	}{"strict": {"detour2", keys[0]}, "wide": {"detour1", keys[1]}}
	allow := map[string]string{
		"strict": fmt.Sprintf("['%s/32', '%s/128']", server4, server6),
		"wide":   fmt.Sprintf("['%s/32', '%s', '64:ff9b::/96']", server4, topology.V6Prefix),
	}
	for _, name := range []string{"strict", "wide"} {
		rl := relays[name]
		cfg := fmt.Sprintf("listen: %s\nlisten6: '%s'\nprivate_key: %s\nports: 40000-40999\nlease: 1m\nallow_destinations: %s\nrate: {per_member: 1000, burst: 1000}\nmembers:\n  - {name: client, public_key: %s}\n",
			netip.AddrPortFrom(l.Addr(rl.node), relayPort), netip.AddrPortFrom(l.Addr6(rl.node), relayPort), rl.key, allow[name], memberKey.Public())
		if _, err := l.startRelay(ctx, o, rl.node, name, cfg); err != nil {
			return r.failed(err)
		}
	}
	resolve := func(s string) (netip.Addr, error) {
		v4in6 := func(node string) netip.Addr {
			b := netip.MustParseAddr("64:ff9b::").As16()
			v4 := l.Addr(node).As4()
			copy(b[12:], v4[:])
			return netip.AddrFrom16(b)
		}
		switch {
		case s == "server6":
			return server6, nil
		case s == "server4":
			return server4, nil
		case s == "client6":
			return l.Addr6("client"), nil
		case strings.HasSuffix(s, "_6"):
			return l.Addr6(strings.TrimSuffix(s, "_6")), nil
		case strings.HasSuffix(s, "_4"):
			return l.Addr(strings.TrimSuffix(s, "_4")), nil
		case strings.HasPrefix(s, "V4IN6("):
			return v4in6(strings.TrimSuffix(strings.TrimPrefix(s, "V4IN6("), ")")), nil
		case s == "::ffff:SERVER4":
			return netip.AddrFrom16(server4.As16()), nil
		}
		return netip.ParseAddr(s)
	}
	type sess struct{ v4, v6 *relayconn.Conn }
	conns := map[string]*sess{}
	defer func() {
		for _, s := range conns {
			for _, c := range []*relayconn.Conn{s.v4, s.v6} {
				if c != nil {
					c.Close()
				}
			}
		}
	}()
	for name, rl := range relays {
		s := &sess{}
		var err error
		if s.v4, err = l.dialRelayNet(relayconn.Relay{Name: name, Addr: netip.AddrPortFrom(l.Addr(rl.node), relayPort), PublicKey: rl.key.Public()}, memberKey, nil, "udp4"); err != nil {
			return r.failed(err)
		}
		if s.v6, err = l.dialRelayNet(relayconn.Relay{Name: name, Addr: netip.AddrPortFrom(l.Addr6(rl.node), relayPort), PublicKey: rl.key.Public()}, memberKey, nil, "udp6"); err != nil {
			return r.failed(err)
		}
		conns[name] = s
		// The relay may still be starting: wait for a control grant on
		// each session (a refusal is an answer too).
		for _, c := range []*relayconn.Conn{s.v4, s.v6} {
			var perr error
			for end := time.Now().Add(15 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
				pctx, cancel := context.WithTimeout(ctx, time.Second)
				perr = c.Ping(pctx)
				cancel()
				if perr == nil {
					break
				}
			}
			if perr != nil {
				r.Error = fmt.Sprintf("relay %s (%s) did not answer a ping within 15 s: %v (logs in %s)", name, rl.node, perr, o.Dir)
				return r
			}
		}
	}
	var granted, refused, controlsMissed []string
	port := uint16(2000)
	type outcome struct {
		check  destCheck
		server netip.AddrPort
		reason string
	}
	var outs []outcome
	for _, ch := range destChecks {
		port++
		a, err := resolve(ch.addr)
		if err != nil || !a.IsValid() {
			r.Error = fmt.Sprintf("check %q: address %q: %v", ch.what, ch.addr, err)
			return r
		}
		server := netip.AddrPortFrom(a, port)
		s := conns[ch.relay]
		// The session of the destination's family (after unmapping: the
		// library sends a mapped address as IPv4); a raw mapped address
		// goes over IPv6, where the attacker writes it as family 6.
		c := s.v4
		if a.Unmap().Is6() || ch.raw {
			c = s.v6
		}
		var gerr error
		if ch.raw {
			rl := relays[ch.relay]
			gerr = rawMappedGrant(l, netip.AddrPortFrom(l.Addr6(rl.node), relayPort), rl.key.Public(), memberKey, server)
		} else {
			gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, _, gerr = c.Grant(gctx, server, 0)
			cancel()
		}
		reason := "granted"
		if gerr != nil {
			var pe *proto.Error
			if !errors.As(gerr, &pe) {
				r.Error = fmt.Sprintf("check %q (%v): no answer: %v (logs in %s)", ch.what, server, gerr, o.Dir)
				return r
			}
			reason = pe.Reason.String()
		}
		outs = append(outs, outcome{ch, server, reason})
		label := fmt.Sprintf("%s %s", ch.relay, server.Addr())
		switch {
		case ch.control && gerr != nil:
			controlsMissed = append(controlsMissed, label+" ("+reason+")")
		case !ch.control && gerr == nil:
			granted = append(granted, label+" ("+ch.what+")")
		case !ch.control:
			refused = append(refused, label)
		}
	}
	// Why the relay refused each (its log line, matched by the unique
	// server port), written beside the results.
	why := relayWhy(o.Dir)
	var lines []string
	for _, x := range outs {
		w := why[x.server.Port()]
		lines = append(lines, fmt.Sprintf("%s\t%s\t%s\t%s\t%s", x.check.relay, x.check.what, x.server, x.reason, w))
	}
	os.WriteFile(filepath.Join(o.Dir, "checks.tsv"), []byte(strings.Join(lines, "\n")+"\n"), 0o644)
	r.Value = float64(len(granted))
	r.Pass = len(granted) == 0 && len(controlsMissed) == 0
	nForbidden := len(granted) + len(refused)
	r.Detail = fmt.Sprintf("dual-stack lab, relays strict (allow: the server's two addresses) and wide (allow: the lab's ULA prefix and 64:ff9b::/96); %d forbidden destinations asked (grants over the session of their family; %d IPv4-mapped ones written as family 6 on the wire with a handshake of the case's own): %d refused, %d granted",
		nForbidden, countRaw(), len(refused), len(granted))
	if len(granted) > 0 {
		r.Detail += " [" + strings.Join(granted, "; ") + "]"
	}
	nControls := 0
	for _, ch := range destChecks {
		if ch.control {
			nControls++
		}
	}
	r.Detail += fmt.Sprintf("; controls granted %d of %d", nControls-len(controlsMissed), nControls)
	if len(controlsMissed) > 0 {
		r.Detail += " [refused: " + strings.Join(controlsMissed, "; ") + "]"
	}
	r.Detail += "; per check: " + summarize(outs, func(x outcome) (string, string, string) {
		return fmt.Sprintf("%s %s", x.check.relay, x.server.Addr()), x.reason, why[x.server.Port()]
	})
	return r
}

func countRaw() int {
	n := 0
	for _, ch := range destChecks {
		if ch.raw {
			n++
		}
	}
	return n
}

// summarize lists each check as "relay addr: reason (why)".
func summarize[T any](xs []T, f func(T) (string, string, string)) string {
	var parts []string
	for _, x := range xs {
		label, reason, why := f(x)
		if why != "" {
			reason += ": " + why
		}
		parts = append(parts, label+" -> "+reason)
	}
	return strings.Join(parts, "; ")
}

// relayWhy reads the relays' logs in dir (strict.log, wide.log): the
// "destination refused" lines' why, by server port.
func relayWhy(dir string) map[uint16]string {
	out := map[uint16]string{}
	re := regexp.MustCompile(`server=(\S+) why=("(?:[^"\\]|\\.)*"|\S+)`)
	for _, name := range []string{"strict", "wide"} {
		b, err := os.ReadFile(filepath.Join(dir, name+".log"))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if !strings.Contains(line, "destination refused") {
				continue
			}
			m := re.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			ap, err := netip.ParseAddrPort(m[1])
			if err != nil {
				continue
			}
			out[ap.Port()] = strings.Trim(m[2], `"`)
		}
	}
	return out
}

// rawMappedGrant asks relay for a grant toward server with the address
// written as family 6 even when it is IPv4-mapped (what the client library
// never sends): a handshake and a transport packet of its own from the
// client node. It returns nil when granted, the relay's refusal as a
// *proto.Error, or why there was no answer.
func rawMappedGrant(l *caseLab, relay netip.AddrPort, relayPub, member proto.Key, server netip.AddrPort) error {
	var pc net.PacketConn
	if err := l.do("client", func() error {
		var err error
		pc, err = net.ListenPacket("udp6", ":0")
		return err
	}); err != nil {
		return err
	}
	defer pc.Close()
	to := net.UDPAddrFromAddrPort(relay)
	in, err := proto.NewInitiation(member, relayPub, uint32(time.Now().UnixNano()), time.Now())
	if err != nil {
		return err
	}
	if _, err := pc.WriteTo(in.Packet, to); err != nil {
		return err
	}
	buf := make([]byte, proto.MaxPacketLen)
	pc.SetReadDeadline(time.Now().Add(3 * time.Second))
	n, _, err := pc.ReadFrom(buf)
	if err != nil {
		return fmt.Errorf("no handshake response: %w", err)
	}
	if typ, err := proto.PacketType(buf[:n]); err != nil || typ != proto.TypeResponse {
		return fmt.Errorf("handshake answered with packet type %d (%v), not a response", buf[0], err)
	}
	resp, err := proto.ParseResponse(buf[:n])
	if err != nil {
		return err
	}
	ses, err := in.Finish(resp)
	if err != nil {
		return err
	}
	msg, err := family6Grant(server)
	if err != nil {
		return err
	}
	pkt, err := ses.Seal(msg)
	if err != nil {
		return err
	}
	if _, err := pc.WriteTo(pkt, to); err != nil {
		return err
	}
	pc.SetReadDeadline(time.Now().Add(3 * time.Second))
	for {
		n, _, err := pc.ReadFrom(buf)
		if err != nil {
			return fmt.Errorf("no reply to the grant: %w", err)
		}
		if typ, _ := proto.PacketType(buf[:n]); typ != proto.TypeTransport {
			continue
		}
		t, err := proto.ParseTransport(buf[:n])
		if err != nil {
			return err
		}
		b, err := ses.Open(t)
		if err != nil {
			return err
		}
		rep, err := proto.ParseReply(b)
		if err != nil {
			return err
		}
		if rep.Reason != proto.OK {
			return &proto.Error{Op: proto.OpGrant, Reason: rep.Reason}
		}
		return nil
	}
}

// family6Grant is a grant request (id 1) toward server with its address
// written as family 6 and 16 bytes whatever it is (an IPv4 address as its
// IPv4-mapped form): a grant toward a placeholder IPv6 address, then its
// 16 address bytes replaced (header 8 bytes, family byte, address).
func family6Grant(server netip.AddrPort) ([]byte, error) {
	msg, err := proto.MarshalRequest(proto.NewRequest(1, &proto.GrantRequest{Server: netip.AddrPortFrom(netip.MustParseAddr("2001:db8::1"), server.Port())}))
	if err != nil {
		return nil, err
	}
	if len(msg) < 25 || msg[8] != 6 {
		return nil, fmt.Errorf("internal: grant request layout %x is not header+family 6+address", msg)
	}
	a := server.Addr().As16()
	copy(msg[9:25], a[:])
	return msg, nil
}
