package tunnelctl

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/proto"
)

// oldOrNewRelay answers encap requests as a relay would: old refuses the
// flagged request as malformed (its parser takes one action byte only),
// fail refuses both with that error; otherwise the flagged request gets
// the IPv6 inside and the plain one the IPv4 shape.
type oldOrNewRelay struct {
	old     bool
	fail    error
	flagged int
	plain   int
}

var askGrant = proto.EncapGrant{ClientPrefix: netip.MustParsePrefix("100.81.0.7/16"), Gateway: netip.MustParseAddr("100.81.0.1"),
	Endpoint: netip.MustParseAddrPort("198.18.1.1:4789"), Member: netip.MustParseAddr("198.18.1.2"), VNI: 7, MTU: 1450}

func (r *oldOrNewRelay) Encap(context.Context) (proto.EncapGrant, time.Duration, error) {
	r.plain++
	if r.fail != nil {
		return proto.EncapGrant{}, 0, r.fail
	}
	return askGrant, time.Minute, nil
}

func (r *oldOrNewRelay) EncapIPv6(context.Context) (proto.EncapGrant, time.Duration, error) {
	r.flagged++
	switch {
	case r.old:
		return proto.EncapGrant{}, 0, &proto.Error{Op: proto.OpEncap, Reason: proto.ReasonMalformed}
	case r.fail != nil:
		return proto.EncapGrant{}, 0, r.fail
	}
	g := askGrant
	g.ClientPrefix6, g.Gateway6 = netip.MustParsePrefix("fd64:81::7/64"), netip.MustParseAddr("fd64:81::1")
	return g, time.Minute, nil
}

// TestAskEncapFallback: a new relay answers the flagged request (one
// request); an old relay's malformed answer makes the client ask again
// without the flag and get the IPv4 tunnel; any other refusal is the
// answer (no second request).
func TestAskEncapFallback(t *testing.T) {
	ctx := context.Background()
	n := &oldOrNewRelay{}
	if g, _, err := askEncap(ctx, n); err != nil || !g.ClientPrefix6.IsValid() || n.flagged != 1 || n.plain != 0 {
		t.Fatalf("new relay: %+v %v, requests %d flagged %d plain; want the IPv6 inside in one flagged request", g, err, n.flagged, n.plain)
	}
	o := &oldOrNewRelay{old: true}
	if g, _, err := askEncap(ctx, o); err != nil || g != askGrant || o.flagged != 1 || o.plain != 1 {
		t.Fatalf("old relay: %+v %v, requests %d flagged %d plain; want the IPv4 grant after one of each", g, err, o.flagged, o.plain)
	}
	denied := &proto.Error{Op: proto.OpEncap, Reason: proto.ReasonUnsupported}
	f := &oldOrNewRelay{fail: denied}
	if _, _, err := askEncap(ctx, f); !errors.Is(err, denied) || f.plain != 0 {
		t.Fatalf("refusing relay: %v after %d plain requests, want %v and none", err, f.plain, denied)
	}
}
