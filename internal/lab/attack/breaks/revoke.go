package breaks

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/mpdetour/mpdetour/internal/convert"
	"github.com/mpdetour/mpdetour/internal/relayconn"
)

const (
	revokeGrace = 2 * time.Second // the bound after the list reaches the relay
	revokeWatch = 2 * time.Second // bytes counted from revokeGrace to revokeGrace+revokeWatch
)

// revokedConversion (break 4): a member's conversion carries a stream
// from a server in the lab to the member; the relay's members list drops
// the member (config rewritten, SIGHUP). Target: 0 bytes reach the member
// through the conversion from 2 s after the reload on.
func revokedConversion(ctx context.Context, o Options) Result {
	r := Result{Break: 4, Metric: "bytes moved 2-4 s after the revocation", Target: "0"}
	l, keys, err := begin(ctx, o, "r", 3)
	if err != nil {
		return r.failed(err)
	}
	defer l.close()
	relayKey, memberKey, otherKey := keys[0], keys[1], keys[2]
	relayAddr := netip.AddrPortFrom(l.Addr("detour1"), relayPort)
	server := netip.AddrPortFrom(l.Addr("server"), 5300)
	cfg := filepath.Join(o.Dir, "relay.yaml")
	config := func(members string) error {
		return os.WriteFile(cfg, []byte(fmt.Sprintf("listen: %s\nprivate_key: %s\nports: 40000-40999\nlease: 1m\nallow_destinations: [%s/32]\nmembers:\n%sconvert:\n  enabled: true\n  listen: %s\n",
			relayAddr, relayKey, server.Addr(), members, netip.AddrPortFrom(relayAddr.Addr(), 45674))), 0o600)
	}
	other := fmt.Sprintf("  - {name: other, public_key: %s}\n", otherKey.Public())
	if err := config(other + fmt.Sprintf("  - {name: client, public_key: %s}\n", memberKey.Public())); err != nil {
		return r.failed(err)
	}
	if err := l.start(ctx, "detour1", filepath.Join(o.Dir, "relay.log"), o.Binary, "relay", "--config", cfg); err != nil {
		return r.failed(err)
	}
	relayProc := l.procs[len(l.procs)-1].Process
	// The server streams to whoever connects.
	var ln net.Listener
	if err := l.do("server", func() error {
		var err error
		ln, err = net.Listen("tcp", server.String())
		return err
	}); err != nil {
		return r.failed(err)
	}
	defer ln.Close()
	go streamTo(ln)
	rc, err := l.dialRelay(relayconn.Relay{Name: "detour1", Addr: relayAddr, PublicKey: relayKey.Public()}, memberKey, nil)
	if err != nil {
		return r.failed(err)
	}
	defer rc.Close()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	conv, tickets, _, err := rc.Convert(cctx, 1)
	cancel()
	if err != nil || len(tickets) == 0 {
		r.Error = fmt.Sprintf("converter tickets: %v (log in %s)", err, o.Dir)
		return r
	}
	var c net.Conn
	if err := l.do("client", func() error {
		var err error
		c, err = convert.Dial(ctx, conv, server, tickets[0][:], convert.DialOptions{})
		return err
	}); err != nil {
		r.Error = "conversion: " + err.Error()
		return r
	}
	defer c.Close()
	var got atomic.Int64
	ended := make(chan error, 1)
	go func() {
		buf := make([]byte, 64<<10)
		for {
			n, err := c.Read(buf)
			got.Add(int64(n))
			if err != nil {
				ended <- err
				return
			}
		}
	}()
	time.Sleep(time.Second)
	before := got.Load()
	if before == 0 {
		r.Error = "the conversion carried nothing before the revocation"
		return r
	}
	if err := config(other); err != nil {
		return r.failed(err)
	}
	t0 := time.Now()
	if err := relayProc.Signal(syscall.SIGHUP); err != nil {
		r.Error = "SIGHUP: " + err.Error()
		return r
	}
	time.Sleep(revokeGrace)
	atGrace := got.Load()
	time.Sleep(revokeWatch)
	moved := got.Load() - atGrace
	endedIn := "still open at the end"
	select {
	case err := <-ended:
		if err == io.EOF {
			endedIn = "ended (EOF)"
		} else {
			endedIn = fmt.Sprintf("ended (%v)", err)
		}
	default:
	}
	r.Value = float64(moved)
	r.Pass = moved == 0
	r.Detail = fmt.Sprintf("a conversion streaming server->member carried %d bytes in its first second; the member removed from members and SIGHUP at t0: %d bytes in t0..t0+%s, %d bytes in t0+%s..t0+%s; the conversion %s %s after t0",
		before, atGrace-before, revokeGrace, moved, revokeGrace, revokeGrace+revokeWatch, endedIn, time.Since(t0).Round(time.Millisecond))
	return r
}
