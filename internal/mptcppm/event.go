package mptcppm

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"

	"github.com/mdlayher/netlink"
)

// EventType is enum mptcp_event_type; it travels as the genetlink command.
type EventType uint8

const (
	EventCreated         EventType = 1
	EventEstablished     EventType = 2
	EventClosed          EventType = 3
	EventAnnounced       EventType = 6
	EventRemoved         EventType = 7
	EventSubEstablished  EventType = 10
	EventSubClosed       EventType = 11
	EventSubPriority     EventType = 13
	EventListenerCreated EventType = 15
	EventListenerClosed  EventType = 16
)

var eventNames = map[EventType]string{
	EventCreated: "CREATED", EventEstablished: "ESTABLISHED", EventClosed: "CLOSED",
	EventAnnounced: "ANNOUNCED", EventRemoved: "REMOVED", EventSubEstablished: "SUB_ESTABLISHED",
	EventSubClosed: "SUB_CLOSED", EventSubPriority: "SUB_PRIORITY",
	EventListenerCreated: "LISTENER_CREATED", EventListenerClosed: "LISTENER_CLOSED",
}

func (t EventType) String() string {
	if s, ok := eventNames[t]; ok {
		return s
	}
	return fmt.Sprintf("EVENT(%d)", uint8(t))
}

// Attr is a bit set of the event attributes present in a message, so that
// "absent" and "zero" stay distinguishable (a loc_id of 0 is meaningful).
type Attr uint32

// Has reports whether attribute number a (an MPTCP_ATTR_* value) was present.
func (s Attr) Has(a int) bool { return a > 0 && a <= evMax && s&(1<<a) != 0 }

// Attribute numbers for Event.Present.Has.
const (
	AttrToken       = evToken
	AttrFamily      = evFamily
	AttrLocID       = evLocID
	AttrRemID       = evRemID
	AttrSport       = evSport
	AttrDport       = evDport
	AttrBackup      = evBackup
	AttrError       = evError
	AttrFlags       = evFlags
	AttrTimeout     = evTimeout
	AttrIfIndex     = evIfIndex
	AttrResetReason = evResetReason
	AttrResetFlags  = evResetFlags
	AttrServerSide  = evServerSide
)

// Event flags (Event.Flags, uapi MPTCP_PM_EV_FLAG_*).
const (
	// EventFlagDenyJoinID0: the peer set the C flag, it accepts no join to
	// its initial address (address id 0).
	EventFlagDenyJoinID0 = 1 << 0
	// EventFlagServerSide: the event is about a connection this host
	// accepted.
	EventFlagServerSide = 1 << 1
)

// Event is one decoded mptcp_pm event with every attribute the kernel sends.
// Local is saddr/sport and Remote daddr/dport as the kernel reports them
// (for a server-side connection Remote is the client).
type Event struct {
	Type        EventType
	Token       uint32
	Family      uint16
	LocalID     uint8
	RemoteID    uint8
	Local       netip.AddrPort
	Remote      netip.AddrPort
	Backup      uint8
	Error       uint8 // errno copied from sk_err (SUB_CLOSED)
	Flags       uint16
	Timeout     uint32
	IfIndex     uint32
	ResetReason uint32
	ResetFlags  uint32
	ServerSide  uint8
	Present     Attr
	// Unknown keeps attributes this codec does not know (newer kernels),
	// so they survive a decode/encode round trip.
	Unknown []netlink.Attribute
}

func (e Event) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s token=%08x", e.Type, e.Token)
	if e.Local.Addr().IsValid() || e.Present.Has(evSport) {
		fmt.Fprintf(&b, " local=%s", e.Local)
	}
	if e.Remote.Addr().IsValid() || e.Present.Has(evDport) {
		fmt.Fprintf(&b, " remote=%s", e.Remote)
	}
	if e.Present.Has(evLocID) {
		fmt.Fprintf(&b, " loc_id=%d", e.LocalID)
	}
	if e.Present.Has(evRemID) {
		fmt.Fprintf(&b, " rem_id=%d", e.RemoteID)
	}
	if e.Present.Has(evBackup) {
		fmt.Fprintf(&b, " backup=%d", e.Backup)
	}
	if e.Present.Has(evError) {
		fmt.Fprintf(&b, " error=%d", e.Error)
	}
	if e.Present.Has(evServerSide) {
		fmt.Fprintf(&b, " server_side=%d", e.ServerSide)
	}
	return b.String()
}

// evLen is each event attribute's payload size; 0 marks unknown numbers.
var evLen = [evMax + 1]int{
	evToken: 4, evFamily: 2, evLocID: 1, evRemID: 1, evSaddr4: 4, evSaddr6: 16,
	evDaddr4: 4, evDaddr6: 16, evSport: 2, evDport: 2, evBackup: 1, evError: 1,
	evFlags: 2, evTimeout: 4, evIfIndex: 4, evResetReason: 4, evResetFlags: 4, evServerSide: 1,
}

// DecodeEvent decodes the attributes of one event message. It never panics
// on malformed input; errors name the offending attribute.
func DecodeEvent(typ EventType, b []byte) (Event, error) {
	e := Event{Type: typ}
	attrs, err := netlink.UnmarshalAttributes(b)
	if err != nil {
		return e, fmt.Errorf("mptcp_pm %s event: %w", typ, err)
	}
	var l4, l6, r4, r6 []byte
	for _, a := range attrs {
		t := a.Type & 0x3fff // strip NLA_F_NESTED / NLA_F_NET_BYTEORDER
		d := a.Data
		want := 0
		if t <= evMax {
			want = evLen[t]
		}
		if want == 0 {
			e.Unknown = append(e.Unknown, netlink.Attribute{Type: a.Type, Data: append([]byte(nil), d...)})
			continue
		}
		// Address attributes of family 6 are "min-len 16"; the rest are exact.
		if len(d) < want || (t != evSaddr6 && t != evDaddr6 && len(d) != want) {
			return e, fmt.Errorf("mptcp_pm %s event: attribute %d has %d bytes, want %d", typ, t, len(d), want)
		}
		if e.Present.Has(int(t)) {
			return e, fmt.Errorf("mptcp_pm %s event: attribute %d repeated", typ, t)
		}
		e.Present |= 1 << t
		switch t {
		case evToken:
			e.Token = nativeU32(d)
		case evFamily:
			e.Family = nativeU16(d)
		case evLocID:
			e.LocalID = d[0]
		case evRemID:
			e.RemoteID = d[0]
		case evSaddr4:
			l4 = d
		case evSaddr6:
			l6 = d[:16]
		case evDaddr4:
			r4 = d
		case evDaddr6:
			r6 = d[:16]
		case evSport:
			e.Local = netip.AddrPortFrom(e.Local.Addr(), binary.BigEndian.Uint16(d))
		case evDport:
			e.Remote = netip.AddrPortFrom(e.Remote.Addr(), binary.BigEndian.Uint16(d))
		case evBackup:
			e.Backup = d[0]
		case evError:
			e.Error = d[0]
		case evFlags:
			e.Flags = nativeU16(d)
		case evTimeout:
			e.Timeout = nativeU32(d)
		case evIfIndex:
			e.IfIndex = nativeU32(d)
		case evResetReason:
			e.ResetReason = nativeU32(d)
		case evResetFlags:
			e.ResetFlags = nativeU32(d)
		case evServerSide:
			e.ServerSide = d[0]
		}
	}
	if l4 != nil && l6 != nil || r4 != nil && r6 != nil {
		return e, fmt.Errorf("mptcp_pm %s event: both IPv4 and IPv6 addresses present", typ)
	}
	if a, ok := addrOf(l4, l6); ok {
		e.Local = netip.AddrPortFrom(a, e.Local.Port())
	}
	if a, ok := addrOf(r4, r6); ok {
		e.Remote = netip.AddrPortFrom(a, e.Remote.Port())
	}
	return e, nil
}

func addrOf(v4, v6 []byte) (netip.Addr, bool) {
	switch {
	case v4 != nil:
		return netip.AddrFrom4([4]byte(v4)), true
	case v6 != nil:
		return netip.AddrFrom16([16]byte(v6)), true
	}
	return netip.Addr{}, false
}

// Encode renders the event's attributes as the kernel would send them; it is
// the inverse of DecodeEvent (used for fixtures and tests of consumers).
func (e Event) Encode() ([]byte, error) {
	var attrs []netlink.Attribute
	put := func(t uint16, d []byte) {
		if e.Present.Has(int(t)) {
			attrs = append(attrs, netlink.Attribute{Type: t, Data: d})
		}
	}
	put(evToken, u32(e.Token))
	put(evFamily, u16(e.Family))
	put(evLocID, []byte{e.LocalID})
	put(evRemID, []byte{e.RemoteID})
	if a := e.Local.Addr(); a.Is4() {
		put(evSaddr4, a.AsSlice())
	} else if a.IsValid() {
		b := a.As16()
		put(evSaddr6, b[:])
	}
	if a := e.Remote.Addr(); a.Is4() {
		put(evDaddr4, a.AsSlice())
	} else if a.IsValid() {
		b := a.As16()
		put(evDaddr6, b[:])
	}
	put(evSport, binary.BigEndian.AppendUint16(nil, e.Local.Port()))
	put(evDport, binary.BigEndian.AppendUint16(nil, e.Remote.Port()))
	put(evBackup, []byte{e.Backup})
	put(evError, []byte{e.Error})
	put(evFlags, u16(e.Flags))
	put(evTimeout, u32(e.Timeout))
	put(evIfIndex, u32(e.IfIndex))
	put(evResetReason, u32(e.ResetReason))
	put(evResetFlags, u32(e.ResetFlags))
	put(evServerSide, []byte{e.ServerSide})
	attrs = append(attrs, e.Unknown...)
	return netlink.MarshalAttributes(attrs)
}

// Present bits for the address attributes are set by the decoder; Encode
// needs them too, so events built by hand get them from SetAddrs.
func (e *Event) SetAddrs(local, remote netip.AddrPort) {
	e.Local, e.Remote = local, remote
	e.Present |= 1<<evSport | 1<<evDport
	if local.Addr().Is4() {
		e.Present |= 1 << evSaddr4
	} else if local.Addr().IsValid() {
		e.Present |= 1 << evSaddr6
	}
	if remote.Addr().Is4() {
		e.Present |= 1 << evDaddr4
	} else if remote.Addr().IsValid() {
		e.Present |= 1 << evDaddr6
	}
}

func nativeU32(b []byte) uint32 { return binary.NativeEndian.Uint32(b) }
func nativeU16(b []byte) uint16 { return binary.NativeEndian.Uint16(b) }
func u32(v uint32) []byte       { return binary.NativeEndian.AppendUint32(nil, v) }
func u16(v uint16) []byte       { return binary.NativeEndian.AppendUint16(nil, v) }
