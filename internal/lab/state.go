package lab

import (
	"encoding/json"
	"errors"
	"fmt"
	"github.com/mpdetour/mpdetour/internal/lab/topology"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// RunDir holds one directory of state per lab. It lives under /run so a
// reboot, which also forgets every namespace, forgets the labs too.
const RunDir = "/run/mpdetour/lab"

// StateDir returns the directory of lab name's state.
func StateDir(name string) string { return filepath.Join(RunDir, name) }

// state is what Open and Down need to find and remove a lab, written
// before each namespace is created so that a kill -9 at any point leaves
// enough behind to clean up.
type state struct {
	Name     string            `json:"name"`
	Topology string            `json:"topology"` // name
	Source   string            `json:"source"`
	Params   map[string]string `json:"params,omitempty"`
	Created  time.Time         `json:"created"`
	Builder  int               `json:"builder_pid"`
	Complete bool              `json:"complete"`
	// Namespaces lists every namespace created or about to be created.
	Namespaces []string         `json:"namespaces"`
	Nodes      []*topology.Node `json:"nodes"`
	Links      []*topology.Link `json:"links"`
	Emulation  []LinkEmu        `json:"emulation"`
	DelayLine  *procRef         `json:"delay_line,omitempty"`
}

// LinkEmu records how a link is emulated on this kernel.
type LinkEmu struct {
	Link string `json:"link"`
	// Mid is the hidden namespace between the endpoints when the delay
	// line carries the link ("" otherwise).
	Mid   string `json:"mid,omitempty"`
	Delay string `json:"delay,omitempty"` // "netem", "delayline" or ""
	Loss  string `json:"loss,omitempty"`  // "netem", "nftables" or ""
	Rate  string `json:"rate,omitempty"`  // "tbf" or ""
}

// procRef identifies a process across pid reuse by its start time.
type procRef struct {
	PID   int    `json:"pid"`
	Start uint64 `json:"start"` // field 22 of /proc/PID/stat
}

func procStart(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name may contain spaces and parentheses: split after the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// alive reports whether the recorded process still runs (and is the same one).
func (p *procRef) alive() bool {
	if p == nil || p.PID <= 0 {
		return false
	}
	st, err := procStart(p.PID)
	if err != nil || st != p.Start {
		return false
	}
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(p.PID) + "/stat")
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	// A zombie has finished; only its parent's wait is missing.
	return i < 0 || !strings.HasPrefix(s[i+1:], " Z")
}

func (s *state) save() error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	path := filepath.Join(StateDir(s.Name), "state.json")
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func loadState(name string) (*state, error) {
	b, err := os.ReadFile(filepath.Join(StateDir(name), "state.json"))
	if err != nil {
		return nil, err
	}
	var s state
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("lab %s: corrupt state: %w", name, err)
	}
	if s.Name != name {
		return nil, fmt.Errorf("lab %s: state names lab %q", name, s.Name)
	}
	return &s, nil
}

// List returns the names of existing labs (complete or not), sorted.
func List() ([]string, error) {
	ents, err := os.ReadDir(RunDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() && topology.CheckLabName(e.Name()) == nil {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out, nil
}
