package relay

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
)

// starNet builds the gossip tests' network: a router namespace (hubPrefix)
// that forwards, and attach, which hangs a new namespace off it on
// 10.<octet>.<i>.0/24 (router .1, namespace .2, default route via the
// router) and returns it with its address.
func starNet(t *testing.T, hubPrefix string, octet int) (attach func(prefix string, i int) (*netnstest.NS, string)) {
	t.Helper()
	hub := netnstest.New(t, hubPrefix)
	if err := hub.Sysctl("net/ipv4/ip_forward", "1"); err != nil {
		t.Fatal(err)
	}
	return func(prefix string, i int) (*netnstest.NS, string) {
		ns := netnstest.New(t, prefix)
		addr := fmt.Sprintf("10.%d.%d.2", octet, i)
		netnstest.Link(t, hub, fmt.Sprintf("10.%d.%d.1/24", octet, i), ns, addr+"/24")
		ns.Route(t, "0.0.0.0/0", fmt.Sprintf("10.%d.%d.1", octet, i))
		return ns, addr
	}
}

// writeRelayCert issues a relay certificate for k named name, valid from a
// minute before now for an hour, and writes it to dir/file.
func writeRelayCert(t *testing.T, auth *collective.Authority, dir, file, name string, k proto.Key, now time.Time) string {
	t.Helper()
	c, err := auth.Issue(k.Public(), name, collective.RoleRelay, now.Add(-time.Minute), now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, file)
	if err := os.WriteFile(path, []byte(c.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
