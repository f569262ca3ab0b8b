package dataplane

import (
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// The NAT fast path (fast_path: true): a software flowtable on the relay's
// interfaces and, in the forward chain,
//
//	ct mark & natMark == natMark ct state established flow add @ft
//
// so established connections the relay NATs skip the forward path
// (routing, the nftables chains, conntrack's per-packet work) after their
// first packets; other forwarded traffic is untouched. Attribution then
// comes from conntrack accounting (ctacct.go), which the flowtable's
// counter flag keeps updated.
//
// Devices: the flowtable hooks the ingress of named devices, so it needs
// the list. The relay takes every Ethernet-like, non-loopback link of its
// namespace from the kernel (rtnetlink) at start and adds links that appear later (a
// flowtable update adds devices; the kernel unhooks removed devices
// itself). A fixed list in the config would go stale when interfaces come
// and go (containers, VLANs, a renamed NIC) and would be one more thing to
// get wrong; offloading needs both directions' devices in the table, and
// every interface the relay forwards between is exactly that list.
//
// Kernels built without nf_flow_table (CONFIG_NF_FLOW_TABLE, like the
// development machine's 6.18) refuse the flowtable: the relay logs it and
// forwards through the normal path, still counting through conntrack.

const flowtableName = "ft"

// linkWatch follows link changes in the relay's namespace (rtnetlink
// group RTNLGRP_LINK; mdlayher/netlink, whose Close wakes a blocked
// receive, so stopping does not wait for the next link event).
type linkWatch struct {
	conn    *netlink.Conn // subscribed to link changes
	list    *netlink.Conn // for dumps; created in the namespace like conn
	done    chan struct{}
	closing atomic.Bool
}

// link is what the flowtable needs of a link message.
type link struct {
	name    string
	ether   bool // ARPHRD_ETHER (loopback, tunnels and the like are not)
	deleted bool
}

// startFastPath subscribes to conntrack destroy events and link changes and
// lists the devices. It runs in the relay's namespace (sockets stay there).
func (d *nftDataPlane) startFastPath() error {
	ct, err := newCTAccount(d.log)
	if err != nil {
		return err
	}
	ev, err := netlink.Dial(unix.NETLINK_ROUTE, &netlink.Config{Groups: 1 << (unix.RTNLGRP_LINK - 1)})
	if err != nil {
		ct.close()
		return fmt.Errorf("fast path: link updates: %w", err)
	}
	list, err := netlink.Dial(unix.NETLINK_ROUTE, nil)
	if err != nil {
		ev.Close()
		ct.close()
		return fmt.Errorf("fast path: listing links: %w", err)
	}
	links, err := listLinks(list)
	if err != nil {
		list.Close()
		ev.Close()
		ct.close()
		return fmt.Errorf("fast path: listing links: %w", err)
	}
	for _, l := range links {
		if l.ether {
			d.devs = append(d.devs, l.name)
		}
	}
	d.ct, d.links = ct, &linkWatch{conn: ev, list: list, done: make(chan struct{})}
	go d.watchLinks(d.links)
	return nil
}

// listLinks dumps the links of c's namespace.
func listLinks(c *netlink.Conn) ([]link, error) {
	msgs, err := c.Execute(netlink.Message{
		Header: netlink.Header{Type: unix.RTM_GETLINK, Flags: netlink.Request | netlink.Dump},
		Data:   make([]byte, unix.SizeofIfInfomsg),
	})
	if err != nil {
		return nil, err
	}
	var out []link
	for _, m := range msgs {
		if l, ok := parseLink(m); ok {
			out = append(out, l)
		}
	}
	return out, nil
}

func parseLink(m netlink.Message) (link, bool) {
	if (m.Header.Type != unix.RTM_NEWLINK && m.Header.Type != unix.RTM_DELLINK) || len(m.Data) < unix.SizeofIfInfomsg {
		return link{}, false
	}
	l := link{
		ether:   binaryutil.NativeEndian.Uint16(m.Data[2:4]) == unix.ARPHRD_ETHER,
		deleted: m.Header.Type == unix.RTM_DELLINK,
	}
	ad, err := netlink.NewAttributeDecoder(m.Data[unix.SizeofIfInfomsg:])
	if err != nil {
		return link{}, false
	}
	for ad.Next() {
		if ad.Type() == unix.IFLA_IFNAME {
			l.name = ad.String()
		}
	}
	return l, l.name != ""
}

func (d *nftDataPlane) watchLinks(w *linkWatch) {
	defer close(w.done)
	for {
		msgs, err := w.conn.Receive()
		if err != nil {
			if w.closing.Load() {
				return
			}
			if !errors.Is(err, unix.ENOBUFS) {
				d.log.Warn("fast path: link updates: receive failed", "err", err)
				time.Sleep(100 * time.Millisecond)
			}
			// A lost update could be a new device: read the list again.
			if links, err := listLinks(w.list); err == nil {
				for _, l := range links {
					d.linkChanged(l)
				}
			}
			continue
		}
		for _, m := range msgs {
			if l, ok := parseLink(m); ok {
				d.linkChanged(l)
			}
		}
	}
}

func (d *nftDataPlane) linkChanged(l link) {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case l.deleted:
		d.devs = slices.DeleteFunc(d.devs, func(n string) bool { return n == l.name })
		for i := range d.fam {
			if ft := d.fam[i].ft; ft != nil {
				ft.Devices = slices.Clone(d.devs)
			}
		}
	case l.ether && !slices.Contains(d.devs, l.name):
		d.devs = append(d.devs, l.name)
		n := 0
		for i := range d.fam {
			if ft := d.fam[i].ft; ft != nil {
				ft.Devices = slices.Clone(d.devs)
				d.conn.AddFlowtable(ft) // an update: the kernel adds the new device
				n++
			}
		}
		if n == 0 {
			return
		}
		if err := d.conn.Flush(); err != nil {
			d.log.Warn("fast path: adding a device to the flowtable", "device", l.name, "err", err)
			return
		}
		d.log.Info("fast path: device added to the flowtable", "device", l.name)
	}
}

// installFlowtables adds a flowtable and the offload rule to each family's
// table (the kernel hooks a flowtable per table; both take the same
// devices) in their own transaction, after the tables: a kernel without
// flowtables keeps the rest. Called with d.mu held (or before d is shared).
func (d *nftDataPlane) installFlowtables() {
	var fts [2]*nftables.Flowtable
	for i := range d.fam {
		if d.has(i) {
			fts[i] = d.addFlowtable(d.fam[i].tab, d.fam[i].fwd)
		}
	}
	if err := d.conn.Flush(); err != nil {
		d.log.Warn("fast path unavailable: the kernel refused the flowtable (built without nf_flow_table?); forwarding through the normal path, attribution through conntrack accounting",
			"err", err)
		return
	}
	for i := range d.fam {
		d.fam[i].ft = fts[i]
	}
	d.log.Info("fast path: flowtables installed (ip, ip6)", "devices", d.devs)
}

// addFlowtable queues a flowtable and its offload rule in tab.
func (d *nftDataPlane) addFlowtable(tab *nftables.Table, fwd *nftables.Chain) *nftables.Flowtable {
	ft := &nftables.Flowtable{Table: tab, Name: flowtableName, Hooknum: nftables.FlowtableHookIngress,
		Priority: nftables.FlowtablePriorityFilter, Devices: slices.Clone(d.devs), Flags: nftables.FlowtableFlagsCounter}
	d.conn.AddFlowtable(ft)
	// ct mark & natMark == natMark ct state established flow add @ft
	d.conn.AddRule(&nftables.Rule{Table: tab, Chain: fwd, Exprs: []expr.Any{
		&expr.Ct{Key: expr.CtKeyMARK, Register: regAux},
		&expr.Bitwise{SourceRegister: regAux, DestRegister: regAux, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(natMark), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: regAux, Data: binaryutil.NativeEndian.PutUint32(natMark)},
		&expr.Ct{Key: expr.CtKeySTATE, Register: regAux},
		&expr.Bitwise{SourceRegister: regAux, DestRegister: regAux, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: regAux, Data: make([]byte, 4)},
		&expr.FlowOffload{Name: flowtableName},
	}})
	return ft
}

// FastPath reports whether the flowtables are installed (tests, logs).
func (d *nftDataPlane) FastPath() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.fam[0].ft != nil && (d.fam[1].ft != nil || !d.has(1))
}

func (d *nftDataPlane) stopFastPath() {
	if d.links != nil {
		d.links.closing.Store(true)
		d.links.conn.Close()
		<-d.links.done
		d.links.list.Close()
		d.links = nil
	}
	if d.ct != nil {
		d.ct.close()
		d.ct = nil
	}
}
