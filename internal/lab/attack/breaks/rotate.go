package breaks

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relayconn"
)

const (
	rotateQuota     = 2 // the relay's quota.per_member in the case
	rotateRotations = 3
)

// rotationQuota (break 4): one member (a collective certificate, name
// alice) takes NAT mappings up to the quota, rotates its key, and asks
// again from the old key and from the new one; rotateRotations times. The
// mappings it holds over all its keys must never exceed the quota.
func rotationQuota(ctx context.Context, o Options) Result {
	r := Result{Break: 4, Metric: "mappings one member holds over its keys", Target: fmt.Sprintf("<= %d (quota)", rotateQuota)}
	l, keys, err := begin(ctx, o, "q", 1)
	if err != nil {
		return r.failed(err)
	}
	defer l.close()
	auth, err := collective.NewAuthority()
	if err != nil {
		return r.failed(err)
	}
	relayKey := keys[0]
	relayAddr := netip.AddrPortFrom(l.Addr("detour1"), relayPort)
	server := l.Addr("server")
	if _, err := l.startRelay(ctx, o, "detour1", "relay", fmt.Sprintf("listen: %s\nprivate_key: %s\nports: 40000-40999\nlease: 1m\nallow_destinations: [%s/32]\nquota: {per_member: %d}\ncollective:\n  authority: %s\n",
		relayAddr, relayKey, server, rotateQuota, auth.Public())); err != nil {
		return r.failed(err)
	}
	now := time.Now()
	newKey := func() (proto.Key, []byte, error) {
		k, err := proto.GenerateKey()
		if err != nil {
			return k, nil, err
		}
		c, err := auth.Issue(k.Public(), "alice", collective.RoleClient, now.Add(-time.Hour), now.Add(24*time.Hour))
		if err != nil {
			return k, nil, err
		}
		return k, c.Bytes(), nil
	}
	relay := relayconn.Relay{Name: "detour1", Addr: relayAddr, PublicKey: relayKey.Public()}
	var conns []*relayconn.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	dial := func(k proto.Key, cert []byte) (*relayconn.Conn, error) {
		c, err := l.dialRelay(relay, k, cert)
		if err == nil {
			conns = append(conns, c)
		}
		return c, err
	}
	port := uint16(1000)
	held := 0
	// grantAll asks c for mappings to new server ports until refused
	// (at most quota+1 tries): what the key is allowed beyond the member's
	// holdings.
	grantAll := func(c *relayconn.Conn) error {
		for range rotateQuota + 1 {
			port++
			gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, _, err := c.Grant(gctx, netip.AddrPortFrom(server, port), 0)
			cancel()
			if err != nil {
				if e := (*proto.Error)(nil); errors.As(err, &e) && e.Reason == proto.ReasonQuota {
					return nil
				}
				return err
			}
			held++
		}
		return nil
	}
	k, cert, err := newKey()
	if err != nil {
		return r.failed(err)
	}
	c, err := dial(k, cert)
	if err != nil {
		return r.failed(err)
	}
	// The relay may still be starting: the first grant waits for it.
	if err := grantAll(c); err != nil {
		r.Error = fmt.Sprintf("the member's first grants: %v (log in %s)", err, o.Dir)
		return r
	}
	rotated := 0
	for range rotateRotations {
		nk, ncert, err := newKey()
		if err != nil {
			return r.failed(err)
		}
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err = c.Rotate(rctx, nk, ncert)
		cancel()
		if err != nil {
			r.Detail = fmt.Sprintf("rotation %d refused: %v; ", rotated+1, err)
			break
		}
		rotated++
		// The new key, then the old key on a session of its own.
		if err := grantAll(c); err != nil {
			r.Error = "grants on the new key: " + err.Error()
			return r
		}
		old, err := dial(k, cert)
		if err != nil {
			return r.failed(err)
		}
		if err := grantAll(old); err != nil {
			r.Detail += fmt.Sprintf("old key after rotation %d: %v; ", rotated, err)
		}
		k, cert = nk, ncert
	}
	r.Value = float64(held)
	r.Pass = held <= rotateQuota && rotated == rotateRotations
	r.Detail += fmt.Sprintf("quota.per_member %d; %d rotations, after each grants asked on the new key and on the old key (a session of its own) until refused: %d mappings granted and held (lease 1m, none released)",
		rotateQuota, rotated, held)
	return r
}
