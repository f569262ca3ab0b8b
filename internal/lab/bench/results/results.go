// Package results stores benchmark trials: one JSON line per trial,
// appended and synced as soon as the trial ends so that an interrupted run
// loses at most the trial in progress, plus JSON and CSV exports.
package results

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Trial outcomes.
const (
	OK          = "ok"
	Failed      = "failed"      // the procedure ran and broke; no goodput
	Unavailable = "unavailable" // the procedure's component is missing here
)

// Subflow is one TCP subflow of a trial, as the sender's kernel saw it.
type Subflow struct {
	// Path says which way the subflow went: "default", "nat:NODE", "tunnel:NODE".
	Path   string `json:"path"`
	Local  string `json:"local"`
	Remote string `json:"remote"`
	Bytes  uint64 `json:"bytes"` // bytes acked by the receiver, whole transfer
	// WindowBytes were acked within the goodput window (after the warm-up).
	WindowBytes uint64  `json:"window_bytes"`
	RTTms       float64 `json:"rtt_ms"` // smoothed RTT at the end
	MinRTTms    float64 `json:"min_rtt_ms"`
	// Retrans counts retransmitted segments.
	Retrans uint64 `json:"retrans"`
}

// Record is one trial of one cell.
type Record struct {
	Scenario      string    `json:"scenario"`
	Configuration string    `json:"configuration"`
	Cell          string    `json:"cell"` // procedure instance, e.g. "tcp-nat@relay2"
	Procedure     string    `json:"procedure"`
	Detours       []string  `json:"detours,omitempty"`
	Trial         int       `json:"trial"` // 1-based
	Start         time.Time `json:"start"`
	Status        string    `json:"status"`
	Reason        string    `json:"reason,omitempty"`
	// GoodputMbps is the bytes received between warm-up and the end of
	// the transfer over that time (the reference method), in Mbit/s.
	GoodputMbps float64 `json:"goodput_mbps"`
	WindowBytes uint64  `json:"window_bytes"`
	// WindowS is the length of GoodputMbps's window (warm-up to the last
	// byte), EqualBytes the bytes the receiver got between the warm-up and
	// the end of the writing duration ([Warmup, Duration] from the
	// transfer's start, from its per-second counts) and EqualGoodputMbps
	// those over Duration - Warmup: a window of the same length for every
	// procedure (docs/design.md). Nil in records written before they were
	// recorded, and for trials that are not one bulk transfer (flows,
	// churn, collective).
	WindowS          *float64 `json:"window_s,omitempty"`
	EqualBytes       *uint64  `json:"equal_bytes,omitempty"`
	EqualGoodputMbps *float64 `json:"equal_goodput_mbps,omitempty"`
	// MaxGapS is the longest stall of the receiver (no data delivered) in
	// seconds, MaxGapEndS when it ended (failover scenarios).
	MaxGapS    float64 `json:"max_gap_s,omitempty"`
	MaxGapEndS float64 `json:"max_gap_end_s,omitempty"`
	// ResumeS: with a fault, seconds after it ended until the faulted
	// path carried data again (-1: not before the transfer ended).
	ResumeS *float64 `json:"resume_s,omitempty"`
	// TailMbps: with a fault, the rate over the last third of the
	// transfer from the client's per-subflow samples (Mbit/s).
	TailMbps *float64 `json:"tail_mbps,omitempty"`
	// SetupMs is the median setup latency of the trial's probe
	// connections (connect() to first byte of a one-byte request/response;
	// scenario converter), SetupAllMs every probe.
	SetupMs    *float64  `json:"setup_ms,omitempty"`
	SetupAllMs []float64 `json:"setup_all_ms,omitempty"`
	Subflows   []Subflow `json:"subflows,omitempty"`
	// PolicyLog: the agent's log lines of the trial that act on one
	// subflow (a shed, a backup made active, a path failed or revived:
	// the lines naming a path=), in order, at most PolicyLogMax; what the
	// policy decided, which the end-of-trial subflow list cannot show
	// (a shed first subflow stays listed until the connection closes).
	// Nil for trials without an agent, or with nothing logged.
	PolicyLog []string `json:"policy_log,omitempty"`
	// FCTMs: with a flow configuration (rack scenario), the median flow
	// completion time of the trial's flows, FCTAllMs every flow's (ms,
	// connect() to the sink's answer after the last byte), FlowBytes the
	// size of each flow; GoodputMbps is then FlowBytes*8 / FCTMs.
	FCTMs     *float64  `json:"fct_ms,omitempty"`
	FCTAllMs  []float64 `json:"fct_all_ms,omitempty"`
	FlowBytes int64     `json:"flow_bytes,omitempty"`
	// Churn: trials of many connections across route changes
	// (loadbalancer scenario).
	Churn *Churn `json:"churn,omitempty"`
	// Collective: a trial of procedure collective (discovery, relay death).
	Collective *Collective `json:"collective,omitempty"`
	// Attack: in attack configurations, the attack's and the prober's
	// counts and the kernels' MPTCP counter deltas over the trial.
	Attack map[string]float64 `json:"attack,omitempty"`
	// Process: the CPU a daemon of the cell used during the transfer
	// (procedure converted: "converter.cpu_s", the relay process's user +
	// system time, "converter.wall_s", and "converter.cores_per_gbps", CPU
	// seconds per Gbit moved, i.e. cores busy per Gbit/s).
	Process map[string]float64 `json:"process,omitempty"`
	// Parameters: lab settings in order (KEY=VALUE), transfer settings.
	Params   []string          `json:"params"`
	CC       string            `json:"cc"`
	Duration float64           `json:"duration_s"`
	Warmup   float64           `json:"warmup_s"`
	Versions map[string]string `json:"versions"`
	// LoadAvg is the host's 1-minute load average when the trial ended:
	// the machine is shared, and contention shows in the numbers.
	LoadAvg float64 `json:"loadavg_1m"`
}

// PolicyLogMax bounds Record.PolicyLog: a policy that flaps would fill
// the results file; the last kept line then says how many were left out.
const PolicyLogMax = 50

// Churn is the outcome of a trial that runs many connections at once while
// the network changes under them.
type Churn struct {
	Connections  int `json:"connections"`
	Broken       int `json:"broken"` // ended with an error or never delivered the receiver's summary
	RouteChanges int `json:"route_changes"`
	// Reasons are the distinct errors of the broken connections (at most 5).
	Reasons []string `json:"reasons,omitempty"`
	// Counters are kernel MPTCP counters over the trial, "node.Name" ->
	// increase (e.g. "client.AddAddr": ADD_ADDRs the clients received).
	Counters map[string]uint64 `json:"counters,omitempty"`
	// Detail describes each broken connection from the client's MPTCP
	// events: joins before the first route change, announcements
	// received, subflows opened and closed (times in seconds from the
	// trial's start).
	Detail []string `json:"detail,omitempty"`
	// ShortOfJoins counts the connections (broken or not) that had fewer
	// joins than announced addresses when the route first moved.
	ShortOfJoins int `json:"short_of_joins"`
}

// Collective is one trial of procedure collective. Times are
// seconds from the agents' start (discovery) or from the SIGKILL (the
// relay's death); -1 = not reached within the trial's limit.
type Collective struct {
	Relays int `json:"relays"`
	// DiscoveryInterval is the agents' roster poll if not their default
	// (MPDETOUR_BENCH_DISCOVERY_INTERVAL).
	DiscoveryInterval string `json:"discovery_interval,omitempty"`
	// Killed is the relay killed with SIGKILL (one carrying detours, no
	// client's bootstrap), Affected the clients with a subflow through it.
	Killed   string   `json:"killed,omitempty"`
	Affected []string `json:"affected,omitempty"`
	// KilledAtS: when it was killed, from the first agent's start (the
	// agents read the roster every interval from their start; a random
	// wait of up to one interval before the kill varies the phase).
	KilledAtS float64 `json:"killed_at_s,omitempty"`
	// OutOfRostersS: until the killed relay was absent from the roster of
	// every other relay (polled in turn, every ~0.1 s); OutOfRosterEachS
	// per relay, in roster order.
	OutOfRostersS    float64   `json:"out_of_rosters_s"`
	OutOfRosterEachS []float64 `json:"out_of_roster_each_s,omitempty"`
	// DroppedByAgentsS: until every affected agent had dropped it (its
	// log line "relay left the roster").
	DroppedByAgentsS float64            `json:"dropped_by_agents_s"`
	Clients          []CollectiveClient `json:"clients"`
}

// CollectiveClient is one member's agent in a collective trial.
type CollectiveClient struct {
	Name      string `json:"name"`
	Bootstrap string `json:"bootstrap"` // the one relay its configuration lists
	// ConnectS: agent start -> its status socket, when the MPTCP
	// connection to the server is opened.
	ConnectS float64 `json:"connect_s"`
	// UsableS: agent start -> grants from >= 3 discovered relays (agent
	// log, "relay grant" lines of roster relays).
	UsableS float64 `json:"usable_s"`
	// DetoursS: agent start -> established subflows (kernel, inet_diag)
	// through >= 3 distinct relays; DiscoveredDetoursS: through >= 3
	// relays other than the bootstrap one.
	DetoursS           float64 `json:"detours_s"`
	DiscoveredDetoursS float64 `json:"discovered_detours_s"`
	// Relays: relays with an established subflow when the relay was killed.
	Relays []string `json:"relays"`
	// Affected clients only (from the SIGKILL): DroppedS until its agent
	// dropped the relay (log), ReplacedS until subflows were established
	// through as many live relays as before, VictimGoneS until the subflow
	// through the killed relay was gone from the kernel.
	DroppedS    *float64 `json:"dropped_s,omitempty"`
	ReplacedS   *float64 `json:"replaced_s,omitempty"`
	VictimGoneS *float64 `json:"victim_gone_s,omitempty"`
}

// Key identifies a cell.
type Key struct{ Configuration, Cell string }

// Done counts, per cell, the trials that ran (ok or failed): the ones
// --resume does not repeat. Unavailable records do not count, so a later
// run retries procedures whose component has appeared since.
func Done(recs []Record) map[Key]int {
	m := map[Key]int{}
	for _, r := range recs {
		if r.Status == OK || r.Status == Failed {
			m[Key{r.Configuration, r.Cell}]++
		}
	}
	return m
}

// File names inside a result directory.
const (
	TrialsFile = "trials.jsonl"
	JSONFile   = "results.json"
	CSVFile    = "results.csv"
)

// Store appends records to DIR/trials.jsonl.
type Store struct {
	f *os.File
}

// Open opens (creating) the trial log in dir. Unless resume is set, an
// existing non-empty log is an error: results of different runs must not
// mix silently.
func Open(dir string, resume bool) (*Store, []Record, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, nil, err
	}
	p := filepath.Join(dir, TrialsFile)
	recs, err := Load(p)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, nil, err
	}
	if len(recs) > 0 && !resume {
		return nil, nil, fmt.Errorf("%s already holds %d trials: pass --resume to continue that run, or choose another --out", p, len(recs))
	}
	if err := dropTornTail(p); err != nil {
		return nil, nil, err
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, nil, err
	}
	return &Store{f: f}, recs, nil
}

// dropTornTail cuts a final line without newline (a write interrupted by a
// crash), so that the next record starts on a line of its own.
func dropTornTail(p string) error {
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) || len(b) == 0 || b[len(b)-1] == '\n' {
		return nil
	}
	if err != nil {
		return err
	}
	return os.Truncate(p, int64(bytes.LastIndexByte(b, '\n')+1))
}

// Append writes one record and syncs it to disk.
func (s *Store) Append(r Record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if _, err := s.f.Write(append(b, '\n')); err != nil {
		return err
	}
	return s.f.Sync()
}

// Close closes the log.
func (s *Store) Close() error { return s.f.Close() }

// Load reads a trial log. A last line cut short by a crash is ignored
// (the trial it described is simply run again); any other bad line is an
// error naming its line number.
func Load(path string) ([]Record, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return parse(path, b)
}

func parse(path string, b []byte) ([]Record, error) {
	var recs []Record
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64*1024), 16<<20)
	line := 0
	for sc.Scan() {
		line++
		text := bytes.TrimSpace(sc.Bytes())
		if len(text) == 0 {
			continue
		}
		var r Record
		dec := json.NewDecoder(bytes.NewReader(text))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&r); err != nil {
			if !bytes.HasSuffix(b, []byte("\n")) && isLastLine(b, line) {
				break // torn final write
			}
			return nil, fmt.Errorf("%s:%d: %v", path, line, err)
		}
		if err := r.check(); err != nil {
			return nil, fmt.Errorf("%s:%d: %v", path, line, err)
		}
		recs = append(recs, r)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	return recs, nil
}

func isLastLine(b []byte, line int) bool { return bytes.Count(b, []byte("\n")) == line-1 }

func (r *Record) check() error {
	switch {
	case r.Configuration == "" || r.Cell == "" || r.Procedure == "":
		return errors.New("record without configuration, cell or procedure")
	case r.Status != OK && r.Status != Failed && r.Status != Unavailable:
		return fmt.Errorf("record with unknown status %q", r.Status)
	case r.GoodputMbps < 0 || r.GoodputMbps != r.GoodputMbps:
		return fmt.Errorf("record with goodput %v", r.GoodputMbps)
	case r.EqualGoodputMbps != nil && !(*r.EqualGoodputMbps >= 0):
		return fmt.Errorf("record with equal_goodput_mbps %v", *r.EqualGoodputMbps)
	case r.WindowS != nil && !(*r.WindowS >= 0):
		return fmt.Errorf("record with window_s %v", *r.WindowS)
	}
	return nil
}

// WriteJSON writes all records as one indented JSON array.
func WriteJSON(path string, recs []Record) error {
	if recs == nil {
		recs = []Record{}
	}
	b, err := json.MarshalIndent(recs, "", "  ")
	if err != nil {
		return err
	}
	return writeFile(path, append(b, '\n'))
}

// CSVHeader is the fixed part of the CSV header; per-subflow columns
// sf1_path, sf1_bytes, sf1_window_bytes, sf1_rtt_ms, sf1_min_rtt_ms,
// sf1_retrans, ... follow.
var CSVHeader = []string{
	"scenario", "configuration", "cell", "procedure", "detours", "trial", "start", "status", "reason",
	"goodput_mbps", "window_bytes", "cc", "duration_s", "warmup_s", "params", "versions", "loadavg_1m",
	"window_s", "equal_bytes", "equal_goodput_mbps",
}

// WriteCSV writes one row per trial.
func WriteCSV(path string, recs []Record) error {
	var buf bytes.Buffer
	if err := EncodeCSV(&buf, recs); err != nil {
		return err
	}
	return writeFile(path, buf.Bytes())
}

// EncodeCSV writes the CSV form of recs to w.
func EncodeCSV(w io.Writer, recs []Record) error {
	maxSF := 0
	for _, r := range recs {
		maxSF = max(maxSF, len(r.Subflows))
	}
	header := append([]string(nil), CSVHeader...)
	for i := 1; i <= maxSF; i++ {
		p := "sf" + strconv.Itoa(i) + "_"
		header = append(header, p+"path", p+"bytes", p+"window_bytes", p+"rtt_ms", p+"min_rtt_ms", p+"retrans")
	}
	cw := csv.NewWriter(w)
	if err := cw.Write(header); err != nil {
		return err
	}
	f := func(x float64) string { return strconv.FormatFloat(x, 'f', -1, 64) }
	for _, r := range recs {
		row := []string{
			r.Scenario, r.Configuration, r.Cell, r.Procedure, strings.Join(r.Detours, " "),
			strconv.Itoa(r.Trial), r.Start.UTC().Format(time.RFC3339), r.Status, r.Reason,
			f(r.GoodputMbps), strconv.FormatUint(r.WindowBytes, 10), r.CC, f(r.Duration), f(r.Warmup),
			strings.Join(r.Params, " "), versions(r.Versions), f(r.LoadAvg),
			optF(r.WindowS), optU(r.EqualBytes), optF(r.EqualGoodputMbps),
		}
		for i := 0; i < maxSF; i++ {
			if i < len(r.Subflows) {
				s := r.Subflows[i]
				row = append(row, s.Path, strconv.FormatUint(s.Bytes, 10), strconv.FormatUint(s.WindowBytes, 10),
					f(s.RTTms), f(s.MinRTTms), strconv.FormatUint(s.Retrans, 10))
			} else {
				row = append(row, "", "", "", "", "", "")
			}
		}
		if err := cw.Write(row); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

// optF and optU print an optional field, empty when not recorded.
func optF(v *float64) string {
	if v == nil {
		return ""
	}
	return strconv.FormatFloat(*v, 'f', -1, 64)
}

func optU(v *uint64) string {
	if v == nil {
		return ""
	}
	return strconv.FormatUint(*v, 10)
}

func versions(m map[string]string) string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	var parts []string
	for _, k := range ks {
		parts = append(parts, k+"="+m[k])
	}
	return strings.Join(parts, " ")
}

// writeFile replaces path atomically so a reader never sees half a file.
func writeFile(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
