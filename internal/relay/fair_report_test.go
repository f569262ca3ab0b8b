package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relay/dataplane"
	"github.com/mpdetour/mpdetour/internal/relay/fairshare"
	"github.com/mpdetour/mpdetour/internal/relayconn"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
)

// TestFairnessReport is the measurement behind docs/results/fairness
// (not a pass/fail test: it runs only with MPDETOUR_FAIRNESS_REPORT set to
// a directory, where it writes results.json):
//
//	flock /work/runs/heavy.lock env MPDETOUR_FAIRNESS_REPORT=$PWD/docs/results/fairness \
//	    go test -count=1 -run TestFairnessReport -v -timeout 10m ./internal/relay/
//
// (an absolute path: go test runs in the package's directory).
//
// 1. share: two members compete for a relay at capacity (4 NAT mappings),
// four workers each asking for a mapping, sending through it for 0.5 s,
// releasing it, again (50 ms pause after a refusal), through a 100 Mbit/s
// uplink; without receipts, with the contributor having presented a
// receipt of its relay for 64 MiB, and one for 1 GiB.
// 2. ledger vs kernel: 5 members send for a while over long and short
// connections; after a clean stop the ledger file is compared with the
// kernel's final per-mapping counters in the attribution log.
// 3. kill -9: 5 members send steadily, the relay is killed, the kernel's
// counters (nft, read before restart) are compared with the ledger file.
func TestFairnessReport(t *testing.T) {
	out := os.Getenv("MPDETOUR_FAIRNESS_REPORT")
	if out == "" {
		t.Skip("measurement: set MPDETOUR_FAIRNESS_REPORT=DIR (docs/results/fairness/report.md)")
	}
	dur := 15 * time.Second
	if d, err := time.ParseDuration(os.Getenv("MPDETOUR_FAIRNESS_DURATION")); err == nil {
		dur = d
	}
	res := map[string]any{"duration_s": dur.Seconds()}
	if os.Getenv("MPDETOUR_FAIRNESS_ONLY") != "ledger" {
		res["share_without_receipts"] = measureShare(t, dur, 0)
		res["share_with_small_receipt"] = measureShare(t, dur, 64<<20)
		res["share_with_receipts"] = measureShare(t, dur, 1<<30)
	}
	if os.Getenv("MPDETOUR_FAIRNESS_ONLY") == "share" {
		t.Logf("%v", res)
		return
	}
	res["ledger_vs_kernel"] = measureLedger(t, dur)
	var kills []map[string]any
	for i, at := range []time.Duration{3100 * time.Millisecond, 4700 * time.Millisecond, 5900 * time.Millisecond} {
		kills = append(kills, measureKill(t, i, at))
	}
	res["kill9"] = kills
	b, _ := json.MarshalIndent(res, "", "  ")
	t.Logf("%s", b)
	defer checkFairnessReport(t, res) // after results.json is written
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(out, "results.json"), append(b, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
}

// discardSink accepts connections in ns and reads them to the end.
func discardSink(t *testing.T, ns, addr string) {
	t.Helper()
	var ln net.Listener
	var err error
	in(t, ns, func() { ln, err = net.Listen("tcp4", addr) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	netnstest.Serve(ln, func(c net.Conn) { _, _ = io.Copy(io.Discard, c); c.Close() })
}

type member struct {
	name string
	key  proto.Key
	conn *relayconn.Conn
}

func collectiveMembers(t *testing.T, f *fixture, k keys, auth *collective.Authority, names ...string) []*member {
	now := time.Now()
	var ms []*member
	for _, n := range names {
		key := testKey(t)
		cert, err := auth.Issue(key.Public(), n, collective.RoleClient|collective.RoleRelay, now.Add(-time.Minute), now.Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		c, err := relayconn.Dial(relayconn.Relay{Name: "r", Addr: relayAddr(), PublicKey: k.relay.Public()}, key,
			relayconn.Options{Certificate: cert.Bytes(), ListenPacket: func() (net.PacketConn, error) { return udpIn(t, f.Client, ""), nil }})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		ms = append(ms, &member{name: n, key: key, conn: c})
	}
	return ms
}

// send writes n bytes (0: until stop) to addr from ns; it returns the
// bytes written.
func send(t *testing.T, ns, addr string, n int64, stop <-chan struct{}) int64 {
	c, err := dialFrom(t, ns, addr)
	if err != nil {
		return 0
	}
	defer c.Close()
	buf := make([]byte, 64<<10)
	var done int64
	for n == 0 || done < n {
		if stop != nil {
			select {
			case <-stop:
				return done
			default:
			}
		}
		chunk := buf
		if n > 0 && n-done < int64(len(chunk)) {
			chunk = chunk[:n-done]
		}
		_ = c.SetWriteDeadline(time.Now().Add(2 * time.Second))
		w, err := c.Write(chunk)
		done += int64(w)
		if err != nil {
			return done
		}
	}
	return done
}

func measureShare(t *testing.T, dur time.Duration, receipt uint64) map[string]any {
	auth, _ := collective.NewAuthority()
	f, k, _, p, _ := relayLine(t, fmt.Sprintf("collective: {authority: %s}\nfair_share: {capacity: 4}\nrate: {per_member: 1000, burst: 1000}\n", auth.Public()))
	ms := collectiveMembers(t, f, k, auth, "contributor", "free-rider")
	// The relay's uplink to the server: 100 Mbit/s, so that what the members
	// get is bandwidth, not this host's CPU.
	if out, err := exec.Command("ip", "netns", "exec", f.Relay, "tc", "qdisc", "add", "dev", "r1", "root", "tbf",
		"rate", "100mbit", "burst", "64kb", "latency", "20ms").CombinedOutput(); err != nil {
		t.Fatalf("tc: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), dur+30*time.Second)
	defer cancel()
	if receipt > 0 {
		r := &collective.Receipt{Served: testKey(t).Public(), Seq: 1, Start: time.Now().Add(-time.Hour), End: time.Now(), Relayed: receipt}
		if err := collective.SignReceipt(r, ms[0].key); err != nil {
			t.Fatal(err)
		}
		if _, err := ms[0].conn.PresentReceipt(ctx, r.Bytes()); err != nil {
			t.Fatalf("receipt: %v\n%s", err, p.stderr.String())
		}
	}
	type tally struct {
		grants, refused, errors atomic.Int64
		bytes, heldNS           atomic.Int64
	}
	tallies := []*tally{{}, {}}
	var errMu sync.Mutex
	errKinds := map[string]int{}
	var wg sync.WaitGroup
	deadline := time.Now().Add(dur)
	const hold = 500 * time.Millisecond // a worker sends this long on each mapping
	for mi, m := range ms {
		for w := 0; w < 4; w++ {
			port := uint16(5301 + 4*mi + w)
			srv := netip.AddrPortFrom(netip.MustParseAddr(fxServer), port)
			discardSink(t, f.Server, srv.String())
			wg.Go(func() {
				tl := tallies[mi]
				for time.Now().Before(deadline) {
					d, _, err := m.conn.Grant(ctx, srv, 0)
					if err != nil {
						if proto.ReasonOf(err) == proto.ReasonCapacity {
							tl.refused.Add(1)
						} else {
							tl.errors.Add(1)
							errMu.Lock()
							errKinds[m.name+": "+err.Error()]++
							errMu.Unlock()
						}
						time.Sleep(50 * time.Millisecond)
						continue
					}
					t0 := time.Now()
					tl.grants.Add(1)
					stop := make(chan struct{})
					time.AfterFunc(hold, func() { close(stop) })
					tl.bytes.Add(send(t, f.Client, d.String(), 0, stop))
					_ = m.conn.Release(ctx, d.Port()) // not-found when it was given to the other member
					tl.heldNS.Add(int64(time.Since(t0)))
				}
			})
		}
	}
	wg.Wait()
	// Mappings given to the other member keep counting the connections
	// still on them; the relay reads those every 2 s until they stand still.
	time.Sleep(5 * time.Second)
	var st *Status
	var err error
	in(t, f.Relay, func() { st, err = QueryStatus(5 * time.Second) })
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]any{"capacity_mappings": 4, "workers_per_member": 4, "receipt_bytes": receipt, "hold_s": hold.Seconds()}
	var totalBytes, totalGrants float64
	for _, tl := range tallies {
		totalBytes += float64(tl.bytes.Load())
		totalGrants += float64(tl.grants.Load())
	}
	for mi, m := range ms {
		tl := tallies[mi]
		row := map[string]any{
			"grants": tl.grants.Load(), "capacity_refusals": tl.refused.Load(), "other_errors": tl.errors.Load(),
			"bytes_sent": tl.bytes.Load(), "mapping_seconds": float64(tl.heldNS.Load()) / 1e9,
			"share_of_bytes": float64(tl.bytes.Load()) / totalBytes, "share_of_grants": float64(tl.grants.Load()) / totalGrants,
		}
		for _, sm := range st.Members {
			if sm.Name == m.name && sm.Ledger != nil {
				row["ledger_consumed"], row["ledger_earned"], row["credit_units_at_end"] = sm.Ledger.Consumed, sm.Ledger.Earned, sm.Ledger.CreditUnits
			}
		}
		out[m.name] = row
	}
	out["relay_preempted"] = preemptions(p)
	out["other_error_kinds"] = errKinds
	return out
}

// preemptions counts the relay's log lines of mappings given to a member
// with more credit.
func preemptions(p *relayProc) int {
	return strings.Count(p.stderr.String(), "capacity: mapping given to a member with more credit")
}

func measureLedger(t *testing.T, dur time.Duration) map[string]any {
	auth, _ := collective.NewAuthority()
	dir := t.TempDir()
	ledgerPath := filepath.Join(dir, "ledger.json")
	f, k, cfgPath, p, _ := relayLine(t, fmt.Sprintf("collective: {authority: %s}\nattribution_flush: 2s\nfair_share: {ledger_file: %s}\n", auth.Public(), ledgerPath))
	names := []string{"m1", "m2", "m3", "m4", "m5"}
	ms := collectiveMembers(t, f, k, auth, names...)
	ctx, cancel := context.WithTimeout(context.Background(), dur+30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var app [5]atomic.Int64
	deadline := time.Now().Add(dur)
	for mi, m := range ms {
		long := netip.AddrPortFrom(netip.MustParseAddr(fxServer), uint16(5401+2*mi))
		short := netip.AddrPortFrom(netip.MustParseAddr(fxServer), uint16(5402+2*mi))
		discardSink(t, f.Server, long.String())
		discardSink(t, f.Server, short.String())
		// A long connection on one mapping for the whole run...
		wg.Go(func() {
			d, _, err := m.conn.Grant(ctx, long, 0)
			if err != nil {
				t.Errorf("%s: %v", m.name, err)
				return
			}
			stop := make(chan struct{})
			time.AfterFunc(time.Until(deadline), func() { close(stop) })
			app[mi].Add(send(t, f.Client, d.String(), 0, stop))
		})
		// ...and short ones on mappings granted and released.
		wg.Go(func() {
			for time.Now().Before(deadline) {
				d, _, err := m.conn.Grant(ctx, short, 0)
				if err != nil {
					continue
				}
				app[mi].Add(send(t, f.Client, d.String(), 4<<20, nil))
				_ = m.conn.Release(ctx, d.Port())
			}
		})
	}
	wg.Wait()
	time.Sleep(500 * time.Millisecond)
	p.signal(t, syscall.SIGTERM)
	if err := p.wait(t); err != nil {
		t.Fatalf("relay exit: %v", err)
	}
	l, err := fairshare.Load(ledgerPath)
	if err != nil {
		t.Fatal(err)
	}
	kernel := map[string]uint64{}
	for _, ev := range readAttribution(t, filepath.Join(filepath.Dir(cfgPath), "attribution.jsonl")) {
		if ev.Bytes != nil && ev.Event != "usage" && ev.Event != "convert" {
			kernel[ev.KeyID] += *ev.Bytes
		}
	}
	rows := map[string]any{}
	var worst float64
	for mi, m := range ms {
		e := l.Members[m.key.Public()]
		if e == nil {
			t.Fatalf("%s not in the ledger", m.name)
		}
		kb := kernel[m.key.Public().ID()]
		diff := (float64(e.Consumed) - float64(kb)) / float64(kb)
		worst = max(worst, abs(diff))
		rows[m.name] = map[string]any{"ledger": e.Consumed, "kernel_final_counters": kb, "relative_difference": diff, "application_bytes_sent": app[mi].Load()}
	}
	rows["worst_relative_difference"] = worst
	return rows
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

// nftAcctBytes sums the byte counters of the relay's accounting set.
func nftAcctBytes(t *testing.T, ns string) uint64 {
	t.Helper()
	out, err := nftList(t, ns, "-j", "list", "set", "ip", TableName, dataplane.AcctSetName)
	if err != nil {
		t.Fatalf("nft: %v\n%s", err, out)
	}
	var doc any
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatal(err)
	}
	var sum uint64
	var walk func(v any, inCounter bool)
	walk = func(v any, inCounter bool) {
		switch x := v.(type) {
		case map[string]any:
			for key, val := range x {
				if inCounter && key == "bytes" {
					if n, ok := val.(float64); ok {
						sum += uint64(n)
					}
				}
				walk(val, key == "counter")
			}
		case []any:
			for _, val := range x {
				walk(val, inCounter)
			}
		}
	}
	walk(doc, false)
	return sum
}

func measureKill(t *testing.T, run int, killAt time.Duration) map[string]any {
	auth, _ := collective.NewAuthority()
	dir := t.TempDir()
	ledgerPath := filepath.Join(dir, "ledger.json")
	const flush = 2 * time.Second
	f, k, cfgPath, p, _ := relayLine(t, fmt.Sprintf("collective: {authority: %s}\nattribution_flush: %s\nfair_share: {ledger_file: %s}\n", auth.Public(), flush, ledgerPath))
	ms := collectiveMembers(t, f, k, auth, "k1", "k2", "k3", "k4", "k5")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	for mi, m := range ms {
		srv := netip.AddrPortFrom(netip.MustParseAddr(fxServer), uint16(5501+mi))
		discardSink(t, f.Server, srv.String())
		d, _, err := m.conn.Grant(ctx, srv, 0)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() { send(t, f.Client, d.String(), 0, stop) })
	}
	time.Sleep(killAt)
	p.signal(t, syscall.SIGKILL)
	_ = p.wait(t)
	close(stop)
	wg.Wait()
	ran := time.Since(start)
	kernel := nftAcctBytes(t, f.Relay) // the killed relay's table is still there
	l, err := fairshare.Load(ledgerPath)
	if err != nil {
		t.Fatal(err)
	}
	var ledger uint64
	var keys []string
	for key, e := range l.Members {
		ledger += e.Consumed
		keys = append(keys, key.ID())
	}
	sort.Strings(keys)
	perPeriod := float64(kernel) / ran.Seconds() * flush.Seconds()
	// The restarted relay starts from the file.
	p2 := startRelay(t, f.Relay, cfgPath)
	waitFor(t, "relay serving", func() bool { return strings.Contains(p2.stderr.String(), "relay serving") })
	var st *Status
	in(t, f.Relay, func() { st, err = QueryStatus(5 * time.Second) })
	if err != nil {
		t.Fatal(err)
	}
	var restored uint64
	for _, m := range st.Members {
		if m.Ledger != nil {
			restored += m.Ledger.Consumed
		}
	}
	if st.Fair != nil {
		for _, o := range st.Fair.Others {
			restored += o.Ledger.Consumed
		}
	}
	_ = run
	return map[string]any{
		"killed_after_s": killAt.Seconds(), "flush_period_s": flush.Seconds(), "kernel_bytes_at_kill": kernel,
		"ledger_bytes_in_file": ledger, "lost_bytes": int64(kernel) - int64(ledger),
		"bytes_per_flush_period": perPeriod, "lost_in_flush_periods": (float64(kernel) - float64(ledger)) / perPeriod,
		"ledger_after_restart": restored,
	}
}
