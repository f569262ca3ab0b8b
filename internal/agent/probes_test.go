package agent

import (
	"context"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
)

// MarkProbe marks the test connection's local port for as long as it
// lives; IsProbe sees it (root's markers only).
func TestMarkProbe(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("markers are root's")
	}
	var lc net.ListenConfig
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
			defer c.Close()
		}
	}()
	dir := filepath.Join(t.TempDir(), "probes")
	var d net.Dialer
	d.SetMultipathTCP(true)
	var unmark func()
	d.Control, unmark = MarkProbe(dir)
	c, err := d.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	local := netip.MustParseAddrPort(c.LocalAddr().String())
	if !IsProbe(dir, local) {
		t.Fatalf("the probe from %s is not marked", local)
	}
	if IsProbe(dir, netip.AddrPortFrom(local.Addr(), local.Port()+1)) || IsProbe("", local) {
		t.Fatal("an unmarked port, or no directory, counted as a probe")
	}
	c.Close()
	unmark()
	if IsProbe(dir, local) {
		t.Fatal("marker left after the probe")
	}
}
