package bench

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/mpdetour/mpdetour/internal/benchtool"
	"github.com/mpdetour/mpdetour/internal/convclient"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relay"
)

// setupConverted is procedure converted (scenario converter, docs/convert.md):
// the server does not speak MPTCP; the relay in roles.converter runs the
// converter; the cell's detour relays grant NAT detours toward the
// converter; the agent in the client node keeps converter tickets and
// serves conversions; the sender runs as an unmodified plain-TCP program
// under "mpdetour run". Its first connection to each server port goes
// direct and teaches the agent that the server does not speak MPTCP (an
// unrecorded warm-up), the trials' connections are converted, and the
// agent adds the detour subflows to the converter.
func setupConverted(ctx context.Context, env *Env) (_ Session, err error) {
	node := env.Roles.Converter
	convIP := converterAddr(env)
	convAddr := netip.AddrPortFrom(convIP, relay.DefaultConvertPort)
	renv := *env
	renv.RelayAllow = append(append([]netip.Addr{}, env.RelayAllow...), convAddr.Addr())
	rs, err := startRelays(ctx, &renv, natOnly)
	if err != nil {
		return nil, err
	}
	var ag *daemon
	defer func() {
		if err != nil {
			if ag != nil {
				ag.stop()
			}
			rs.close()
		}
	}()
	for _, d := range env.Cell.Detours {
		if err := rs.probe(ctx, env, d); err != nil {
			return nil, err
		}
	}
	conv, err := startConverterRelay(ctx, env, rs, node)
	if err != nil {
		return nil, err
	}
	sock := filepath.Join(env.Dir, "convert.sock")
	section := rs.agentSection(env, false) +
		fmt.Sprintf("    - {name: %s, address: %s, public_key: %s}\n", node, netip.AddrPortFrom(convIP, relay.DefaultPort), rs.keys[node].Public()) +
		fmt.Sprintf("convert:\n  enabled: true\n  socket: %s\n  relays: [%s]\n", sock, node)
	ag, err = startAgentFor(ctx, env, len(env.Cell.Detours), nil, section, convAddr)
	if err != nil {
		return nil, err
	}
	if err := ag.waitFor(ctx, "converter tickets", 20*time.Second, func() bool {
		st, err := convclient.FetchStatus(sock)
		return err == nil && len(st.Converters) == 1 && st.Converters[0].Tickets > 0
	}); err != nil {
		return nil, err
	}
	t := &transfer{env: env, dst: env.serverAddr(), wantSubflows: 1 + len(env.Cell.Detours),
		paths:      map[netip.Addr]string{convAddr.Addr(): "default"},
		wrap:       []string{env.Binary, "run", "--convert", sock, "--log", filepath.Join(env.Dir, "run.log"), "--"},
		probeSetup: env.LatencyPort > 0,
		close:      func() error { return errors.Join(ag.stop(), rs.close()) },
		daemons:    append([]*daemon{ag}, rs.daemons...),
		cpuOf:      conv,
		cpuName:    "converter",
	}
	for a, p := range rs.paths {
		t.paths[a] = p
	}
	var before uint64
	t.check = func(res *benchtool.Result) error {
		st, err := convclient.FetchStatus(sock)
		if err != nil {
			return err
		}
		if !res.MPTCP || st.Counters.Converted <= before {
			return fmt.Errorf("the connection was not converted (MPTCP %v, conversions %d before, %d after)", res.MPTCP, before, st.Counters.Converted)
		}
		before = st.Counters.Converted
		return nil
	}
	if err := t.learn(ctx, sock); err != nil {
		return nil, err
	}
	st, err := convclient.FetchStatus(sock)
	if err != nil {
		return nil, err
	}
	before = st.Counters.Converted
	return t, nil
}

// converterAddr is the converter node's address on the server's network
// (a link it shares with the server), else its primary address. The relay
// tells members the address their control session came to, so this is
// also where the agent asks for tickets. In topology detours the primary
// address of r2 is on the default path's core link C0, which the detour
// relays would reach back through r1 and C0; its address on A2 is reached
// by every path over its own links. In brennan2017 and line both addresses
// are on the same node on the same paths.
func converterAddr(env *Env) netip.Addr {
	node := env.Roles.Converter
	for _, l := range env.Lab.Topology().Links {
		switch {
		case l.A.Node == node && l.B.Node == env.Roles.Server:
			return l.A.Addr.Addr()
		case l.B.Node == node && l.A.Node == env.Roles.Server:
			return l.B.Addr.Addr()
		}
	}
	return env.Lab.Addr(node)
}

// learn is the warm-up: the first connection to each server port (the
// latency responder, the goodput receiver) goes direct and teaches the
// agent that the server does not speak MPTCP; a few converted connections
// after it give the client namespace its TCP Fast Open cookie for the
// converter. Nothing of it is recorded.
func (t *transfer) learn(ctx context.Context, sock string) error {
	e := t.env
	ports := []int{e.Port}
	// A short transfer to the goodput receiver, one probe to the latency
	// responder: each the first connection to its port.
	if _, err := t.output(ctx, append(append([]string{}, t.wrap...), e.Binary, "bench", "send", e.serverAddr().String(),
		"--duration", "1500ms", "--warmup", "500ms", "--json")); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	if e.LatencyPort > 0 {
		ports = append(ports, e.LatencyPort)
		dst := netip.AddrPortFrom(e.serverAddr().Addr(), uint16(e.LatencyPort))
		// Two probes 50 ms apart: the supervisor learns from the first
		// connection only while the program still runs (it gives up when
		// the program is gone), and one probe over unshaped veths ends in
		// well under its first 2 ms poll.
		if _, err := t.output(ctx, append(append([]string{}, t.wrap...), e.Binary, "bench", "latency", dst.String(), "--count", "2", "--pause", "50ms")); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		st, err := convclient.FetchStatus(sock)
		if err == nil && len(st.NoMPTCP) >= len(ports) {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("warm-up: the agent did not learn that the server does not speak MPTCP (status %+v, %v)", st, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if e.LatencyPort > 0 {
		if _, err := t.setupLatency(ctx, 3); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
	}
	return nil
}

// startConverterRelay starts a relay with the converter role in node,
// next to the server's network: the server is its allowed destination,
// TCP Fast Open's server bit is set there (the relay never changes
// sysctls itself).
func startConverterRelay(ctx context.Context, env *Env, rs *relays, node string) (*daemon, error) {
	k, err := proto.GenerateKey()
	if err != nil {
		return nil, err
	}
	rs.keys[node] = k
	if err := env.Lab.Do(node, func() error {
		return os.WriteFile("/proc/sys/net/ipv4/tcp_fastopen", []byte("3"), 0o644)
	}); err != nil {
		return nil, fmt.Errorf("tcp_fastopen in %s: %w", node, err)
	}
	lease := relayLease
	if env.RelayLease > 0 {
		lease = env.RelayLease
	}
	var b strings.Builder
	fmt.Fprintf(&b, "listen: 0.0.0.0:%d\nprivate_key: %s\nports: 41000-41099\nlease: %s\n", relay.DefaultPort, k, lease)
	fmt.Fprintf(&b, "members:\n  - {name: bench, public_key: %s}\n", rs.member.Public())
	fmt.Fprintf(&b, "allow_destinations: [%s/32]\n", env.Lab.Addr(env.Roles.Server))
	fmt.Fprintf(&b, "convert:\n  enabled: true\n  listen: 0.0.0.0:%d\n", relay.DefaultConvertPort)
	path := filepath.Join(env.Dir, "relay-"+node+".yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		return nil, err
	}
	d, err := startDaemon(ctx, env, node, "relay-"+node, env.Binary, "relay", "--config", path)
	if err != nil {
		return nil, err
	}
	rs.daemons = append(rs.daemons, d)
	return d, nil
}
