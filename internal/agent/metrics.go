package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/mpdetour/mpdetour/internal/metricsrv"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// ServeMetrics serves /metrics for a on addr (e.g. 127.0.0.1:9465, or
// unix:/PATH, a socket of mode 0600) until the returned stop is called;
// with a token every scrape must send it as a bearer token. The listener
// is opened before it returns, so a busy port is an error at start, not a
// log line later. An endpoint other local users can read is logged once
// (docs/security.md, Metrics).
func ServeMetrics(addr, token string, a *Agent, log *slog.Logger) (stop func(), err error) {
	reg := prometheus.NewRegistry()
	// The Go runtime and process collectors (go_goroutines,
	// process_open_fds, process_resident_memory_bytes...) are what a soak
	// test or an operator watches for leaks.
	reg.MustRegister(NewMetrics(a), collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	ln, err := metricsrv.Listen(addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	if why := metricsrv.Exposed(addr, token); why != "" {
		log.Warn(why)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", metricsrv.Protect(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), token))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server stopped", "err", err)
		}
	}()
	log.Info("metrics", "listen", ln.Addr().String())
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, nil
}

// Metrics exports the agent's state for Prometheus. Every scrape reads one
// Status snapshot through the goroutine that owns the state (no second copy
// of the counters to drift). Label values come from fixed sets (path kind,
// role, state, errno name of a known list) or from the configuration
// (detour names), never from the network.
type Metrics struct {
	a *Agent

	connections, subflows, detourUp, detourHealthy         *prometheus.Desc
	events, eventsLost, resyncs, adopted, commands, cmdErr *prometheus.Desc
	creates, createErr                                     *prometheus.Desc
	detourEstablished, detourFailed, latency               *prometheus.Desc
	mptcpDisabled, mptcpDisables, mptcpFallbacks           *prometheus.Desc
	relayState, relaySuccess                               *prometheus.Desc
}

// NewMetrics describes the agent's metrics; register it on a registry.
func NewMetrics(a *Agent) *Metrics {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("mpdetour_agent_"+name, help, labels, nil)
	}
	return &Metrics{a: a,
		connections:       d("connections", "MPTCP connections managed now"),
		subflows:          d("subflows", "Subflows now, by path kind (default, nat, tunnel, announced, other) and policy role", "path", "role"),
		detourUp:          d("detour_subflows", "Subflows up through each relay (kind:relay) now", "detour"),
		detourHealthy:     d("detour_healthy", "Detours of this relay and kind not in backoff", "detour"),
		detourEstablished: d("detour_subflows_established_total", "Subflows established through each detour", "detour"),
		detourFailed:      d("detour_subflows_failed_total", "Subflow failures through each detour (refused, timed out, stalled)", "detour"),
		events:            d("events_total", "mptcp_pm events received"),
		eventsLost:        d("events_lost_total", "Event socket overruns (ENOBUFS); each is followed by a resync"),
		resyncs:           d("resyncs_total", "Resynchronisations with the kernel's connection table"),
		adopted:           d("adopted_total", "Connections adopted at start or on resync"),
		commands:          d("commands_total", "mptcp_pm commands issued"),
		cmdErr:            d("command_errors_total", "mptcp_pm commands that failed, by errno", "errno"),
		creates:           d("subflow_creates_total", "SUBFLOW_CREATE commands issued (of commands_total); far above connections x detours means retries"),
		createErr:         d("subflow_create_errors_total", "SUBFLOW_CREATE commands the kernel refused (of command_errors_total)"),
		latency:           d("established_to_subflow_create_seconds", "ESTABLISHED event to SUBFLOW_CREATE sent, over the recent samples", "quantile"),
		mptcpDisabled:     d("mptcp_blackhole_disabled", "1 while the kernel's MPTCP blackhole detection has new connections made plain TCP (no detours); clear with sysctl -w net.mptcp.blackhole_timeout=N"),
		mptcpDisables:     d("mptcp_blackhole_disables_total", "Times the kernel disabled MPTCP for new connections since boot (MPTcpExt Blackhole)"),
		mptcpFallbacks:    d("mptcp_blackhole_fallbacks_total", "Connections made plain TCP because of a disable, since boot (MPTcpExt MPCapableSYNTXDisabled)"),
		relayState:        d("relay_state", "1 for each relay's current state as the client sees it (ok, no-answer, unauthorized, revoked, refused, policy-denied, tunnel-no-handshake, unknown), 0 for the others", "relay", "state"),
		relaySuccess:      d("relay_last_success_timestamp_seconds", "When each relay last answered a grant, renewal or ping (0: never)", "relay"),
	}
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.connections, m.subflows, m.detourUp, m.detourHealthy, m.detourEstablished, m.detourFailed,
		m.events, m.eventsLost, m.resyncs, m.adopted, m.commands, m.cmdErr, m.creates, m.createErr, m.latency,
		m.mptcpDisabled, m.mptcpDisables, m.mptcpFallbacks, m.relayState, m.relaySuccess} {
		ch <- d
	}
}

// knownErrnos bounds the errno label (the names the kernel's mptcp_pm
// commands return); anything else is "other".
var knownErrnos = map[string]bool{
	"invalid argument": true, "no such file or directory": true, "no buffer space available": true,
	"address already in use": true, "cannot assign requested address": true, "connection refused": true,
	"network is unreachable": true, "no route to host": true, "connection timed out": true,
	"operation not permitted": true, "operation not supported": true, "resource temporarily unavailable": true,
	"transport endpoint is not connected": true, "no space left on device": true, "other": true,
}

func pathKind(path string) string {
	kind, _, _ := strings.Cut(path, ":")
	if path == "default (redial)" {
		kind = "default"
	}
	switch kind {
	case "default", "nat", "tunnel", "announced":
		return kind
	}
	return "other"
}

func role(r string) string {
	switch r {
	case "connecting", "active", "backup", "probing", "evicted", "failed":
		return r
	case "":
		return "unknown"
	}
	return "other"
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	st := m.a.Status()
	g := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, l...)
	}
	c := func(d *prometheus.Desc, v uint64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), l...)
	}
	g(m.connections, float64(len(st.Connections)))
	type pr struct{ path, role string }
	subs := map[pr]int{}
	for _, cs := range st.Connections {
		for _, s := range cs.Subflows {
			subs[pr{pathKind(s.Path), role(s.Role)}]++
		}
	}
	for k, n := range subs {
		g(m.subflows, float64(n), k.path, k.role)
	}
	// Per relay and kind, not per detour address: relays hand out new
	// ports, and a label per port would grow without bound.
	type agg struct {
		up, healthy         int
		established, failed uint64
	}
	per := map[string]*agg{}
	for _, d := range st.Detours {
		name := d.Kind + ":" + d.Relay
		x := per[name]
		if x == nil {
			x = &agg{}
			per[name] = x
		}
		x.up += d.Subflows
		if d.Healthy {
			x.healthy++
		}
		x.established += d.Established
		x.failed += d.Failed
	}
	for name, x := range per {
		g(m.detourUp, float64(x.up), name)
		g(m.detourHealthy, float64(x.healthy), name)
		c(m.detourEstablished, x.established, name)
		c(m.detourFailed, x.failed, name)
	}
	k := st.Counters
	c(m.events, k.Events)
	c(m.eventsLost, k.EventsLost)
	c(m.resyncs, k.Resyncs)
	c(m.adopted, k.Adopted)
	c(m.commands, k.Commands)
	c(m.creates, k.SubflowCreates)
	c(m.createErr, k.SubflowCreateErrors)
	byErrno := map[string]uint64{}
	for name, n := range k.ErrorsByErrno {
		if !knownErrnos[name] {
			name = "other"
		}
		byErrno[name] += n
	}
	for name, n := range byErrno {
		c(m.cmdErr, n, name)
	}
	if b := st.Blackhole; b != nil && b.Error == "" {
		g(m.mptcpDisabled, map[bool]float64{true: 1}[b.State == BlackholeDisabled])
		c(m.mptcpDisables, b.Disables)
		c(m.mptcpFallbacks, b.Fallbacks)
	}
	for _, r := range st.Relays {
		for _, state := range RelayStates {
			g(m.relayState, map[bool]float64{true: 1}[r.State == state], r.Name, state)
		}
		last := 0.0
		if !r.LastSuccess.IsZero() {
			last = float64(r.LastSuccess.UnixNano()) / 1e9
		}
		g(m.relaySuccess, last, r.Name)
	}
	if st.Latency.Samples > 0 {
		g(m.latency, st.Latency.P50ms/1e3, "0.5")
		g(m.latency, st.Latency.P99ms/1e3, "0.99")
		g(m.latency, st.Latency.Maxms/1e3, "1")
	}
}
