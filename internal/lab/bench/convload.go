package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/mpdetour/mpdetour/internal/benchtool"
	"github.com/mpdetour/mpdetour/internal/lab"
	"github.com/mpdetour/mpdetour/internal/lab/convload"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relay"
)

// ConvertLoadOptions configure ConvertLoad ("mpdetour-lab convert-load"):
// a lab of topology line (client -- relay -- server), the converter in the
// relay node (the real `mpdetour relay` with `convert:`), a one-byte
// responder in the server node, and the load generator
// ("mpdetour-lab convert-load-member", package convload) in the client
// node as a member of the relay.
type ConvertLoadOptions struct {
	Lab    *lab.Lab // topology line, up
	Binary string   // mpdetour executable for the relay
	// LabBinary runs the load generator: an executable with the
	// "convert-load-member" command (mpdetour-lab).
	LabBinary string
	Dir       string // scratch: configs, keys, logs

	Idle        int // hold this many conversions idle ...
	Concurrency int
	Hold        time.Duration // ... this long once all are open
	Rate        float64       // or open this many per second ...
	Duration    time.Duration // ... for this long
	MaxConns    int           // the converter's max_conns (default max(1024, Idle+1024))
	// MemberRate, when > 0, is the relay's rate.per_member (control
	// requests per second per member; burst twice that). The default (50)
	// with up to 32 tickets per request (proto.MaxTickets) caps one member at
	// 1,600 conversions/s (400/s with the earlier 8 per request).
	MemberRate float64
	Progress   io.Writer
}

// ProcessLook is a sample of a process and of the kernel.
type ProcessLook struct {
	RSSKiB   int64   `json:"rss_kib"`
	HWMKiB   int64   `json:"rss_peak_kib"`
	Threads  int     `json:"threads"`
	FDs      int     `json:"fds"`
	Pipes    int     `json:"pipes"`   // fds that are pipes (splice)
	Sockets  int     `json:"sockets"` // fds that are sockets
	CPUS     float64 `json:"cpu_s"`   // user + system since start
	SlabKiB  int64   `json:"slab_kib"`
	SockStat string  `json:"sockstat"` // the converter namespace's /proc/net/sockstat (TCP line)
	// Slabs: the kernel's slab caches most relevant to sockets and pipes
	// (name -> active objects x object size, bytes).
	Slabs map[string]int64 `json:"slabs,omitempty"`
	At    time.Time        `json:"at"`
}

// ConvertLoadReport is what ConvertLoad measured.
type ConvertLoadReport struct {
	Mode      string            `json:"mode"`
	Options   map[string]string `json:"options"`
	Before    ProcessLook       `json:"converter_before"`
	Held      *ProcessLook      `json:"converter_held,omitempty"` // idle: all conversions open
	After     ProcessLook       `json:"converter_after"`
	Opened    *convload.Result  `json:"opened,omitempty"`
	Result    *convload.Result  `json:"result"`
	Responder int               `json:"responder_held,omitempty"` // idle: connections the destination held
	// Per conversion (idle): converter RSS, fds, kernel slab growth
	// (whole machine: client, converter and destination sockets).
	PerConn map[string]float64 `json:"per_conversion,omitempty"`
	// Rate: the converter's CPU over the run, in cores.
	CPUCores float64 `json:"converter_cpu_cores,omitempty"`
	LoadAvg  float64 `json:"loadavg_1m"`
	Start    time.Time
}

const convertLoadPort = 5203

// ConvertLoad runs one load against the converter.
func ConvertLoad(ctx context.Context, o ConvertLoadOptions) (*ConvertLoadReport, error) {
	if (o.Idle > 0) == (o.Rate > 0) {
		return nil, errors.New("convert load: exactly one of idle and rate")
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if o.MaxConns <= 0 {
		o.MaxConns = max(1024, o.Idle+1024)
	}
	rep := &ConvertLoadReport{Start: time.Now().UTC(), Options: map[string]string{
		"idle": strconv.Itoa(o.Idle), "hold": o.Hold.String(), "rate": strconv.FormatFloat(o.Rate, 'f', -1, 64),
		"duration": o.Duration.String(), "max_conns": strconv.Itoa(o.MaxConns), "concurrency": strconv.Itoa(o.Concurrency),
		"member_rate": strconv.FormatFloat(o.MemberRate, 'f', -1, 64),
	}}
	rep.Mode = "idle"
	if o.Rate > 0 {
		rep.Mode = "rate"
	}
	// Descriptors: this process holds the destination's side of every
	// conversion, the converter (a child, inheriting the limit) two
	// sockets and two splice pipes (four fds) per conversion.
	limit, err := benchtool.RaiseNofile(uint64(8*o.Idle + 65536))
	if err != nil {
		return nil, err
	}
	rep.Options["nofile"] = strconv.FormatUint(limit, 10)
	if need := uint64(2*o.Idle + 64); limit < need {
		fmt.Fprintf(o.Progress, "warning: open files limit %d (the hard limit; raising it needs CAP_SYS_RESOURCE) < %d: the converter needs at least two descriptors per conversion\n", limit, need)
	}
	l := o.Lab
	for _, n := range []string{"client", "relay", "server"} {
		if l.NetnsPath(n) == "" {
			return nil, fmt.Errorf("convert load needs topology line (nodes client, relay, server); no node %q", n)
		}
	}
	if o.Binary == "" || o.LabBinary == "" {
		return nil, errors.New("convert load needs the mpdetour binary (the relay) and the mpdetour-lab binary (the load generator)")
	}
	env := &Env{Lab: l, Dir: o.Dir, Binary: o.Binary}
	relayKey, err := proto.GenerateKey()
	if err != nil {
		return nil, err
	}
	member, err := proto.GenerateKey()
	if err != nil {
		return nil, err
	}
	keyFile := filepath.Join(o.Dir, "member.key")
	if err := os.WriteFile(keyFile, []byte(member.String()+"\n"), 0o600); err != nil {
		return nil, err
	}
	if err := l.Do("relay", func() error {
		return os.WriteFile("/proc/sys/net/ipv4/tcp_fastopen", []byte("3"), 0o644)
	}); err != nil {
		return nil, fmt.Errorf("tcp_fastopen in relay: %w", err)
	}
	server := l.Addr("server")
	cfg := fmt.Sprintf(`listen: 0.0.0.0:%d
private_key: %s
ports: 41000-41099
lease: 1h
members:
  - {name: load, public_key: %s}
allow_destinations: [%s/32]
convert:
  enabled: true
  listen: 0.0.0.0:%d
  max_conns: %d
`, relay.DefaultPort, relayKey, member.Public(), server, relay.DefaultConvertPort, o.MaxConns)
	if o.MemberRate > 0 {
		cfg += fmt.Sprintf("rate: {per_member: %g, burst: %d}\n", o.MemberRate, int(2*o.MemberRate))
	}
	cfgPath := filepath.Join(o.Dir, "relay.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	var ln net.Listener
	if err := l.Do("server", func() (err error) {
		var lc net.ListenConfig
		lc.SetMultipathTCP(false)
		ln, err = lc.Listen(ctx, "tcp", fmt.Sprintf("%s:%d", server, convertLoadPort))
		return err
	}); err != nil {
		return nil, fmt.Errorf("responder: %w", err)
	}
	resp := convload.NewResponder(ln)
	defer resp.Close()
	conv, err := startDaemon(ctx, env, "relay", "relay", o.Binary, "relay", "--config", cfgPath)
	if err != nil {
		return nil, err
	}
	defer conv.stop()
	pid := conv.cmd.Process.Pid
	if err := conv.waitFor(ctx, "converter listener", 20*time.Second, func() bool {
		b, _ := os.ReadFile(conv.logPath)
		return bytes.Contains(b, []byte("converter listening"))
	}); err != nil {
		return nil, err
	}
	time.Sleep(500 * time.Millisecond)
	if rep.Before, err = look(l, pid); err != nil {
		return nil, err
	}
	args := []string{o.LabBinary, "convert-load-member",
		"--relay", netip.AddrPortFrom(l.Addr("relay"), relay.DefaultPort).String(),
		"--relay-key", relayKey.Public().String(), "--key-file", keyFile,
		"--dst", netip.AddrPortFrom(server, convertLoadPort).String()}
	if o.Idle > 0 {
		args = append(args, "--idle", strconv.Itoa(o.Idle))
		if o.Concurrency > 0 {
			args = append(args, "--concurrency", strconv.Itoa(o.Concurrency))
		}
	} else {
		args = append(args, "--rate", strconv.FormatFloat(o.Rate, 'f', -1, 64), "--duration", o.Duration.String())
	}
	gen := l.Command(ctx, "client", args...)
	stdin, err := gen.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := gen.StdoutPipe()
	if err != nil {
		return nil, err
	}
	var stderr bytes.Buffer
	gen.Stderr = &stderr
	gen.WaitDelay = 5 * time.Second
	if err := gen.Start(); err != nil {
		return nil, err
	}
	defer gen.Process.Kill()
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var ev struct {
			Event string `json:"event"`
		}
		var r convload.Result
		if json.Unmarshal(sc.Bytes(), &ev) != nil || json.Unmarshal(sc.Bytes(), &r) != nil {
			return nil, fmt.Errorf("load generator: bad line %q", sc.Text())
		}
		switch ev.Event {
		case "open":
			rep.Opened = &r
			fmt.Fprintf(o.Progress, "open: %d of %d in %.1f s (convert p50 %.2f ms, p99 %.2f ms), errors %v\n",
				r.Open, o.Idle, r.ElapsedS, r.ConvertMs.P50, r.ConvertMs.P99, r.Errors)
			// Let the last handshakes and allocations settle, then look.
			time.Sleep(2 * time.Second)
			h, err := look(l, pid)
			if err != nil {
				return nil, err
			}
			rep.Held = &h
			rep.Responder = resp.Open()
			fmt.Fprintf(o.Progress, "held: converter RSS %d KiB (before %d), fds %d (pipes %d, sockets %d), threads %d; destination holds %d; slab %+d KiB\n",
				h.RSSKiB, rep.Before.RSSKiB, h.FDs, h.Pipes, h.Sockets, h.Threads, rep.Responder, h.SlabKiB-rep.Before.SlabKiB)
			if o.Hold > 0 {
				select {
				case <-time.After(o.Hold):
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			stdin.Close()
		case "done":
			rep.Result = &r
		}
	}
	werr := gen.Wait()
	if rep.Result == nil {
		return nil, fmt.Errorf("load generator: %v: %s", werr, strings.TrimSpace(stderr.String()))
	}
	if rep.After, err = look(l, pid); err != nil {
		return nil, err
	}
	rep.LoadAvg = loadAvg()
	if ok, _ := conv.exited(); ok {
		return nil, conv.failure()
	}
	if h := rep.Held; h != nil && rep.Opened != nil && rep.Opened.Open > 0 {
		n := float64(rep.Opened.Open)
		rep.PerConn = map[string]float64{
			"converter_rss_kib": float64(h.RSSKiB-rep.Before.RSSKiB) / n,
			"converter_fds":     float64(h.FDs-rep.Before.FDs) / n,
			"converter_pipes":   float64(h.Pipes-rep.Before.Pipes) / n,
			"converter_sockets": float64(h.Sockets-rep.Before.Sockets) / n,
			"converter_threads": float64(h.Threads-rep.Before.Threads) / n,
			"kernel_slab_kib":   float64(h.SlabKiB-rep.Before.SlabKiB) / n,
		}
		for name, b := range h.Slabs {
			rep.PerConn["slab_bytes."+name] = float64(b-rep.Before.Slabs[name]) / n
		}
	}
	if rep.Mode == "rate" && rep.Result.ElapsedS > 0 {
		rep.CPUCores = (rep.After.CPUS - rep.Before.CPUS) / rep.Result.ElapsedS
	}
	if werr != nil {
		return rep, fmt.Errorf("load generator: %v: %s", werr, strings.TrimSpace(stderr.String()))
	}
	return rep, nil
}

// slabCaches are the caches a conversion grows: sockets of each protocol,
// their dentries/inodes (sock_inode_cache), files, pipes' buffers (in
// kmalloc), epoll items.
var slabCaches = []string{"MPTCP", "MPTCPv6", "TCP", "TCPv6", "request_sock_TCP", "tw_sock_TCP", "sock_inode_cache",
	"filp", "dentry", "eventpoll_epi", "eventpoll_pwq", "skbuff_head_cache", "kmalloc-1k", "kmalloc-2k", "kmalloc-4k",
	"kmalloc-512", "kmalloc-8k", "kmalloc-16k", "kmalloc-32k", "kmalloc-cg-16k", "kmalloc-cg-8k", "kmalloc-cg-1k", "kmalloc-cg-2k", "kmalloc-cg-4k", "kmalloc-256", "kmalloc-192", "kmalloc-128", "kmalloc-64", "pid", "inode_cache"}

// look samples process pid (in the converter's namespace) and the kernel.
func look(l *lab.Lab, pid int) (ProcessLook, error) {
	p := ProcessLook{At: time.Now().UTC(), Slabs: map[string]int64{}}
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return p, err
	}
	for _, line := range strings.Split(string(st), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		n, _ := strconv.ParseInt(f[0], 10, 64)
		switch k {
		case "VmRSS":
			p.RSSKiB = n
		case "VmHWM":
			p.HWMKiB = n
		case "Threads":
			p.Threads = int(n)
		}
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return p, err
	}
	p.FDs = len(fds)
	for _, fd := range fds {
		t, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err != nil {
			continue
		}
		switch {
		case strings.HasPrefix(t, "pipe:"):
			p.Pipes++
		case strings.HasPrefix(t, "socket:"):
			p.Sockets++
		}
	}
	cpu, err := processCPU(pid)
	if err != nil {
		return p, err
	}
	p.CPUS = cpu.Seconds()
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/sockstat", pid)); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "TCP:") {
				p.SockStat = strings.TrimSpace(line)
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "Slab:" {
				p.SlabKiB, _ = strconv.ParseInt(f[1], 10, 64)
			}
		}
	}
	if b, err := os.ReadFile("/proc/slabinfo"); err == nil {
		want := map[string]bool{}
		for _, s := range slabCaches {
			want[s] = true
		}
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) < 4 || !want[f[0]] {
				continue
			}
			active, _ := strconv.ParseInt(f[1], 10, 64)
			size, _ := strconv.ParseInt(f[3], 10, 64)
			p.Slabs[f[0]] = active * size
		}
	}
	return p, nil
}
