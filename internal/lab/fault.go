package lab

import (
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// faultTable is the nftables table a black hole lives in (inet, in the
// node the link leaves from).
const faultTable = "mpdetour_lab_fault"

// BlackHole drops every packet that enters or leaves link's interface on
// the link's first node (A end), in both directions: a path failure that
// sends nothing back (no ICMP, no RST), as a dead router would. restore
// removes it. Used by failover scenarios.
func (l *Lab) BlackHole(link string) (restore func() error, err error) {
	k := l.topo.Link(link)
	if k == nil {
		return nil, fmt.Errorf("lab %s has no link %q", l.name, link)
	}
	node := k.A.Node
	tab := &nftables.Table{Name: faultTable, Family: nftables.TableFamilyINet}
	ifname := func(key expr.MetaKey) []expr.Any {
		name := make([]byte, unix.IFNAMSIZ)
		copy(name, link)
		return []expr.Any{
			&expr.Meta{Key: key, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: name},
			&expr.Verdict{Kind: expr.VerdictDrop},
		}
	}
	err = l.Do(node, func() error {
		c, err := nftables.New()
		if err != nil {
			return err
		}
		c.AddTable(tab)
		for _, h := range []struct {
			name string
			hook *nftables.ChainHook
			key  expr.MetaKey
		}{
			{"in", nftables.ChainHookPrerouting, expr.MetaKeyIIFNAME},
			{"out", nftables.ChainHookPostrouting, expr.MetaKeyOIFNAME},
		} {
			ch := c.AddChain(&nftables.Chain{Name: h.name, Table: tab, Type: nftables.ChainTypeFilter,
				Hooknum: h.hook, Priority: nftables.ChainPriorityRef(-300)})
			c.AddRule(&nftables.Rule{Table: tab, Chain: ch, Exprs: ifname(h.key)})
		}
		return c.Flush()
	})
	if err != nil {
		return nil, fmt.Errorf("black-holing link %s on %s: %w", link, node, err)
	}
	return func() error {
		return l.Do(node, func() error {
			c, err := nftables.New()
			if err != nil {
				return err
			}
			c.DelTable(tab)
			return c.Flush()
		})
	}, nil
}
