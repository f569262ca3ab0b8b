package mptcpize

import (
	"fmt"

	"github.com/mdlayher/genetlink"
	"github.com/mdlayher/netlink"
)

// PMLimits are the in-kernel path manager's per-namespace limits
// (`ip mptcp limits`).
type PMLimits struct {
	Subflows        uint32 // extra subflows per connection, incl. accepted joins
	AddAddrAccepted uint32 // ADD_ADDR announcements a client acts on
}

const (
	pmCmdGetLimits    = 6 // MPTCP_PM_CMD_GET_LIMITS
	pmAttrRcvAddAddrs = 2 // MPTCP_PM_ATTR_RCV_ADD_ADDRS
	pmAttrSubflows    = 3 // MPTCP_PM_ATTR_SUBFLOWS
	pmFamilyName      = "mptcp_pm"
)

// ReadPMLimits asks the mptcp_pm generic-netlink family of the current
// network namespace for its limits.
func ReadPMLimits() (PMLimits, error) {
	c, err := genetlink.Dial(nil)
	if err != nil {
		return PMLimits{}, fmt.Errorf("genetlink: %w", err)
	}
	defer c.Close()
	fam, err := c.GetFamily(pmFamilyName)
	if err != nil {
		return PMLimits{}, fmt.Errorf("genetlink family %s: %w", pmFamilyName, err)
	}
	msgs, err := c.Execute(genetlink.Message{Header: genetlink.Header{Command: pmCmdGetLimits, Version: fam.Version}},
		fam.ID, netlink.Request)
	if err != nil {
		return PMLimits{}, fmt.Errorf("mptcp_pm GET_LIMITS: %w", err)
	}
	if len(msgs) != 1 {
		return PMLimits{}, fmt.Errorf("mptcp_pm GET_LIMITS: %d replies", len(msgs))
	}
	return parseLimits(msgs[0].Data)
}

// parseLimits decodes the attributes of a GET_LIMITS reply.
func parseLimits(b []byte) (PMLimits, error) {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return PMLimits{}, fmt.Errorf("mptcp_pm limits: %w", err)
	}
	var l PMLimits
	var haveSub, haveAdd bool
	for ad.Next() {
		switch ad.Type() {
		case pmAttrSubflows:
			if len(ad.Bytes()) != 4 {
				return PMLimits{}, fmt.Errorf("mptcp_pm limits: subflows attribute of %d bytes", len(ad.Bytes()))
			}
			l.Subflows, haveSub = ad.Uint32(), true
		case pmAttrRcvAddAddrs:
			if len(ad.Bytes()) != 4 {
				return PMLimits{}, fmt.Errorf("mptcp_pm limits: add_addr_accepted attribute of %d bytes", len(ad.Bytes()))
			}
			l.AddAddrAccepted, haveAdd = ad.Uint32(), true
		}
	}
	if err := ad.Err(); err != nil {
		return PMLimits{}, fmt.Errorf("mptcp_pm limits: %w", err)
	}
	if !haveSub || !haveAdd {
		return PMLimits{}, fmt.Errorf("mptcp_pm limits: reply lacks subflows or add_addr_accepted")
	}
	return l, nil
}
