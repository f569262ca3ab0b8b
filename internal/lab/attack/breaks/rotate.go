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
	return r.judge(rotationAttack(ctx, l, auth, relayconn.Relay{Name: "detour1", Addr: relayAddr, PublicKey: relayKey.Public()}, server, rotateQuota)).logsIn(o.Dir)
}

// rotationAttack: a member named alice (certificates of auth) takes NAT
// mappings at relay toward server (new ports) until refused, rotates its
// key rotateRotations times and after each asks again on the new key and
// on the old one (a session of its own). It returns the mappings granted
// and held, whether they stayed within quota (the relay's
// quota.per_member) with every rotation accepted, and what it saw. An
// error: the attack could not be made.
func rotationAttack(ctx context.Context, l *caseLab, auth *collective.Authority, relay relayconn.Relay, server netip.Addr, quota int) (float64, bool, string, error) {
	detail := ""
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
		for range quota + 1 {
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
		return 0, false, "", err
	}
	c, err := dial(k, cert)
	if err != nil {
		return 0, false, "", err
	}
	// The relay may still be starting: the first grant waits for it.
	if err := grantAll(c); err != nil {
		return 0, false, "", fmt.Errorf("the member's first grants: %v", err)
	}
	rotated := 0
	for range rotateRotations {
		nk, ncert, err := newKey()
		if err != nil {
			return 0, false, "", err
		}
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err = c.Rotate(rctx, nk, ncert)
		cancel()
		if err != nil {
			detail = fmt.Sprintf("rotation %d refused: %v; ", rotated+1, err)
			break
		}
		rotated++
		// The new key, then the old key on a session of its own.
		if err := grantAll(c); err != nil {
			return 0, false, "", fmt.Errorf("grants on the new key: %w", err)
		}
		old, err := dial(k, cert)
		if err != nil {
			return 0, false, "", err
		}
		if err := grantAll(old); err != nil {
			detail += fmt.Sprintf("old key after rotation %d: %v; ", rotated, err)
		}
		k, cert = nk, ncert
	}
	detail += fmt.Sprintf("quota.per_member %d; %d rotations, after each grants asked on the new key and on the old key (a session of its own) until refused: %d mappings granted and held (none released)",
		quota, rotated, held)
	return float64(held), held <= quota && rotated == rotateRotations, detail, nil
}
