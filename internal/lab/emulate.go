package lab

import (
	"encoding/binary"
	"fmt"
	"github.com/mpdetour/mpdetour/internal/lab/topology"
	"log/slog"
	"unsafe"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/mpdetour/mpdetour/internal/netnsx"
)

// frameBytes is the size of a full-size Ethernet frame as qdiscs count it
// (no FCS); queue limits in packets are converted with it.
const frameBytes = 1514

// detectNetem reports whether the kernel can create netem qdiscs, by
// trying on the loopback of a lab namespace.
func (b *builder) detectNetem(ns string) bool {
	h := b.handles[ns]
	lo, err := h.LinkByName("lo")
	if err != nil {
		return false
	}
	q := netlink.NewNetem(netlink.QdiscAttrs{LinkIndex: lo.Attrs().Index, Handle: netlink.MakeHandle(0x7a, 0), Parent: netlink.HANDLE_ROOT},
		netlink.NetemQdiscAttrs{Latency: 1000})
	if err := h.QdiscAdd(q); err != nil {
		slog.Debug("netem unavailable; delay line and nftables emulate delay and loss", "err", err)
		return false
	}
	h.QdiscDel(q)
	return true
}

// tbfBurst is the token bucket depth: at least two full frames (tbf can
// never send a frame larger than its bucket) and about 1 ms at the rate.
func tbfBurst(r topology.Rate) uint32 {
	return uint32(max(2*frameBytes, uint64(r)/8/1000))
}

// shapeEgress installs the qdiscs of one direction on its sender's
// interface: tbf for the rate, with netem below it where the kernel has
// netem and the direction is delayed or lossy.
func (b *builder) shapeEgress(h *netlink.Handle, dev netlink.Link, s topology.Shape, emu LinkEmu) error {
	idx := dev.Attrs().Index
	useNetem := b.netem && (s.Delay > 0 || s.Loss > 0)
	parent := uint32(netlink.HANDLE_ROOT)
	if s.Rate > 0 {
		bps := uint64(s.Rate) / 8
		q := &netlink.Tbf{
			QdiscAttrs: netlink.QdiscAttrs{LinkIndex: idx, Handle: netlink.MakeHandle(1, 0), Parent: netlink.HANDLE_ROOT},
			Rate:       bps,
			Limit:      uint32(s.QueueLimit() * frameBytes),
			Buffer:     netlink.Xmittime(bps, tbfBurst(s.Rate)),
		}
		if err := h.QdiscAdd(q); err != nil {
			return fmt.Errorf("tbf %v: %w", s.Rate, err)
		}
		parent = netlink.MakeHandle(1, 1)
	}
	if useNetem {
		// netem's limit counts the packets it delays as well as the queue.
		inFlight := 0
		if s.Rate > 0 {
			inFlight = int(float64(s.Rate) / 8 / frameBytes * s.Delay.Seconds())
		} else {
			inFlight = int(s.Delay.Seconds() * 100_000)
		}
		q := netlink.NewNetem(netlink.QdiscAttrs{LinkIndex: idx, Handle: netlink.MakeHandle(10, 0), Parent: parent},
			netlink.NetemQdiscAttrs{
				Latency: uint32(s.Delay.Microseconds()),
				Loss:    float32(s.Loss * 100),
				Limit:   uint32(s.QueueLimit() + inFlight + 100),
			})
		if err := h.QdiscAdd(q); err != nil {
			return fmt.Errorf("netem: %w", err)
		}
	}
	return nil
}

// offloadsOff turns off segmentation and receive offloads (and, for links
// through the delay line, transmit checksum offload) on ifname inside the
// namespace at nsPath, through the SIOCETHTOOL ioctl.
func offloadsOff(nsPath, ifname string, csum bool) error {
	cmds := []uint32{unix.ETHTOOL_STSO, unix.ETHTOOL_SGSO, unix.ETHTOOL_SGRO}
	if csum {
		cmds = append(cmds, unix.ETHTOOL_STXCSUM)
	}
	return netnsx.Do(nsPath, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		for _, c := range cmds {
			if err := ethtoolSet(fd, ifname, c, 0); err != nil {
				return fmt.Errorf("%s: ethtool 0x%x: %w", ifname, c, err)
			}
		}
		return nil
	})
}

// ethtoolValue is struct ethtool_value.
type ethtoolValue struct {
	cmd  uint32
	data uint32
}

// ifreqData is struct ifreq with the ifr_data member.
type ifreqData struct {
	name [unix.IFNAMSIZ]byte
	data uintptr
	_    [16]byte
}

func ethtoolSet(fd int, ifname string, cmd, value uint32) error {
	v := ethtoolValue{cmd: cmd, data: value}
	var ifr ifreqData
	copy(ifr.name[:], ifname)
	ifr.data = uintptr(unsafe.Pointer(&v))
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr)))
	if errno != 0 {
		return errno
	}
	return nil
}

// NftTable is the nftables table the lab owns in each node namespace.
const NftTable = "mpdetour_lab"

// lossModulus is the resolution of random drops: parts per million.
const lossModulus = 1_000_000

// nftLoss drops packets arriving on ifname with probability p, with a
// netdev ingress chain in the receiving namespace:
// numgen random mod 1000000 < p*1000000 drop.
func nftLoss(ns netns.NsHandle, ifname string, p topology.Loss) error {
	if p <= 0 {
		return nil
	}
	c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		return err
	}
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyNetdev, Name: NftTable})
	prio := nftables.ChainPriorityFilter
	ch := c.AddChain(&nftables.Chain{
		Name: "loss_" + ifname, Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookIngress, Priority: prio, Device: ifname,
	})
	k := uint32(float64(p)*lossModulus + 0.5)
	thr := make([]byte, 4)
	binary.BigEndian.PutUint32(thr, k)
	// numgen writes a host-order integer; cmp compares bytes, so convert
	// to network order first (nft does the same for "< N").
	c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{
		&expr.Numgen{Register: 1, Modulus: lossModulus, Type: unix.NFT_NG_RANDOM},
		&expr.Byteorder{SourceRegister: 1, DestRegister: 1, Op: expr.ByteorderHton, Len: 4, Size: 4},
		&expr.Cmp{Op: expr.CmpOpLt, Register: 1, Data: thr},
		&expr.Counter{},
		&expr.Verdict{Kind: expr.VerdictDrop},
	}})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	return nil
}
