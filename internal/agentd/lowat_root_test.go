package agentd

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/agent"
	"github.com/mpdetour/mpdetour/internal/netnsx"
	"github.com/mpdetour/mpdetour/internal/policy"
	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
)

// The real program through the agent's path: an MPTCP connection made in
// the cgroup gets its subflow's lowat (status counts the setting), and
// after close nothing is attached to the cgroup.
//
// Twice: the agent in this namespace (netns "") and an agent whose
// netns: names another namespace, where the connection is (the lowat key
// then carries that namespace's cookie, not this process's). Then
// scaled (subflow_lowat_scale: rtt), in the other namespace: the entry
// starts at the floor (one setting); a probe round that measures the
// subflow with an RTT far above its own rewrites it, and the program sets
// the subflow's lowat again (to the ceiling).
func TestLowatRealProgram(t *testing.T) {
	testenv.MPTCP(t)
	t.Run("own namespace", func(t *testing.T) { lowatRealProgram(t, "", 0) })
	t.Run("netns", func(t *testing.T) { lowatRealProgram(t, netnstest.New(t, "alwns").Name, 0) })
	t.Run("scaled", func(t *testing.T) { lowatRealProgram(t, netnstest.New(t, "alwns").Name, 64<<20) })
}

func lowatRealProgram(t *testing.T, netns string, ceil uint32) {
	cg := cgroupProgram(t, "lowat", netns)
	l := startLowat(64<<10, ceil, false, cg.prog, slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)))
	if st := l.status(); st.State != "active" {
		t.Fatalf("status %+v", st)
	}
	var lc net.ListenConfig
	lc.SetMultipathTCP(true)
	var ln net.Listener
	if err := netnsx.Do(netns, func() (err error) { ln, err = lc.Listen(t.Context(), "tcp", "127.0.0.1:0"); return err }); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			io.Copy(io.Discard, c)
			c.Close()
		}
	}()
	c := cg.dial(t, netns, ln.Addr().String())
	if _, err := c.Write(make([]byte, 256<<10)); err != nil {
		t.Fatal(err)
	}
	// As the agent does: the pair is reported after the subflow's
	// ESTABLISHED callback (from the path manager's events), so the
	// program sets the lowat at an RTT callback.
	local, remote := c.LocalAddr().(*net.TCPAddr).AddrPort(), c.RemoteAddr().(*net.TCPAddr).AddrPort()
	l.subflows(1, []agent.SubflowPair{{Local: local, Remote: remote}})
	waitSets := func(n uint64) agent.LowatStatus {
		var st agent.LowatStatus
		for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
			if st = l.status(); st.Sets >= n {
				break
			}
			if _, err := c.Write(make([]byte, 64<<10)); err != nil {
				t.Fatal(err)
			}
		}
		return st
	}
	st := waitSets(1)
	if st.State != "active" || st.Sets == 0 || st.Pairs != 1 || st.Refused != "" {
		t.Errorf("status %+v, want active with the subflow's lowat set", st)
	}
	if ceil != 0 {
		l.measured([]policy.Measurement{{Token: 1, Local: local, Remote: remote, RTT: 10 * time.Second}})
		if st2 := waitSets(st.Sets + 1); st2.Sets <= st.Sets || st2.Rewrites != 1 || st2.Scale != "rtt" || st2.Refused != "" {
			t.Errorf("after a probe round with T 10 s: status %+v (before: %d settings), want the entry rewritten once and the lowat set again", st2, st.Sets)
		}
	}
	l.subflows(1, nil)
	if st := l.status(); st.Pairs != 0 {
		t.Errorf("status after the connection %+v, want no pairs", st)
	}
	cg.closeDetached(t)
}
