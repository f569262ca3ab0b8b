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
	"strings"
	"sync"
	"time"

	"github.com/mpdetour/mpdetour/internal/detour"
	"github.com/mpdetour/mpdetour/internal/mptcppm"
	"github.com/mpdetour/mpdetour/internal/policy"
	"github.com/mpdetour/mpdetour/internal/subflowcc"
)

// Status is what "mpdetour status" shows (JSON field names are stable).
type Status struct {
	NetNS       string         `json:"netns"`
	Policy      string         `json:"policy"`
	PMTypeSaved string         `json:"pm_type_saved"`
	Started     time.Time      `json:"started"`
	Counters    Counters       `json:"counters"`
	Latency     LatencySummary `json:"established_to_subflow_create"`
	LatencyAck  LatencySummary `json:"established_to_subflow_create_ack"`
	Connections []ConnStatus   `json:"connections"`
	Detours     []DetourStatus `json:"detours"`
	DiagError   string         `json:"diag_error,omitempty"`
	// Conversions: connections sent through a converter (docs/convert.md):
	// the converter router's status (convclient.Status) as JSON, since the
	// core does not know the converter's types.
	Conversions json.RawMessage `json:"conversions,omitempty"`
	// Blackhole: the kernel's MPTCP blackhole fallback.
	Blackhole *BlackholeStatus `json:"mptcp_blackhole,omitempty"`
	// Relays: each relay's state as the client sees it.
	Relays []RelayStatus `json:"relays,omitempty"`
	// PMTypeGuard: pm_type changed under the agent and set back.
	PMTypeGuard *PMTypeStatus `json:"pm_type_guard,omitempty"`
	// Families sums connections, subflows and detours per address family
	// (IPv4, IPv6), from the lists above.
	Families []FamilyStatus `json:"families"`
	// CwndClamp: the cwnd clamps of tunnel subflows (cwnd_clamp), when
	// configured: active, or failed with the reason (no clamps applied).
	CwndClamp *policy.ClampStatus `json:"cwnd_clamp,omitempty"`
	// SubflowLowat: the per-subflow unsent limit (subflow_lowat), when
	// configured.
	SubflowLowat *LowatStatus `json:"subflow_lowat,omitempty"`
	// SubflowPacing: subflow pacing (subflow_pacing), when configured.
	SubflowPacing *PacingStatus `json:"subflow_pacing,omitempty"`
	// SubflowCongestion: detour subflows' congestion control
	// (subflow_congestion), when configured: active with its routes and
	// the destinations it could not give one, or failed with the reason.
	SubflowCongestion *subflowcc.Status `json:"subflow_congestion,omitempty"`
	// StaleLossCnt: net.mptcp.stale_loss_cnt (stale_loss_cnt), when
	// configured: set (with the value found) or failed with the reason.
	StaleLossCnt *StaleStatus `json:"stale_loss_cnt,omitempty"`
	// BufferSizing: the socket buffer maxima (buffer_sizing), when on:
	// what the sizer found and set now, or failed with the reason.
	BufferSizing *BufferStatus `json:"buffer_sizing,omitempty"`
}

// BufferStatus is buffer_sizing's state.
type BufferStatus struct {
	State string `json:"state"` // "on" or "failed"
	// Found: the tcp_rmem and tcp_wmem triples found at start, restored at
	// stop; Max: the maximum set now, 0 while the found ones suffice.
	Found map[string]string `json:"found,omitempty"`
	Max   int64             `json:"max"`
	// Changes: how often the sizer moved the maximum.
	Changes int    `json:"changes"`
	Error   string `json:"error,omitempty"`
}

// StaleStatus is the stale_loss_cnt setting's state.
type StaleStatus struct {
	State string `json:"state"` // "set" or "failed"
	Want  int    `json:"want"`
	Was   string `json:"was,omitempty"` // the namespace's value, restored at stop
	Error string `json:"error,omitempty"`
}

// FamilyStatus is one address family's share of the status.
type FamilyStatus struct {
	Family string `json:"family"` // "IPv4" or "IPv6"
	// Connections: by the server's address; OnInet6: of those, on an
	// AF_INET6 socket (only those can take subflows of the other family).
	Connections int `json:"connections"`
	OnInet6     int `json:"on_af_inet6"`
	// Subflows up of this family, and of those in connections of the
	// other family (cross-family).
	Subflows int `json:"subflows"`
	Cross    int `json:"cross_family_subflows"`
	// Detours of this family (by the subflow's source for a tunnel, the
	// relay's address for a NAT detour) and how many are healthy.
	Detours int `json:"detours"`
	Healthy int `json:"healthy_detours"`
}

// familyOf names an address's family ("" if it does not parse).
func familyOf(s string) string {
	ap, err := netip.ParseAddrPort(s)
	a := ap.Addr()
	if err != nil {
		if a, err = netip.ParseAddr(s); err != nil {
			return ""
		}
	}
	return policy.FamilyName(a)
}

// Summarize fills st.Families from the connections and detours.
func Summarize(st *Status) {
	fam := map[string]*FamilyStatus{"IPv4": {Family: "IPv4"}, "IPv6": {Family: "IPv6"}}
	for _, c := range st.Connections {
		cf := fam[familyOf(c.Remote)]
		if cf == nil {
			continue
		}
		cf.Connections++
		if c.Socket == "AF_INET6" {
			cf.OnInet6++
		}
		for _, s := range c.Subflows {
			sf := fam[familyOf(s.Remote)]
			if sf == nil || s.State != "up" {
				continue
			}
			sf.Subflows++
			if sf != cf {
				sf.Cross++
			}
		}
	}
	for _, d := range st.Detours {
		at := d.Remote
		if d.Local != "" {
			at = d.Local
		}
		if f := fam[familyOf(at)]; f != nil {
			f.Detours++
			if d.Healthy {
				f.Healthy++
			}
		}
	}
	st.Families = []FamilyStatus{*fam["IPv4"], *fam["IPv6"]}
}

// Counters are totals since start.
type Counters struct {
	Events        uint64 `json:"events"`
	EventsLost    uint64 `json:"events_lost"` // ENOBUFS occurrences
	Resyncs       uint64 `json:"resyncs"`
	Adopted       uint64 `json:"adopted"`
	Commands      uint64 `json:"commands"`
	CommandErrors uint64 `json:"command_errors"`
	// SubflowCreates and SubflowCreateErrors: the SUBFLOW_CREATE commands
	// among Commands and CommandErrors.
	SubflowCreates      uint64 `json:"subflow_creates"`
	SubflowCreateErrors uint64 `json:"subflow_create_errors"`
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
	// Refusals counts refused subflows by reason; while HoldUntil is in
	// the future no new subflow is tried (backoff).
	Refusals  map[string]int `json:"refusals,omitempty"`
	HoldUntil time.Time      `json:"hold_until,omitzero"`
	Decision  string         `json:"decision,omitempty"`
	// Socket is the MPTCP socket's family, AF_INET or AF_INET6 (only the
	// latter takes subflows of the other address family); CrossFamily
	// says which other-family address its detours lead to and where it
	// was learned, or why it gets none.
	Socket      string `json:"socket"`
	CrossFamily string `json:"cross_family,omitempty"`
	token       uint32
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
	// Role is the policy's: connecting, active, backup, probing, evicted, failed.
	Role     string  `json:"role"`
	RateMbps float64 `json:"rate_mbps"`
	LossPct  float64 `json:"loss_pct"`
	Decision string  `json:"decision,omitempty"`
	// local and remote match the row with inet_diag's subflows.
	local, remote netip.AddrPort
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

// Status collects the agent's view (from the loop that owns it) and live
// subflow statistics (from inet_diag).
func (a *Agent) Status() Status {
	reply := make(chan Status, 1)
	var st Status
	select {
	case a.statusReq <- reply:
		st = <-reply
	case <-time.After(5 * time.Second):
		return Status{NetNS: a.cfg.NetNS, DiagError: "agent loop busy: no answer within 5s"}
	}
	if a.cfg.ConvertStatus != nil {
		if b, err := json.Marshal(a.cfg.ConvertStatus()); err == nil {
			st.Conversions = b
		}
	}
	if a.cfg.Blackhole != nil {
		bh := a.cfg.Blackhole()
		st.Blackhole = &bh
	}
	if a.cfg.PMType != nil {
		g := a.cfg.PMType()
		st.PMTypeGuard = &g
	}
	if a.cfg.CwndClamp != nil {
		c := a.cfg.CwndClamp()
		st.CwndClamp = &c
	}
	if a.cfg.SubflowLowat != nil {
		l := a.cfg.SubflowLowat()
		st.SubflowLowat = &l
	}
	if a.cfg.SubflowPacing != nil {
		p := a.cfg.SubflowPacing()
		st.SubflowPacing = &p
	}
	if a.cfg.SubflowCC != nil {
		c := a.cfg.SubflowCC.Status()
		st.SubflowCongestion = &c
	}
	markNeverEstablished(st.Detours)
	if a.cfg.RelayStatus != nil {
		st.Relays = a.cfg.RelayStatus()
		markRelayTrouble(st.Detours, st.Relays)
	}
	live := map[uint32]mptcppm.Connection{}
	if conns, err := a.k.Connections(); err != nil {
		st.DiagError = err.Error()
	} else {
		for _, c := range conns {
			live[c.Token] = c
		}
	}
	type diagKey struct{ l, r netip.AddrPort }
	for i := range st.Connections {
		cs := &st.Connections[i]
		stats := map[diagKey]mptcppm.Subflow{}
		for _, s := range live[cs.token].Subflows {
			stats[diagKey{unmap(s.Local), unmap(s.Remote)}] = s
		}
		for j := range cs.Subflows {
			ss := &cs.Subflows[j]
			if s, ok := stats[diagKey{ss.local, ss.remote}]; ok {
				ss.State = tcpState(s.State)
				ss.Local, ss.LocalID, ss.RemoteID, ss.Backup = unmap(s.Local).String(), s.LocalID, s.RemoteID, s.Backup()
				ss.BytesSent, ss.BytesReceived, ss.RTTms = s.BytesSent, s.BytesReceived, float64(s.RTT.Microseconds())/1000
			}
		}
	}
	return st
}

// snapshot is the loop's view; it runs on the loop.
func (a *Agent) snapshot() Status {
	st := Status{NetNS: a.cfg.NetNS, Policy: a.cfg.Policy.String(), Started: a.started,
		Latency: a.lat.summary(), LatencyAck: a.latAck.summary(), StaleLossCnt: a.stale}
	if a.bufs != nil {
		b := *a.bufs // the loop replaces a.bufs, never changes it
		st.BufferSizing = &b
	}
	if k, ok := a.k.(*LinuxKernel); ok {
		st.PMTypeSaved = k.PMTypeBefore
	}
	st.Counters = Counters{Events: a.stats.events.Load(), EventsLost: a.stats.lost.Load(),
		Resyncs: a.stats.resyncs.Load(), Adopted: a.stats.adopted.Load(),
		Commands: a.stats.commands.Load(), CommandErrors: a.stats.cmdErrors.Load(),
		SubflowCreates: a.stats.creates.Load(), SubflowCreateErrors: a.stats.createErrors.Load()}
	if len(a.errnoCnt) > 0 {
		st.Counters.ErrorsByErrno = maps.Clone(a.errnoCnt)
	}
	rep := a.pol.Report()
	byToken := map[uint32]policy.ConnReport{}
	for _, c := range rep.Conns {
		byToken[c.Token] = c
	}
	for tok, cv := range a.conns {
		cr := byToken[tok]
		cs := ConnStatus{Token: fmt.Sprintf("%08x", tok), Local: cv.c.Local.String(), Remote: cv.c.Remote.String(),
			Established: cv.established, Adopted: cv.adopted, Since: cv.since,
			Refusals: cr.Refusals, HoldUntil: cr.HoldUntil, Decision: cr.Decision, token: tok,
			Socket: map[bool]string{true: "AF_INET6", false: "AF_INET"}[cv.c.Inet6], CrossFamily: cr.Cross}
		seen := map[subKey]bool{}
		for _, r := range cr.Subflows {
			k := keyOf(r.Local, r.Remote)
			seen[k] = true
			ss := SubflowStatus{Path: r.Path, Local: r.Local.String(), Remote: r.Remote.String(), State: "up",
				Role: string(r.Role), RateMbps: r.Rate * 8 / 1e6, LossPct: 100 * r.Loss, Decision: r.Decision,
				RTTms: float64(r.RTT.Microseconds()) / 1000, local: unmap(netip.AddrPortFrom(r.Local, 0)), remote: r.Remote}
			if sv := cv.subs[k]; sv != nil {
				ss.Local, ss.local = sv.sf.Local.String(), sv.sf.Local
				ss.LocalID, ss.RemoteID, ss.Backup = sv.sf.LocalID, sv.sf.RemoteID, sv.sf.Backup
				if !sv.up {
					ss.State = "connecting"
				}
			} else if r.Path == "default" || r.Path == "default (redial)" {
				ss.Local, ss.local = cv.c.Local.String(), cv.c.Local
				if r.Port != 0 {
					// A redial replaced (or may replace) the initial subflow.
					ss.local = netip.AddrPortFrom(r.Local, r.Port)
					ss.Local = ss.local.String()
				}
			}
			if r.Role == policy.RoleFailed || r.Role == policy.RoleEvicted {
				ss.State = "closing"
			}
			cs.Subflows = append(cs.Subflows, ss)
		}
		// Subflows the policy does not track (opened by someone else).
		for k, sv := range cv.subs {
			if !seen[k] && sv.up {
				cs.Subflows = append(cs.Subflows, SubflowStatus{Path: sv.path, Local: sv.sf.Local.String(), Remote: sv.sf.Remote.String(),
					LocalID: sv.sf.LocalID, RemoteID: sv.sf.RemoteID, Backup: sv.sf.Backup, State: "up", Role: "untracked",
					local: sv.sf.Local, remote: sv.sf.Remote})
			}
		}
		sort.Slice(cs.Subflows, func(i, j int) bool {
			return cs.Subflows[i].Path+cs.Subflows[i].Remote < cs.Subflows[j].Path+cs.Subflows[j].Remote
		})
		st.Connections = append(st.Connections, cs)
	}
	sort.Slice(st.Connections, func(i, j int) bool { return st.Connections[i].Token < st.Connections[j].Token })

	known := map[string]detourView{}
	for k, dv := range a.detours {
		known[k] = *dv
	}
	health := map[string]policy.DetourReport{}
	for _, d := range rep.Detours {
		health[policy.Key(d.Detour)] = d
		if _, ok := known[policy.Key(d.Detour)]; !ok {
			known[policy.Key(d.Detour)] = detourView{d: d.Detour}
		}
	}
	// Configured detours show even before first use, withheld ones
	// (pathcheck.Filter: they strip MPTCP options) although unused.
	for _, s := range a.sources {
		if w, ok := s.(interface{ Stripped() []detour.Detour }); ok {
			for _, d := range w.Stripped() {
				if _, ok := known[policy.Key(d)]; !ok {
					known[policy.Key(d)] = detourView{d: d}
				}
			}
		}
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
		if h, ok := health[k]; ok {
			ds.Failed = max(ds.Failed, uint64(h.Total))
			if !h.BackoffUntil.IsZero() {
				ds.BackoffTill, ds.Healthy = h.BackoffUntil, false
			}
			if h.LastError != "" {
				ds.LastError = h.LastError
			}
		}
		for _, s := range a.sources {
			if u, ok := s.(interface {
				Unusable(detour.Detour) (string, bool)
			}); ok {
				if why, bad := u.Unusable(dv.d); bad {
					ds.Healthy, ds.LastError = false, why
				}
			}
		}
		st.Detours = append(st.Detours, ds)
	}
	sort.Slice(st.Detours, func(i, j int) bool { return st.Detours[i].Name < st.Detours[j].Name })
	Summarize(&st)
	return st
}

// markNeverEstablished marks a detour unhealthy whose subflows all failed
// (issue 28: a v1 detour whose every subflow was refused, errno 111,
// showed HEALTH ok): failures, not one subflow established, none up.
func markNeverEstablished(ds []DetourStatus) {
	for i := range ds {
		d := &ds[i]
		if d.Failed > 0 && d.Established == 0 && d.Subflows == 0 {
			d.Healthy = false
			if d.LastError == "" {
				d.LastError = "no subflow through it was ever established"
			} else if !strings.HasPrefix(d.LastError, "all ") {
				d.LastError = fmt.Sprintf("all %d subflows failed, none established; last: %s", d.Failed, d.LastError)
			}
		}
	}
}

// markRelayTrouble marks the detours of a relay in trouble unhealthy, with
// the relay's state as their last error: a revoked member's or an
// unreachable relay's detours are not "ok". A tunnel
// without handshake concerns the relay's tunnel detour only; refusals of
// some destinations by policy concern none of the granted detours.
func markRelayTrouble(ds []DetourStatus, rs []RelayStatus) {
	state := map[string]RelayStatus{}
	for _, r := range rs {
		state[r.Name] = r
	}
	for i := range ds {
		r, ok := state[ds[i].Relay]
		if !ok {
			continue
		}
		switch r.State {
		case RelayNoAnswer, RelayUnauthorized, RelayRevoked:
		case RelayNoHandshake:
			if ds[i].Kind != "tunnel" {
				continue
			}
		default:
			continue
		}
		ds[i].Healthy = false
		ds[i].LastError = "relay " + r.State + ": " + r.Detail
	}
}

func tcpState(s uint8) string {
	if int(s) < len(tcpStates) && s > 0 {
		return tcpStates[s]
	}
	return fmt.Sprintf("state(%d)", s)
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
		if errors.Is(err, os.ErrPermission) {
			return st, fmt.Errorf("agent status socket %s: permission denied: the status shows every user's connections and is root's (run as root)", path)
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
