package doctor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/agent"
	"github.com/mpdetour/mpdetour/internal/bpfclamp"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relayclient"
	"github.com/mpdetour/mpdetour/internal/relayconn"
	"golang.org/x/sys/unix"
)

func fakeProc(t *testing.T, sysctls map[string]string) Paths {
	t.Helper()
	dir := t.TempDir()
	for name, v := range sysctls {
		p := filepath.Join(dir, "sys", strings.ReplaceAll(name, ".", "/"))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return Paths{Proc: dir, Dev: dir}
}

func find(r Report, check string) Result {
	for _, x := range r {
		if x.Check == check {
			return x
		}
	}
	return Result{Check: "(missing " + check + ")", Status: -1}
}

func TestKernelMPTCPDisabledAndMissing(t *testing.T) {
	r := Kernel(fakeProc(t, map[string]string{"net.mptcp.enabled": "0"}), 0)
	if x := find(r, "MPTCP"); x.Status != Fail || !strings.Contains(x.Fix, "sysctl -w net.mptcp.enabled=1") {
		t.Fatalf("disabled MPTCP: %+v", x)
	}
	if !r.Failed() {
		t.Fatal("report with a FAIL says it did not fail")
	}
	r = Kernel(fakeProc(t, nil), 0)
	if len(r) != 1 || r[0].Status != Fail || !strings.Contains(r[0].Detail, "kernel without MPTCP") {
		t.Fatalf("no MPTCP sysctl: %+v", r)
	}
}

func TestRelayForwardingOff(t *testing.T) {
	r := RelayHost(fakeProc(t, map[string]string{"net.ipv4.ip_forward": "0", "net.ipv4.tcp_fastopen": "1"}), "mpdetour_test_none", true, true)
	if x := find(r, "forwarding"); x.Status != Fail || !strings.Contains(x.Fix, "ip_forward = 1") {
		t.Fatalf("forwarding off: %+v", x)
	}
	if x := find(r, "converter TCP Fast Open"); x.Status != Warn || !strings.Contains(x.Fix, "tcp_fastopen = 3") {
		t.Fatalf("converter without server TFO: %+v", x)
	}
	// No kernel module check can be forced here, but the WireGuard check
	// must say something either way; with no /dev/net/tun in the fake dev
	// directory it fails unless the module exists.
	if x := find(r, "WireGuard"); x.Status == -1 {
		t.Fatalf("no WireGuard check in %+v", r)
	}
}

// A relay that does not answer is a FAIL that names the UDP port to open.
func TestClientRelayNoAnswer(t *testing.T) {
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0") // bound, never answers
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	relayKey, _ := proto.GenerateKey()
	member, _ := proto.GenerateKey()
	addr := netip.MustParseAddrPort(pc.LocalAddr().String())
	r := Client(context.Background(), ClientConfig{
		Source:  relayclient.SourceConfig{PrivateKey: member, Relays: []relayconn.Relay{{Name: "r1", Addr: addr, PublicKey: relayKey.Public()}}},
		Timeout: 400 * time.Millisecond,
	})
	x := find(r, "relay r1")
	if x.Status != Fail || !strings.Contains(x.Detail, "no answer") || !strings.Contains(x.Fix, "UDP port") {
		t.Fatalf("silent relay: %+v", x)
	}
	var b bytes.Buffer
	r.Print(&b)
	if !strings.Contains(b.String(), "FAIL") || !strings.Contains(b.String(), "-> check the address") {
		t.Fatalf("printed report:\n%s", b.String())
	}
}

// The direct MPTCP check against a plain TCP listener reports the fallback.
func TestClientFallbackDetected(t *testing.T) {
	// Plain TCP (Go listens with MPTCP by default since 1.24).
	var plain net.ListenConfig
	plain.SetMultipathTCP(false)
	ln, err := plain.Listen(context.Background(), "tcp4", "127.0.0.1:0")
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
	r := Client(context.Background(), ClientConfig{Server: netip.MustParseAddrPort(ln.Addr().String()), Timeout: time.Second, ProbeDir: t.TempDir()})
	if x := find(r, "direct"); x.Status != Fail || !strings.Contains(x.Detail, "fell back to plain TCP") {
		t.Fatalf("fallback: %+v", r)
	}
	var lc net.ListenConfig
	lc.SetMultipathTCP(true)
	mln, err := lc.Listen(context.Background(), "tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer mln.Close()
	go func() {
		for {
			c, err := mln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	r = Client(context.Background(), ClientConfig{Server: netip.MustParseAddrPort(mln.Addr().String()), Timeout: time.Second, ProbeDir: t.TempDir()})
	if x := find(r, "direct"); x.Status != OK {
		t.Fatalf("MPTCP server: %+v", r)
	}
}

// Families gives one line per family: the IPv6 default route, relays per
// family (none of a family says what its connections get), a running
// agent's detours per family; IPv6 switched off says so and skips IPv6.
func TestFamilies(t *testing.T) {
	routes := func(v6 bool) (string, bool, error) {
		if v6 {
			return "", false, nil
		}
		return "10.0.1.254 dev eth0", true, nil
	}
	st := &agent.Status{Families: []agent.FamilyStatus{{Family: "IPv4", Connections: 2, OnInet6: 1}, {Family: "IPv6", Detours: 1, Healthy: 1, Subflows: 1, Cross: 1}}}
	r := Families(fakeProc(t, map[string]string{"net.ipv6.conf.all.disable_ipv6": "0"}), FamilyInput{DefaultRoute: routes,
		Relays: []netip.AddrPort{netip.MustParseAddrPort("[fd00:3::2]:45673")}, OtherFamily: 1, Running: st})
	for check, want := range map[string]struct {
		st     Status
		detail string
	}{
		"IPv4 default route":   {OK, "via 10.0.1.254 dev eth0"},
		"IPv6 default route":   {Info, "none"},
		"IPv4 relays":          {Info, "NAT detours only of the other family, toward the 1 mapped servers"},
		"IPv6 relays":          {OK, "1"},
		"IPv6 under the agent": {OK, "1 subflows up (1 cross-family), 1 detours (1 healthy)"},
		"IPv4 under the agent": {OK, "2 connections (1 on AF_INET6)"},
	} {
		got := find(r, check)
		if got.Status != want.st || !strings.Contains(got.Detail, want.detail) {
			t.Errorf("%s: %v %q, want %v %q", check, got.Status, got.Detail, want.st, want.detail)
		}
	}
	r = Families(fakeProc(t, map[string]string{"net.ipv6.conf.all.disable_ipv6": "1"}), FamilyInput{DefaultRoute: routes, Relays: []netip.AddrPort{}})
	if got := find(r, "IPv6"); got.Status != Info || !strings.Contains(got.Detail, "IPv4 only") {
		t.Errorf("IPv6 off: %+v", got)
	}
	if got := find(r, "IPv6 default route"); got.Status != -1 {
		t.Errorf("IPv6 off, yet checked: %+v", got)
	}
	if got := find(r, "IPv4 relays"); got.Status != Info || !strings.Contains(got.Detail, "get no NAT detour") {
		t.Errorf("no IPv4 relay: %+v", got)
	}
}

// A relay session of one family is not asked for a detour toward a server
// of the other (it grants only within its family): Info, not a FAIL
// blaming the relay's policy.
func TestDetourPathOtherFamilyNotAsked(t *testing.T) {
	relayKey, _ := proto.GenerateKey()
	member, _ := proto.GenerateKey()
	c, err := relayconn.Dial(relayconn.Relay{Name: "r1/v6", Addr: netip.MustParseAddrPort("[::1]:9"), PublicKey: relayKey.Public()}, member, relayconn.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var r Report
	r.detourPath(context.Background(), c, "r1/v6", netip.MustParseAddrPort("192.0.2.10:5201"), 300*time.Millisecond, "")
	x := find(r, "detour via r1/v6")
	if x.Status != Info || !strings.Contains(x.Detail, "an IPv6 session grants toward IPv6 servers only") {
		t.Fatalf("%+v", x)
	}
}

// The BPF program check: ok with the directory the probe used; a probe
// that fails is one warning saying why and that the agent runs without
// the limit, with the fix for the reason.
func TestBPFProgram(t *testing.T) {
	r := BPF("", func(dir string) (string, error) { return "/sys/fs/cgroup", nil })
	if len(r) != 1 || r[0].Status != OK || !strings.Contains(r[0].Detail, "/sys/fs/cgroup") {
		t.Fatalf("loads: %+v", r)
	}
	// No bpf_cgroup: the cgroup v2 root, and what that reaches.
	if !strings.Contains(r[0].Detail, "no bpf_cgroup: the agent attaches it to the cgroup v2 root /sys/fs/cgroup, so every MPTCP subflow on this host") {
		t.Errorf("default cgroup not explained: %+v", r)
	}
	if r = BPF("/sys/fs/cgroup/m", func(dir string) (string, error) { return dir, nil }); len(r) != 1 || r[0].Status != OK || strings.Contains(r[0].Detail, "cgroup v2 root") {
		t.Errorf("bpf_cgroup: %+v", r)
	}
	// Loaded, but no probe cgroup could be made (a read-only cgroup
	// mount): information, not a warning that the agent cannot attach.
	r = BPF("/x", func(dir string) (string, error) {
		return dir, &bpfclamp.AttachNotTriedError{Err: fmt.Errorf("mkdir /x/p: %w", unix.EROFS)}
	})
	if len(r) != 1 || r[0].Status != Info || !strings.Contains(r[0].Detail, "loads") || !strings.Contains(r[0].Detail, "read-only file system") {
		t.Errorf("attach not tried: %+v", r)
	}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("bpfclamp: create map: %w", unix.EPERM), "CAP_BPF"},
		{errors.New("bpfclamp: load sock_ops program: load program: invalid argument: program of this type cannot use helper bpf_skc_to_mptcp_sock#196"), "CAP_PERFMON"},
		{errors.New("no cgroup v2 mount (cgroup_no_v1 / systemd.unified_cgroup_hierarchy, or set bpf_cgroup; ip netns exec remounts /sys without it: start the agent in the host's mount namespace with the netns: key)"), "mount cgroup v2"},
		{errors.New("bpfclamp: load sock_ops program: invalid argument (no /sys/kernel/btf/vmlinux: the kernel has no BTF, CONFIG_DEBUG_INFO_BTF)"), "CONFIG_DEBUG_INFO_BTF=y"},
		{errors.New("bpfclamp: attach to cgroup /x: bad file descriptor"), ""},
	} {
		var asked string
		r := BPF("/x", func(dir string) (string, error) { asked = dir; return dir, tc.err })
		if asked != "/x" || len(r) != 1 {
			t.Fatalf("%v: asked %q, report %+v", tc.err, asked, r)
		}
		x := r[0]
		if x.Status != Warn || r.Failed() || !strings.Contains(x.Detail, tc.err.Error()) || !strings.Contains(x.Detail, "runs without the per-subflow unsent limit") ||
			!strings.Contains(x.Fix, tc.want) || (tc.want == "") != (x.Fix == "") {
			t.Errorf("%v: %+v, want a warning with the reason and a fix containing %q", tc.err, x, tc.want)
		}
	}
}
