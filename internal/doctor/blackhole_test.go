package doctor

import (
	"context"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/agent"
	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
)

func withNetstat(t *testing.T, p Paths, blackhole, fallbacks string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(p.Proc, "net"), 0o755); err != nil {
		t.Fatal(err)
	}
	b := "TcpExt: A B\nTcpExt: 1 2\nMPTcpExt: MPCapableSYNTX Blackhole MPCapableSYNTXDisabled\nMPTcpExt: 5 " + blackhole + " " + fallbacks + "\n"
	if err := os.WriteFile(filepath.Join(p.Proc, "net", "netstat"), []byte(b), 0o644); err != nil {
		t.Fatal(err)
	}
}

// Doctor says when the kernel disabled MPTCP and how to
// clear it.
func TestBlackholeCheck(t *testing.T) {
	const check = "MPTCP blackhole fallback"
	p := fakeProc(t, map[string]string{"net.mptcp.blackhole_timeout": "3600"})
	withNetstat(t, p, "0", "0")
	if x := find(Blackhole(p, nil), check); x.Status != OK {
		t.Fatalf("never disabled: %+v", x)
	}
	withNetstat(t, p, "2", "40")
	x := find(Blackhole(p, nil), check)
	if x.Status != Warn || !strings.Contains(x.Detail, "2 times since boot") || !strings.Contains(x.Detail, "40 connections") ||
		!strings.HasPrefix(x.Fix, "sysctl -w net.mptcp.blackhole_timeout=3600") {
		t.Fatalf("disabled since boot, no agent: %+v", x)
	}
	if x := find(Blackhole(p, &agent.BlackholeStatus{State: agent.BlackholeOK}), check); x.Status != Info || !strings.Contains(x.Detail, "not in force now") {
		t.Fatalf("agent says not in force: %+v", x)
	}
	x = find(Blackhole(p, &agent.BlackholeStatus{State: agent.BlackholeDisabled, Since: time.Now(), Fallbacks: 40}), check)
	if x.Status != Fail || !strings.Contains(x.Detail, "disabled MPTCP for new connections") || !strings.HasPrefix(x.Fix, "sysctl -w net.mptcp.blackhole_timeout=3600") {
		t.Fatalf("agent says disabled: %+v", x)
	}
	off := fakeProc(t, map[string]string{"net.mptcp.blackhole_timeout": "0"})
	if x := find(Blackhole(off, nil), check); x.Status != Info {
		t.Fatalf("detection off: %+v", x)
	}
}

// With MPTCP disabled by the kernel, doctor's connection check names the
// kernel, not the server or a middlebox (real kernel, in a namespace whose
// path dropped MP_CAPABLE SYNs once).
func TestClientBlackholeNamed(t *testing.T) {
	testenv.MPTCP(t)
	testenv.Tools(t, "nft", "ip")
	cl, srv := netnstest.New(t, "dbhc"), netnstest.New(t, "dbhs")
	netnstest.Link(t, cl, "10.92.0.1/24", srv, "10.92.0.2/24")
	if err := cl.Sysctl("net/mptcp/blackhole_timeout", "3600"); err != nil {
		t.Fatal(err)
	}
	srv.Run("nft", "add table inet bh")
	srv.Run("nft", "add chain inet bh in { type filter hook input priority 0; }")
	srv.Run("nft", "add rule inet bh in tcp flags syn tcp option mptcp exists drop")
	var lc net.ListenConfig
	lc.SetMultipathTCP(true)
	ln, err := srv.Listen(lc, "tcp", "10.92.0.2:7002")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	netnstest.Serve(ln, func(c net.Conn) { c.Close() })
	dst := netip.MustParseAddrPort("10.92.0.2:7002")
	probes := t.TempDir()
	var first, second Report
	if err := cl.Do(func() error {
		runtime.LockOSThread()
		first = Client(context.Background(), ClientConfig{Server: dst, Timeout: 10 * time.Second, ProbeDir: probes})
		srv.Run("nft", "delete table inet bh")
		second = Client(context.Background(), ClientConfig{Server: dst, Timeout: 10 * time.Second, ProbeDir: probes})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if x := find(first, "direct"); x.Status != Fail || strings.Contains(x.Detail, "blackhole") {
		t.Fatalf("the connection whose SYNs were dropped: %+v", x)
	}
	if x := find(second, "direct"); x.Status != Fail || !strings.Contains(x.Detail, "the kernel has MPTCP disabled") || !strings.HasPrefix(x.Fix, "sysctl -w net.mptcp.blackhole_timeout=3600") {
		t.Fatalf("the next connection: %+v", x)
	}
}

// Doctor flags pm_type changed under a running agent.
func TestRunningAgentPMType(t *testing.T) {
	const check = "pm_type under the agent"
	st := &agent.Status{Policy: "static"}
	if x := find(RunningAgent(fakeProc(t, map[string]string{"net.mptcp.pm_type": "0"}), st), check); x.Status != Fail || !strings.Contains(x.Detail, "another program changed it") {
		t.Fatalf("pm_type 0 under the agent: %+v", x)
	}
	p := fakeProc(t, map[string]string{"net.mptcp.pm_type": "1"})
	if x := find(RunningAgent(p, st), check); x.Status != OK {
		t.Fatalf("pm_type 1: %+v", x)
	}
	st.PMTypeGuard = &agent.PMTypeStatus{Restores: 3, LastFound: "0", LastRestore: time.Now()}
	if x := find(RunningAgent(p, st), check); x.Status != Warn || !strings.Contains(x.Detail, "3 times") {
		t.Fatalf("restored 3 times: %+v", x)
	}
	if x := find(RunningAgent(p, nil), "agent"); x.Status != Info {
		t.Fatalf("no agent: %+v", x)
	}
}

// Doctor reports the running agent's per-subflow unsent limit: what a
// root shell's probe cannot show (a unit without CAP_BPF runs without it).
func TestRunningAgentLowat(t *testing.T) {
	const check = "subflow lowat of the agent"
	p := fakeProc(t, map[string]string{"net.mptcp.pm_type": "1"})
	st := &agent.Status{Policy: "static", SubflowLowat: &agent.LowatStatus{State: "failed", Bytes: 131072,
		Error: "needs CAP_BPF and CAP_NET_ADMIN (the deploy unit grants both): bpfclamp: create map: operation not permitted"}}
	if x := find(RunningAgent(p, st), check); x.Status != Warn || !strings.Contains(x.Detail, "operation not permitted") || !strings.Contains(x.Fix, "CAP_BPF") {
		t.Fatalf("failed: %+v", x)
	}
	st.SubflowLowat = &agent.LowatStatus{State: "refused", Bytes: 131072, Refused: "the kernel refused TCP_NOTSENT_LOWAT from BPF"}
	if x := find(RunningAgent(p, st), check); x.Status != Warn || !strings.Contains(x.Detail, "refused") {
		t.Fatalf("refused: %+v", x)
	}
	st.SubflowLowat = &agent.LowatStatus{State: "active", Bytes: 131072, Pairs: 2, Sets: 4}
	if x := find(RunningAgent(p, st), check); x.Status != OK || !strings.Contains(x.Detail, "131072") {
		t.Fatalf("active: %+v", x)
	}
	// The default: where it is attached and that it is the default; a
	// failed default says how to turn it off.
	st.SubflowLowat = &agent.LowatStatus{State: "active", Bytes: 131072, Pairs: 2, Sets: 4, Default: true, Cgroup: "cgroup v2 root"}
	if x := find(RunningAgent(p, st), check); x.Status != OK || !strings.Contains(x.Detail, "program at cgroup v2 root (the default)") {
		t.Fatalf("active default: %+v", x)
	}
	st.SubflowLowat = &agent.LowatStatus{State: "failed", Bytes: 131072, Default: true, Error: "no cgroup v2 mount"}
	if x := find(RunningAgent(p, st), check); x.Status != Warn || !strings.Contains(x.Detail, "subflow_lowat: 0 turns it off") {
		t.Fatalf("failed default: %+v", x)
	}
	st.SubflowLowat = &agent.LowatStatus{State: "active", Bytes: 131072, Pairs: 2, Sets: 4, Scale: "rtt", Ceil: 4194304}
	if x := find(RunningAgent(p, st), check); x.Status != OK || !strings.Contains(x.Detail, "scaled to the subflows' RTTs (subflow_lowat_scale: rtt), 131072-4194304 bytes") {
		t.Fatalf("active, scaled: %+v", x)
	}
	st.SubflowLowat = nil
	if x := find(RunningAgent(p, st), check); x.Status != Info || !strings.Contains(x.Detail, "off") {
		t.Fatalf("off: %+v", x)
	}
}

// Doctor checks a running agent's tunnel detours end to
// end: the handshake, then a connection from the tunnel's address.
func TestTunnelsChecked(t *testing.T) {
	var lc net.ListenConfig
	lc.SetMultipathTCP(false)
	ln, err := lc.Listen(context.Background(), "tcp4", "127.0.0.1:0")
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
			c.Close()
		}
	}()
	open := netip.MustParseAddrPort(ln.Addr().String())
	closed := netip.AddrPortFrom(open.Addr(), 1) // nothing listens
	st := &agent.Status{
		Relays: []agent.RelayStatus{
			{Name: "fresh", Tunnel: true, LastHandshake: time.Now().Add(-30 * time.Second)},
			{Name: "never", Tunnel: true},
			{Name: "stale", Tunnel: true, LastHandshake: time.Now().Add(-10 * time.Minute)},
			{Name: "nat-only"},
		},
		Detours: []agent.DetourStatus{{Kind: "tunnel", Relay: "fresh", Local: "127.0.0.1"}},
	}
	r := Tunnels(context.Background(), st, open, time.Second)
	if len(r) != 3 {
		t.Fatalf("%d results, want one per tunnel: %+v", len(r), r)
	}
	if x := find(r, "tunnel via fresh"); x.Status != OK || !strings.Contains(x.Detail, "went through it") {
		t.Fatalf("working tunnel: %+v", x)
	}
	if x := find(r, "tunnel via never"); x.Status != Fail || !strings.Contains(x.Fix, "51820") {
		t.Fatalf("no handshake: %+v", x)
	}
	if x := find(r, "tunnel via stale"); x.Status != Fail || !strings.Contains(x.Detail, "10m0s ago") {
		t.Fatalf("stale handshake: %+v", x)
	}
	r = Tunnels(context.Background(), st, closed, time.Second)
	if x := find(r, "tunnel via fresh"); x.Status != Fail || !strings.Contains(x.Detail, "no TCP connection") || !strings.Contains(x.Fix, "allow_destinations") {
		t.Fatalf("probe refused: %+v", x)
	}
	if r := Tunnels(context.Background(), nil, open, time.Second); len(r) != 0 {
		t.Fatalf("without agent: %+v", r)
	}
}
