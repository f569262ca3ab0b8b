package dataplane

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Attribution through conntrack accounting (fast_path: true).
//
// A flowtable's software fast path moves packets of offloaded connections
// past the forward hook, so the per-mapping nftables counters (acct set)
// would stop counting them. What the fast path does keep updated, with the
// flowtable's counter flag, is conntrack's own accounting of each
// connection. So with the fast path on, the relay counts a mapping as the
// sum of the conntrack counters (both directions) of its connections:
//
//   - live connections: a ctnetlink dump filtered in the kernel on the
//     relay's ct mark (natMark), read when counters are asked for;
//   - finished connections: destroy events (they carry the final
//     counters), added to the mapping's total as they arrive. The socket
//     asks for reliable delivery (NETLINK_BROADCAST_ERROR): when the relay
//     cannot take an event, conntrack keeps the entry and delivers it again
//     later, so a burst of closes delays events rather than losing them.
//
// Conntrack only counts when accounting is on in the namespace; a rule
// that reads "ct bytes" turns it on (the kernel does so for nft_ct and
// xt_connbytes), so the relay's table carries one (install) and no sysctl
// is written.
//
// A connection destroyed between a dump and the processing of its event is
// missing from that one reading (low, never high: a dumped connection whose
// destroy event was processed before the sum is skipped by its conntrack
// id); the next reading has it. The reaper logs a closed mapping only once
// its count has stood still for a reap interval.

// goneKeep is how long the id of a destroyed connection is remembered: far
// longer than a dump takes.
const goneKeep = 30 * time.Second

// ctnetlink constants (linux/netfilter/nfnetlink_conntrack.h); x/sys/unix
// does not have them.
const (
	nfnlSubsysCtnetlink = 1
	ipctnlMsgCtGet      = 1
	ipctnlMsgCtDelete   = 2

	ctaTupleOrig     = 1
	ctaMark          = 8
	ctaCountersOrig  = 9
	ctaCountersReply = 10
	ctaID            = 12
	ctaMarkMask      = 21

	ctaTupleIP    = 1
	ctaTupleProto = 2
	ctaIPv4Src    = 1
	ctaIPv6Src    = 3
	ctaProtoDst   = 3

	ctaCountersPackets = 1
	ctaCountersBytes   = 2
)

// ctFlow is what the relay needs of one conntrack entry.
type ctFlow struct {
	ID   uint32
	Key  Key // original source address . original destination port
	Mark uint32
	Cnt  Counter // both directions
}

// ctAccount holds the totals of finished connections per mapping.
type ctAccount struct {
	log    *slog.Logger
	events *netlink.Conn

	mu       sync.Mutex
	known    map[Key]bool    // mappings with an element (Map .. Forget)
	finished map[Key]Counter // sums of destroyed connections
	// gone holds the conntrack ids of recently destroyed connections, so
	// that a dump that still saw one is not added to its final count.
	gone      map[uint32]time.Time
	lastPrune time.Time
	done      chan struct{}
	closing   atomic.Bool
}

// newCTAccount subscribes to destroy events in the calling thread's
// network namespace.
func newCTAccount(log *slog.Logger) (*ctAccount, error) {
	ev, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{Groups: 1 << (unix.NFNLGRP_CONNTRACK_DESTROY - 1)})
	if err != nil {
		return nil, fmt.Errorf("conntrack events: %w", err)
	}
	if err := ev.SetOption(netlink.BroadcastError, true); err != nil {
		ev.Close()
		return nil, fmt.Errorf("conntrack events: NETLINK_BROADCAST_ERROR: %w", err)
	}
	_ = ev.SetOption(netlink.NoENOBUFS, true)
	_ = ev.SetReadBuffer(4 << 20)
	a := &ctAccount{log: log, events: ev, known: map[Key]bool{}, finished: map[Key]Counter{},
		gone: map[uint32]time.Time{}, done: make(chan struct{})}
	go a.loop()
	return a, nil
}

func (a *ctAccount) loop() {
	defer close(a.done)
	for {
		msgs, err := a.events.Receive()
		if err != nil {
			if a.closing.Load() {
				return
			}
			// Not expected with NETLINK_NO_ENOBUFS and reliable delivery;
			// keep listening (a stopped loop would undercount silently).
			a.log.Error("conntrack destroy events: receive failed; attribution of connections closed just now may be low", "err", err)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		for _, m := range msgs {
			if m.Header.Type != netlink.HeaderType(nfnlSubsysCtnetlink<<8|ipctnlMsgCtDelete) {
				continue
			}
			f, ok := parseCTFlow(m.Data)
			if !ok || f.Mark&natMark != natMark {
				continue
			}
			a.mu.Lock()
			if a.known[f.Key] {
				c := a.finished[f.Key]
				c.Bytes += f.Cnt.Bytes
				c.Packets += f.Cnt.Packets
				a.finished[f.Key] = c
				now := time.Now()
				a.gone[f.ID] = now
				if now.Sub(a.lastPrune) > goneKeep {
					for id, at := range a.gone {
						if now.Sub(at) > goneKeep {
							delete(a.gone, id)
						}
					}
					a.lastPrune = now
				}
			}
			a.mu.Unlock()
		}
	}
}

func (a *ctAccount) add(keys []Key) {
	a.mu.Lock()
	for _, k := range keys {
		a.known[k] = true
	}
	a.mu.Unlock()
}

func (a *ctAccount) forget(keys []Key) {
	a.mu.Lock()
	for _, k := range keys {
		delete(a.known, k)
		delete(a.finished, k)
	}
	a.mu.Unlock()
}

// counters sums finished and live connections of keys (nil keys: every
// known mapping). c is a netfilter netlink socket in the relay's namespace.
func (a *ctAccount) counters(c *netlink.Conn, keys []Key) (map[Key]Counter, error) {
	live, err := dumpCT(c)
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if keys == nil {
		for k := range a.known {
			keys = append(keys, k)
		}
	}
	out := make(map[Key]Counter, len(keys))
	for _, k := range keys {
		out[k] = a.finished[k]
	}
	for _, f := range live {
		if _, dead := a.gone[f.ID]; dead {
			continue // dumped just before its destroy event: counted in finished
		}
		if c, ok := out[f.Key]; ok {
			c.Bytes += f.Cnt.Bytes
			c.Packets += f.Cnt.Packets
			out[f.Key] = c
		}
	}
	return out, nil
}

func (a *ctAccount) close() {
	a.closing.Store(true)
	a.events.Close()
	<-a.done
}

// dumpCT lists the conntrack entries of both families carrying natMark
// (the kernel filters on CTA_MARK/CTA_MARK_MASK).
func dumpCT(c *netlink.Conn) ([]ctFlow, error) {
	var out []ctFlow
	for _, f := range families {
		fl, err := dumpCTFamily(c, f.afinet)
		if err != nil {
			return nil, err
		}
		out = append(out, fl...)
	}
	return out, nil
}

func dumpCTFamily(c *netlink.Conn, af uint8) ([]ctFlow, error) {
	data, err := netlink.MarshalAttributes([]netlink.Attribute{
		{Type: ctaMark, Data: binary.BigEndian.AppendUint32(nil, natMark)},
		{Type: ctaMarkMask, Data: binary.BigEndian.AppendUint32(nil, natMark)},
	})
	if err != nil {
		return nil, err
	}
	msgs, err := c.Execute(netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(nfnlSubsysCtnetlink<<8 | ipctnlMsgCtGet),
			Flags: netlink.Request | netlink.Dump,
		},
		Data: append([]byte{af, unix.NFNETLINK_V0, 0, 0}, data...),
	})
	if err != nil {
		return nil, fmt.Errorf("conntrack dump: %w", err)
	}
	out := make([]ctFlow, 0, len(msgs))
	for _, m := range msgs {
		if f, ok := parseCTFlow(m.Data); ok && f.Mark&natMark == natMark {
			out = append(out, f)
		}
	}
	return out, nil
}

// parseCTFlow decodes a ctnetlink message body (nfgenmsg + attributes).
func parseCTFlow(b []byte) (ctFlow, bool) {
	var f ctFlow
	if len(b) < 4 || (b[0] != unix.AF_INET && b[0] != unix.AF_INET6) {
		return f, false
	}
	ad, err := netlink.NewAttributeDecoder(b[4:])
	if err != nil {
		return f, false
	}
	ad.ByteOrder = binary.BigEndian
	var haveAddr, havePort bool
	for ad.Next() {
		switch ad.Type() {
		case ctaTupleOrig:
			ad.Nested(func(t *netlink.AttributeDecoder) error {
				for t.Next() {
					switch t.Type() {
					case ctaTupleIP:
						t.Nested(func(ip *netlink.AttributeDecoder) error {
							for ip.Next() {
								switch {
								case ip.Type() == ctaIPv4Src && len(ip.Bytes()) == 4:
									f.Key.Client, haveAddr = netip.AddrFrom4([4]byte(ip.Bytes())), true
								case ip.Type() == ctaIPv6Src && len(ip.Bytes()) == 16:
									f.Key.Client, haveAddr = netip.AddrFrom16([16]byte(ip.Bytes())), true
								}
							}
							return nil
						})
					case ctaTupleProto:
						t.Nested(func(p *netlink.AttributeDecoder) error {
							for p.Next() {
								if p.Type() == ctaProtoDst {
									f.Key.Port, havePort = p.Uint16(), true
								}
							}
							return nil
						})
					}
				}
				return nil
			})
		case ctaCountersOrig, ctaCountersReply:
			ad.Nested(func(c *netlink.AttributeDecoder) error {
				for c.Next() {
					switch c.Type() {
					case ctaCountersPackets:
						f.Cnt.Packets += c.Uint64()
					case ctaCountersBytes:
						f.Cnt.Bytes += c.Uint64()
					}
				}
				return nil
			})
		case ctaMark:
			f.Mark = ad.Uint32()
		case ctaID:
			f.ID = ad.Uint32()
		}
	}
	return f, ad.Err() == nil && haveAddr && havePort
}
