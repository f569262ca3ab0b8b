package proto

import (
	"encoding/binary"
	"fmt"
	"net/netip"
)

// Legacy v1: the original prototype's unauthenticated 12-byte UDP format,
// served only when a relay operator opts in (see docs/relay.md for its
// weaknesses).
//
//	ver:u8 (=1) | op:u8 (0=request, 1=response) | reserved:u16 (0) | rip[4] | rpt:u16 | dpt:u16
const (
	LegacyPort     = 45672
	LegacyLen      = 12
	LegacyVersion  = 1
	LegacyRequest  = 0
	LegacyResponse = 1
)

// LegacyMsg is a v1 request or response.
type LegacyMsg struct {
	Response bool
	Server   netip.AddrPort // rip:rpt, the final server
	Port     uint16         // dpt: proposed (request) or granted (response) detour port
}

// ParseLegacy decodes an untrusted v1 datagram.
func ParseLegacy(b []byte) (LegacyMsg, error) {
	var m LegacyMsg
	if len(b) != LegacyLen {
		return m, fmt.Errorf("v1 datagram of %d bytes, want %d", len(b), LegacyLen)
	}
	if b[0] != LegacyVersion {
		return m, fmt.Errorf("v1 datagram with version %d", b[0])
	}
	switch b[1] {
	case LegacyRequest:
	case LegacyResponse:
		m.Response = true
	default:
		return m, fmt.Errorf("v1 datagram with op %d", b[1])
	}
	if b[2] != 0 || b[3] != 0 {
		return m, fmt.Errorf("v1 datagram with non-zero reserved field")
	}
	m.Server = netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[4:8])), binary.BigEndian.Uint16(b[8:]))
	m.Port = binary.BigEndian.Uint16(b[10:])
	if m.Server.Port() == 0 {
		return m, fmt.Errorf("v1 datagram with server port 0")
	}
	return m, nil
}

// MarshalLegacy encodes a v1 datagram. The server must be IPv4.
func MarshalLegacy(m LegacyMsg) ([]byte, error) {
	a := m.Server.Addr().Unmap()
	if !a.Is4() {
		return nil, fmt.Errorf("v1 carries only IPv4 servers, got %v", m.Server.Addr())
	}
	b := make([]byte, LegacyLen)
	b[0] = LegacyVersion
	if m.Response {
		b[1] = LegacyResponse
	}
	v := a.As4()
	copy(b[4:], v[:])
	binary.BigEndian.PutUint16(b[8:], m.Server.Port())
	binary.BigEndian.PutUint16(b[10:], m.Port)
	return b, nil
}
