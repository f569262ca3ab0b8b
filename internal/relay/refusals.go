package relay

import (
	"fmt"
	"log/slog"
	"net/netip"
	"sort"
	"strings"
	"time"

	"github.com/mpdetour/mpdetour/internal/proto"
)

// refusalWindow is how often refused handshakes are summarised in the log.
const refusalWindow = 10 * time.Second

// refusalLog keeps the log bounded under a flood of refused handshakes:
// the first refusal of a window is logged with its details, the others are
// counted by reason and summarised in one line when the window ends (the
// metrics count every one, by reason).
type refusalLog struct {
	start   time.Time
	counts  map[proto.Reason]int
	sources map[netip.Addr]bool
	last    netip.AddrPort
}

func (r *refusalLog) note(log *slog.Logger, now time.Time, reason proto.Reason, from netip.AddrPort, detail string) {
	if r.counts == nil {
		r.counts, r.sources, r.start = map[proto.Reason]int{}, map[netip.Addr]bool{}, now
		log.Info("handshake refused", "reason", reason.String(), "from", from, "detail", detail,
			"note", fmt.Sprintf("further refusals are summarised every %s", refusalWindow))
	} else {
		r.counts[reason]++
		if len(r.sources) < 10000 {
			r.sources[from.Addr()] = true
		}
	}
	r.last = from
}

// flush logs the window's summary once it is over.
func (r *refusalLog) flush(log *slog.Logger, now time.Time) {
	if r.counts == nil || now.Sub(r.start) < refusalWindow {
		return
	}
	if len(r.counts) > 0 {
		var parts []string
		total := 0
		for reason, n := range r.counts {
			parts = append(parts, fmt.Sprintf("%s=%d", reason, n))
			total += n
		}
		sort.Strings(parts)
		log.Info("handshakes refused", "total", total, "by_reason", strings.Join(parts, " "),
			"sources", len(r.sources), "last_from", r.last, "window", now.Sub(r.start).Round(time.Second))
	}
	r.counts, r.sources = nil, nil
}
