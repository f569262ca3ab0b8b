package relayconn

import (
	"context"
	"fmt"

	"github.com/mpdetour/mpdetour/internal/proto"
)

// Roster reads the relay's roster of the collective (OpRoster), page by
// page, up to max entries. The entries are untrusted bytes: verify them
// (roster.Parse, Entry.Verify). total is the roster's size as the relay
// reported it.
func (c *Conn) Roster(ctx context.Context, max int) (entries [][]byte, total int, err error) {
	r, err := c.RosterSince(ctx, max, 0, false)
	return r.Entries, r.Total, err
}

// RosterRead is what RosterSince read.
type RosterRead struct {
	Entries   [][]byte // empty when Unchanged
	Total     int      // the roster's size as the relay reported it
	Digest    uint64   // the roster's digest (0: the relay sent none)
	Unchanged bool     // the relay holds the roster whose digest was passed in
}

// RosterSince is Roster for a client that holds the roster with digest
// have (0: none): when the relay's roster still has that digest, the
// relay answers with one small page and Unchanged is set. With digest
// false the request carries no digest (for relays older than the
// digest, which refuse it as malformed). When the roster changes between
// pages (the digests differ) the read starts over, at most three times.
func (c *Conn) RosterSince(ctx context.Context, max int, have uint64, digest bool) (RosterRead, error) {
	var r RosterRead
	for attempt := 0; ; attempt++ {
		r = RosterRead{}
		start, restart := 0, false
		for !restart {
			rep, err := call[*proto.RosterReply](ctx, c, &proto.RosterRequest{Start: uint16(start), Have: have, HasDigest: digest})
			if err != nil {
				return r, err
			}
			p := rep.Roster
			if int(p.Start) != start {
				return r, fmt.Errorf("relay %q: roster page from %d, asked from %d", c.relay.Name, p.Start, start)
			}
			if start == 0 {
				r.Digest = p.Digest
				if digest && p.Digest != 0 && p.Digest == have && len(p.Entries) == 0 {
					r.Total, r.Unchanged = int(p.Total), true
					return r, nil
				}
			} else if p.Digest != r.Digest {
				restart = true // the roster changed between pages
				break
			}
			r.Total = int(p.Total)
			r.Entries = append(r.Entries, p.Entries...)
			start += len(p.Entries)
			if start >= r.Total || len(r.Entries) >= max {
				r.Entries = r.Entries[:min(len(r.Entries), max)]
				return r, nil
			}
			if len(p.Entries) == 0 {
				return r, fmt.Errorf("relay %q: empty roster page at %d of %d", c.relay.Name, start, r.Total)
			}
			// Later pages: ask with no digest held, the reply's digest
			// tells whether the roster is still the first page's.
			have = 0
		}
		if attempt == 2 {
			return r, fmt.Errorf("relay %q: the roster changed while it was read, three times", c.relay.Name)
		}
	}
}
