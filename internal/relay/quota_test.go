package relay

import (
	"context"
	"net/netip"
	"testing"
	"time"
)

// The quota operation reports the member's mappings and quota, end to end
// through the client method.
func TestQuotaOperation(t *testing.T) {
	l := startLoopRelay(t, func(c *Reloadable) { c.QuotaPerMember = 5 })
	c := l.dial(t, l.k.member, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, s := range []string{"10.0.2.2:80", "10.0.2.3:80"} {
		if _, _, err := c.Grant(ctx, netip.MustParseAddrPort(s), 0); err != nil {
			t.Fatal(err)
		}
	}
	used, quota, err := c.Quota(ctx)
	if err != nil || used != 2 || quota != 5 {
		t.Fatalf("quota: %d of %d, %v; want 2 of 5", used, quota, err)
	}
}
