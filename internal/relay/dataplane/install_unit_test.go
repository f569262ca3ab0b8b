package dataplane

import (
	"errors"
	"log/slog"
	"testing"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// fakeKernel answers nftables batches like a kernel that refuses a batch
// with a message that refuse matches (the whole batch, as the kernel
// does), and records the batches it took. The test connection hands it one
// message at a time; a batch is what lies between NFNL_MSG_BATCH_BEGIN and
// NFNL_MSG_BATCH_END.
type fakeKernel struct {
	refuse   func(msgType uint16, family uint8) bool
	cur      []netlink.Message
	accepted [][]netlink.Message
	refused  int
}

func (k *fakeKernel) dial(req []netlink.Message) ([]netlink.Message, error) {
	for _, m := range req {
		switch t := uint16(m.Header.Type); {
		case t == unix.NFNL_MSG_BATCH_BEGIN:
			k.cur = nil
		case t == unix.NFNL_MSG_BATCH_END:
			k.accepted = append(k.accepted, k.cur)
			k.cur = nil
		case len(m.Data) > 0 && t>>8 == unix.NFNL_SUBSYS_NFTABLES && k.refuse(t&0xff, m.Data[0]):
			k.refused++
			k.cur = nil
			return nil, errors.New("operation not supported")
		default:
			k.cur = append(k.cur, m)
		}
	}
	return req, nil
}

// deletesTable says whether batch deletes table TableName of family af.
func deletesTable(batch []netlink.Message, af uint8) bool {
	for _, m := range batch {
		if uint16(m.Header.Type) == unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_DELTABLE && len(m.Data) > 0 && m.Data[0] == af {
			return true
		}
	}
	return false
}

func newInstallTest(t *testing.T, k *fakeKernel) *nftDataPlane {
	t.Helper()
	conn, err := nftables.New(nftables.WithTestDial(k.dial))
	if err != nil {
		t.Fatal(err)
	}
	return &nftDataPlane{conn: conn, log: slog.New(slog.DiscardHandler)}
}

// On the fall-back to IPv4 alone, a leftover ip6 table (a crashed run's)
// is deleted in a transaction of its own; when the kernel refuses that too
// (no IPv6 nftables at all: no leftover can exist) the IPv4 table still
// serves.
func TestInstallIPv4FallbackDropsLeftoverIPv6(t *testing.T) {
	for _, c := range []struct {
		name   string
		refuse func(msgType uint16, family uint8) bool
		// wantDrop: the leftover's deletion is one of the accepted batches.
		wantDrop bool
	}{
		{"ip6 NAT chains refused", func(mt uint16, af uint8) bool { return af == unix.AF_INET6 && mt == unix.NFT_MSG_NEWCHAIN }, true},
		{"no ip6 nftables", func(mt uint16, af uint8) bool { return af == unix.AF_INET6 }, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			k := &fakeKernel{refuse: c.refuse}
			d := newInstallTest(t, k)
			if err := d.install(); err != nil {
				t.Fatalf("install: %v", err)
			}
			if !d.has(0) || d.has(1) {
				t.Fatalf("installed families ip %v ip6 %v, want ip alone", d.has(0), d.has(1))
			}
			var v4, drop int
			for _, b := range k.accepted {
				if deletesTable(b, unix.AF_INET) {
					v4++
				}
				if deletesTable(b, unix.AF_INET6) {
					drop++
				}
			}
			if v4 != 1 {
				t.Errorf("%d accepted batches (re)create the ip table, want 1", v4)
			}
			if c.wantDrop && drop != 1 {
				t.Errorf("the leftover ip6 table was not deleted (%d accepted batches, %d refused)", len(k.accepted), k.refused)
			}
			if !c.wantDrop && (drop != 0 || k.refused != 2) {
				t.Errorf("%d refused batches, want 2 (both families, then the ip6 deletion)", k.refused)
			}
		})
	}
	// A kernel with both families: one batch, no separate deletion.
	k := &fakeKernel{refuse: func(uint16, uint8) bool { return false }}
	d := newInstallTest(t, k)
	if err := d.install(); err != nil || !d.has(1) || len(k.accepted) != 1 {
		t.Errorf("install with both families: %v, ip6 %v, %d batches", err, d.has(1), len(k.accepted))
	}
}
