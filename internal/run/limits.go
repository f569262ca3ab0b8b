package run

import (
	"github.com/mpdetour/mpdetour/internal/mptcppm"
)

// PMLimits are the in-kernel path manager's per-namespace limits
// (`ip mptcp limits`).
type PMLimits struct {
	Subflows        uint32 // extra subflows per connection, incl. accepted joins
	AddAddrAccepted uint32 // ADD_ADDR announcements a client acts on
}

// ReadPMLimits asks the mptcp_pm generic-netlink family of the current
// network namespace for its limits.
func ReadPMLimits() (PMLimits, error) {
	c, err := mptcppm.Dial(mptcppm.Options{})
	if err != nil {
		return PMLimits{}, err
	}
	defer c.Close()
	l, err := c.GetLimits()
	if err != nil {
		return PMLimits{}, err
	}
	return PMLimits{Subflows: l.Subflows, AddAddrAccepted: l.AddAddrAccepted}, nil
}
