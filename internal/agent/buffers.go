package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/mpdetour/mpdetour/internal/netnsx"
)

// bufferSysctls are the socket buffer triples (min default max) the sizer
// raises the maximum of: MPTCP's receive autotuning is capped by
// tcp_rmem[2], its send side by tcp_wmem[2].
var bufferSysctls = []string{"net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"}

// maxBuffer bounds what the sizer sets (bytes), whatever the measurements.
const maxBuffer = 64 << 20

// bufferSizer raises the namespace's tcp_rmem/tcp_wmem maximum to what the
// policy says the measured connections need (policy.Engine.BufferWanted:
// 2 x the sum of their rates x their largest RTT), never below what it
// found nor above maxBuffer, and restores what it found at stop. The
// originals are kept in a state file beside the status socket before the
// first change, so that the next agent restores them after a crash.
type bufferSizer struct {
	ns    string
	saved *savedSysctls
	orig  map[string][3]int64 // saved's values, parsed
	cur   int64               // the maximum set now; 0 = the original
	// changes: how often apply moved the maximum (status).
	changes int
	log     *slog.Logger
}

// status is the sizer's state for the agent's status.
func (b *bufferSizer) status() *BufferStatus {
	st := &BufferStatus{State: "on", Max: b.cur, Changes: b.changes, Found: map[string]string{}}
	for name, tr := range b.orig {
		st.Found[name] = fmt.Sprintf("%d %d %d", tr[0], tr[1], tr[2])
	}
	return st
}

func newBufferSizer(cfg Options, log *slog.Logger) (*bufferSizer, error) {
	valid := func(v string) error { _, err := parseTriple(v); return err }
	saved, err := saveSysctls(cfg, "buffers", "buffer_sizing", bufferSysctls, valid, log)
	if err != nil {
		return nil, err
	}
	b := &bufferSizer{ns: cfg.NetNS, saved: saved, orig: map[string][3]int64{}, log: log}
	for name, v := range saved.orig {
		b.orig[name], _ = parseTriple(v) // checked by saveSysctls
	}
	return b, nil
}

func parseTriple(v string) ([3]int64, error) {
	var t [3]int64
	f := strings.Fields(v)
	if len(f) != 3 {
		return t, fmt.Errorf("%q is not three numbers", v)
	}
	for i, s := range f {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 {
			return t, fmt.Errorf("%q is not three positive numbers", v)
		}
		t[i] = n
	}
	return t, nil
}

// apply sets the maximum for want bytes (clamped), changing the sysctls
// only when the target moves by more than a quarter.
func (b *bufferSizer) apply(want int64) error {
	target := min(want, maxBuffer)
	least := int64(-1)
	for _, tr := range b.orig {
		if least < 0 || tr[2] < least {
			least = tr[2]
		}
	}
	if target <= least {
		target = 0 // the originals suffice
	}
	cur := b.cur
	switch {
	case target == cur:
		return nil
	case target != 0 && cur != 0 && target*4 < cur*5 && target*5 > cur*4:
		return nil // within 25 %
	}
	var errs []error
	for _, name := range bufferSysctls {
		tr := b.orig[name]
		if target > tr[2] {
			tr[2] = target
		}
		errs = append(errs, writeSysctl(b.ns, name, fmt.Sprintf("%d %d %d", tr[0], tr[1], tr[2])))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	b.cur = target
	b.changes++
	b.log.Info("socket buffer maximum", "bytes", target, "wanted", want, "note", "0 = the original")
	return nil
}

// restore puts back what the sizer found and removes the state file.
func (b *bufferSizer) restore() error {
	if err := b.saved.restore(); err != nil {
		return err
	}
	b.cur = 0
	return nil
}

// nsStateFile is the state file named prefix.INODE beside the status
// socket, INODE naming the agent's namespace: a mechanism that changes a
// namespace's sysctls keeps what it found there, for the next agent to
// restore after a crash.
func nsStateFile(cfg Options, prefix string) (string, error) {
	dir := DefaultStateDir
	if cfg.Socket != "" {
		dir = filepath.Dir(cfg.Socket)
	}
	var st syscall.Stat_t
	if err := netnsx.Do(cfg.NetNS, func() error { return syscall.Stat("/proc/thread-self/ns/net", &st) }); err != nil {
		return "", fmt.Errorf("identify namespace %q: %w", cfg.NetNS, err)
	}
	return filepath.Join(dir, fmt.Sprintf("%s.%d", prefix, st.Ino)), nil
}

// writeStateFile writes data to path atomically and synced.
func writeStateFile(path, data string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".state-*")
	if err != nil {
		return err
	}
	_, werr := f.WriteString(data)
	serr := f.Sync()
	cerr := f.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		os.Remove(f.Name())
		return err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		os.Remove(f.Name())
		return err
	}
	return nil
}
