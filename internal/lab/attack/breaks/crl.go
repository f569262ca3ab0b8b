package breaks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relayconn"
)

// revokedCRL (break 4, the certificate path): two relays of one
// collective in a gossip cluster (gossip.secret_file); a member known only
// by its certificate streams from a server through detour1's converter.
// The authority's new revocation list, naming the member's certificate, is
// written to detour2's crl_file (what docs/collective.md tells the
// operator: one relay's file is enough); detour1 has no crl_file, so the
// list can reach it only by gossip. "The list reaches the relay" is taken
// as the start of the last status call (`relay status --json`,
// roster.crl_seq) in which detour1 still held the old list, an instant
// before the true arrival (so the window below starts early: stricter).
// Target: 0 bytes through the conversion from 2 s after that to 4 s.
func revokedCRL(ctx context.Context, o Options) Result {
	r := Result{Break: 4, Metric: "bytes moved 2-4 s after the list reached the relay (by gossip)", Target: "0"}
	l, keys, err := begin(ctx, o, "l", 3)
	if err != nil {
		return r.failed(err)
	}
	defer l.close()
	auth, secret, err := authority(o)
	if err != nil {
		return r.failed(err)
	}
	now := time.Now()
	memberKey := keys[2]
	memberCert, err := auth.Issue(memberKey.Public(), "alice", collective.RoleClient, now.Add(-time.Hour), now.Add(24*time.Hour))
	if err != nil {
		return r.failed(err)
	}
	crl1 := auth.Revoke(nil, now)
	crlPath := filepath.Join(o.Dir, "crl.txt")
	if err := os.WriteFile(crlPath, []byte(crl1.String()+"\n"), 0o600); err != nil {
		return r.failed(err)
	}
	server := netip.AddrPortFrom(l.Addr("server"), 5300)
	nodes := []string{"detour1", "detour2"}
	for i, node := range nodes {
		k := keys[i]
		cert, err := relayCert(o, auth, k, node)
		if err != nil {
			return r.failed(err)
		}
		addr := l.Addr(node)
		extra := ""
		if node == "detour1" {
			extra = fmt.Sprintf("convert:\n  enabled: true\n  listen: %s\n", netip.AddrPortFrom(addr, 45674))
		}
		crlLine, join := "", ""
		if node == "detour2" {
			crlLine = "  crl_file: " + crlPath + "\n"
			join = fmt.Sprintf("    join: [%s]\n", netip.AddrPortFrom(l.Addr(nodes[0]), gossipPort))
		}
		config := fmt.Sprintf("listen: %s\nprivate_key: %s\nports: 40000-40999\nlease: 1m\nallow_destinations: [%s/32]\n%scollective:\n  authority: %s\n  certificate_file: %s\n%s  gossip:\n    bind: %s\n    secret_file: %s\n%s",
			netip.AddrPortFrom(addr, relayPort), k, server.Addr(), extra, auth.Public(), cert, crlLine, netip.AddrPortFrom(addr, gossipPort), secret, join)
		if _, err := l.startRelay(ctx, o, node, "relay-"+node, config); err != nil {
			return r.failed(err)
		}
		if i == 0 {
			time.Sleep(500 * time.Millisecond) // detour2 joins it
		}
	}
	// Both relays list each other (the list travels by gossip).
	joined := false
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end) && !joined; time.Sleep(200 * time.Millisecond) {
		joined = len(rosterNames(ctx, l, o.Binary, "detour1")) == 2 && len(rosterNames(ctx, l, o.Binary, "detour2")) == 2
	}
	if !joined {
		r.Error = fmt.Sprintf("the two relays did not list each other within 20 s (logs in %s)", o.Dir)
		return r
	}
	seq1, _ := crlSeq(ctx, l, o.Binary, "detour1")
	relay := relayconn.Relay{Name: "detour1", Addr: netip.AddrPortFrom(l.Addr("detour1"), relayPort), PublicKey: keys[0].Public()}
	cs, err := l.streamConversion(ctx, server, relay, memberKey, memberCert.Bytes())
	if err != nil {
		r.Error = fmt.Sprintf("the certified member's %v (logs in %s)", err, o.Dir)
		return r
	}
	defer cs.close()
	got, ended, endedAt, rc := &cs.got, cs.ended, &cs.endedAt, cs.rc
	time.Sleep(time.Second)
	before := got.Load()
	if before == 0 {
		r.Error = "the conversion carried nothing before the revocation"
		return r
	}
	// The new list, written the way `mpdetour collective revoke` does
	// (temporary file, rename) to detour2's crl_file.
	crl2 := auth.Revoke(crl1, time.Now(), memberCert.Serial)
	tmp := crlPath + ".new"
	if err := os.WriteFile(tmp, []byte(crl2.String()+"\n"), 0o600); err != nil {
		return r.failed(err)
	}
	tw := time.Now()
	if err := os.Rename(tmp, crlPath); err != nil {
		return r.failed(err)
	}
	// When detour1 holds it: the start of the last call that still showed
	// the old sequence number is t0.
	var t0, seen time.Time
	t0, atT0 := tw, got.Load()
	for end := tw.Add(15 * time.Second); time.Now().Before(end); {
		ts, gs := time.Now(), got.Load()
		seq, err := crlSeq(ctx, l, o.Binary, "detour1")
		if err == nil && seq >= crl2.Seq {
			seen = time.Now()
			break
		}
		if err == nil {
			t0, atT0 = ts, gs
		}
		time.Sleep(50 * time.Millisecond)
	}
	if seen.IsZero() {
		r.Error = fmt.Sprintf("detour1 did not hold list seq %d within 15 s of writing it to detour2's crl_file (it held %d before; logs in %s)", crl2.Seq, seq1, o.Dir)
		return r
	}
	atSeen := got.Load()
	time.Sleep(time.Until(t0.Add(revokeGrace)))
	atGrace := got.Load()
	time.Sleep(time.Until(t0.Add(revokeGrace + revokeWatch)))
	moved := got.Load() - atGrace
	endedIn := "still open at the end"
	select {
	case err := <-ended:
		how := fmt.Sprintf("%v", err)
		if errors.Is(err, io.EOF) {
			how = "EOF"
		}
		endedIn = fmt.Sprintf("ended (%s) %s after t0", how, time.Unix(0, endedAt.Load()).Sub(t0).Round(time.Millisecond))
	default:
	}
	// A grant asked afterwards (the client presents the certificate again
	// on a new session if the relay dropped the old one).
	gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	_, _, gerr := rc.Grant(gctx, netip.AddrPortFrom(server.Addr(), 5301), 0)
	cancel()
	grantAfter := "granted"
	if gerr != nil {
		grantAfter = "refused: " + gerr.Error()
		if e := (*proto.Error)(nil); errors.As(gerr, &e) {
			grantAfter = "refused " + e.Reason.String()
		}
	}
	r.Value = float64(moved)
	r.Pass = moved == 0 && gerr != nil
	r.Detail = fmt.Sprintf("relays detour1 (converter, no crl_file) and detour2 (crl_file) in a gossip cluster with secret_file; a certified member's conversion through detour1 carried %d bytes in its first second; list seq %d naming its serial written to detour2's crl_file at tw; detour1 showed it %s after tw; t0 = %s after tw (the start of the last status call that still showed the old list, tw if none did): %d bytes in t0..t0+%s (%d of them before detour1 showed it), %d bytes in t0+%s..t0+%s; the conversion %s; a grant asked afterwards: %s",
		before, crl2.Seq, seen.Sub(tw).Round(time.Millisecond), t0.Sub(tw).Round(time.Millisecond), atGrace-atT0, revokeGrace, atSeen-atT0, moved, revokeGrace, revokeGrace+revokeWatch, endedIn, grantAfter)
	return r
}

// streamTo writes to every connection ln accepts until it fails.
func streamTo(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			buf := make([]byte, 16<<10)
			for {
				if _, err := c.Write(buf); err != nil {
					return
				}
			}
		}()
	}
}

// crlSeq is the revocation list sequence number node's relay applied (its
// `relay status --json`, roster.crl_seq).
func crlSeq(ctx context.Context, l *caseLab, bin, node string) (uint64, error) {
	out, err := l.output(ctx, node, bin, "relay", "status", "--json")
	if err != nil {
		return 0, err
	}
	var st struct {
		Roster *struct {
			CRLSeq uint64 `json:"crl_seq"`
		} `json:"roster"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		return 0, err
	}
	if st.Roster == nil {
		return 0, errors.New("no roster in the status")
	}
	return st.Roster.CRLSeq, nil
}
