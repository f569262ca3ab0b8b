package mptcppm

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/mdlayher/netlink"
)

// Addr is an MPTCP address as commands take it (a nested address attribute):
// an endpoint of the in-kernel PM, or one end of a subflow for the
// userspace PM commands.
type Addr struct {
	ID      uint8
	IP      netip.Addr
	Port    uint16
	Flags   AddrFlags
	IfIndex int32
}

// AddrFrom builds an Addr for one end of a subflow.
func AddrFrom(ap netip.AddrPort, id uint8) Addr {
	return Addr{ID: id, IP: ap.Addr().Unmap(), Port: ap.Port()}
}

func (a Addr) String() string {
	s := fmt.Sprintf("id %d %s", a.ID, netip.AddrPortFrom(a.IP, a.Port))
	if a.Flags != 0 {
		s += fmt.Sprintf(" flags %#x", uint32(a.Flags))
	}
	if a.IfIndex != 0 {
		s += fmt.Sprintf(" dev %d", a.IfIndex)
	}
	return s
}

func (a Addr) family() uint16 {
	if a.IP.Is4() || a.IP.Is4In6() {
		return afInet
	}
	return afInet6
}

// encode writes the nested address attribute's members. The id is always
// sent: for the userspace PM 0 means "the connection's initial address".
func (a Addr) encode(ae *netlink.AttributeEncoder) error {
	if !a.IP.IsValid() {
		return fmt.Errorf("address without IP")
	}
	ae.Uint16(addrFamily, a.family())
	ae.Uint8(addrID, a.ID)
	if ip := a.IP.Unmap(); ip.Is4() {
		ae.Bytes(addrAddr4, ip.AsSlice())
	} else {
		ae.Bytes(addrAddr6, ip.AsSlice())
	}
	if a.Port != 0 {
		// The spec calls it big-endian, but the kernel reads and writes
		// it with nla_get_u16/htons: host order on the wire.
		ae.Uint16(addrPort, a.Port)
	}
	if a.Flags != 0 {
		ae.Uint32(addrFlags, uint32(a.Flags))
	}
	if a.IfIndex != 0 {
		ae.Int32(addrIfIndex, a.IfIndex)
	}
	return nil
}

// decodeAddr parses a nested address attribute (GET_ADDR replies).
func decodeAddr(b []byte) (Addr, error) {
	var a Addr
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return a, err
	}
	for ad.Next() {
		d := ad.Bytes()
		switch ad.Type() {
		case addrFamily:
			_ = ad.Uint16()
		case addrID:
			a.ID = ad.Uint8()
		case addrAddr4:
			if len(d) != 4 {
				return a, fmt.Errorf("addr4 of %d bytes", len(d))
			}
			a.IP = netip.AddrFrom4([4]byte(d))
		case addrAddr6:
			if len(d) != 16 {
				return a, fmt.Errorf("addr6 of %d bytes", len(d))
			}
			a.IP = netip.AddrFrom16([16]byte(d))
		case addrPort:
			if len(d) != 2 {
				return a, fmt.Errorf("port of %d bytes", len(d))
			}
			a.Port = binary.NativeEndian.Uint16(d)
		case addrFlags:
			a.Flags = AddrFlags(ad.Uint32())
		case addrIfIndex:
			a.IfIndex = ad.Int32()
		}
	}
	return a, ad.Err()
}

// request is one command: its number, the connection it concerns (0 for
// the in-kernel PM's per-namespace commands) and its attributes.
type request struct {
	cmd   uint8
	token uint32
	enc   func(ae *netlink.AttributeEncoder) error
}

func (r request) marshal() ([]byte, error) {
	ae := netlink.NewAttributeEncoder()
	if r.enc != nil {
		if err := r.enc(ae); err != nil {
			return nil, err
		}
	}
	return ae.Encode()
}

func nested(ae *netlink.AttributeEncoder, typ uint16, a Addr) {
	ae.Nested(typ, func(nae *netlink.AttributeEncoder) error { return a.encode(nae) })
}

func subflowReq(cmd uint8, token uint32, local, remote Addr) request {
	return request{cmd: cmd, token: token, enc: func(ae *netlink.AttributeEncoder) error {
		if !local.IP.IsValid() || !remote.IP.IsValid() {
			return fmt.Errorf("subflow needs a local and a remote address")
		}
		ae.Uint32(attrToken, token)
		nested(ae, attrAddr, local)
		nested(ae, attrAddrRemote, remote)
		return nil
	}}
}

func announceReq(token uint32, a Addr) request {
	a.Flags |= FlagSignal
	return request{cmd: CmdAnnounce, token: token, enc: func(ae *netlink.AttributeEncoder) error {
		ae.Uint32(attrToken, token)
		nested(ae, attrAddr, a)
		return nil
	}}
}

func removeReq(token uint32, id uint8) request {
	return request{cmd: CmdRemove, token: token, enc: func(ae *netlink.AttributeEncoder) error {
		ae.Uint32(attrToken, token)
		ae.Uint8(attrLocID, id)
		return nil
	}}
}
