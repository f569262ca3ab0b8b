package breaks

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/lab"
	"github.com/mpdetour/mpdetour/internal/lab/topology"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relayconn"
	"github.com/mpdetour/mpdetour/internal/roster"
)

// caseLab is one case's lab (the built-in "detours" topology: client, r1,
// r2, server, detour1, detour2) and the daemons it started; close stops
// them and takes the lab down.
type caseLab struct {
	*lab.Lab
	procs []*exec.Cmd
}

func upLab(ctx context.Context, name string) (*caseLab, error) {
	t, err := topology.Builtin("detours")
	if err != nil {
		return nil, err
	}
	l, err := lab.Up(ctx, t, name)
	if err != nil {
		return nil, err
	}
	return &caseLab{Lab: l}, nil
}

// start runs argv in node in the background, its output in logPath.
func (l *caseLab) start(ctx context.Context, node, logPath string, argv ...string) error {
	f, err := os.Create(logPath)
	if err != nil {
		return err
	}
	cmd := l.Command(ctx, node, argv...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = cmd.Start()
	f.Close()
	if err != nil {
		return fmt.Errorf("starting %v in %s: %w", argv, node, err)
	}
	l.procs = append(l.procs, cmd)
	return nil
}

// run runs argv in node to its end: combined output.
func (l *caseLab) run(ctx context.Context, node string, argv ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := l.Command(ctx, node, argv...).CombinedOutput()
	return string(out), err
}

// output runs argv in node to its end: standard output only.
func (l *caseLab) output(ctx context.Context, node string, argv ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := l.Command(ctx, node, argv...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%w: %s", err, stderr.String())
	}
	return stdout.String(), nil
}

func (l *caseLab) do(node string, fn func() error) error { return l.Do(node, fn) }

// close stops the daemons (SIGTERM, then SIGKILL after 5 s) and takes the
// lab down (which also kills anything left in its namespaces).
func (l *caseLab) close() error {
	var errs []error
	for _, c := range l.procs {
		stopProc(c)
	}
	errs = append(errs, l.Down())
	return errors.Join(errs...)
}

// begin brings up a case's lab (LabName + suffix) and makes n keys.
func begin(ctx context.Context, o Options, suffix string, n int) (*caseLab, []proto.Key, error) {
	keys := make([]proto.Key, n)
	for i := range keys {
		var err error
		if keys[i], err = proto.GenerateKey(); err != nil {
			return nil, nil, err
		}
	}
	l, err := upLab(ctx, o.LabName+suffix)
	if err != nil {
		return nil, nil, err
	}
	return l, keys, nil
}

// authority makes a collective authority and writes a fresh gossip secret
// to Dir/gossip.key for the cases that run a relay cluster; it returns
// the secret's path.
func authority(o Options) (*collective.Authority, string, error) {
	auth, err := collective.NewAuthority()
	if err != nil {
		return nil, "", err
	}
	secret := filepath.Join(o.Dir, "gossip.key")
	if err := os.WriteFile(secret, []byte(roster.NewSecret()), 0o600); err != nil {
		return nil, "", err
	}
	return auth, secret, nil
}

// relayCert issues a relay certificate for key named node and writes it
// to Dir/node.cert; it returns the path.
func relayCert(o Options, auth *collective.Authority, key proto.Key, node string) (string, error) {
	now := time.Now()
	c, err := auth.Issue(key.Public(), node, collective.RoleRelay, now.Add(-time.Hour), now.Add(24*time.Hour))
	if err != nil {
		return "", err
	}
	cert := filepath.Join(o.Dir, node+".cert")
	return cert, os.WriteFile(cert, []byte(c.String()+"\n"), 0o600)
}

// startRelay writes a relay configuration to Dir/name.yaml and runs the
// build's relay on it in node (log Dir/name.log); it returns the path.
func (l *caseLab) startRelay(ctx context.Context, o Options, node, name, config string) (string, error) {
	path := filepath.Join(o.Dir, name+".yaml")
	if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
		return "", err
	}
	return path, l.start(ctx, node, filepath.Join(o.Dir, name+".log"), o.Binary, "relay", "--config", path)
}

// dialRelay opens a member's control connection to relay from the
// client node (over IPv4).
func (l *caseLab) dialRelay(relay relayconn.Relay, k proto.Key, cert []byte) (*relayconn.Conn, error) {
	return l.dialRelayNet(relay, k, cert, "udp4")
}

// dialRelayNet is dialRelay over network ("udp4" or "udp6").
func (l *caseLab) dialRelayNet(relay relayconn.Relay, k proto.Key, cert []byte, network string) (*relayconn.Conn, error) {
	var pc net.PacketConn
	if err := l.do("client", func() error {
		var err error
		pc, err = net.ListenPacket(network, ":0")
		return err
	}); err != nil {
		return nil, err
	}
	c, err := relayconn.Dial(relay, k, relayconn.Options{Certificate: cert, ListenPacket: func() (net.PacketConn, error) { return pc, nil }})
	if err != nil {
		pc.Close()
		return nil, err
	}
	return c, nil
}

// stopProc stops c: SIGTERM, then SIGKILL after 5 s (a stopped one is
// left as it is).
func stopProc(c *exec.Cmd) {
	if c.ProcessState != nil {
		return
	}
	c.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { c.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		c.Process.Kill()
		<-done
	}
}

// failed is r with err as the reason the case could not run.
func (r Result) failed(err error) Result {
	r.Error = err.Error()
	return r
}

// judge is r with an attack's figure, verdict and detail, or with err as
// the reason the case could not run.
func (r Result) judge(value float64, pass bool, detail string, err error) Result {
	if err != nil {
		return r.failed(err)
	}
	r.Value, r.Pass, r.Detail = value, pass, detail
	return r
}

// logsIn names dir (the daemons' logs) in r's error, if any.
func (r Result) logsIn(dir string) Result {
	if r.Error != "" {
		r.Error += " (log in " + dir + ")"
	}
	return r
}
