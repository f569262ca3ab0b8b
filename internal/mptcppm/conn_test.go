package mptcppm_test

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/mptcppm"
	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
	"golang.org/x/sys/unix"
)

var record = flag.Bool("record", false, "write the kernel's raw events to testdata/")

// pair is a client namespace on the userspace PM and a server namespace
// with two addresses, joined by one veth link.
type pair struct {
	c, s   *netnstest.NS
	server netip.AddrPort // first server address
	alt    netip.Addr     // second server address, for extra subflows
	ln     net.Listener
}

func newPair(t *testing.T) *pair {
	testenv.MPTCP(t)
	testenv.Tools(t, "ip", "ss")
	p := &pair{c: netnstest.New(t, "tac"), s: netnstest.New(t, "tas")}
	netnstest.Link(t, p.c, "10.0.1.1/24", p.s, "10.0.1.2/24")
	_, sdev := "", ""
	links := p.s.Run("ip", "-o", "link", "show", "type", "veth")
	sdev = strings.TrimSpace(strings.Split(strings.Split(links, ":")[1], "@")[0])
	p.s.Run("ip", "addr", "add", "10.0.1.3/24", "dev", sdev)
	p.c.Run("sysctl", "-qw", "net.mptcp.pm_type=1")
	p.s.Run("ip", "mptcp", "limits", "set", "subflows", "8", "add_addr_accepted", "8")
	p.server = netip.MustParseAddrPort("10.0.1.2:5201")
	p.alt = netip.MustParseAddr("10.0.1.3")
	var lc net.ListenConfig
	lc.SetMultipathTCP(true)
	ln, err := p.s.Listen(lc, "tcp", "0.0.0.0:5201")
	if err != nil {
		t.Fatal(err)
	}
	p.ln = ln
	t.Cleanup(func() { ln.Close() })
	netnstest.Serve(ln, func(c net.Conn) { io.Copy(c, c); c.Close() })
	return p
}

// commands opens a command socket in the client namespace, closed when
// the test ends.
func (p *pair) commands(t *testing.T) *mptcppm.Conn {
	t.Helper()
	pm, err := mptcppm.Dial(mptcppm.Options{NetNS: p.c.Name})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pm.Close() })
	return pm
}

func (p *pair) dial(t *testing.T) net.Conn {
	t.Helper()
	d := &net.Dialer{Timeout: 5 * time.Second}
	d.SetMultipathTCP(true)
	c, err := p.c.Dial(d, "tcp", p.server.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	// The client's MPTCP connection is fully established (ESTABLISHED
	// event) only once data flows.
	if _, err := c.Write([]byte("hi")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatal(err)
	}
	return c
}

// waitEvent returns the next event of type typ for token (0 = any),
// failing after a timeout. Events of other types are returned in skipped.
func waitEvent(t *testing.T, ch <-chan mptcppm.Event, typ mptcppm.EventType, token uint32) mptcppm.Event {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case ev := <-ch:
			t.Logf("event %v", ev)
			if ev.Type == typ && (token == 0 || ev.Token == token) {
				return ev
			}
		case <-deadline:
			t.Fatalf("no %s event for token %08x within 10s", typ, token)
		}
	}
}

// listen starts an event reader; with -record it also saves raw messages.
func listen(t *testing.T, ns, label string) <-chan mptcppm.Event {
	ev, err := mptcppm.ListenEvents(mptcppm.Options{NetNS: ns})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ev.Close() })
	ch := make(chan mptcppm.Event, 1024)
	seq := 0
	go func() {
		for {
			msgs, err := ev.ReceiveRaw()
			if err != nil {
				if !errors.Is(err, mptcppm.ErrEventsLost) {
					return
				}
				continue
			}
			for _, m := range msgs {
				typ := mptcppm.EventType(m.Header.Command)
				if *record {
					seq++
					name := fmt.Sprintf("%s-%s-%02d-%s.bin", strings.TrimPrefix(t.Name(), "Test"), label, seq, typ)
					_ = os.WriteFile(filepath.Join("testdata", name), m.Data, 0o644)
				}
				e, err := mptcppm.DecodeEvent(typ, m.Data)
				if err != nil {
					t.Errorf("decode kernel event %s: %v", typ, err)
					continue
				}
				ch <- e
			}
		}
	}()
	return ch
}

func mptcpInfo(t *testing.T, c net.Conn) mptcppm.MPTCPInfo {
	t.Helper()
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 256)
	var n int
	var serr error
	rc.Control(func(fd uintptr) {
		l := uint32(len(buf))
		_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, 284 /* SOL_MPTCP */, 1, /* MPTCP_INFO */
			uintptr(unsafePointer(buf)), uintptr(unsafePointer32(&l)), 0)
		if e != 0 {
			serr = e
		}
		n = int(l)
	})
	if serr != nil {
		t.Fatalf("getsockopt MPTCP_INFO: %v", serr)
	}
	info, err := mptcppm.DecodeMPTCPInfo(buf[:n])
	if err != nil {
		t.Fatal(err)
	}
	return info
}

func TestConnectionEvents(t *testing.T) {
	p := newPair(t)
	events := listen(t, p.c.Name, "client")
	c := p.dial(t)
	local := netip.MustParseAddrPort(c.LocalAddr().String())

	created := waitEvent(t, events, mptcppm.EventCreated, 0)
	if created.Token == 0 || created.Local != local || created.Remote != p.server || created.Family != unix.AF_INET {
		t.Fatalf("CREATED = %v, want local %s remote %s family 2 and a token", created, local, p.server)
	}
	est := waitEvent(t, events, mptcppm.EventEstablished, created.Token)
	if est.Local != local || est.Remote != p.server || est.Present.Has(mptcppm.AttrServerSide) && est.ServerSide != 0 {
		t.Fatalf("ESTABLISHED = %v", est)
	}
	if info := mptcpInfo(t, c); info.Token != created.Token {
		t.Fatalf("MPTCP_INFO token %08x, event token %08x", info.Token, created.Token)
	}
	c.Close()
	closed := waitEvent(t, events, mptcppm.EventClosed, created.Token)
	if closed.Present != 1<<mptcppm.AttrToken {
		t.Fatalf("CLOSED carries more than the token: %v", closed)
	}
}

func TestSubflowCreateSetFlagsDestroy(t *testing.T) {
	p := newPair(t)
	events := listen(t, p.c.Name, "client")
	sevents := listen(t, p.s.Name, "server")
	pm := p.commands(t)
	c := p.dial(t)
	local := netip.MustParseAddrPort(c.LocalAddr().String())
	est := waitEvent(t, events, mptcppm.EventEstablished, 0)
	tok := est.Token

	remote := mptcppm.Addr{IP: p.alt, Port: p.server.Port()}
	if err := pm.SubflowCreate(tok, mptcppm.Addr{IP: local.Addr()}, remote); err != nil {
		t.Fatalf("SUBFLOW_CREATE: %v", err)
	}
	sub := waitEvent(t, events, mptcppm.EventSubEstablished, tok)
	if sub.Remote != netip.AddrPortFrom(p.alt, p.server.Port()) || sub.Local.Addr() != local.Addr() || sub.Backup != 0 {
		t.Fatalf("SUB_ESTABLISHED = %v", sub)
	}
	if n := mptcpInfo(t, c).Subflows; n != 1 { // mptcpi_subflows counts joins
		t.Fatalf("MPTCP_INFO subflows = %d, want 1 extra subflow", n)
	}
	conns, err := mptcppm.Dump(mptcppm.Options{NetNS: p.c.Name})
	if err != nil {
		t.Fatal(err)
	}
	if len(conns) != 1 || conns[0].Token != tok || len(conns[0].Subflows) != 2 || conns[0].Remote != p.server {
		t.Fatalf("inet_diag dump = %+v, want token %08x with 2 subflows", conns, tok)
	}
	if conns[0].ServerSide {
		t.Error("client connection reported as server side")
	}
	if sconns, err := mptcppm.Dump(mptcppm.Options{NetNS: p.s.Name}); err != nil || len(sconns) != 1 || !sconns[0].ServerSide {
		t.Errorf("server-side dump = %+v, %v; want one server-side connection", sconns, err)
	}
	ss := p.c.Run("ss", "-Mn")
	if !strings.Contains(ss, p.server.String()) {
		t.Errorf("ss -M does not show the connection: %s", ss)
	}

	// Backup: set on the client, visible in the client's subflow flags and
	// reported to the server as MP_PRIO.
	if err := pm.SetBackup(tok, mptcppm.AddrFrom(sub.Local, 0), mptcppm.AddrFrom(sub.Remote, 0), true); err != nil {
		t.Fatalf("SET_FLAGS backup: %v", err)
	}
	prio := waitEvent(t, sevents, mptcppm.EventSubPriority, 0)
	// The Go server listens dual-stack: its events carry v4-mapped IPv6.
	if prio.Backup != 1 || netip.AddrPortFrom(prio.Remote.Addr().Unmap(), prio.Remote.Port()) != sub.Local {
		t.Fatalf("server SUB_PRIORITY = %v, want backup=1 from %s", prio, sub.Local)
	}
	conns, err = mptcppm.Dump(mptcppm.Options{NetNS: p.c.Name})
	if err != nil {
		t.Fatal(err)
	}
	backups := 0
	for _, sf := range conns[0].Subflows {
		if sf.Backup() {
			backups++
			if sf.Local != sub.Local || sf.Remote != sub.Remote {
				t.Errorf("backup flag on the wrong subflow %s -> %s", sf.Local, sf.Remote)
			}
		}
	}
	if backups != 1 {
		t.Fatalf("%d subflows flagged backup, want 1: %+v", backups, conns[0].Subflows)
	}

	if err := pm.SubflowDestroy(tok, mptcppm.AddrFrom(sub.Local, 0), mptcppm.AddrFrom(sub.Remote, 0)); err != nil {
		t.Fatalf("SUBFLOW_DESTROY: %v", err)
	}
	closed := waitEvent(t, events, mptcppm.EventSubClosed, tok)
	if closed.Remote != sub.Remote || closed.Local != sub.Local {
		t.Fatalf("SUB_CLOSED = %v, want %s -> %s", closed, sub.Local, sub.Remote)
	}
	// The connection still works on its initial subflow.
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo after destroy: %q %v", buf, err)
	}
}

func TestCommandErrors(t *testing.T) {
	p := newPair(t)
	events := listen(t, p.c.Name, "client")
	pm := p.commands(t)

	// Unknown connection.
	err := pm.SubflowCreate(0x1234abcd, mptcppm.Addr{IP: netip.MustParseAddr("10.0.1.1")}, mptcppm.Addr{IP: p.alt, Port: 5201})
	var pe *mptcppm.Error
	if !errors.As(err, &pe) || pe.Errno == 0 || pe.Cmd != "SUBFLOW_CREATE" || pe.Token != 0x1234abcd {
		t.Fatalf("SUBFLOW_CREATE on unknown token: %v, want an *mptcppm.Error with errno", err)
	}
	if !strings.Contains(err.Error(), "1234abcd") {
		t.Errorf("error does not name the token: %v", err)
	}

	c := p.dial(t)
	local := netip.MustParseAddrPort(c.LocalAddr().String())
	est := waitEvent(t, events, mptcppm.EventEstablished, 0)
	if err := pm.SubflowCreate(est.Token, mptcppm.Addr{IP: local.Addr()}, mptcppm.Addr{IP: p.alt, Port: 5201}); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, events, mptcppm.EventSubEstablished, est.Token)
	// The initial address with another id: the kernel refuses and says why.
	err = pm.SubflowCreate(est.Token, mptcppm.Addr{ID: 7, IP: local.Addr()}, mptcppm.Addr{IP: p.alt, Port: 5201})
	if !errors.As(err, &pe) || !errors.Is(err, unix.EINVAL) || pe.Msg == "" {
		t.Fatalf("SUBFLOW_CREATE with mismatched id: %v, want EINVAL with the kernel's extack message", err)
	}
	t.Logf("kernel explains: %v", err)
}

func TestLimitsAndEndpoints(t *testing.T) {
	testenv.MPTCP(t)
	ns := netnstest.New(t, "tal")
	netnstest.Link(t, ns, "10.0.9.1/24", netnstest.New(t, "tam"), "10.0.9.2/24")
	pm, err := mptcppm.Dial(mptcppm.Options{NetNS: ns.Name})
	if err != nil {
		t.Fatal(err)
	}
	defer pm.Close()
	want := mptcppm.Limits{AddAddrAccepted: 3, Subflows: 5}
	if err := pm.SetLimits(want); err != nil {
		t.Fatal(err)
	}
	got, err := pm.GetLimits()
	if err != nil || got != want {
		t.Fatalf("GET_LIMITS = %+v, %v; want %+v", got, err, want)
	}
	if out := ns.Run("ip", "mptcp", "limits", "show"); !strings.Contains(out, "subflows 5") {
		t.Fatalf("ip mptcp limits: %s", out)
	}
	ep := mptcppm.Addr{ID: 9, IP: netip.MustParseAddr("10.0.9.1"), Flags: mptcppm.FlagSubflow}
	if err := pm.AddAddr(ep); err != nil {
		t.Fatal(err)
	}
	addrs, err := pm.Addrs()
	if err != nil || len(addrs) != 1 || addrs[0].ID != 9 || addrs[0].IP != ep.IP || addrs[0].Flags&mptcppm.FlagSubflow == 0 {
		t.Fatalf("GET_ADDR dump = %v, %v", addrs, err)
	}
	if err := pm.SetFlags(0, mptcppm.Addr{ID: 9, IP: ep.IP, Flags: mptcppm.FlagBackup}, nil); err != nil {
		t.Fatal(err)
	}
	if out := ns.Run("ip", "mptcp", "endpoint", "show"); !strings.Contains(out, "backup") {
		t.Fatalf("SET_FLAGS backup not visible: %s", out)
	}
	if err := pm.FlushAddrs(); err != nil {
		t.Fatal(err)
	}
	if addrs, err := pm.Addrs(); err != nil || len(addrs) != 0 {
		t.Fatalf("after FLUSH: %v %v", addrs, err)
	}
	err = pm.DelAddr(mptcppm.Addr{ID: 9, IP: ep.IP})
	if err == nil || !strings.Contains(err.Error(), "DEL_ADDR") {
		t.Fatalf("DEL_ADDR of a flushed endpoint: %v, want an error naming the command", err)
	}
}

func TestAnnounceRemove(t *testing.T) {
	p := newPair(t)
	events := listen(t, p.c.Name, "client")
	sevents := listen(t, p.s.Name, "server")
	pm := p.commands(t)
	// The server (in-kernel PM) signals its second address.
	p.s.Run("ip", "mptcp", "endpoint", "add", p.alt.String(), "id", "5", "signal")
	c := p.dial(t)
	_ = c
	est := waitEvent(t, events, mptcppm.EventEstablished, 0)
	ann := waitEvent(t, events, mptcppm.EventAnnounced, est.Token)
	if ann.RemoteID != 5 || ann.Remote.Addr() != p.alt {
		t.Fatalf("ANNOUNCED = %v, want rem_id 5 for %s", ann, p.alt)
	}
	p.s.Run("ip", "mptcp", "endpoint", "delete", "id", "5")
	rm := waitEvent(t, events, mptcppm.EventRemoved, est.Token)
	if rm.RemoteID != 5 {
		t.Fatalf("REMOVED = %v, want rem_id 5", rm)
	}

	// The client announces an address of its own, then withdraws it.
	cdev := strings.TrimSpace(strings.Split(strings.Split(p.c.Run("ip", "-o", "link", "show", "type", "veth"), ":")[1], "@")[0])
	p.c.Run("ip", "addr", "add", "10.0.1.4/24", "dev", cdev)
	if err := pm.Announce(est.Token, mptcppm.Addr{ID: 3, IP: netip.MustParseAddr("10.0.1.4")}); err != nil {
		t.Fatalf("ANNOUNCE: %v", err)
	}
	sann := waitEvent(t, sevents, mptcppm.EventAnnounced, 0)
	if sann.RemoteID != 3 || sann.Remote.Addr().Unmap() != netip.MustParseAddr("10.0.1.4") {
		t.Fatalf("server ANNOUNCED = %v", sann)
	}
	if err := pm.Remove(est.Token, 3); err != nil {
		t.Fatalf("REMOVE: %v", err)
	}
	if srm := waitEvent(t, sevents, mptcppm.EventRemoved, sann.Token); srm.RemoteID != 3 {
		t.Fatalf("server REMOVED = %v", srm)
	}

	// A subflow toward a closed port fails asynchronously with its errno.
	if err := pm.SubflowCreate(est.Token, mptcppm.Addr{IP: netip.MustParseAddr("10.0.1.1")}, mptcppm.Addr{IP: p.alt, Port: 5999}); err != nil {
		t.Fatal(err)
	}
	sc := waitEvent(t, events, mptcppm.EventSubClosed, est.Token)
	if !sc.Present.Has(mptcppm.AttrError) || sc.Error != uint8(unix.ECONNREFUSED) {
		t.Fatalf("SUB_CLOSED = %v, want error %d", sc, unix.ECONNREFUSED)
	}
}

// A tunnel detour's subflow leaves from another local address, with a
// local id of its own.
func TestSubflowFromSecondAddress(t *testing.T) {
	p := newPair(t)
	events := listen(t, p.c.Name, "client2")
	pm := p.commands(t)
	cdev := strings.TrimSpace(strings.Split(strings.Split(p.c.Run("ip", "-o", "link", "show", "type", "veth"), ":")[1], "@")[0])
	p.c.Run("ip", "addr", "add", "10.0.1.5/24", "dev", cdev)
	p.dial(t)
	est := waitEvent(t, events, mptcppm.EventEstablished, 0)
	second := netip.MustParseAddr("10.0.1.5")
	if err := pm.SubflowCreate(est.Token, mptcppm.Addr{ID: 5, IP: second}, mptcppm.AddrFrom(p.server, 0)); err != nil {
		t.Fatalf("SUBFLOW_CREATE from a second address with id 5: %v", err)
	}
	sub := waitEvent(t, events, mptcppm.EventSubEstablished, est.Token)
	if sub.Local.Addr() != second || sub.LocalID != 5 || sub.Remote != p.server {
		t.Fatalf("SUB_ESTABLISHED = %v, want from %s with local id 5", sub, second)
	}
	// The same address under another id is refused.
	err := pm.SubflowCreate(est.Token, mptcppm.Addr{ID: 6, IP: second}, mptcppm.AddrFrom(netip.AddrPortFrom(p.alt, 5201), 0))
	if !errors.Is(err, unix.EINVAL) {
		t.Fatalf("second address under another id: %v, want EINVAL", err)
	}
}

// A burst the receive buffer cannot hold is reported as ErrEventsLost, and
// the socket keeps delivering afterwards.
func TestEventsLost(t *testing.T) {
	p := newPair(t)
	ev, err := mptcppm.ListenEvents(mptcppm.Options{NetNS: p.c.Name, ReadBuffer: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer ev.Close()
	for range 20 {
		p.dial(t).Close()
	}
	lost := false
	for {
		ev.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		_, err := ev.Receive()
		if errors.Is(err, mptcppm.ErrEventsLost) {
			lost = true
		} else if errors.Is(err, os.ErrDeadlineExceeded) {
			break // drained
		} else if err != nil {
			t.Fatalf("after the burst: %v", err)
		}
	}
	if !lost {
		t.Fatal("no ErrEventsLost after overflowing a minimal receive buffer")
	}
	ev.SetReadDeadline(time.Now().Add(10 * time.Second))
	got := make(chan mptcppm.Event, 64)
	go func() {
		defer close(got)
		for {
			evs, err := ev.Receive()
			if err != nil && !errors.Is(err, mptcppm.ErrEventsLost) {
				return
			}
			for _, e := range evs {
				got <- e
			}
		}
	}()
	c := p.dial(t)
	local := netip.MustParseAddrPort(c.LocalAddr().String())
	for e := range got {
		if e.Type == mptcppm.EventEstablished && e.Local == local {
			return
		}
	}
	t.Fatal("no event for a new connection after the overflow")
}

// ConnState looks one connection up by token: ESTABLISHED while it is,
// something else once the connection is closing, not found for a token
// the kernel does not know.
func TestConnState(t *testing.T) {
	p := newPair(t)
	events := listen(t, p.c.Name, "client")
	c := p.dial(t)
	tok := waitEvent(t, events, mptcppm.EventEstablished, 0).Token
	o := mptcppm.Options{NetNS: p.c.Name}
	if st, found, err := mptcppm.ConnState(o, tok); err != nil || !found || st != 1 {
		t.Fatalf("ConnState(%08x) = %d, %v, %v; want 1 (ESTABLISHED), found", tok, st, found, err)
	}
	if st, found, err := mptcppm.ConnState(o, tok+1); err != nil || found {
		t.Fatalf("ConnState of an unknown token = %d, %v, %v; want not found", st, found, err)
	}
	// The server's end is an AF_INET6 socket (Go's dual-stack listener on
	// 0.0.0.0): the AF_INET request finds it by token all the same (the
	// handler answers with the socket's own family).
	so := mptcppm.Options{NetNS: p.s.Name}
	conns, err := mptcppm.Dump(so)
	if err != nil {
		t.Fatal(err)
	}
	v6 := 0
	for _, sc := range conns {
		if !sc.Inet6 {
			continue
		}
		v6++
		if st, found, err := mptcppm.ConnState(so, sc.Token); err != nil || !found || st != sc.State {
			t.Errorf("ConnState of the AF_INET6 connection %08x = %d, %v, %v; want %d, found", sc.Token, st, found, err, sc.State)
		}
	}
	if v6 == 0 {
		t.Errorf("no AF_INET6 connection in the server's namespace: %+v", conns)
	}
	// Half-close: our DATA_FIN, then the echo server's.
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		st, found, err := mptcppm.ConnState(o, tok)
		if err != nil {
			t.Fatal(err)
		}
		if !found || st != 1 {
			t.Logf("after the half-close: state %d, found %v", st, found)
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("connection still ESTABLISHED 5 s after both DATA_FINs")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
