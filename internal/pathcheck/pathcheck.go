// Package pathcheck finds out whether MPTCP options survive a path, the
// way tracebox does: it sends TCP SYNs carrying MPTCP options with
// increasing TTLs, reads what each router quotes back in its ICMP
// time-exceeded error (the packet as it arrived there), compares that
// with what was sent, and reads the final SYN/ACK to see whether the
// server answered MP_CAPABLE. A path is the default one to the server, a
// NAT detour (probes go to the relay's granted address:port) or a tunnel
// detour (probes leave from the tunnel's address or device).
//
// Both families: an IPv4 path's probes are IPv4 packets, an IPv6 path's
// IPv6 packets (the path's destination says which; one run may mix them).
// It uses raw sockets (a probe tool, not a data plane): for IPv4
// IP_HDRINCL for the probes, a raw TCP socket for SYN/ACKs and RSTs and a
// raw ICMP socket for the errors; for IPv6 (which has no header-including
// send) a raw TCP socket that sends the TCP segment with the hop limit in
// a control message and receives the answers, and a raw ICMPv6 socket
// filtered to the error types; all opened in the namespace given. The SYN/ACKs are answered
// by the host's own kernel with a RST (no socket owns the probe's port),
// so no half-open connection stays on the server.
package pathcheck

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"

	"github.com/mpdetour/mpdetour/internal/mptcpwire"
	"github.com/mpdetour/mpdetour/internal/netnsx"
)

// Path kinds.
const (
	Default = "default"
	NAT     = "nat"
	Tunnel  = "tunnel"
)

// Path is one way to the server to probe.
type Path struct {
	Name string `json:"name"` // e.g. "default", "nat:detour1", "tunnel:wg0"
	Kind string `json:"kind"` // default, nat, tunnel
	// Dst is where the probes go: the server, or a NAT detour's relay
	// address and port.
	Dst netip.AddrPort `json:"dst"`
	// Src is the source address (a tunnel's); invalid = the route's.
	Src netip.Addr `json:"src,omitzero"`
	// Device binds the probes to an interface (a tunnel's), optional.
	Device string `json:"device,omitempty"`
}

// Probe kinds.
const (
	ProbeCapable = "mp_capable" // SYN with MP_CAPABLE (a new MPTCP connection)
	ProbeJoin    = "mp_join"    // SYN with MP_JOIN (a subflow), random token
)

// Options configure Run.
type Options struct {
	Paths []Path
	// Netns is the namespace to probe from ("" = ours; a name or path).
	Netns string
	// MaxTTL is the last TTL tried (default 16); with NoTTL one probe per
	// path goes out with TTL 64 (no per-hop view, only the final answer).
	MaxTTL int
	NoTTL  bool
	// Wait is how long to wait for an answer to each probe (default 1 s).
	Wait time.Duration
	// Join adds the MP_JOIN probe to MP_CAPABLE.
	Join bool
}

// Change is one field that differed between the probe sent and what a
// hop quoted (or, for the final answer, what the server's answer says).
type Change struct {
	Field string `json:"field"`
	Sent  string `json:"sent"`
	Seen  string `json:"seen"`
}

// MPTCP option states at a hop.
const (
	Intact    = "intact"
	Removed   = "removed"
	Modified  = "modified"
	Truncated = "not quoted" // the quote ended before the options
)

// Hop is what one TTL told.
type Hop struct {
	TTL int `json:"ttl"`
	// From is the router that answered (invalid: no answer within Wait).
	From netip.Addr `json:"from,omitzero"`
	// ICMP is the error's type: "time-exceeded", "unreachable code N", or
	// "" for no answer.
	ICMP string `json:"icmp,omitempty"`
	// MPTCP is what became of the probe's MPTCP option by this hop.
	MPTCP   string   `json:"mptcp,omitempty"`
	Changes []Change `json:"changes,omitempty"`
	RTTms   float64  `json:"rtt_ms,omitempty"`
}

// Final is the end host's answer.
type Final struct {
	From  netip.AddrPort `json:"from"`
	Flags string         `json:"flags"` // SA, R, RA
	// MPTCP is the MPTCP option the answer carried ("" none), e.g.
	// MP_CAPABLE or MP_TCPRST.
	MPTCP   string   `json:"mptcp,omitempty"`
	Options []string `json:"options"`
	RTTms   float64  `json:"rtt_ms"`
}

// ProbeResult is one probe kind's sweep over one path.
type ProbeResult struct {
	Probe string `json:"probe"`
	Hops  []Hop  `json:"hops,omitempty"`
	Final *Final `json:"final,omitempty"`
	// LostAfter/LostAt: the option was seen intact at hop LostAfter (0 =
	// at the sender) and removed or modified at hop LostAt (0 = unknown).
	LostAfter int    `json:"lost_after,omitempty"`
	LostAt    int    `json:"lost_at,omitempty"`
	LostHow   string `json:"lost_how,omitempty"`
}

// Verdicts of a path.
const (
	OK          = "ok"             // the server answered MP_CAPABLE
	Stripped    = "mptcp-stripped" // a hop removed or changed the MPTCP option
	NoMPTCP     = "no-mptcp"       // the server answered plain TCP, no hop to blame
	Closed      = "closed"         // RST: nothing listens there
	Unreachable = "unreachable"    // no answer from the end
	Failed      = "error"          // the probe could not be sent
)

// PathResult is the outcome for one path.
type PathResult struct {
	Path    Path          `json:"path"`
	Verdict string        `json:"verdict"`
	Detail  string        `json:"detail"`
	Probes  []ProbeResult `json:"probes"`
}

// Report is the outcome of Run.
type Report struct {
	Paths []PathResult `json:"paths"`
}

// Run probes every path in turn.
func Run(ctx context.Context, o Options) (*Report, error) {
	if len(o.Paths) == 0 {
		return nil, errors.New("path-check: no path to probe")
	}
	if o.MaxTTL <= 0 {
		o.MaxTTL = 16
	}
	if o.MaxTTL > 64 {
		return nil, fmt.Errorf("path-check: max TTL %d above 64", o.MaxTTL)
	}
	if o.Wait <= 0 {
		o.Wait = time.Second
	}
	for i, p := range o.Paths {
		if err := checkAddrs(p); err != nil {
			return nil, fmt.Errorf("path-check: path %q: %w", p.Name, err)
		}
		if p.Name == "" {
			o.Paths[i].Name = p.Kind
		}
	}
	rep := &Report{}
	for _, p := range o.Paths {
		if err := ctx.Err(); err != nil {
			return rep, err
		}
		rep.Paths = append(rep.Paths, runPath(ctx, o, p))
	}
	crossCheck(rep)
	return rep, nil
}

// checkAddrs refuses what no probe can be sent to or from: a destination
// without a port, an IPv4-mapped IPv6 address (say the IPv4 address), a
// zone (a link-local server is not a path through routers), the
// unspecified address, a source of the other family.
func checkAddrs(p Path) error {
	d := p.Dst.Addr()
	switch {
	case !d.IsValid() || p.Dst.Port() == 0:
		return fmt.Errorf("destination %v must be an address with a port", p.Dst)
	case d.Is4In6():
		return fmt.Errorf("destination %v is an IPv4-mapped IPv6 address: give the IPv4 address %v", p.Dst, d.Unmap())
	case d.Zone() != "" || d.IsLinkLocalUnicast():
		return fmt.Errorf("destination %v is link-local: no path through routers to probe", p.Dst)
	case d.IsUnspecified() || d.IsMulticast():
		return fmt.Errorf("destination %v is not a unicast address", p.Dst)
	case p.Src.IsValid() && (p.Src.Is4() != d.Is4() || p.Src.Is4In6() || p.Src.Zone() != ""):
		return fmt.Errorf("source %v does not fit destination %v: a probe's addresses are of one family (no IPv4-mapped or zoned source)", p.Src, p.Dst)
	}
	return nil
}

// sockets are one path's raw sockets.
type sockets struct {
	v6   bool
	send *ipv4.RawConn // IPv4: IP_HDRINCL, sends the probes
	tcp  *ipv4.RawConn // IPv4: receives TCP answers
	// IPv6: sends the probes' TCP segments (hop limit per probe) and
	// receives TCP answers (an IPv6 raw socket never carries the header).
	tcp6 *ipv6.PacketConn
	icmp net.PacketConn
	src  netip.Addr
}

func (s *sockets) close() {
	if s.send != nil {
		s.send.Close()
	}
	if s.tcp != nil {
		s.tcp.Close()
	}
	if s.tcp6 != nil {
		s.tcp6.Close()
	}
	if s.icmp != nil {
		s.icmp.Close()
	}
}

func bindDevice(c syscall.Conn, dev string) error {
	if dev == "" {
		return nil
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.BindToDevice(int(fd), dev) }); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("bind to device %s: %w", dev, serr)
	}
	return nil
}

// rawSocket opens the raw socket that sends a path's probes, bound to the
// source (so that source-based routing, a tunnel's, applies) and to the
// device when the path names one.
func rawSocket(network string, src netip.Addr, dev string) (*net.IPConn, error) {
	pc, err := net.ListenPacket(network, src.String())
	if err != nil {
		return nil, fmt.Errorf("raw socket %s (needs root or CAP_NET_RAW): %w", network, err)
	}
	if err := bindDevice(pc.(*net.IPConn), dev); err != nil {
		pc.Close()
		return nil, err
	}
	return pc.(*net.IPConn), nil
}

func openSockets(o Options, p Path) (*sockets, error) {
	s := &sockets{v6: p.Dst.Addr().Is6()}
	err := netnsx.Do(o.Netns, func() error {
		// The source address: the given one, or the one the route picks
		// (a UDP "connection" sends nothing).
		s.src = p.Src
		if !s.src.IsValid() {
			d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
				var serr error
				if p.Device != "" {
					if err := c.Control(func(fd uintptr) { serr = unix.BindToDevice(int(fd), p.Device) }); err != nil {
						return err
					}
				}
				return serr
			}}
			u, err := d.Dial(map[bool]string{false: "udp4", true: "udp6"}[s.v6], p.Dst.String())
			if err != nil {
				return fmt.Errorf("no route to %s: %w", p.Dst, err)
			}
			s.src = u.LocalAddr().(*net.UDPAddr).AddrPort().Addr().Unmap()
			u.Close()
		}
		if s.v6 {
			return s.open6(p)
		}
		// The send socket is bound to the source so that source-based
		// routing (a tunnel's) applies to the probes.
		pc, err := rawSocket("ip4:tcp", s.src, p.Device)
		if err != nil {
			return err
		}
		if s.send, err = ipv4.NewRawConn(pc); err != nil {
			pc.Close()
			return err
		}
		// The receiving sockets: bound to the source address, every TCP
		// segment and ICMP message to it is copied here.
		rc, err := net.ListenPacket("ip4:tcp", s.src.String())
		if err != nil {
			return fmt.Errorf("raw TCP socket: %w", err)
		}
		if s.tcp, err = ipv4.NewRawConn(rc); err != nil {
			rc.Close()
			return err
		}
		if s.icmp, err = net.ListenPacket("ip4:icmp", s.src.String()); err != nil {
			return fmt.Errorf("raw ICMP socket: %w", err)
		}
		return nil
	})
	if err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

// open6 opens an IPv6 path's sockets (in the probe's namespace): one raw
// TCP socket bound to the source (and device) that sends the probes and
// receives the answers, and a raw ICMPv6 socket that lets only the error
// types through (no neighbour discovery chatter).
func (s *sockets) open6(p Path) error {
	pc, err := rawSocket("ip6:tcp", s.src, p.Device)
	if err != nil {
		return err
	}
	s.tcp6 = ipv6.NewPacketConn(pc)
	ic, err := net.ListenPacket("ip6:ipv6-icmp", s.src.String())
	if err != nil {
		return fmt.Errorf("raw ICMPv6 socket: %w", err)
	}
	s.icmp = ic
	var f ipv6.ICMPFilter
	f.SetAll(true)
	for _, t := range []ipv6.ICMPType{ipv6.ICMPTypeDestinationUnreachable, ipv6.ICMPTypeTimeExceeded, ipv6.ICMPTypeParameterProblem} {
		f.Accept(t)
	}
	if err := ipv6.NewPacketConn(ic).SetICMPFilter(&f); err != nil {
		return fmt.Errorf("ICMPv6 filter: %w", err)
	}
	return nil
}

// answer is something received that may belong to a probe.
type answer struct {
	at    time.Time
	from  netip.Addr
	icmp  string             // non-empty: an ICMP error quoting quote
	quote *mptcpwire.Segment // the quoted probe
	trunc bool               // the quote was cut
	seg   *mptcpwire.Segment // a TCP answer from the end host
}

// readers feed answers into ch until the sockets close.
func (s *sockets) readers(ch chan<- answer, done <-chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	wg.Add(2)
	send := func(a answer) {
		select {
		case ch <- a:
		case <-done:
		}
	}
	go func() {
		defer wg.Done()
		buf := make([]byte, 65536)
		for {
			seg, err := s.readTCP(buf)
			if err != nil {
				return
			}
			if seg != nil {
				send(answer{at: time.Now(), from: seg.Src, seg: seg})
			}
		}
	}()
	go func() {
		defer wg.Done()
		buf := make([]byte, 65536)
		for {
			n, from, err := s.icmp.ReadFrom(buf)
			if err != nil {
				return
			}
			at := time.Now()
			a, ok := parseICMP(buf[:n], s.v6)
			if !ok {
				continue
			}
			a.at = at
			if ip, ok := from.(*net.IPAddr); ok {
				a.from, _ = netip.AddrFromSlice(ip.IP)
				a.from = a.from.Unmap()
			}
			send(a)
		}
	}()
	return &wg
}

// readTCP reads one TCP segment sent to the source: (nil, nil) for one
// that does not parse, an error when the socket is closed.
func (s *sockets) readTCP(buf []byte) (*mptcpwire.Segment, error) {
	if s.v6 {
		n, _, from, err := s.tcp6.ReadFrom(buf)
		if err != nil {
			return nil, err
		}
		ip, ok := from.(*net.IPAddr)
		if !ok {
			return nil, nil
		}
		src, _ := netip.AddrFromSlice(ip.IP)
		seg, err := mptcpwire.ParseTCP(buf[:n], src, s.src)
		if err != nil {
			return nil, nil
		}
		return seg, nil
	}
	h, p, _, err := s.tcp.ReadFrom(buf)
	if err != nil {
		return nil, err
	}
	if h == nil || len(p) < 20 {
		return nil, nil
	}
	// Rebuild the packet for the parser (the header was split off).
	hb, err := h.Marshal()
	if err != nil {
		return nil, nil
	}
	full := append(hb, p...)
	binary.BigEndian.PutUint16(full[2:], uint16(len(full)))
	seg, _, err := mptcpwire.ParseIPv4(full, false)
	if err != nil {
		return nil, nil
	}
	return seg, nil
}

// parseICMP decodes an ICMP (v6: ICMPv6) error that quotes a TCP segment.
// Untrusted bytes: fuzzed (FuzzParseICMP).
func parseICMP(b []byte, v6 bool) (answer, bool) {
	proto, parse := 1, mptcpwire.ParseIPv4
	if v6 {
		proto, parse = 58, mptcpwire.ParseIPv6
	}
	m, err := icmp.ParseMessage(proto, b)
	if err != nil {
		return answer{}, false
	}
	var data []byte
	var kind string
	switch body := m.Body.(type) {
	case *icmp.TimeExceeded:
		data, kind = body.Data, "time-exceeded"
	case *icmp.DstUnreach:
		data, kind = body.Data, fmt.Sprintf("unreachable code %d", m.Code)
	case *icmp.ParamProb:
		data, kind = body.Data, "parameter problem"
	default:
		return answer{}, false
	}
	q, trunc, err := parse(data, true)
	if err != nil {
		return answer{}, false
	}
	return answer{icmp: kind, quote: q, trunc: trunc}, true
}

func random32() uint32 {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return binary.BigEndian.Uint32(b[:])
}

// probePort picks a source port from the top of the ephemeral range,
// where the kernel rarely has sockets.
func probePort() uint16 { return uint16(50000 + random32()%10000) }

func (s *sockets) build(p Path, kind string, ttl int, port uint16, seq uint32) (*mptcpwire.Segment, error) {
	seg := &mptcpwire.Segment{
		Src: s.src, Dst: p.Dst.Addr(), TTL: uint8(ttl), ID: uint16(random32()),
		SrcPort: port, DstPort: p.Dst.Port(), Seq: seq, Flags: mptcpwire.SYN, Window: 64240,
		Options: []mptcpwire.Option{
			{Kind: mptcpwire.OptMSS, Data: []byte{0x05, 0xb4}},
			{Kind: mptcpwire.OptSACKPerm},
			{Kind: mptcpwire.OptNOP},
			{Kind: mptcpwire.OptWScale, Data: []byte{7}},
		},
	}
	switch kind {
	case ProbeCapable:
		seg.Options = append(seg.Options, mptcpwire.CapableSYN())
	case ProbeJoin:
		seg.Options = append(seg.Options, mptcpwire.JoinSYN(1, false, random32(), random32()))
	}
	return seg, nil
}

func (s *sockets) sendSeg(seg *mptcpwire.Segment) error {
	if s.v6 {
		t, err := seg.MarshalTCP()
		if err != nil {
			return err
		}
		// The kernel writes the IPv6 header: hop limit per probe, the
		// traffic class the socket's (0, as the probe says).
		_, err = s.tcp6.WriteTo(t, &ipv6.ControlMessage{HopLimit: int(seg.TTL)}, &net.IPAddr{IP: seg.Dst.AsSlice()})
		return err
	}
	b, err := seg.Marshal()
	if err != nil {
		return err
	}
	h, err := ipv4.ParseHeader(b[:20])
	if err != nil {
		return err
	}
	return s.send.WriteTo(h, b[20:], nil)
}

func runPath(ctx context.Context, o Options, p Path) PathResult {
	res := PathResult{Path: p}
	s, err := openSockets(o, p)
	if err != nil {
		res.Verdict, res.Detail = Failed, err.Error()
		return res
	}
	res.Path.Src = s.src
	ch := make(chan answer, 64)
	done := make(chan struct{})
	wg := s.readers(ch, done)
	defer func() {
		close(done)
		s.close()
		wg.Wait()
	}()
	kinds := []string{ProbeCapable}
	if o.Join {
		kinds = append(kinds, ProbeJoin)
	}
	for _, k := range kinds {
		pr, err := sweep(ctx, o, p, s, k, ch)
		if err != nil {
			res.Verdict, res.Detail = Failed, err.Error()
			return res
		}
		res.Probes = append(res.Probes, pr)
	}
	res.Verdict, res.Detail = verdict(res.Probes)
	return res
}

// sweep sends one probe kind with TTL 1, 2, ... until the end host
// answers (or MaxTTL), waiting up to Wait for each.
func sweep(ctx context.Context, o Options, p Path, s *sockets, kind string, ch <-chan answer) (ProbeResult, error) {
	pr := ProbeResult{Probe: kind}
	port := probePort()
	first, last := 1, o.MaxTTL
	if o.NoTTL {
		first, last = 64, 64
	}
	for ttl := first; ttl <= last; ttl++ {
		seq := random32()
		seg, err := s.build(p, kind, ttl, port, seq)
		if err != nil {
			return pr, err
		}
		sent := time.Now()
		if err := s.sendSeg(seg); err != nil {
			return pr, fmt.Errorf("send probe to %s: %w", p.Dst, err)
		}
		timer := time.NewTimer(o.Wait)
		hop := Hop{TTL: ttl}
		var final *Final
	wait:
		for {
			select {
			case <-ctx.Done():
				timer.Stop()
				return pr, ctx.Err()
			case <-timer.C:
				break wait
			case a := <-ch:
				switch {
				case a.quote != nil:
					if a.quote.SrcPort != port || a.quote.Seq != seq {
						continue
					}
					hop.From, hop.ICMP = a.from, a.icmp
					hop.RTTms = ms(a.at.Sub(sent))
					hop.MPTCP, hop.Changes = compare(seg, a.quote, a.trunc)
					break wait
				case a.seg != nil:
					t := a.seg
					if t.DstPort != port || t.SrcPort != p.Dst.Port() || t.Src != p.Dst.Addr() || t.Flags&(mptcpwire.SYN|mptcpwire.RST) == 0 {
						continue
					}
					if t.Flags&mptcpwire.ACK != 0 && t.Ack != seq+1 {
						continue
					}
					final = finalOf(t, a.at.Sub(sent))
					break wait
				}
			}
		}
		timer.Stop()
		if final != nil {
			pr.Final = final
			break
		}
		if !o.NoTTL {
			pr.Hops = append(pr.Hops, hop)
		}
		// An ICMP unreachable ends the sweep: nothing further will answer.
		if hop.ICMP != "" && hop.ICMP != "time-exceeded" {
			break
		}
	}
	// Where the option was lost: the last hop that quoted it intact, and
	// the first after it that quoted it removed or changed.
	seenIntact := 0
	for _, h := range pr.Hops {
		switch h.MPTCP {
		case Intact:
			seenIntact = h.TTL
		case Removed, Modified:
			if pr.LostAt == 0 {
				pr.LostAfter, pr.LostAt, pr.LostHow = seenIntact, h.TTL, h.MPTCP
			}
		}
	}
	return pr, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func finalOf(t *mptcpwire.Segment, rtt time.Duration) *Final {
	f := &Final{From: netip.AddrPortFrom(t.Src, t.SrcPort), Flags: mptcpwire.FlagString(t.Flags), RTTms: ms(rtt)}
	for _, o := range mptcpwire.Meaningful(t.Options) {
		f.Options = append(f.Options, o.String())
		if o.Kind == mptcpwire.OptMPTCP && f.MPTCP == "" {
			f.MPTCP = o.Name()
		}
	}
	if f.Options == nil {
		f.Options = []string{}
	}
	return f
}

// compare says what became of the probe by the time a hop quoted it.
func compare(sent, seen *mptcpwire.Segment, trunc bool) (string, []Change) {
	var ch []Change
	add := func(field string, a, b any) {
		if fmt.Sprint(a) != fmt.Sprint(b) {
			ch = append(ch, Change{Field: field, Sent: fmt.Sprint(a), Seen: fmt.Sprint(b)})
		}
	}
	add("ip.tos", sent.TOS, seen.TOS)
	add("ip.src", sent.Src, seen.Src)
	add("ip.dst", sent.Dst, seen.Dst)
	add("tcp.sport", sent.SrcPort, seen.SrcPort)
	add("tcp.dport", sent.DstPort, seen.DstPort)
	add("tcp.seq", sent.Seq, seen.Seq)
	if trunc && len(seen.Options) == 0 && seen.Window == 0 {
		return Truncated, ch
	}
	add("tcp.window", sent.Window, seen.Window)
	add("tcp.flags", mptcpwire.FlagString(sent.Flags), mptcpwire.FlagString(seen.Flags))
	so, qo := mptcpwire.Meaningful(sent.Options), mptcpwire.Meaningful(seen.Options)
	state := Intact
	for _, o := range so {
		var match *mptcpwire.Option
		for i := range qo {
			if qo[i].Kind == o.Kind && qo[i].Subtype() == o.Subtype() {
				match = &qo[i]
				break
			}
		}
		switch {
		case match == nil && trunc:
			if o.Kind == mptcpwire.OptMPTCP {
				state = Truncated
			}
		case match == nil:
			ch = append(ch, Change{Field: "option " + o.Name(), Sent: o.String(), Seen: "removed"})
			if o.Kind == mptcpwire.OptMPTCP {
				state = Removed
			}
		case !match.Equal(o):
			ch = append(ch, Change{Field: "option " + o.Name(), Sent: fmt.Sprintf("%x", o.Data), Seen: fmt.Sprintf("%x", match.Data)})
			if o.Kind == mptcpwire.OptMPTCP {
				state = Modified
			}
		}
	}
	for _, q := range qo {
		found := false
		for _, o := range so {
			if q.Kind == o.Kind && q.Subtype() == o.Subtype() {
				found = true
			}
		}
		if !found {
			ch = append(ch, Change{Field: "option " + q.Name(), Sent: "absent", Seen: q.String()})
		}
	}
	return state, ch
}

// verdict sums a path's probes up.
func verdict(prs []ProbeResult) (string, string) {
	c := prs[0] // MP_CAPABLE
	lost := func(pr ProbeResult) string {
		return fmt.Sprintf("%s %s between hop %d and hop %d", pr.Probe, pr.LostHow, pr.LostAfter, pr.LostAt)
	}
	var extra string
	for _, pr := range prs[1:] {
		if pr.LostAt > 0 {
			extra = "; " + lost(pr)
		}
	}
	switch {
	case c.Final == nil:
		if c.LostAt > 0 {
			return Stripped, lost(c) + "; no answer from the end" + extra
		}
		return Unreachable, "no SYN/ACK or RST from the end" + extra
	case c.Final.Flags == "SA" && c.Final.MPTCP == "MP_CAPABLE":
		if extra != "" {
			return Stripped, "the server answered MP_CAPABLE, but" + extra[1:] + " (subflows through this path would fail)"
		}
		return OK, "the server answered MP_CAPABLE: MPTCP options survive this path"
	case c.Final.Flags == "SA":
		if c.LostAt > 0 {
			return Stripped, lost(c) + "; the server answered plain TCP" + extra
		}
		return NoMPTCP, "the server answered plain TCP (it does not speak MPTCP, or a hop that sends no ICMP strips the option)" + extra
	default:
		return Closed, "the end answered " + c.Final.Flags + " (nothing listens there)" + extra
	}
}

// crossCheck: a path whose server answered plain TCP while another path
// to the same server got MP_CAPABLE loses MPTCP on the way.
func crossCheck(rep *Report) {
	mptcpServers := map[netip.AddrPort]bool{}
	for _, pr := range rep.Paths {
		if pr.Verdict == OK && len(pr.Probes) > 0 && pr.Probes[0].Final != nil {
			mptcpServers[pr.Probes[0].Final.From] = true
		}
	}
	for i, pr := range rep.Paths {
		if pr.Verdict != NoMPTCP || len(pr.Probes) == 0 || pr.Probes[0].Final == nil {
			continue
		}
		// NAT detours answer from the relay: compare by kind of answer.
		for s := range mptcpServers {
			if s == pr.Probes[0].Final.From || pr.Path.Kind == NAT {
				rep.Paths[i].Verdict = Stripped
				rep.Paths[i].Detail = "the server answered plain TCP here but MP_CAPABLE on another path: the option is lost on the way (by a hop that sent no ICMP error, or unprobed with --no-ttl)"
				break
			}
		}
	}
}
