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
	"github.com/mpdetour/mpdetour/internal/proto"
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
	revoke := func() error {
		if err := config(other); err != nil {
			return err
		}
		if err := relayProc.Signal(syscall.SIGHUP); err != nil {
			return fmt.Errorf("SIGHUP: %w", err)
		}
		return nil
	}
	return r.judge(revokeAttack(ctx, l, server, relayconn.Relay{Name: "detour1", Addr: relayAddr, PublicKey: relayKey.Public()}, memberKey, revoke)).logsIn(o.Dir)
}

// revokeAttack streams from server (a listener of its own in the server
// node) to the client node through a conversion at relay asked as member,
// then calls revoke (which drops the member from the relay's members list
// and reloads it) at t0: the bytes moved from t0+revokeGrace to
// t0+revokeGrace+revokeWatch, whether none, and what it saw. An error: the
// attack could not be made.
func revokeAttack(ctx context.Context, l *caseLab, server netip.AddrPort, relay relayconn.Relay, member proto.Key, revoke func() error) (float64, bool, string, error) {
	cs, err := l.streamConversion(ctx, server, relay, member, nil)
	if err != nil {
		return 0, false, "", err
	}
	defer cs.close()
	got, ended := &cs.got, cs.ended
	time.Sleep(time.Second)
	before := got.Load()
	if before == 0 {
		return 0, false, "", fmt.Errorf("the conversion carried nothing before the revocation")
	}
	t0 := time.Now()
	if err := revoke(); err != nil {
		return 0, false, "", err
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
	detail := fmt.Sprintf("a conversion streaming server->member carried %d bytes in its first second; the member removed from members and SIGHUP at t0: %d bytes in t0..t0+%s, %d bytes in t0+%s..t0+%s; the conversion %s %s after t0",
		before, atGrace-before, revokeGrace, moved, revokeGrace, revokeGrace+revokeWatch, endedIn, time.Since(t0).Round(time.Millisecond))
	return float64(moved), moved == 0, detail, nil
}

// conversionStream is a member's conversion carrying a server's endless
// stream to the client node: got counts the bytes read, ended gets the
// read error that ended it (at endedAt, Unix ns).
type conversionStream struct {
	rc      *relayconn.Conn // the member's control connection
	got     atomic.Int64
	endedAt atomic.Int64
	ended   chan error
	closers []io.Closer
}

func (cs *conversionStream) close() {
	for i := len(cs.closers) - 1; i >= 0; i-- {
		cs.closers[i].Close()
	}
}

// streamConversion starts a server streaming to whoever connects at
// server (in the server node), asks relay for a converter ticket as the
// member (key k, certificate cert or nil) from the client node, and reads
// the stream through the conversion.
func (l *caseLab) streamConversion(ctx context.Context, server netip.AddrPort, relay relayconn.Relay, k proto.Key, cert []byte) (*conversionStream, error) {
	cs := &conversionStream{ended: make(chan error, 1)}
	var ln net.Listener
	if err := l.do("server", func() error {
		var err error
		ln, err = net.Listen("tcp", server.String())
		return err
	}); err != nil {
		return nil, err
	}
	cs.closers = append(cs.closers, ln)
	go streamTo(ln)
	rc, err := l.dialRelay(relay, k, cert)
	if err != nil {
		cs.close()
		return nil, err
	}
	cs.rc = rc
	cs.closers = append(cs.closers, rc)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	conv, tickets, _, err := rc.Convert(cctx, 1)
	cancel()
	if err != nil || len(tickets) == 0 {
		cs.close()
		return nil, fmt.Errorf("converter tickets: %v", err)
	}
	var c net.Conn
	if err := l.do("client", func() error {
		var err error
		c, err = convert.Dial(ctx, conv, server, tickets[0][:], convert.DialOptions{})
		return err
	}); err != nil {
		cs.close()
		return nil, fmt.Errorf("conversion: %w", err)
	}
	cs.closers = append(cs.closers, c)
	go func() {
		buf := make([]byte, 64<<10)
		for {
			n, err := c.Read(buf)
			cs.got.Add(int64(n))
			if err != nil {
				cs.endedAt.Store(time.Now().UnixNano())
				cs.ended <- err
				return
			}
		}
	}()
	return cs, nil
}
