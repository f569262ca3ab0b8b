package agent_test

import (
	"context"
	"io"
	"net"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/agent"
	"github.com/mpdetour/mpdetour/internal/detour"
	"github.com/mpdetour/mpdetour/internal/detour/static"
	"github.com/mpdetour/mpdetour/internal/mptcppm"
	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
)

// Against the kernel: an IPv4 connection from an AF_INET6 socket gets the
// IPv6 detour toward the server's mapped IPv6 address (the NAT-kind detour
// here leads straight to it, no relay), from the source address the
// namespace's routes give; the subflow comes up.
func TestAgentCrossFamilyNetns(t *testing.T) {
	testenv.MPTCP(t)
	testenv.Tools(t, "ip")
	c, s := netnstest.New(t, "tgc"), netnstest.New(t, "tgs")
	for _, ns := range []*netnstest.NS{c, s} {
		for _, k := range []string{"net/ipv6/conf/all/disable_ipv6", "net/ipv6/conf/default/disable_ipv6"} {
			if err := ns.Sysctl(k, "0"); err != nil {
				t.Fatal(err)
			}
		}
	}
	cdev, sdev := netnstest.Link(t, c, "10.0.8.1/24", s, "10.0.8.2/24")
	c.Addr(t, cdev, "fd6c:8::1/64")
	s.Addr(t, sdev, "fd6c:8::2/64")
	s.Run("ip", "mptcp", "limits", "set", "subflows", "8", "add_addr_accepted", "8")
	var lc net.ListenConfig
	lc.SetMultipathTCP(true)
	ln, err := s.Listen(lc, "tcp", "[::]:5203")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	netnstest.Serve(ln, func(c net.Conn) { io.Copy(io.Discard, c); c.Close() })

	server4, server6 := netip.MustParseAddrPort("10.0.8.2:5203"), netip.MustParseAddrPort("[fd6c:8::2]:5203")
	d6 := static.Entry{Detour: detour.Detour{Kind: detour.NAT, Relay: "v6", Remote: server6},
		Servers: []netip.Prefix{netip.PrefixFrom(server6.Addr(), 128)}, Port: server6.Port()}
	sock := filepath.Join(t.TempDir(), "agent.sock")
	opts := agent.DefaultOptions()
	opts.NetNS, opts.Socket, opts.Subflows, opts.Probes = c.Name, sock, 1, t.TempDir()
	opts.OtherFamily = map[netip.Addr][]netip.Addr{server4.Addr(): {server6.Addr()}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ag := agentStart(ctx, t, opts, static.New([]static.Entry{d6}))
	defer ag()

	d := &net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.IPv6unspecified}}
	d.SetMultipathTCP(true)
	conn, err := c.Dial(d, "tcp", server4.String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stop := netnstest.KeepWriting(conn)
	defer stop()
	local := netip.MustParseAddrPort(conn.LocalAddr().String())
	deadline := time.Now().Add(5 * time.Second)
	for {
		sf, found, err := mptcppm.FindSubflow(mptcppm.Options{NetNS: c.Name}, local, func(s mptcppm.Subflow) bool {
			return s.Remote.Addr().Unmap() == server6.Addr() && s.BytesAcked > 0
		})
		if err != nil {
			t.Fatal(err)
		}
		if found {
			if sf.Local.Addr() != netip.MustParseAddr("fd6c:8::1") {
				t.Fatalf("IPv6 subflow from %v, want fd6c:8::1", sf.Local)
			}
			break
		}
		if time.Now().After(deadline) {
			st, _ := agent.FetchStatus(sock)
			t.Fatalf("no IPv6 subflow carrying data within 5s; status %+v", st.Connections)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The kernel's list can show the subflow carrying data before the agent
	// has handled its SUB_ESTABLISHED event: wait for the agent's view.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		st, err := agent.FetchStatus(sock)
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Connections) == 1 && st.Connections[0].Socket == "AF_INET6" && st.Families[1].Cross == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status: connections %+v, families %+v", st.Connections, st.Families)
		}
	}
}

// agentStart runs agent.RunLinux until the returned stop is called.
func agentStart(ctx context.Context, t *testing.T, opts agent.Options, srcs ...detour.Source) func() {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- agent.RunLinux(ctx, opts, nil, nil, srcs...) }()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := agent.FetchStatus(opts.Socket); err == nil {
			break
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatal("agent status socket never answered")
		}
	}
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent: %v", err)
		}
	}
}
