package mptcppm_test

import (
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/mptcppm"
	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
)

// What cross-family detours rely on, against the kernel (6.18): the
// userspace PM accepts a SUBFLOW_CREATE of the other family than the
// connection's initial subflow when the MPTCP socket is an AF_INET6 one:
// an IPv4 subflow in an IPv6 connection, and an IPv6 subflow in an IPv4
// connection made from an AF_INET6 socket (IPv4-mapped, what dual-stack
// programs do); the subflow comes up and carries data. An AF_INET socket
// takes only IPv4 subflows ("families mismatch"), and a local address of
// one family with a remote of the other is refused.
func TestCrossFamilySubflow(t *testing.T) {
	testenv.MPTCP(t)
	testenv.Tools(t, "ip")
	c, s := netnstest.New(t, "txc"), netnstest.New(t, "txs")
	for _, ns := range []*netnstest.NS{c, s} {
		for _, k := range []string{"net/ipv6/conf/all/disable_ipv6", "net/ipv6/conf/default/disable_ipv6"} {
			if err := ns.Sysctl(k, "0"); err != nil {
				t.Fatal(err)
			}
		}
	}
	cdev, sdev := netnstest.Link(t, c, "10.0.7.1/24", s, "10.0.7.2/24")
	c.Addr(t, cdev, "fd6c:7::1/64")
	s.Addr(t, sdev, "fd6c:7::2/64")
	if err := c.Sysctl("net/mptcp/pm_type", "1"); err != nil {
		t.Fatal(err)
	}
	s.Run("ip", "mptcp", "limits", "set", "subflows", "8", "add_addr_accepted", "8")
	var lc net.ListenConfig
	lc.SetMultipathTCP(true)
	ln, err := s.Listen(lc, "tcp", "[::]:5202") // dual-stack listener
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	netnstest.Serve(ln, func(c net.Conn) { io.Copy(c, c); c.Close() })
	events := listen(t, c.Name, "client")
	pm, err := mptcppm.Dial(mptcppm.Options{NetNS: c.Name})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pm.Close() })

	v4 := [2]netip.Addr{netip.MustParseAddr("10.0.7.1"), netip.MustParseAddr("10.0.7.2")}
	v6 := [2]netip.Addr{netip.MustParseAddr("fd6c:7::1"), netip.MustParseAddr("fd6c:7::2")}
	for _, tc := range []struct {
		name       string
		start, add [2]netip.Addr // client, server
		inet6      bool          // the client socket is AF_INET6 (an IPv4 connection IPv4-mapped)
		refused    bool          // the kernel refuses the added subflow
	}{
		{"v4 connection on AF_INET, v6 subflow refused", v4, v6, false, true},
		{"v4 connection on AF_INET6, v6 subflow", v4, v6, true, false},
		{"v6 connection, v4 subflow", v6, v4, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &net.Dialer{Timeout: 5 * time.Second}
			d.SetMultipathTCP(true)
			if tc.inet6 && tc.start[1].Is4() {
				// A local address of :: makes Go open an AF_INET6 socket
				// (not IPv6-only) for the IPv4 destination.
				d.LocalAddr = &net.TCPAddr{IP: net.IPv6unspecified}
			}
			conn, err := c.Dial(d, "tcp", netip.AddrPortFrom(tc.start[1], 5202).String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if _, err := conn.Write([]byte("hi")); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(conn, make([]byte, 2)); err != nil {
				t.Fatal(err)
			}
			go io.Copy(io.Discard, conn)
			est := waitEvent(t, events, mptcppm.EventEstablished, 0)
			tok := est.Token
			// The agent tells the two kinds of IPv4 connection apart by the
			// event: an AF_INET6 socket's carries IPv4-mapped addresses.
			if mapped := est.Local.Addr().Is4In6(); tc.start[0].Is4() && mapped != tc.inet6 {
				t.Fatalf("ESTABLISHED local %v: IPv4-mapped %v, want %v", est.Local, mapped, tc.inet6)
			}
			// Mixed local and remote families: refused, nothing created.
			if err := pm.SubflowCreate(tok, mptcppm.Addr{IP: tc.start[0]}, mptcppm.Addr{IP: tc.add[1], Port: 5202}); err == nil {
				t.Fatalf("SUBFLOW_CREATE %s -> %s (mixed families) accepted", tc.start[0], tc.add[1])
			} else {
				t.Logf("mixed families refused: %v", err)
			}
			err = pm.SubflowCreate(tok, mptcppm.Addr{IP: tc.add[0]}, mptcppm.Addr{IP: tc.add[1], Port: 5202})
			if tc.refused {
				if err == nil {
					t.Fatalf("SUBFLOW_CREATE %s -> %s on an AF_INET socket accepted", tc.add[0], tc.add[1])
				}
				t.Logf("refused as expected: %v", err)
				return
			}
			if err != nil {
				t.Fatalf("SUBFLOW_CREATE %s -> %s: %v", tc.add[0], tc.add[1], err)
			}
			sub := waitEvent(t, events, mptcppm.EventSubEstablished, tok)
			if sub.Remote.Addr().Unmap() != tc.add[1] {
				t.Fatalf("SUB_ESTABLISHED to %v, want %v", sub.Remote, tc.add[1])
			}
			// Write until the subflow has carried data (a fixed time is
			// too short on a loaded machine), at most 5 s.
			stop := netnstest.KeepWriting(conn)
			local := netip.MustParseAddrPort(conn.LocalAddr().String())
			var s mptcppm.Subflow
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				var found bool
				s, found, err = mptcppm.FindSubflow(mptcppm.Options{NetNS: c.Name}, local, func(s mptcppm.Subflow) bool { return s.Remote.Addr().Unmap() == tc.add[1] })
				if err != nil || !found {
					stop()
					t.Fatalf("the %s subflow in inet_diag: found %v, %v", tc.add[1], found, err)
				}
				if s.BytesAcked > 0 || time.Now().After(deadline) {
					break
				}
			}
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			if s.BytesAcked == 0 {
				t.Fatalf("the cross-family subflow carried no data in 5 s of writing")
			}
			t.Logf("cross-family subflow %v -> %v: %d bytes acknowledged", s.Local, s.Remote, s.BytesAcked)
		})
	}
}
