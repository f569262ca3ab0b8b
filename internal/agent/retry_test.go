package agent_test

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/agent"
	"github.com/mpdetour/mpdetour/internal/agent/kerneltest"
	"github.com/mpdetour/mpdetour/internal/detour"
	"github.com/mpdetour/mpdetour/internal/detour/static"
	"github.com/mpdetour/mpdetour/internal/mptcppm"
	"github.com/mpdetour/mpdetour/internal/policy"
	"golang.org/x/sys/unix"
)

// run starts an agent with cfg against a fake kernel until the test ends.
func run(t *testing.T, cfg agent.Options, sources ...detour.Source) *harness {
	t.Helper()
	k := kerneltest.New()
	a := agent.New(cfg, nil, k, nil, sources...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	h := &harness{t: t, k: k, a: a}
	var once sync.Once
	h.stop = func() { // idempotent: tests may stop early, Cleanup stops again
		once.Do(func() {
			cancel()
			k.Close()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(h.stop)
	return h
}

func createsBy(cmds []policy.Intent) map[uint32]int {
	n := map[uint32]int{}
	for _, in := range cmds {
		if in.Action == policy.CreateSubflow {
			n[in.Token]++
		}
	}
	return n
}

// Under churn the kernel refuses SUBFLOW_CREATE for
// connections that are closing (ENOTCONN after ESTABLISHED) or gone
// (EINVAL "invalid token"), and their CLOSED events may come late or never.
// Such a refusal is final: each connection gets one create per detour, not
// a retry every 200 ms (before the fix: 20 connections x 2 detours made
// hundreds of creates in 2 s) nor a new one after every connect timeout.
func TestAgentFinalCreateRefusalsEndRetries(t *testing.T) {
	cfg := agent.Options{Subflows: 2, MaxConnections: 1000, CommandWorkers: 2,
		Backoff: 100 * time.Millisecond, MaxBackoff: time.Second, ConnectTimeout: 300 * time.Millisecond,
		ProbeInterval: 0, StallRetransmits: 3, Policy: policy.Static,
	}
	h := run(t, cfg, static.New([]static.Entry{natDetour("r1", relay1), natDetour("r2", relay2)}))
	h.k.Reply(func(in policy.Intent) error {
		if in.Action != policy.CreateSubflow {
			return nil
		}
		if in.Token%2 == 0 {
			return &mptcppm.Error{Cmd: "subflow_create", Token: in.Token, Errno: unix.ENOTCONN}
		}
		return &mptcppm.Error{Cmd: "subflow_create", Token: in.Token, Errno: unix.EINVAL, Msg: "invalid token"}
	})
	const conns = 20
	for tok := uint32(100); tok < 100+conns; tok++ {
		h.connect(tok)
	}
	time.Sleep(2 * time.Second) // 10 ENOTCONN retry rounds, 6 connect timeouts
	n := createsBy(h.k.Commands())
	total := 0
	for tok := uint32(100); tok < 100+conns; tok++ {
		total += n[tok]
		if n[tok] > 2 {
			t.Errorf("token %d: %d SUBFLOW_CREATE after final refusals, want at most 2 (one per detour)", tok, n[tok])
		}
	}
	if total < conns {
		t.Fatalf("only %d creates for %d connections: the test did not exercise the refusals", total, conns)
	}
	t.Logf("%d SUBFLOW_CREATE for %d connections x 2 detours", total, conns)
}

// A join the server resets right after it came up is
// not evidence of a server join limit when the connection lost a subflow
// just before (here the agent destroyed a stalled one: over a black-holed
// path the server never hears of it and still counts it). Before the fix
// the agent learned "extra_subflows=1" for 5 minutes and the next
// connection got one detour subflow instead of two.
func TestAgentJoinResetAfterOwnDestroyLearnsNoLimit(t *testing.T) {
	relay3 := netip.MustParseAddrPort("10.0.5.2:4000")
	cfg := agent.Options{Subflows: 2, MaxConnections: 100, CommandWorkers: 1,
		Backoff: time.Second, MaxBackoff: time.Minute, ConnectTimeout: 3 * time.Second,
		ProbeInterval: 50 * time.Millisecond, StallRetransmits: 3, Policy: policy.Static,
	}
	h := run(t, cfg, static.New([]static.Entry{natDetour("r1", relay1), natDetour("r2", relay2), natDetour("r3", relay3)}))
	h.connect(1)
	_, i := h.wait(0, "create via r1", creates(relay1))
	h.wait(0, "create via r2", creates(relay2))
	sf1 := netip.AddrPortFrom(client.Addr(), 50001)
	sf2 := netip.AddrPortFrom(client.Addr(), 50002)
	h.k.Emit(mptcppm.Event{Type: mptcppm.EventSubEstablished, Token: 1, Local: sf1, Remote: relay1},
		mptcppm.Event{Type: mptcppm.EventSubEstablished, Token: 1, Local: sf2, Remote: relay2})
	// r1's path black-holes: retransmission timeouts pile up.
	h.k.SetSubflows([]mptcppm.Subflow{
		{Token: 1, Local: client, Remote: server, State: 1},
		{Token: 1, Local: sf1, Remote: relay1, State: 1, Retransmits: 3, Unacked: 10},
		{Token: 1, Local: sf2, Remote: relay2, State: 1},
	})
	_, i = h.wait(i, "SUBFLOW_DESTROY of the stalled r1 subflow", func(in policy.Intent) bool {
		return in.Action == policy.DestroySubflow && in.Remote == relay1
	})
	h.k.SetSubflows(nil)
	h.k.Emit(mptcppm.Event{Type: mptcppm.EventSubClosed, Token: 1, Local: sf1, Remote: relay1})
	h.wait(i, "replacement via r3", creates(relay3))
	// The server still counts the destroyed subflow: it resets the
	// replacement right after the handshake.
	sf3 := netip.AddrPortFrom(client.Addr(), 50003)
	h.k.Emit(mptcppm.Event{Type: mptcppm.EventSubEstablished, Token: 1, Local: sf3, Remote: relay3},
		mptcppm.Event{Type: mptcppm.EventSubClosed, Token: 1, Local: sf3, Remote: relay3})
	time.Sleep(200 * time.Millisecond)
	from := len(h.k.Commands())
	h.connect(2)
	// Wait for both creates (a loaded machine may take longer than a fixed
	// wait), then a little longer for a third one that must not come.
	for deadline := time.Now().Add(5 * time.Second); createsBy(h.k.Commands()[from:])[2] < 2 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	if n := createsBy(h.k.Commands()[from:])[2]; n != 2 {
		t.Fatalf("the next connection got %d detour subflows, want 2 (a server limit was learned from the agent's own destroy); commands %v",
			n, h.k.Commands()[from:])
	}
}

// A join the server resets right after it came up
// teaches a server limit only when the connection is still ESTABLISHED at
// the MPTCP level: the agent looks the connection up (sock_diag) and, when
// the server has closed it (CLOSE_WAIT), learns nothing; the next
// connection gets both detours. Before the fix every such reset under
// churn taught "extra_subflows=1".
// When the lookup fails (inet_diag error) the agent judges as before the
// check: the limit is learned. Each case makes exactly one lookup (the
// one short reset amid another join), not one per event.
func TestAgentJoinResetOnClosingConnectionLearnsNoLimit(t *testing.T) {
	for _, tc := range []struct {
		name    string
		state   uint8 // the first connection's MPTCP state when the join is reset
		diagErr error // the lookup's error
		want    int   // detour subflows asked for the next connection
	}{{"closing", 8 /* CLOSE_WAIT */, nil, 2}, {"established", 1, nil, 1}, {"lookup fails", 8, errors.New("inet_diag: no buffer space"), 1}} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := agent.Options{Subflows: 2, MaxConnections: 100, CommandWorkers: 1,
				Backoff: time.Second, MaxBackoff: time.Minute, ConnectTimeout: time.Minute, // no retry of a join that stays pending
				ProbeInterval: 50 * time.Millisecond, StallRetransmits: 3, Policy: policy.Static,
			}
			h := run(t, cfg, static.New([]static.Entry{natDetour("r1", relay1), natDetour("r2", relay2)}))
			h.connect(1)
			h.wait(0, "create via r1", creates(relay1))
			h.wait(0, "create via r2", creates(relay2))
			sf1 := netip.AddrPortFrom(client.Addr(), 50001)
			sf2 := netip.AddrPortFrom(client.Addr(), 50002)
			h.k.SetConnections([]mptcppm.Connection{{Token: 1, Local: client, Remote: server, State: tc.state}})
			h.k.SetConnStateErr(tc.diagErr)
			h.k.Emit(mptcppm.Event{Type: mptcppm.EventSubEstablished, Token: 1, Local: sf1, Remote: relay1},
				mptcppm.Event{Type: mptcppm.EventSubEstablished, Token: 1, Local: sf2, Remote: relay2},
				mptcppm.Event{Type: mptcppm.EventSubClosed, Token: 1, Local: sf2, Remote: relay2, Error: uint8(unix.ECONNRESET)})
			time.Sleep(200 * time.Millisecond)
			from := len(h.k.Commands())
			h.connect(2)
			for deadline := time.Now().Add(5 * time.Second); createsBy(h.k.Commands()[from:])[2] < tc.want && time.Now().Before(deadline); {
				time.Sleep(20 * time.Millisecond)
			}
			time.Sleep(200 * time.Millisecond)
			if n := createsBy(h.k.Commands()[from:])[2]; n != tc.want {
				t.Fatalf("the next connection got %d detour subflows, want %d; commands %v", n, tc.want, h.k.Commands()[from:])
			}
			if n := h.k.ConnStateCalls(); n != 1 {
				t.Fatalf("%d connection-state lookups, want 1 (the short join reset amid another join)", n)
			}
		})
	}
}

// A server that sets the C flag (ESTABLISHED flags bit
// 0) accepts no join to its initial address, and every detour leads there:
// the agent opens no detour subflow for such a connection, but still joins
// an address the server announces; other connections are unaffected.
func TestAgentHonoursServerCFlag(t *testing.T) {
	h := start(t, policy.Static, natDetour("r1", relay1))
	h.k.Emit(mptcppm.Event{Type: mptcppm.EventCreated, Token: 5, Local: client, Remote: server},
		mptcppm.Event{Type: mptcppm.EventEstablished, Token: 5, Local: client, Remote: server, Flags: mptcppm.EventFlagDenyJoinID0})
	announced := netip.MustParseAddrPort("10.0.6.2:5201")
	h.k.Emit(mptcppm.Event{Type: mptcppm.EventAnnounced, Token: 5, RemoteID: 1, Remote: announced})
	h.wait(0, "SUBFLOW_CREATE to the announced address", creates(announced))
	h.connect(6)
	h.wait(0, "SUBFLOW_CREATE via r1 for the connection without the C flag", func(in policy.Intent) bool {
		return in.Action == policy.CreateSubflow && in.Token == 6 && in.Remote == relay1
	})
	for _, in := range h.k.Commands() {
		if in.Token == 5 && in.Remote != announced {
			t.Fatalf("command %v for a connection whose server set the C flag", in)
		}
	}
}

// policy: backup-first opens detour subflows with the B flag (the join's
// SYN carries it) and status shows them as backups, whatever the kernel's
// SUB_ESTABLISHED says.
func TestAgentBackupFirstJoinsAsBackup(t *testing.T) {
	h := start(t, policy.BackupFirst, natDetour("r1", relay1))
	h.connect(11)
	in, _ := h.wait(0, "SUBFLOW_CREATE via r1", creates(relay1))
	if !in.Backup {
		t.Fatalf("create %v without the B flag", in)
	}
	// The 6.18 kernel says backup=0 for such a join (and sends nothing on it).
	h.k.Emit(mptcppm.Event{Type: mptcppm.EventSubEstablished, Token: 11, Local: netip.AddrPortFrom(client.Addr(), 50011), Remote: relay1, Backup: 0})
	for range 50 {
		for _, c := range h.a.Status().Connections {
			for _, s := range c.Subflows {
				if s.Path == "nat:r1" && s.Role == "backup" && s.Backup {
					return
				}
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("status %+v: no backup subflow through r1", h.a.Status().Connections)
}
