package relay

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/relay/fairshare"
	"github.com/mpdetour/mpdetour/internal/relayconn"
)

// Fair sharing on a real relay: the ledger follows the kernel's counter of
// a member's mapping; a receipt of a certified relay earns its member
// credit, and a replayed, forged, self-issued, expired or uncertified one
// is refused; at capacity the member with more credit gets the mapping and
// the one with negative credit is refused "capacity"; after a kill -9 the
// ledger (and the replay window) come back from the ledger file.
func TestFairShare(t *testing.T) {
	auth, err := collective.NewAuthority()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ledgerPath := filepath.Join(dir, "ledger.json")
	f, k, cfgPath, p, _ := relayLine(t, fmt.Sprintf("collective: {authority: %s}\nattribution_flush: 1s\nfair_share: {capacity: 1, ledger_file: %s}\n", auth.Public(), ledgerPath))
	now := time.Now()
	aliceKey, bobKey, other := k.stranger, testKey(t), testKey(t)
	certOf := func(key proto.Key, name string, roles collective.Roles) []byte {
		c, err := auth.Issue(key.Public(), name, roles, now.Add(-time.Minute), now.Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		return c.Bytes()
	}
	dial := func(key proto.Key, cert []byte) *relayconn.Conn {
		c, err := relayconn.Dial(relayconn.Relay{Name: "r", Addr: relayAddr(), PublicKey: k.relay.Public()}, key,
			relayconn.Options{Certificate: cert, ListenPacket: func() (net.PacketConn, error) { return udpIn(t, f.Client, ""), nil }})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	aliceCert := certOf(aliceKey, "carol-relay", collective.RoleClient|collective.RoleRelay) // runs a relay
	alice, bob := dial(aliceKey, aliceCert), dial(bobKey, certOf(bobKey, "bob", collective.RoleClient))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	server := netip.MustParseAddrPort(fxServer + ":5201")
	startSink(t, f.Server, fxServer+":5202")

	// bob consumes 8 MiB: more than the 5 MiB start, his credit goes negative.
	d, _, err := bob.Grant(ctx, server, 0)
	if err != nil {
		t.Fatalf("bob's grant: %v\n%s", err, p.stderr.String())
	}
	conn, err := dialFrom(t, f.Client, d.String())
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 16; i++ {
		if err := echo(conn, 256<<10); err != nil {
			t.Fatal(err)
		}
	}
	conn.Close()
	var st *Status
	ledgerOf := func(name string) *LedgerStatus {
		t.Helper()
		in(t, f.Relay, func() { st, err = QueryStatus(5 * time.Second) })
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range st.Members {
			if m.Name == name {
				if m.Ledger == nil {
					t.Fatalf("member %s has no ledger in status", name)
				}
				return m.Ledger
			}
		}
		t.Fatalf("member %s not in status: %+v", name, st.Members)
		return nil
	}
	bl := ledgerOf("bob")
	var kernel uint64
	for _, m := range st.Members {
		if m.Name == "bob" {
			kernel = m.Bytes
		}
	}
	if bl.Consumed < 8<<20 || bl.Consumed != kernel || bl.Credit >= 0 {
		t.Fatalf("bob's ledger %+v, kernel counter %d: want consumed = kernel >= 8 MiB, credit < 0", bl, kernel)
	}

	// Receipts: alice's relay served someone else for 100 MiB.
	sign := func(priv, served proto.Key, seq uint64, end time.Time) *collective.Receipt {
		r := &collective.Receipt{Served: served.Public(), Seq: seq, Start: end.Add(-time.Minute), End: end, Relayed: 100 << 20}
		if err := collective.SignReceipt(r, priv); err != nil {
			t.Fatal(err)
		}
		return r
	}
	good := sign(aliceKey, other, 1, now)
	credit, err := alice.PresentReceipt(ctx, good.Bytes())
	if err != nil {
		t.Fatalf("valid receipt: %v\n%s", err, p.stderr.String())
	}
	if credit != collective.StartCredit+100<<20 {
		t.Fatalf("credit after the receipt %d, want %d", credit, collective.StartCredit+100<<20)
	}
	forged := sign(other, bobKey, 2, now)
	forged.Issuer = aliceKey.Public()
	refusals := []struct {
		name    string
		by      *relayconn.Conn
		receipt []byte
		want    proto.Reason
	}{
		{"replayed", alice, good.Bytes(), proto.ReasonReplay},
		{"forged", alice, forged.Bytes(), proto.ReasonUnauthorized},
		{"self-issued", alice, sign(aliceKey, aliceKey, 3, now).Bytes(), proto.ReasonUnauthorized},
		{"expired", alice, sign(aliceKey, other, 4, now.Add(-8*24*time.Hour)).Bytes(), proto.ReasonExpired},
		{"issuer not a relay", bob, sign(bobKey, other, 1, now).Bytes(), proto.ReasonUnauthorized},
		{"truncated", alice, good.Bytes()[:100], proto.ReasonMalformed},
	}
	for _, r := range refusals {
		if _, err := r.by.PresentReceipt(ctx, r.receipt); proto.ReasonOf(err) != r.want {
			t.Errorf("%s receipt: %v, want %v", r.name, err, r.want)
		}
	}
	if al := ledgerOf("carol-relay"); al.Earned != 100<<20 || al.Receipts != 1 {
		t.Fatalf("alice's ledger after the refusals %+v, want one receipt of 100 MiB", al)
	}

	// Capacity 1, held by bob: his second grant is refused, alice (more
	// credit) takes the mapping, bob (negative credit) is refused.
	if _, _, err := bob.Grant(ctx, netip.MustParseAddrPort(fxServer+":5202"), 0); proto.ReasonOf(err) != proto.ReasonCapacity {
		t.Fatalf("bob's second grant at capacity: %v, want capacity", err)
	}
	if _, _, err := alice.Grant(ctx, server, 0); err != nil {
		t.Fatalf("alice's grant at capacity: %v", err)
	}
	if _, _, err := bob.Grant(ctx, server, 0); proto.ReasonOf(err) != proto.ReasonCapacity {
		t.Fatalf("bob's grant while alice holds the capacity: %v, want capacity", err)
	}
	if n := elements(t, f.Relay); n != 1 {
		t.Fatalf("%d mappings, want alice's only", n)
	}
	ledgerOf("bob")
	for _, m := range st.Members {
		if m.Name == "bob" && len(m.Mappings) != 0 || m.Name == "carol-relay" && len(m.Mappings) != 1 {
			t.Fatalf("after preemption: %+v", st.Members)
		}
	}

	// kill -9 after a flush: the ledger and the replay window survive.
	before := ledgerOf("bob").Consumed
	waitFor(t, "a flush of the ledger file", func() bool { // every attribution_flush (1 s)
		l, err := fairshare.Load(ledgerPath)
		return err == nil && l.Members[bobKey.Public()] != nil && l.Members[bobKey.Public()].Consumed == before &&
			l.Members[aliceKey.Public()] != nil && l.Members[aliceKey.Public()].Earned == 100<<20
	})
	p.signal(t, syscall.SIGKILL)
	_ = p.wait(t)
	l, err := fairshare.Load(ledgerPath)
	if err != nil {
		t.Fatal(err)
	}
	if e := l.Members[bobKey.Public()]; e == nil || e.Consumed != before {
		t.Fatalf("bob's ledger after kill -9: %+v, want consumed %d", e, before)
	}
	startRelay(t, f.Relay, cfgPath)
	waitFor(t, "alice's certificate presented again", func() bool {
		_, err := alice.PresentReceipt(ctx, good.Bytes())
		return proto.ReasonOf(err) == proto.ReasonReplay
	})
	if al := ledgerOf("carol-relay"); al.Earned != 100<<20 {
		t.Fatalf("alice's earned credit after restart: %+v", al)
	}
	_ = os.Remove(ledgerPath)
}

// Receipts from end to end: relay A (whose key is also its operator's
// member key) serves alice and writes a signed receipt to its receipts
// file; its operator presents the file to relay B (relayconn.PresentAll,
// what `mpdetour collective present` runs) and earns credit there; a second
// run presents nothing new, and the same receipts again are replays.
func TestReceiptsEndToEnd(t *testing.T) {
	dir := t.TempDir()
	receipts := filepath.Join(dir, "receipts.txt")
	fa, ka, _, pa, alice := relayLine(t, fmt.Sprintf("attribution_flush: 1s\nfair_share: {receipts_file: %s, receipt_every: 1s}\n", receipts))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	d, _, err := alice.Grant(ctx, netip.MustParseAddrPort(fxServer+":5201"), 0)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := dialFrom(t, fa.Client, d.String())
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		if err := echo(conn, 256<<10); err != nil {
			t.Fatal(err)
		}
	}
	conn.Close()
	var rs []*collective.Receipt
	waitFor(t, "a receipt for alice's 2 MiB", func() bool {
		rs, err = relayconn.ReadReceipts(receipts)
		var sum uint64
		for _, r := range rs {
			sum += r.Relayed
		}
		return err == nil && sum >= 2<<20
	})
	for _, r := range rs {
		if r.Issuer != ka.relay.Public() || r.Served != ka.member.Public() || r.Check(time.Now()) != nil {
			t.Fatalf("receipt %+v: want issuer relay A, served alice, valid (%v)\n%s", r, r.Check(time.Now()), pa.stderr.String())
		}
	}

	auth, _ := collective.NewAuthority()
	fb, kb, _, pb, _ := relayLine(t, fmt.Sprintf("collective: {authority: %s}\n", auth.Public()))
	now := time.Now()
	cert, err := auth.Issue(ka.relay.Public(), "relay-a-operator", collective.RoleClient|collective.RoleRelay, now.Add(-time.Minute), now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	op, err := relayconn.Dial(relayconn.Relay{Name: "b", Addr: relayAddr(), PublicKey: kb.relay.Public()}, ka.relay,
		relayconn.Options{Certificate: cert.Bytes(), ListenPacket: func() (net.PacketConn, error) { return udpIn(t, fb.Client, ""), nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer op.Close()
	progress := relayconn.Presented{}
	res, err := relayconn.PresentAll(ctx, op, rs, progress, time.Now())
	if err != nil || res.Accepted != len(rs) || res.Refused != 0 {
		t.Fatalf("present: %+v %v\n%s", res, err, pb.stderr.String())
	}
	var sum int64
	for _, r := range rs {
		sum += int64(r.Relayed)
	}
	if res.Credit != collective.StartCredit+sum {
		t.Fatalf("credit %d, want %d", res.Credit, collective.StartCredit+sum)
	}
	if res, err := relayconn.PresentAll(ctx, op, rs, progress, time.Now()); err != nil || res.Skipped != len(rs) || res.Accepted+res.Refused != 0 {
		t.Fatalf("second run: %+v %v", res, err)
	}
	if res, err := relayconn.PresentAll(ctx, op, rs, relayconn.Presented{}, time.Now()); err != nil || res.Reasons["replay"] != len(rs) {
		t.Fatalf("without progress: %+v %v", res, err)
	}
}
