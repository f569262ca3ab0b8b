package bench

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/mpdetour/mpdetour/internal/lab"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relay"
	"github.com/mpdetour/mpdetour/internal/relayconn"
)

// RelayFootprintOptions configure RelayFootprint.
type RelayFootprintOptions struct {
	Lab      *lab.Lab // topology "line": client, relay, server
	Binary   string   // the mpdetour binary the relay runs (the host build is what ships)
	Dir      string   // scratch: config, log
	Mappings int      // NAT mappings to hold [1000]
}

// FootprintLook is a process's memory at one moment.
type FootprintLook struct {
	RSSKiB   int64     `json:"rss_kib"`
	Go       ProcStats `json:"go"` // from its metrics: heap in use, stacks, runtime total
	Mappings int       `json:"mappings"`
	Nft      int       `json:"nft_elements"`
}

// RelayFootprintReport is what RelayFootprint measured.
type RelayFootprintReport struct {
	Version  string        `json:"version"` // the measured binary's `mpdetour version`
	Binary   string        `json:"binary"`
	Mappings int           `json:"mappings"`
	Idle     FootprintLook `json:"idle"`
	Held     FootprintLook `json:"held"` // with Mappings NAT mappings granted
	// Per mapping: RSS and Go heap growth divided by Mappings (bytes).
	RSSPerMapping, HeapPerMapping float64
	GrantSeconds                  float64 `json:"grant_seconds"` // granting them all, one control connection
	Host                          string  `json:"host"`
	LoadAvg                       float64 `json:"loadavg_1m"`
}

const footprintMetrics = "127.0.0.1:9464"

// RelayFootprint starts a relay in the lab's relay node, measures its
// memory idle, grants Mappings NAT mappings to one member (distinct
// destination ports on the server, lease 1 h) and measures it again once
// they are all in its table and in the kernel's map.
func RelayFootprint(ctx context.Context, o RelayFootprintOptions) (*RelayFootprintReport, error) {
	if o.Mappings <= 0 {
		o.Mappings = 1000
	}
	l := o.Lab
	for _, n := range []string{"client", "relay", "server"} {
		if l.NetnsPath(n) == "" {
			return nil, fmt.Errorf("relay footprint needs topology line (nodes client, relay, server); no node %q", n)
		}
	}
	relayKey, err := proto.GenerateKey()
	if err != nil {
		return nil, err
	}
	member, err := proto.GenerateKey()
	if err != nil {
		return nil, err
	}
	server := l.Addr("server")
	cfg := fmt.Sprintf(`listen: 0.0.0.0:%d
private_key: %s
ports: 20000-59999
lease: 1h
members:
  - {name: load, public_key: %s}
allow_destinations: [%s/32]
quota: {per_member: %d, global: %d}
rate: {per_member: 100000, burst: 100000}
metrics: {listen: %s}
`, relay.DefaultPort, relayKey, member.Public(), server, o.Mappings+16, o.Mappings+16, footprintMetrics)
	cfgPath := filepath.Join(o.Dir, "relay.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	env := &Env{Lab: l, Dir: o.Dir, Binary: o.Binary}
	d, err := startDaemon(ctx, env, "relay", "relay", o.Binary, "relay", "--config", cfgPath)
	if err != nil {
		return nil, err
	}
	defer d.stop()
	pid := d.cmd.Process.Pid
	measure := func() (FootprintLook, error) {
		var f FootprintLook
		p, err := look(l, pid)
		if err != nil {
			return f, err
		}
		f.RSSKiB = p.RSSKiB
		r := lookRelay(ctx, l, o.Binary, "relay")
		f.Go, f.Mappings, f.Nft = r.ProcStats, r.Mappings, r.NftElements
		return f, nil
	}
	relayAddr := netip.AddrPortFrom(l.Addr("relay"), relay.DefaultPort)
	var c *relayconn.Conn
	var probe netip.AddrPort
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err = relayconn.Dial(relayconn.Relay{Name: "relay", Addr: relayAddr, PublicKey: relayKey.Public()}, member,
			relayconn.Options{ListenPacket: relayconn.ListenIn(l.NetnsPath("client"))})
		if err == nil {
			probe, _, err = c.Grant(ctx, netip.AddrPortFrom(server, 9), 0) // the relay answers: it is up
		}
		if err == nil || time.Now().After(deadline) {
			break
		}
		if c != nil {
			c.Close()
		}
		time.Sleep(500 * time.Millisecond)
	}
	if err != nil {
		return nil, fmt.Errorf("relay did not answer: %w", err)
	}
	defer c.Close()
	if err := c.Release(ctx, probe.Port()); err != nil {
		return nil, fmt.Errorf("releasing the probe's mapping: %w", err)
	}
	time.Sleep(2 * time.Second)
	rep := &RelayFootprintReport{Binary: o.Binary, Mappings: o.Mappings, Host: hostDescription(), LoadAvg: loadAvg()}
	if out, err := exec.CommandContext(ctx, o.Binary, "version").Output(); err == nil {
		rep.Version = strings.TrimSpace(string(out))
	}
	if rep.Idle, err = measure(); err != nil {
		return nil, err
	}
	t0 := time.Now()
	for i := 0; i < o.Mappings; i++ {
		if _, _, err := c.Grant(ctx, netip.AddrPortFrom(server, uint16(10000+i)), 0); err != nil {
			return nil, fmt.Errorf("grant %d of %d: %w", i+1, o.Mappings, err)
		}
	}
	rep.GrantSeconds = time.Since(t0).Seconds()
	time.Sleep(3 * time.Second)
	if rep.Held, err = measure(); err != nil {
		return nil, err
	}
	if rep.Held.Mappings < o.Mappings || rep.Held.Nft < o.Mappings {
		return rep, fmt.Errorf("the relay holds %d mappings (%d nft elements), want %d", rep.Held.Mappings, rep.Held.Nft, o.Mappings)
	}
	n := float64(o.Mappings)
	rep.RSSPerMapping = float64(rep.Held.RSSKiB-rep.Idle.RSSKiB) * 1024 / n
	rep.HeapPerMapping = (rep.Held.Go.HeapInuseBytes - rep.Idle.Go.HeapInuseBytes) / n
	return rep, nil
}
