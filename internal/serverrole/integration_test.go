package serverrole_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/lab/labtest"
	"github.com/mpdetour/mpdetour/internal/mptcppm"
	"github.com/mpdetour/mpdetour/internal/netnsx"
	"github.com/mpdetour/mpdetour/internal/serverrole"
	"github.com/mpdetour/mpdetour/internal/testenv"
)

// clientEstablished returns the next client-side ESTABLISHED event.
func clientEstablished(t *testing.T, ev *mptcppm.Events) mptcppm.Event {
	t.Helper()
	ev.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		evs, err := ev.Receive()
		if errors.Is(err, mptcppm.ErrEventsLost) {
			continue
		}
		if err != nil {
			t.Fatalf("client events: %v", err)
		}
		for _, e := range evs {
			if e.Type == mptcppm.EventEstablished && e.Flags&2 == 0 && e.ServerSide == 0 {
				return e
			}
		}
	}
}

// In the detours lab (no delay): the server namespace runs the role (its
// event socket, the userspace PM switched on as the agent does), which
// announces the detour node's waypoint (a static NAT to the server) and
// sets the C flag. An unmodified client (Go's MPTCP socket, the in-kernel
// PM, only add_addr_accepted raised) opens a subflow through the waypoint
// that carries data, and its ESTABLISHED event carries the C flag
// (MPTCP_PM_EV_FLAG_DENY_JOIN_ID0) only once the role set it. Stopping the
// role restores the sysctl.
func TestAnnouncementOpensDetourSubflow(t *testing.T) {
	testenv.Root(t)
	testenv.MPTCP(t)
	testenv.Tools(t, "nft")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name := fmt.Sprintf("tsr%d", os.Getpid()%100000)
	l := labtest.UpDetours(ctx, t, name, 1)
	client, server, det := l.NetnsPath("client"), l.NetnsPath("server"), "detour1"
	serverAddr := netip.AddrPortFrom(l.Addr("server"), 5201)
	wp := netip.AddrPortFrom(l.Addr(det), 5201)

	// The waypoint: the detour node forwards its port 5201 to the server.
	nft := l.Command(ctx, det, "nft", "-f", "-")
	nft.Stdin = strings.NewReader(fmt.Sprintf(`table ip wp {
	chain pre { type nat hook prerouting priority dstnat; policy accept; fib daddr type local tcp dport 5201 counter dnat to %s; }
	chain post { type nat hook postrouting priority srcnat; policy accept; ct status dnat masquerade; }
}
`, serverAddr))
	if out, err := nft.CombinedOutput(); err != nil {
		t.Fatalf("nft: %v %s", err, out)
	}

	// Client: accept one announcement (the kernel's default is 0).
	pm, err := mptcppm.Dial(mptcppm.Options{NetNS: client})
	if err != nil {
		t.Fatal(err)
	}
	defer pm.Close()
	if err := pm.SetLimits(mptcppm.Limits{AddAddrAccepted: 1, Subflows: 2}); err != nil {
		t.Fatal(err)
	}
	cev, err := mptcppm.ListenEvents(mptcppm.Options{NetNS: client})
	if err != nil {
		t.Fatal(err)
	}
	defer cev.Close()

	// Server: an MPTCP sink.
	var ln net.Listener
	err = netnsx.Do(server, func() error {
		var lc net.ListenConfig
		lc.SetMultipathTCP(true)
		var err error
		ln, err = lc.Listen(ctx, "tcp", serverAddr.String())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	dial := func() net.Conn {
		t.Helper()
		var c net.Conn
		err := netnsx.Do(client, func() error {
			d := net.Dialer{Timeout: 5 * time.Second}
			d.SetMultipathTCP(true)
			var err error
			c, err = d.DialContext(ctx, "tcp", serverAddr.String())
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			buf := make([]byte, 64<<10)
			for {
				if _, err := c.Write(buf); err != nil {
					return
				}
			}
		}()
		return c
	}

	if on, err := serverrole.CFlag(server); err != nil || on {
		t.Fatalf("C flag before the role: %v %v, want off (kernel default)", on, err)
	}
	// Before the role: no C flag on the wire.
	c0 := dial()
	if e := clientEstablished(t, cev); e.Flags&1 != 0 {
		t.Fatalf("ESTABLISHED %v carries the C flag before the role set it", e)
	}
	c0.Close()

	// The role, then the userspace PM (the agent's order).
	deny := true
	var logs strings.Builder
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	stop, err := serverrole.Start(ctx, server, serverrole.Config{
		Announce:        []serverrole.Announcement{{Name: det, Addr: wp.Addr(), Port: wp.Port(), ID: 1}},
		DenyJoinInitial: &deny,
	}, log)
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			stop()
		}
	}()
	var pmType string
	netnsx.Do(server, func() error {
		b, err := os.ReadFile("/proc/sys/net/mptcp/pm_type")
		pmType = strings.TrimSpace(string(b))
		if err == nil {
			err = os.WriteFile("/proc/sys/net/mptcp/pm_type", []byte("1"), 0)
		}
		return err
	})
	defer netnsx.Do(server, func() error { return os.WriteFile("/proc/sys/net/mptcp/pm_type", []byte(pmType), 0) })
	if on, err := serverrole.CFlag(server); err != nil || !on {
		t.Fatalf("C flag with deny_join_initial: %v %v, want on", on, err)
	}

	c := dial()
	defer c.Close()
	if e := clientEstablished(t, cev); e.Flags&1 == 0 {
		t.Errorf("ESTABLISHED %v without the C flag (MPTCP_PM_EV_FLAG_DENY_JOIN_ID0) after the role set it", e)
	}
	// The client's kernel joins the announced waypoint; the subflow carries data.
	deadline := time.Now().Add(10 * time.Second)
	var via *mptcppm.Subflow
	for via == nil || via.BytesAcked < 1<<20 {
		if time.Now().After(deadline) {
			t.Fatalf("no subflow through the waypoint %s carrying 1 MB within 10 s (found %+v); role log:\n%s", wp, via, logs.String())
		}
		time.Sleep(100 * time.Millisecond)
		subs, err := mptcppm.DumpSubflows(mptcppm.Options{NetNS: client})
		if err != nil {
			t.Fatal(err)
		}
		for i := range subs {
			if s := subs[i]; netip.AddrPortFrom(s.Remote.Addr().Unmap(), s.Remote.Port()) == wp && s.State == 1 {
				via = &s
			}
		}
	}
	// The join arrives at the server's initial address (the waypoint
	// NATs to it), so the server's kernel answers with that address's id,
	// 0, not the announced one (docs/agent.md, Server role).
	t.Logf("subflow via the waypoint: %s -> %s, remote id %d, %d bytes acked", via.Local, via.Remote, via.RemoteID, via.BytesAcked)
	stopped = true
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if on, err := serverrole.CFlag(server); err != nil || on {
		t.Errorf("C flag after stop: %v %v, want restored off", on, err)
	}
	if !strings.Contains(logs.String(), "c_flag=true") || !strings.Contains(logs.String(), "announcements=1") {
		t.Errorf("role log lacks the C flag report or the counters:\n%s", logs.String())
	}
}
