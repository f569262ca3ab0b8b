package bench

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/mpdetour/mpdetour/internal/mptcppm"
)

// The `announced` procedure: a client without any mpdetour software (plain
// MPTCP, the kernel's in-kernel path manager) gains detour subflows because
// the server's `mpdetour agent` (server role) announces the detours with
// ADD_ADDR on every connection. The detour here is a waypoint: a static
// NAT on the detour node (any source, its port 5201 -> the server's), the
// way a server operator's own waypoint or a relay grant open to any client
// address would forward.

func setupAnnounced(ctx context.Context, env *Env) (_ Session, err error) {
	var undo []func() error
	cleanup := func() error {
		var errs []error
		for i := len(undo) - 1; i >= 0; i-- {
			errs = append(errs, undo[i]())
		}
		undo = nil
		return errors.Join(errs...)
	}
	defer func() {
		if err != nil {
			cleanup()
		}
	}()
	server := env.serverAddr()
	paths := map[netip.Addr]string{}
	var ann []announce
	for _, node := range env.Cell.Detours {
		if err := enableForwarding(env, node); err != nil {
			return nil, err
		}
		rm, err := waypoint(ctx, env, node, uint16(env.Port), server)
		if err != nil {
			return nil, err
		}
		undo = append(undo, rm)
		a := netip.AddrPortFrom(env.Lab.Addr(node), uint16(env.Port))
		paths[a.Addr()] = "announced:" + node
		ann = append(ann, announce{name: node, addr: a.String()})
	}
	// The unmodified client only needs to accept the announcements: the
	// kernel's default is add_addr_accepted 0.
	restore, err := acceptAnnouncements(env, env.Roles.Client, len(ann))
	if err != nil {
		return nil, err
	}
	undo = append(undo, restore)
	ag, err := startServerAgent(ctx, env, env.Roles.Server, "server-agent", ann, nil)
	if err != nil {
		return nil, err
	}
	undo = append(undo, ag.stop)
	return &transfer{env: env, dst: server, mptcp: true, wantSubflows: 1 + len(ann), paths: paths,
		close: cleanup, daemons: []*daemon{ag}}, nil
}

// announce is one entry of the server role's announce list.
type announce struct {
	name, addr string
	id         int
}

// startServerAgent runs `mpdetour agent` with a server section in node and
// waits for its status socket. denyJoinInitial nil leaves the C flag alone.
func startServerAgent(ctx context.Context, env *Env, node, name string, ann []announce, denyJoinInitial *bool) (*daemon, error) {
	sock := filepath.Join(env.Dir, name+".sock")
	var b strings.Builder
	fmt.Fprintf(&b, "socket: %s\nlog_level: info\nserver:\n  ports: [\"%d\"]\n", sock, env.Port)
	if denyJoinInitial != nil {
		fmt.Fprintf(&b, "  deny_join_initial: %v\n", *denyJoinInitial)
	}
	if len(ann) > 0 {
		b.WriteString("  announce:\n")
	}
	for _, a := range ann {
		fmt.Fprintf(&b, "    - {name: %s, address: \"%s\"", a.name, a.addr)
		if a.id != 0 {
			fmt.Fprintf(&b, ", id: %d", a.id)
		}
		b.WriteString("}\n")
	}
	// An agent BPF program (subflow_lowat or cwnd_clamp when set) attaches
	// to this runner's cgroup, never the cgroup v2 root.
	cfg, leave, err := withLabCgroup(b.String())
	if err != nil {
		return nil, err
	}
	path := filepath.Join(env.Dir, name+".yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		leave()
		return nil, err
	}
	d, err := startDaemon(ctx, env, node, name, env.Binary, "agent", "--config", path)
	if err != nil {
		leave()
		return nil, err
	}
	d.after = leave
	return waitStatusSocket(ctx, d, sock)
}

// acceptAnnouncements raises node's in-kernel PM limits so that it opens a
// subflow to each of n announced addresses; it returns the restore.
func acceptAnnouncements(env *Env, node string, n int) (func() error, error) {
	c, err := mptcppm.Dial(mptcppm.Options{NetNS: env.Lab.NetnsPath(node)})
	if err != nil {
		return nil, fmt.Errorf("MPTCP limits in %s: %w", node, err)
	}
	defer c.Close()
	old, err := c.GetLimits()
	if err != nil {
		return nil, fmt.Errorf("MPTCP limits in %s: %w", node, err)
	}
	nl := mptcppm.Limits{AddAddrAccepted: max(old.AddAddrAccepted, uint32(n)), Subflows: max(old.Subflows, uint32(n))}
	if err := c.SetLimits(nl); err != nil {
		return nil, fmt.Errorf("MPTCP limits in %s: %w", node, err)
	}
	return func() error {
		c, err := mptcppm.Dial(mptcppm.Options{NetNS: env.Lab.NetnsPath(node)})
		if err != nil {
			return err
		}
		defer c.Close()
		return c.SetLimits(old)
	}, nil
}

// waypoint installs, in node, a static NAT from its port to dst for any
// source (and masquerades the forwarded connections); it returns the
// removal. The lab may use the nft CLI (product code uses netlink).
func waypoint(ctx context.Context, env *Env, node string, port uint16, dst netip.AddrPort) (func() error, error) {
	table := fmt.Sprintf("mpdetour_waypoint_%d", port)
	return nftScript(ctx, env, node, table, fmt.Sprintf(`table ip %s {
	chain pre {
		type nat hook prerouting priority dstnat; policy accept;
		fib daddr type local tcp dport %d dnat to %s
	}
	chain post {
		type nat hook postrouting priority srcnat; policy accept;
		ct status dnat masquerade
	}
}
`, table, port, dst))
}

// nftScript loads an nft ruleset (one table) in node and returns a
// function deleting the table.
func nftScript(ctx context.Context, env *Env, node, table, script string) (func() error, error) {
	cmd := env.Lab.Command(ctx, node, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("nft in %s: %v: %s", node, err, strings.TrimSpace(string(out)))
	}
	return func() error {
		// Not ctx: the removal must run also when the run is cancelled.
		cmd := env.Lab.Command(context.Background(), node, "nft", "delete", "table", "ip", table)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("nft delete table %s in %s: %v: %s", table, node, err, strings.TrimSpace(string(out)))
		}
		return nil
	}, nil
}
