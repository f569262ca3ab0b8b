package main

import (
	"bytes"
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/mpdetour/mpdetour/internal/cli"
	"github.com/mpdetour/mpdetour/internal/pathcheck"
)

// The text report ends with one line per family, each path counted by its
// destination's family.
func TestPathCheckFamilies(t *testing.T) {
	rep := &pathcheck.Report{Paths: []pathcheck.PathResult{
		{Path: pathcheck.Path{Name: "default-v4", Dst: netip.MustParseAddrPort("192.0.2.10:443")}, Verdict: pathcheck.OK},
		{Path: pathcheck.Path{Name: "nat:a", Dst: netip.MustParseAddrPort("198.51.100.1:4000")}, Verdict: pathcheck.Stripped},
		{Path: pathcheck.Path{Name: "default-v6", Dst: netip.MustParseAddrPort("[2001:db8::10]:443")}, Verdict: pathcheck.OK},
	}}
	var b bytes.Buffer
	printPathCheck(&b, rep)
	for _, want := range []string{"IPv4: 2 paths probed (1 ok, 1 mptcp-stripped)", "IPv6: 1 paths probed (1 ok)"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	printPathCheck(&b, &pathcheck.Report{Paths: rep.Paths[2:]})
	if !strings.Contains(b.String(), "IPv4: no path probed") {
		t.Errorf("IPv6-only report:\n%s", b.String())
	}
}

// Servers: one or two, one per family; bad addresses refused with the
// reason; two servers name their paths by family.
func TestPathCheckServers(t *testing.T) {
	ss, err := pathCheckServers([]string{"192.0.2.10:443", "[2001:db8::10]:443"})
	if err != nil || len(ss) != 2 || familySuffix(ss, ss[0]) != "-v4" || familySuffix(ss, ss[1]) != "-v6" || familySuffix(ss[:1], ss[0]) != "" {
		t.Fatalf("%v %v", ss, err)
	}
	if s, ok := serverOfFamily(ss, netip.MustParseAddr("2001:db8::99")); !ok || s != ss[1] {
		t.Errorf("server of IPv6: %v %v", s, ok)
	}
	for args, want := range map[string]string{
		"[::ffff:192.0.2.10]:443":        "IPv4-mapped",
		"[fe80::1%eth0]:443":             "link-local",
		"192.0.2.10:443 192.0.2.11:443":  "both IPv4",
		"[2001:db8::1]:0":                "not SERVER:PORT",
		"a:1 b:2 c:3":                    "got 3 arguments",
		"[2001:db8::1]:443 192.0.2.1:80": "",
	} {
		_, err := pathCheckServers(strings.Fields(args))
		if want == "" && err != nil || want != "" && (err == nil || !strings.Contains(err.Error(), want)) {
			t.Errorf("%s: %v, want %q", args, err, want)
		}
	}
	// A tunnel address of a family without a server is a usage error.
	var out, errb bytes.Buffer
	code := cli.Main(context.Background(), "mpdetour", commands(), []string{"path-check", "192.0.2.10:443", "--tunnel", "wg=fd00::2"}, &out, &errb)
	if code != cli.ExitUsage || !strings.Contains(errb.String(), "an IPv6 tunnel address, but no IPv6 SERVER:PORT") {
		t.Errorf("IPv6 tunnel address without an IPv6 server: exit %d, %s", code, errb.String())
	}
}
