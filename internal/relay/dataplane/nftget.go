package dataplane

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Reading a few counters. google/nftables can only dump a whole set, which
// takes seconds at 100,000 elements; the kernel also answers a GETSETELEM
// request naming elements (one reply per element), which costs only what
// is asked. This is that request, on a plain netfilter netlink socket.

const (
	nftaSetElemExpressions = 0x11 // NFTA_SET_ELEM_EXPRESSIONS (kernel >= 5.13)
	getChunk               = 64   // elements per request: replies must fit the socket buffer
)

func dialNetfilter() (*netlink.Conn, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return nil, err
	}
	// One reply datagram per element: room for a chunk of them.
	_ = c.SetReadBuffer(1 << 20)
	return c, nil
}

// countersOf reads the acct counters of keys (all of family f) into out.
// Every key must exist (the kernel fails the whole request otherwise).
func countersOf(c *netlink.Conn, f family, keys []Key, out map[Key]Counter) error {
	for len(keys) > 0 {
		n := min(len(keys), getChunk)
		if err := countersChunk(c, f, keys[:n], out); err != nil {
			return err
		}
		keys = keys[n:]
	}
	return nil
}

func countersChunk(c *netlink.Conn, f family, keys []Key, out map[Key]Counter) error {
	list := make([]netlink.Attribute, 0, len(keys))
	for _, k := range keys {
		kv, err := netlink.MarshalAttributes([]netlink.Attribute{{Type: unix.NFTA_DATA_VALUE, Data: encodeAddrPort(k.Client, k.Port)}})
		if err != nil {
			return err
		}
		el, err := netlink.MarshalAttributes([]netlink.Attribute{{Type: unix.NLA_F_NESTED | unix.NFTA_SET_ELEM_KEY, Data: kv}})
		if err != nil {
			return err
		}
		list = append(list, netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_LIST_ELEM, Data: el})
	}
	lb, err := netlink.MarshalAttributes(list)
	if err != nil {
		return err
	}
	data, err := netlink.MarshalAttributes([]netlink.Attribute{
		{Type: unix.NFTA_SET_ELEM_LIST_TABLE, Data: []byte(TableName + "\x00")},
		{Type: unix.NFTA_SET_ELEM_LIST_SET, Data: []byte(AcctSetName + "\x00")},
		{Type: unix.NLA_F_NESTED | unix.NFTA_SET_ELEM_LIST_ELEMENTS, Data: lb},
	})
	if err != nil {
		return err
	}
	req := netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETSETELEM),
			Flags: netlink.Request | netlink.Acknowledge,
		},
		Data: append([]byte{f.afinet, unix.NFNETLINK_V0, 0, 0}, data...),
	}
	sent, err := c.Send(req)
	if err != nil {
		return fmt.Errorf("nftables: get counters: %w", err)
	}
	// A lost reply (buffer overrun) must not hang the relay's event loop.
	if err := c.SetReadDeadline(time.Now().Add(2 * time.Second)); err != nil {
		return err
	}
	defer c.SetReadDeadline(time.Time{})
	got := 0
	for {
		msgs, err := c.Receive()
		if err != nil {
			return fmt.Errorf("nftables: get counters: %w", err)
		}
		for _, m := range msgs {
			if m.Header.Sequence != sent.Header.Sequence {
				continue
			}
			if m.Header.Type == netlink.Error {
				if got != len(keys) {
					return fmt.Errorf("nftables: get counters: %d replies for %d elements", got, len(keys))
				}
				return nil
			}
			if len(m.Data) < 4 {
				continue
			}
			if err := parseElemReply(m.Data[4:], out); err != nil {
				return err
			}
			got++
		}
	}
}

// parseElemReply reads the key and counter of the element(s) in one
// NEWSETELEM reply.
func parseElemReply(b []byte, out map[Key]Counter) error {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return err
	}
	for ad.Next() {
		if ad.Type() != unix.NFTA_SET_ELEM_LIST_ELEMENTS {
			continue
		}
		ad.Nested(func(list *netlink.AttributeDecoder) error {
			for list.Next() {
				list.Nested(func(el *netlink.AttributeDecoder) error {
					var key []byte
					var c Counter
					for el.Next() {
						switch el.Type() {
						case unix.NFTA_SET_ELEM_KEY:
							el.Nested(func(k *netlink.AttributeDecoder) error {
								for k.Next() {
									if k.Type() == unix.NFTA_DATA_VALUE {
										key = k.Bytes()
									}
								}
								return nil
							})
						case unix.NFTA_SET_ELEM_EXPR:
							el.Nested(func(e *netlink.AttributeDecoder) error { c = parseCounterExpr(e); return nil })
						case nftaSetElemExpressions:
							el.Nested(func(l *netlink.AttributeDecoder) error {
								for l.Next() {
									l.Nested(func(e *netlink.AttributeDecoder) error {
										if cc := parseCounterExpr(e); cc != (Counter{}) {
											c = cc
										}
										return nil
									})
								}
								return nil
							})
						}
					}
					if a, p, ok := decodeAddrPort(key); ok {
						out[Key{a, p}] = c
					}
					return nil
				})
			}
			return nil
		})
	}
	return ad.Err()
}

func parseCounterExpr(e *netlink.AttributeDecoder) Counter {
	var c Counter
	counter := false
	for e.Next() {
		switch e.Type() {
		case unix.NFTA_EXPR_NAME:
			counter = e.String() == "counter"
		case unix.NFTA_EXPR_DATA:
			e.Nested(func(d *netlink.AttributeDecoder) error {
				for d.Next() {
					v := d.Bytes()
					if len(v) != 8 {
						continue
					}
					switch d.Type() {
					case unix.NFTA_COUNTER_BYTES:
						c.Bytes = binary.BigEndian.Uint64(v)
					case unix.NFTA_COUNTER_PACKETS:
						c.Packets = binary.BigEndian.Uint64(v)
					}
				}
				return nil
			})
		}
	}
	if !counter {
		return Counter{}
	}
	return c
}
