package tunnel

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// RefusedLogEvery is how often the tunnel server reads the counters of its
// destination-policy rules and logs what they refused since (one line per
// period at most, whatever the packet rate: bounded).
const RefusedLogEvery = time.Minute

// Refused is the number of packets from tunnel clients the destination
// policy refused (answered with a reset or an ICMP error) since the table
// was installed: the sum of the counters of the "destinations" chain's
// reject rules, read through netlink.
func (s *Server) Refused() (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	nc, err := s.ns.nft()
	if err != nil {
		return 0, err
	}
	fams := []nftables.TableFamily{nftables.TableFamilyIPv4}
	if s.cfg.Subnet6.IsValid() {
		fams = append(fams, nftables.TableFamilyIPv6)
	}
	var rules []*nftables.Rule
	for _, fam := range fams {
		t := &nftables.Table{Family: fam, Name: TableName}
		rs, err := nc.GetRules(t, &nftables.Chain{Name: "destinations", Table: t})
		if err != nil {
			return 0, fmt.Errorf("nftables: reading the tunnel's destination rules: %w", err)
		}
		rules = append(rules, rs...)
	}
	var n uint64
	for _, r := range rules {
		var c *expr.Counter
		for _, e := range r.Exprs {
			switch e := e.(type) {
			case *expr.Counter:
				c = e
			case *expr.Reject:
				if c != nil {
					n += c.Packets
				}
			}
		}
	}
	return n, nil
}

// watchRefused logs, every period, how many packets read reports refused
// since the previous period (nothing when none). A table reinstalled
// (SetDestinations) restarts its counters: a smaller reading is taken as
// the new base.
func watchRefused(ctx context.Context, read func() (uint64, error), every time.Duration, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	var last uint64
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, err := read()
		if err != nil {
			log.Debug("tunnel: reading the destination policy's counters", "err", err)
			continue
		}
		if n > last {
			log.Warn("tunnel: packets to destinations the policy refuses (answered with a reset or ICMP; see allow_destinations)",
				"packets", n-last, "in", every)
		}
		last = n
	}
}
