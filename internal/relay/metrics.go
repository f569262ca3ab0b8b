package relay

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/mpdetour/mpdetour/internal/metricsrv"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics are always counted (cheap); they are served only when configured.
type metrics struct {
	reg      *prometheus.Registry
	active   prometheus.Gauge
	requests *prometheus.CounterVec
	cookies  prometheus.Counter
	// memberBytes: final counters of closed mappings per member name (names
	// come from the configuration, a fixed set, never from the wire).
	memberBytes *prometheus.CounterVec
	sessions    prometheus.Gauge
	grantTime   prometheus.Histogram
	// conversions by result (a fixed set: conversionResult) and their bytes.
	conversions  *prometheus.CounterVec
	convertBytes prometheus.Counter
	// roster: entries refused by reason (roster.Reason's fixed set) and
	// the verified roster's size.
	rosterRefused *prometheus.CounterVec
	rosterSize    prometheus.Gauge
	// revocation list: gossiped lists refused by reason (roster's CRL*
	// labels) and the sequence number of the list applied.
	crlRefused *prometheus.CounterVec
	crlSeq     prometheus.Gauge
	// rotations: member key rotations by result (rotate.go's fixed set).
	rotations *prometheus.CounterVec
	// closedBytes accumulates the final counters of closed mappings. Live
	// counters are not added at scrape time: that would need a dump of the
	// whole set (seconds at 100,000 mappings, and not consistent while the
	// kernel resizes the hash table).
	closedBytes atomic.Uint64
}

func newMetrics() *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		active: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "mpdetour_relay_active_mappings", Help: "NAT mappings currently granted.",
		}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mpdetour_relay_requests_total", Help: "Requests by operation and result code.",
		}, []string{"op", "result"}),
		memberBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mpdetour_relay_member_bytes_total", Help: "Bytes forwarded through a member's mappings, counted when each mapping closes (legacy v1: member legacy-v1).",
		}, []string{"member"}),
		sessions: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "mpdetour_relay_sessions", Help: "Control-protocol sessions currently held.",
		}),
		grantTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "mpdetour_relay_grant_seconds", Help: "Time from a grant request's arrival to its reply (new mappings installed in the kernel first).",
			Buckets: []float64{.0005, .001, .002, .005, .01, .02, .05, .1, .25, .5, 1},
		}),
		conversions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mpdetour_relay_conversions_total", Help: "Converted connections (convert role) by result: ok, not-authorized, refused, unreachable, resource-exceeded, malformed, refused-other, error.",
		}, []string{"result"}),
		convertBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mpdetour_relay_convert_bytes_total", Help: "Bytes copied by the converter (both directions), counted when each conversion ends.",
		}),
		rosterRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mpdetour_relay_roster_refused_total", Help: "Roster entries refused (collective gossip) by reason: malformed, forged, certificate-forged, certificate-dates, revoked, not-a-relay, future, name-mismatch.",
		}, []string{"reason"}),
		rosterSize: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "mpdetour_relay_roster_relays", Help: "Relays in the verified roster (this one included).",
		}),
		crlRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mpdetour_relay_crl_refused_total", Help: "Revocation lists from gossip refused, by reason: malformed, wrong-authority, forged, stale.",
		}, []string{"reason"}),
		crlSeq: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "mpdetour_relay_crl_seq", Help: "Sequence number of the revocation list applied (0: none).",
		}),
		cookies: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mpdetour_relay_cookie_replies_total", Help: "Initiations answered with a cookie (the relay was under load and the sender had not proven its address).",
		}),
	}
	m.rotations = newRotationsMetric()
	for _, r := range rotateResults {
		m.rotations.WithLabelValues(r)
	}
	bytes := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "mpdetour_relay_bytes_total", Help: "Bytes forwarded through mappings, counted when each mapping closes (both directions).",
	}, func() float64 { return float64(m.closedBytes.Load()) })
	m.reg.MustRegister(m.active, m.requests, m.cookies, m.memberBytes, m.sessions, m.grantTime, m.conversions, m.convertBytes, m.rosterRefused, m.rosterSize, m.crlRefused, m.crlSeq, m.rotations, bytes,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// serve runs the metrics endpoint until ctx ends: on a TCP address or a
// unix socket of mode 0600, with a bearer token when set (metricsrv;
// docs/security.md, Metrics: member names and bytes per member).
func (m *metrics) serve(ctx context.Context, addr, token string, log *slog.Logger) error {
	ln, err := metricsrv.Listen(addr)
	if err != nil {
		return err
	}
	if why := metricsrv.Exposed(addr, token); why != "" {
		log.Warn(why)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", metricsrv.Protect(promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}), token))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics endpoint stopped", "err", err)
		}
	}()
	return nil
}
