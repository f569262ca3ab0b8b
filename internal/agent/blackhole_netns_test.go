package agent

import (
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
)

// TestBlackholeRealKernel provokes the kernel's MPTCP blackhole fallback in
// a namespace (the server's side drops every SYN carrying an MPTCP option,
// so the client's kernel falls back to a plain SYN, which gets through, and
// disables MPTCP) and checks what the agent reads: disabled, then plain TCP
// connections counted, then MPTCP again once the sysctl is written (the fix
// the agent and doctor print).
func TestBlackholeRealKernel(t *testing.T) {
	testenv.MPTCP(t)
	testenv.Tools(t, "nft", "ip")
	cl, srv := netnstest.New(t, "bhc"), netnstest.New(t, "bhs")
	netnstest.Link(t, cl, "10.91.0.1/24", srv, "10.91.0.2/24")
	if err := cl.Sysctl("net/mptcp/blackhole_timeout", "3600"); err != nil {
		t.Fatal(err)
	}
	srv.Run("nft", "add table inet bh")
	srv.Run("nft", "add chain inet bh in { type filter hook input priority 0; }")
	srv.Run("nft", "add rule inet bh in tcp flags syn tcp option mptcp exists drop")
	lc := net.ListenConfig{}
	lc.SetMultipathTCP(true)
	ln, err := srv.Listen(lc, "tcp", "10.91.0.2:7001")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	netnstest.Serve(ln, func(c net.Conn) { c.Close() })

	w := newBlackholeWatch(slog.New(slog.DiscardHandler))
	read := func() {
		t.Helper()
		mib, to, err := readBlackhole(cl.Path)
		if err != nil {
			t.Fatal(err)
		}
		w.observe(time.Now(), mib, to, err)
	}
	dial := func() (mptcp bool) {
		t.Helper()
		d := &net.Dialer{Timeout: 15 * time.Second}
		d.SetMultipathTCP(true)
		c, err := cl.Dial(d, "tcp", "10.91.0.2:7001")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		m, err := c.(*net.TCPConn).MultipathTCP()
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	read()
	if st := w.status(); st.State != BlackholeOK {
		t.Fatalf("fresh namespace: %+v", st)
	}
	// ~3 s: two MP_CAPABLE SYNs dropped, then a plain one.
	if dial() {
		t.Fatal("the first connection kept MPTCP through a path that drops MPTCP SYNs")
	}
	read()
	st := w.status()
	if st.State != BlackholeDisabled || st.Disables != 1 || st.SYNDrops == 0 {
		t.Fatalf("after the blackhole: %+v", st)
	}
	// The next connection is plain TCP at once (no SYN with MP_CAPABLE).
	srv.Run("nft", "delete table inet bh")
	if dial() {
		t.Fatal("MPTCP while the kernel has it disabled")
	}
	read()
	if st := w.status(); st.State != BlackholeDisabled || st.Fallbacks == 0 {
		t.Fatalf("a connection made plain TCP: %+v", st)
	}
	// The fix: write the sysctl; the next connection is MPTCP again.
	if err := cl.Sysctl("net/mptcp/blackhole_timeout", "3600"); err != nil {
		t.Fatal(err)
	}
	if !dial() {
		t.Fatal("no MPTCP after writing net.mptcp.blackhole_timeout")
	}
	read()
	if st := w.status(); st.State != BlackholeOK {
		t.Fatalf("after the fix: %+v", st)
	}
}

// TestPMTypeRestoredRealKernel: another program sets pm_type to 0 under a
// running agent; the agent sets it back within a poll and says so in its
// status; on exit it restores the value it found at start.
func TestPMTypeRestoredRealKernel(t *testing.T) {
	testenv.MPTCP(t)
	ns := netnstest.New(t, "pmg")
	cfg := DefaultOptions()
	cfg.Subflows = 1
	cfg.NetNS = ns.Name
	cfg.Socket = filepath.Join(t.TempDir(), "agent.sock")
	r := start(t, cfg)
	pmType := func() string {
		v, err := readSysctl(ns.Name, "net.mptcp.pm_type")
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if v := pmType(); v != "1" {
		t.Fatalf("pm_type %s under the agent", v)
	}
	if err := ns.Sysctl("net/mptcp/pm_type", "0"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 3*BlackholePoll, "pm_type set back", func() (bool, string) {
		st, err := FetchStatus(cfg.Socket)
		if err != nil {
			return false, err.Error()
		}
		g := st.PMTypeGuard
		return pmType() == "1" && g != nil && g.Restores == 1 && g.LastFound == "0", fmt.Sprintf("pm_type %s, guard %+v", pmType(), g)
	})
	r.stop(t)
	if v := pmType(); v != "0" {
		t.Fatalf("pm_type %s after the agent stopped, want the 0 it found", v)
	}
}
