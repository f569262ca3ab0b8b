package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/mpdetour/mpdetour/internal/detour"
	"github.com/mpdetour/mpdetour/internal/mptcppm"
	"github.com/mpdetour/mpdetour/internal/policy"
)

// Status is what "mpdetour status" shows (JSON field names are stable).
type Status struct {
	NetNS       string         `json:"netns"`
	PMTypeSaved string         `json:"pm_type_saved"`
	Started     time.Time      `json:"started"`
	Counters    Counters       `json:"counters"`
	Latency     LatencySummary `json:"established_to_subflow_create"`
	LatencyAck  LatencySummary `json:"established_to_subflow_create_ack"`
	Connections []ConnStatus   `json:"connections"`
	Detours     []DetourStatus `json:"detours"`
	DiagError   string         `json:"diag_error,omitempty"`
}

// Counters are totals since start.
type Counters struct {
	Events        uint64 `json:"events"`
	EventsLost    uint64 `json:"events_lost"` // ENOBUFS occurrences
	Resyncs       uint64 `json:"resyncs"`
	Adopted       uint64 `json:"adopted"`
	Commands      uint64 `json:"commands"`
	CommandErrors uint64 `json:"command_errors"`
	// ErrorsByErrno splits CommandErrors by the kernel's errno.
	ErrorsByErrno map[string]uint64 `json:"errors_by_errno,omitempty"`
}

// ConnStatus is one managed connection.
type ConnStatus struct {
	Token       string          `json:"token"`
	Local       string          `json:"local"`
	Remote      string          `json:"remote"`
	Established bool            `json:"established"`
	Adopted     bool            `json:"adopted"`
	Since       time.Time       `json:"since"`
	Subflows    []SubflowStatus `json:"subflows"`
}

// SubflowStatus is one subflow; byte counts and RTT come from inet_diag.
type SubflowStatus struct {
	Path          string  `json:"path"` // "default", "nat:RELAY", "tunnel:RELAY", "announced", "other"
	Local         string  `json:"local"`
	Remote        string  `json:"remote"`
	LocalID       uint8   `json:"local_id"`
	RemoteID      uint8   `json:"remote_id"`
	State         string  `json:"state"`
	Backup        bool    `json:"backup"`
	BytesSent     uint64  `json:"bytes_sent"`
	BytesReceived uint64  `json:"bytes_received"`
	RTTms         float64 `json:"rtt_ms"`
}

// DetourStatus is one detour's health.
type DetourStatus struct {
	Name        string    `json:"name"`
	Kind        string    `json:"kind"`
	Relay       string    `json:"relay"`
	Local       string    `json:"local,omitempty"`
	Remote      string    `json:"remote"`
	Subflows    int       `json:"subflows"`
	Established uint64    `json:"established"`
	Failed      uint64    `json:"failed"`
	LastError   string    `json:"last_error,omitempty"`
	BackoffTill time.Time `json:"backoff_until,omitzero"`
	Healthy     bool      `json:"healthy"`
}

// LatencySummary describes the time from an ESTABLISHED event's arrival
// to a SUBFLOW_CREATE it caused (sent, or acknowledged by the kernel).
type LatencySummary struct {
	Samples int     `json:"samples"`
	P50ms   float64 `json:"p50_ms"`
	P99ms   float64 `json:"p99_ms"`
	Maxms   float64 `json:"max_ms"`
}

// latency keeps the most recent samples in a ring (bounded memory).
type latency struct {
	mu   sync.Mutex
	ring []time.Duration
	next int
	full bool
}

const latencyRing = 1 << 16

func (l *latency) add(d time.Duration) {
	l.mu.Lock()
	if l.ring == nil {
		l.ring = make([]time.Duration, latencyRing)
	}
	l.ring[l.next] = d
	l.next = (l.next + 1) % latencyRing
	l.full = l.full || l.next == 0
	l.mu.Unlock()
}

func (l *latency) summary() LatencySummary {
	l.mu.Lock()
	n := l.next
	if l.full {
		n = latencyRing
	}
	s := slices.Clone(l.ring[:n])
	l.mu.Unlock()
	if len(s) == 0 {
		return LatencySummary{}
	}
	slices.Sort(s)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	return LatencySummary{Samples: len(s), P50ms: ms(s[len(s)/2]), P99ms: ms(s[len(s)*99/100]), Maxms: ms(s[len(s)-1])}
}

var tcpStates = [...]string{"", "ESTABLISHED", "SYN_SENT", "SYN_RECV", "FIN_WAIT1", "FIN_WAIT2",
	"TIME_WAIT", "CLOSE", "CLOSE_WAIT", "LAST_ACK", "LISTEN", "CLOSING"}

// Status collects the agent's view and live subflow statistics.
func (a *Agent) Status() Status {
	st := Status{NetNS: a.cfg.NetNS, PMTypeSaved: a.pmOld, Started: a.started, Latency: a.lat.summary(), LatencyAck: a.latAck.summary()}
	st.Counters = Counters{Events: a.stats.events.Load(), EventsLost: a.stats.lost.Load(),
		Resyncs: a.stats.resyncs.Load(), Adopted: a.stats.adopted.Load(),
		Commands: a.stats.commands.Load(), CommandErrors: a.stats.cmdErrors.Load()}
	a.errMu.Lock()
	if len(a.errnoCnt) > 0 {
		st.Counters.ErrorsByErrno = maps.Clone(a.errnoCnt)
	}
	a.errMu.Unlock()
	live := map[uint32]mptcppm.Connection{}
	if conns, err := mptcppm.Dump(a.opts); err != nil {
		st.DiagError = err.Error()
	} else {
		for _, c := range conns {
			live[c.Token] = c
		}
	}
	type diagKey struct{ l, r netip.AddrPort }
	a.mu.Lock()
	for tok, cv := range a.conns {
		cs := ConnStatus{Token: fmt.Sprintf("%08x", tok), Local: cv.c.Local.String(), Remote: cv.c.Remote.String(),
			Established: cv.established, Adopted: cv.adopted, Since: cv.since}
		stats := map[diagKey]mptcppm.Subflow{}
		for _, s := range live[tok].Subflows {
			stats[diagKey{unmap(s.Local), unmap(s.Remote)}] = s
		}
		// The initial subflow never produces a SUB_ESTABLISHED event.
		if s, ok := stats[diagKey{cv.c.Local, cv.c.Remote}]; ok {
			cs.Subflows = append(cs.Subflows, subStatus("default", s))
		}
		for _, sv := range cv.subs {
			ss := SubflowStatus{Path: sv.path, Local: sv.sf.Local.String(), Remote: sv.sf.Remote.String(),
				LocalID: sv.sf.LocalID, RemoteID: sv.sf.RemoteID, Backup: sv.sf.Backup, State: "connecting"}
			if s, ok := stats[diagKey{sv.sf.Local, sv.sf.Remote}]; ok && sv.up {
				ss = subStatus(sv.path, s)
			} else if sv.up {
				ss.State = "up"
			}
			cs.Subflows = append(cs.Subflows, ss)
		}
		sort.Slice(cs.Subflows, func(i, j int) bool {
			return cs.Subflows[i].Path+cs.Subflows[i].Remote < cs.Subflows[j].Path+cs.Subflows[j].Remote
		})
		st.Connections = append(st.Connections, cs)
	}
	known := map[string]detourView{}
	for k, dv := range a.detours {
		known[k] = *dv
	}
	a.mu.Unlock()
	sort.Slice(st.Connections, func(i, j int) bool { return st.Connections[i].Token < st.Connections[j].Token })

	// Configured detours show even before first use.
	for _, s := range a.sources {
		if all, ok := s.(interface{ All() []detour.Detour }); ok {
			for _, d := range all.All() {
				if _, ok := known[policy.Key(d)]; !ok && d.Kind == detour.NAT {
					known[policy.Key(d)] = detourView{d: d}
				}
			}
		}
	}
	for k, dv := range known {
		ds := DetourStatus{Name: k, Kind: dv.d.Kind.String(), Relay: dv.d.Relay, Remote: dv.d.Remote.String(),
			Subflows: dv.up, Established: dv.established, Failed: dv.failed, LastError: dv.lastErr, Healthy: true}
		if dv.d.Local.IsValid() {
			ds.Local = dv.d.Local.String()
		}
		if t := a.pol.backoff(dv.d); !t.IsZero() {
			ds.BackoffTill, ds.Healthy = t, false
		}
		st.Detours = append(st.Detours, ds)
	}
	sort.Slice(st.Detours, func(i, j int) bool { return st.Detours[i].Name < st.Detours[j].Name })
	return st
}

func subStatus(path string, s mptcppm.Subflow) SubflowStatus {
	state := fmt.Sprintf("state(%d)", s.State)
	if int(s.State) < len(tcpStates) && s.State > 0 {
		state = tcpStates[s.State]
	}
	return SubflowStatus{Path: path, Local: unmap(s.Local).String(), Remote: unmap(s.Remote).String(),
		LocalID: s.LocalID, RemoteID: s.RemoteID, State: state, Backup: s.Backup(),
		BytesSent: s.BytesSent, BytesReceived: s.BytesReceived, RTTms: float64(s.RTT.Microseconds()) / 1000}
}

// serveStatus answers each connection on the unix socket with one JSON
// Status document.
func (a *Agent) serveStatus(path string) (io.Closer, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("status socket: %w", err)
	}
	// A socket file left by a crashed agent is removed; a live one is not.
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return nil, fmt.Errorf("status socket %s: another agent is running", path)
	}
	_ = os.Remove(path)
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("status socket: %w", err)
	}
	_ = os.Chmod(path, 0o600)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
				enc := json.NewEncoder(c)
				enc.SetIndent("", "  ")
				if err := enc.Encode(a.Status()); err != nil {
					a.log.Debug("status client", "err", err)
				}
			}()
		}
	}()
	return l, nil
}

// FetchStatus asks the agent listening on path.
func FetchStatus(path string) (Status, error) {
	var st Status
	c, err := net.DialTimeout("unix", path, 5*time.Second)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return st, fmt.Errorf("no agent status socket at %s (is mpdetour agent running?)", path)
		}
		return st, fmt.Errorf("agent status socket %s: %w", path, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(15 * time.Second))
	if err := json.NewDecoder(c).Decode(&st); err != nil {
		return st, fmt.Errorf("agent status: %w", err)
	}
	return st, nil
}
