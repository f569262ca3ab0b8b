package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/mpdetour/mpdetour/internal/lab/bench/scenario"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relay"
	"github.com/mpdetour/mpdetour/internal/relayconn"
)

func setupTCPNAT(ctx context.Context, env *Env) (Session, error) {
	rs, err := startRelays(ctx, env, natOnly)
	if err != nil {
		return nil, err
	}
	d := env.Cell.Detours[0]
	granted, err := rs.grant(ctx, env, d)
	if err != nil {
		rs.close()
		return nil, err
	}
	return &transfer{env: env, dst: granted, paths: rs.paths, close: rs.close, daemons: rs.daemons}, nil
}

// setupMPTCP1NAT is MPTCP to the NAT port of the cell's detour, without an
// agent: one subflow through the detour, MPTCP's own cost on that path.
func setupMPTCP1NAT(ctx context.Context, env *Env) (Session, error) {
	t, err := setupTCPNAT(ctx, env)
	if err != nil {
		return nil, err
	}
	tr := t.(*transfer)
	tr.mptcp, tr.wantSubflows = true, 1
	return tr, nil
}

func setupMPTCPNAT(ctx context.Context, env *Env) (Session, error) {
	return setupNATAgent(ctx, env, false)
}

// setupMPTCPCross is mptcp-cross: the connection starts on IPv4 over the
// default path, from an AF_INET6 socket (IPv4-mapped, what a dual-stack
// program opens; an AF_INET socket cannot take an IPv6 subflow, measured
// in TestCrossFamilySubflow), and the agent adds IPv6 NAT detours toward
// the server's IPv6 address, which it knows from the configured mapping
// (other_family). The relays are mptcp-nat6's (IPv6 grants).
func setupMPTCPCross(ctx context.Context, env *Env) (Session, error) {
	if err := ipv6(env, scenario.MPTCPCross); err != nil {
		return nil, err
	}
	server4 := netip.AddrPortFrom(env.Lab.Addr(env.Roles.Server), uint16(env.Port))
	rs, err := startProbedRelays(ctx, env)
	if err != nil {
		return nil, err
	}
	extra := rs.agentSection(env, false) + fmt.Sprintf("other_family:\n  - {server: %s, addresses: ['%s']}\n", server4.Addr(), env.serverAddr().Addr())
	ag, err := startAgentFor(ctx, env, env.Cell.K(), nil, extra, server4)
	if err != nil {
		rs.close()
		return nil, err
	}
	return &transfer{env: env, dst: server4, mptcp: true, inet6: true, wantSubflows: 1 + min(env.Cell.K(), len(env.Cell.Detours)), paths: rs.paths,
		close: func() error { return errors.Join(ag.stop(), rs.close()) }, daemons: append([]*daemon{ag}, rs.daemons...)}, nil
}

// setupMPTCPNATBackup is setupMPTCPNAT with every relay of the cell marked
// backup in the agent's config: its detour subflows carry the B flag.
func setupMPTCPNATBackup(ctx context.Context, env *Env) (Session, error) {
	return setupNATAgent(ctx, env, true)
}

func setupNATAgent(ctx context.Context, env *Env, backup bool) (Session, error) {
	rs, err := startProbedRelays(ctx, env)
	if err != nil {
		return nil, err
	}
	ag, err := startAgent(ctx, env, env.Cell.K(), nil, rs.agentSection(env, backup)+scenario.AgentExtra(env.Cell.Procedure))
	if err != nil {
		rs.close()
		return nil, err
	}
	return &transfer{env: env, dst: env.serverAddr(), mptcp: true, wantSubflows: 1 + min(env.Cell.K(), len(env.Cell.Detours)), paths: rs.paths,
		close: func() error { return errors.Join(ag.stop(), rs.close()) }, daemons: append([]*daemon{ag}, rs.daemons...)}, nil
}

// startProbedRelays starts NAT relays for an agent: the agent asks them
// itself, when each connection is created; a probe grant first makes sure
// they are up.
func startProbedRelays(ctx context.Context, env *Env) (*relays, error) {
	rs, err := startRelays(ctx, env, natOnly)
	if err != nil {
		return nil, err
	}
	for _, d := range env.Cell.Detours {
		if err := rs.probe(ctx, env, d); err != nil {
			rs.close()
			return nil, err
		}
	}
	return rs, nil
}

// relayLease outlasts any cell: an expired grant would refuse the next
// trial's connection.
const relayLease = 6 * time.Hour

// relays are `mpdetour relay` processes, one per detour node of a cell.
type relays struct {
	member  proto.Key
	keys    map[string]proto.Key // node -> relay private key
	daemons []*daemon
	paths   map[netip.Addr]string
	// prefixes name tunnel subflows by their local address.
	prefixes map[netip.Prefix]string
}

// relayMode says which detours the relays offer.
type relayMode int

const (
	natOnly    relayMode = iota
	natTunnel            // NAT detours and WireGuard tunnels
	tunnelOnly           // tunnels; NAT grants to the server are refused by policy
	natEncap             // NAT detours and both tunnel kinds (wireguard, vxlan)
	encapOnly            // both tunnel kinds; NAT grants to the server refused
)

// encapSubnet is relay i's VXLAN subnet (distinct per relay, like tunnelSubnet).
func encapSubnet(i int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{100, 81, byte(i + 1), 0}), 24)
}

// encapSubnet6 is relay i's VXLAN subnet6 (the IPv6 inside), distinct per
// relay like encapSubnet.
func encapSubnet6(i int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom16([16]byte{0xfd, 0x64, 0, 0x81, 0, byte(i + 1)}), 64)
}

// tunnelSubnet is relay i's tunnel subnet: distinct per relay so that a
// subflow's local address tells which tunnel it took.
func tunnelSubnet(i int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{100, 80, byte(i + 1), 0}), 24)
}

// tunnelSubnet6 is relay i's IPv6 tunnel subnet (tunnel.subnet6), distinct
// per relay like tunnelSubnet.
func tunnelSubnet6(i int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom16([16]byte{0xfd, 0x64, 0, 0x80, 0, byte(i + 1)}), 64)
}

// startRelays starts a relay in each of the cell's detour nodes.
func startRelays(ctx context.Context, env *Env, mode relayMode) (_ *relays, err error) {
	rs := &relays{keys: map[string]proto.Key{}, paths: map[netip.Addr]string{}, prefixes: map[netip.Prefix]string{}}
	defer func() {
		if err != nil {
			rs.close()
		}
	}()
	if rs.member, err = proto.GenerateKey(); err != nil {
		return nil, err
	}
	server := env.addr(env.Roles.Server)
	lease := relayLease
	if env.RelayLease > 0 {
		lease = env.RelayLease
	}
	for i, node := range env.Cell.Detours {
		k, err := proto.GenerateKey()
		if err != nil {
			return nil, err
		}
		rs.keys[node] = k
		rs.paths[env.addr(node)] = "nat:" + node
		if err := enableForwarding(env, node); err != nil {
			return nil, err
		}
		cfg := fmt.Sprintf(`listen: 0.0.0.0:%d
private_key: %s
ports: 40000-40999
lease: %s
members:
  - {name: bench, public_key: %s}
`, relay.DefaultPort, k, lease, rs.member.Public()) + env.RelayMembers
		if env.IPv6 {
			cfg += fmt.Sprintf("listen6: '[::]:%d'\n", relay.DefaultPort)
		}
		cfg += env.RelayConfig
		if env.RelayConfigFor != nil {
			more, err := env.RelayConfigFor(node, k.Public())
			if err != nil {
				return nil, err
			}
			cfg += more
		}
		if mode != tunnelOnly && mode != encapOnly {
			// The lab's server has a private address, refused unless allowed.
			allow := []string{hostPrefix(server).String()}
			for _, a := range env.RelayAllow {
				allow = append(allow, hostPrefix(a).String())
			}
			cfg += fmt.Sprintf("allow_destinations: [%s]\n", strings.Join(allow, ", "))
		}
		if env.RelayState {
			cfg += fmt.Sprintf("state_file: %s\n", filepath.Join(env.Dir, "relay-"+node+".state.json"))
		}
		if mode != natOnly {
			cfg += fmt.Sprintf("tunnel:\n  subnet: %s\n  allow_destinations: ['%s']\n", tunnelSubnet(i), hostPrefix(server))
			if env.IPv6 {
				cfg += fmt.Sprintf("  subnet6: '%s'\n", tunnelSubnet6(i))
				rs.prefixes[tunnelSubnet6(i)] = "tunnel:" + node
			}
			if env.RelayState {
				cfg += fmt.Sprintf("  state_file: %s\n", filepath.Join(env.Dir, "tunnel-"+node+".state.json"))
			}
			rs.prefixes[tunnelSubnet(i)] = "tunnel:" + node
			if mode == natEncap || mode == encapOnly {
				if env.IPv6 {
					cfg += fmt.Sprintf("  kinds: [wireguard, vxlan]\n  vxlan: {subnet: %s, subnet6: '%s'}\n", encapSubnet(i), encapSubnet6(i))
					rs.prefixes[encapSubnet6(i)] = "vxlan:" + node
				} else {
					cfg += fmt.Sprintf("  kinds: [wireguard, vxlan]\n  vxlan: {subnet: %s}\n", encapSubnet(i))
				}
				rs.prefixes[encapSubnet(i)] = "vxlan:" + node
			}
		}
		path := filepath.Join(env.Dir, "relay-"+node+".yaml")
		if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
			return nil, err
		}
		d, err := startDaemon(ctx, env, node, "relay-"+node, env.Binary, "relay", "--config", path)
		if err != nil {
			return nil, err
		}
		rs.daemons = append(rs.daemons, d)
	}
	return rs, nil
}

// enableForwarding turns on IPv4 (and in a lab with IPv6, IPv6)
// forwarding in node: a detour forwards. The relay only warns when it is
// off (the operator's call; here the lab is ours).
func enableForwarding(env *Env, node string) error {
	err := env.Lab.Do(node, func() error {
		if env.Lab.Family().Has6() {
			if err := os.WriteFile("/proc/sys/net/ipv6/conf/all/forwarding", []byte("1"), 0o644); err != nil {
				return err
			}
		}
		return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644)
	})
	if err != nil {
		return fmt.Errorf("ip_forward in %s: %w", node, err)
	}
	return nil
}

func (rs *relays) close() error {
	var errs []error
	for _, d := range rs.daemons {
		errs = append(errs, d.stop())
	}
	rs.daemons = nil
	return errors.Join(errs...)
}

func (rs *relays) daemon(node string) *daemon {
	for _, d := range rs.daemons {
		if d.name == "relay-"+node {
			return d
		}
	}
	return nil
}

// conn opens an authenticated control channel from the client node to the
// relay in node.
func (rs *relays) conn(env *Env, node string) (*relayconn.Conn, error) {
	r := relayconn.Relay{
		Name:      node,
		Addr:      netip.AddrPortFrom(env.addr(node), relay.DefaultPort),
		PublicKey: rs.keys[node].Public(),
	}
	listen := func() (net.PacketConn, error) {
		var pc net.PacketConn
		err := env.Lab.Do(env.Roles.Client, func() error {
			var err error
			network := "udp4"
			if env.IPv6 {
				network = "udp6"
			}
			pc, err = net.ListenUDP(network, nil)
			return err
		})
		return pc, err
	}
	return relayconn.Dial(r, rs.member, relayconn.Options{ListenPacket: listen})
}

// grant asks the relay in node for a NAT mapping to the receiver, the way
// the agent does, and returns the relay address and port to connect to.
func (rs *relays) grant(ctx context.Context, env *Env, node string) (netip.AddrPort, error) {
	c, err := rs.conn(env, node)
	if err != nil {
		return netip.AddrPort{}, err
	}
	defer c.Close()
	// The relay may still be starting: the client retransmits its
	// handshake, so one request with a deadline covers the start-up.
	gctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	granted, _, err := c.Grant(gctx, env.serverAddr(), 0)
	if err != nil {
		if d := rs.daemon(node); d != nil {
			if ok, _ := d.exited(); ok {
				return netip.AddrPort{}, d.failure()
			}
			return netip.AddrPort{}, fmt.Errorf("grant from relay %s: %w (relay log: %s)", node, err, d.tail())
		}
		return netip.AddrPort{}, fmt.Errorf("grant from relay %s: %w", node, err)
	}
	return granted, nil
}

// probe checks that the relay in node grants, and gives the port back.
func (rs *relays) probe(ctx context.Context, env *Env, node string) error {
	granted, err := rs.grant(ctx, env, node)
	if err != nil {
		return err
	}
	c, err := rs.conn(env, node)
	if err != nil {
		return err
	}
	defer c.Close()
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := c.Release(rctx, granted.Port()); err != nil {
		// Under link loss the client resends a release whose reply was
		// lost, and the relay answers the copy with not-found: the port
		// is released, which is all the probe needs.
		var pe *proto.Error
		if errors.As(err, &pe) && pe.Reason == proto.ReasonNotFound {
			return nil
		}
		return fmt.Errorf("release at relay %s: %w", node, err)
	}
	return nil
}

// agentSection is the agent config's relays section: the member key and
// every relay of the cell.
func (rs *relays) agentSection(env *Env, backup bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "relays:\n  key: %s\n  servers:\n", rs.member)
	for _, node := range env.Cell.Detours {
		fmt.Fprintf(&b, "    - {name: %s, address: '%s', public_key: %s, backup: %v}\n",
			node, netip.AddrPortFrom(env.addr(node), relay.DefaultPort), rs.keys[node].Public(), backup)
	}
	return b.String()
}

// agentDetour is one static detour in the agent's config.
type agentDetour struct {
	kind    string // nat or tunnel
	relay   string
	address netip.AddrPort // nat: relay address and granted port
	local   netip.Addr     // tunnel: the tunnel's address
}

// startAgent runs `mpdetour agent` in the client node, keeping `subflows`
// detour subflows per connection, with static detours ds and the extra
// config text (a relays section), and waits for its status socket (it
// appears once the agent listens for MPTCP events and has switched the
// node to the userspace path manager).
func startAgent(ctx context.Context, env *Env, subflows int, ds []agentDetour, extra string) (*daemon, error) {
	return startAgentFor(ctx, env, subflows, ds, extra, env.serverAddr())
}

// startAgentFor is startAgent with detours for connections to target (the
// converter for procedure converted) instead of the server.
func startAgentFor(ctx context.Context, env *Env, subflows int, ds []agentDetour, extra string, target netip.AddrPort) (*daemon, error) {
	sock := filepath.Join(env.Dir, "agent.sock")
	cfg, leave, err := withLabCgroup(agentConfig(env, sock, subflows, ds, extra, target, env.serverAddr()))
	if err != nil {
		return nil, err
	}
	path := filepath.Join(env.Dir, "agent.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		leave()
		return nil, err
	}
	d, err := startDaemon(ctx, env, env.Roles.Client, "agent", env.Binary, "agent", "--config", path)
	if err != nil {
		leave()
		return nil, err
	}
	d.after = leave
	return waitStatusSocket(ctx, d, sock)
}

// agentConfig is the agent's config file for startAgentFor, without the
// bpf_cgroup line: status socket sock, the cell's procedure's policy, a
// selector for target, static detours ds toward server,
// extra and the scenario's agent config.
func agentConfig(env *Env, sock string, subflows int, ds []agentDetour, extra string, target, server netip.AddrPort) string {
	var b strings.Builder
	// MPDETOUR_BENCH_LOG=debug: the agent logs every intent and trial
	// (with MPDETOUR_BENCH_KEEP=1 to keep the logs).
	level := "info"
	if v := os.Getenv("MPDETOUR_BENCH_LOG"); v != "" {
		level = v
	}
	fmt.Fprintf(&b, "socket: %s\nsubflows: %d\nlog_level: %s\n", sock, subflows, level)
	if pol := scenario.Policy(env.Cell.Procedure); pol != "" {
		// Procedures that name a policy compare policies side by side; the
		// adaptive one measures every 100 ms, so the static one probes as
		// often (its stall check), to compare policies, not probe rates.
		fmt.Fprintf(&b, "policy: %s\nprobe_interval: 100ms\n", pol)
	}
	ports := fmt.Sprintf("\"%d\"", target.Port())
	if env.FlowPort != 0 && target == server {
		// Flow trials go to the flow sink's port.
		ports += fmt.Sprintf(", \"%d\"", env.FlowPort)
	}
	fmt.Fprintf(&b, "selectors:\n  - {prefixes: [%s], ports: [%s]}\n", hostPrefix(target.Addr()), ports)
	if len(ds) > 0 {
		b.WriteString("detours:\n")
	}
	for _, d := range ds {
		switch d.kind {
		case "nat":
			fmt.Fprintf(&b, "  - {kind: nat, relay: %s, address: %s, server: %s}\n", d.relay, d.address, server)
		case "tunnel":
			fmt.Fprintf(&b, "  - {kind: tunnel, relay: %s, local: %s, servers: [%s/32]}\n", d.relay, d.local, server.Addr())
		}
	}
	b.WriteString(extra)
	b.WriteString(env.AgentConfig)
	return b.String()
}

// waitStatusSocket waits until agent d listens on its status socket sock
// (it does once it follows MPTCP events); d is stopped if it does not.
func waitStatusSocket(ctx context.Context, d *daemon, sock string) (*daemon, error) {
	err := d.waitFor(ctx, "status socket", 15*time.Second, func() bool {
		_, err := os.Stat(sock)
		return err == nil
	})
	if err != nil {
		d.stop()
		return nil, err
	}
	return d, nil
}
