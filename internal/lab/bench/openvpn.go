package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netns"
)

// The OpenVPN baseline: plain TCP through an OpenVPN tunnel from the
// client to the detour node, as the original evaluation's tunnel detour
// (peer-to-peer, static key, no cipher and no auth, like the 2017 setup).
// The detour masquerades tunnel traffic to its own address.
var (
	ovpnClient = netip.MustParseAddr("100.71.0.1")
	ovpnPeer   = netip.MustParseAddr("100.71.0.2")
)

const (
	ovpnPort  = 1194
	ovpnIface = "tunovpn"
	ovpnTable = "mpdetour_bench_ovpn"
)

func setupOpenVPN(ctx context.Context, env *Env) (_ Session, err error) {
	prog, err := exec.LookPath("openvpn")
	if err != nil {
		return nil, Unavailable("openvpn is not installed (Debian package openvpn)")
	}
	node := env.Cell.Detours[0]
	server := env.serverAddr().Addr()
	var undo []func() error
	closeAll := func() error {
		var errs []error
		for i := len(undo) - 1; i >= 0; i-- {
			errs = append(errs, undo[i]())
		}
		undo = nil
		return errors.Join(errs...)
	}
	defer func() {
		if err != nil {
			closeAll()
		}
	}()
	if err := enableForwarding(env, node); err != nil {
		return nil, err
	}
	unmasq, err := masquerade(env, node, netip.PrefixFrom(ovpnClient, 30).Masked())
	if err != nil {
		return nil, err
	}
	undo = append(undo, unmasq)
	key := filepath.Join(env.Dir, "openvpn.key")
	if err := writeStaticKey(key); err != nil {
		return nil, err
	}
	common := []string{prog, "--dev", ovpnIface, "--dev-type", "tun", "--cipher", "none", "--auth", "none",
		"--ping", "1", "--verb", "3"}
	peer, err := startDaemon(ctx, env, node, "openvpn-"+node, append(common,
		"--secret", key, "1", "--ifconfig", ovpnPeer.String(), ovpnClient.String(), "--lport", strconv.Itoa(ovpnPort))...)
	if err != nil {
		return nil, err
	}
	undo = append(undo, peer.stop)
	cl, err := startDaemon(ctx, env, env.Roles.Client, "openvpn-client", append(common,
		"--secret", key, "0", "--ifconfig", ovpnClient.String(), ovpnPeer.String(),
		"--remote", env.Lab.Addr(node).String(), strconv.Itoa(ovpnPort), "--nobind",
		"--route", server.String(), "255.255.255.255")...)
	if err != nil {
		return nil, err
	}
	undo = append(undo, cl.stop)
	// The route to the server exists once the client is initialised; the
	// peer is reachable once it has answered a ping.
	err = cl.waitFor(ctx, "OpenVPN peer connection", 15*time.Second, func() bool {
		b, _ := os.ReadFile(cl.logPath)
		return strings.Contains(string(b), "Initialization Sequence Completed") &&
			strings.Contains(string(b), "Peer Connection Initiated")
	})
	if err != nil {
		return nil, err
	}
	return &transfer{env: env, dst: env.serverAddr(), paths: map[netip.Addr]string{ovpnClient: "openvpn:" + node},
		close: closeAll, daemons: []*daemon{peer, cl}}, nil
}

// writeStaticKey writes an OpenVPN static key file (2048 random bits).
func writeStaticKey(path string) error {
	b := make([]byte, 256)
	if _, err := rand.Read(b); err != nil {
		return err
	}
	var s strings.Builder
	s.WriteString("-----BEGIN OpenVPN Static key V1-----\n")
	for i := 0; i < len(b); i += 16 {
		s.WriteString(hex.EncodeToString(b[i:i+16]) + "\n")
	}
	s.WriteString("-----END OpenVPN Static key V1-----\n")
	return os.WriteFile(path, []byte(s.String()), 0o600)
}

// nftIn runs fn with an nftables connection in node's namespace.
func nftIn(env *Env, node string, fn func(c *nftables.Conn) error) error {
	ns, err := netns.GetFromPath(env.Lab.NetnsPath(node))
	if err != nil {
		return err
	}
	defer ns.Close()
	c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		return fmt.Errorf("nftables in %s: %w", node, err)
	}
	return fn(c)
}

// masquerade adds, in node, an nftables table that masquerades packets
// from src leaving the node; it returns the removal.
func masquerade(env *Env, node string, src netip.Prefix) (func() error, error) {
	t := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: ovpnTable}
	err := nftIn(env, node, func(c *nftables.Conn) error {
		c.AddTable(t)
		ch := c.AddChain(&nftables.Chain{
			Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
			Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource,
		})
		m := make([]byte, 4)
		for i := 0; i < src.Bits(); i++ {
			m[i/8] |= 0x80 >> (i % 8)
		}
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: m, Xor: make([]byte, 4)},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: src.Addr().AsSlice()},
			&expr.Masq{},
		}})
		return c.Flush()
	})
	if err != nil {
		return nil, fmt.Errorf("nftables masquerade in %s: %w", node, err)
	}
	return func() error {
		err := nftIn(env, node, func(c *nftables.Conn) error {
			c.DelTable(t)
			return c.Flush()
		})
		if err != nil {
			return fmt.Errorf("removing nftables table %s in %s: %w", ovpnTable, node, err)
		}
		return nil
	}, nil
}
