package tunnel

import (
	"fmt"
	"runtime"

	"github.com/google/nftables"
	"github.com/mpdetour/mpdetour/internal/netnsx"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// nsRef is the network namespace a Server or Client configures. Products run
// one per process in the process's own namespace (spec ""); tests drive
// several namespaces from one process, so every kernel object is created
// through a handle bound to the namespace rather than the calling thread's.
type nsRef struct {
	spec   string // "" = the process's namespace
	handle netns.NsHandle
}

// openNetns resolves spec: "" (current namespace), a name under
// /var/run/netns, or an absolute path to a namespace file.
func openNetns(spec string) (*nsRef, error) {
	h, err := netnsx.Open(spec)
	if err != nil {
		return nil, err
	}
	return &nsRef{spec: spec, handle: h}, nil
}

func (n *nsRef) close() {
	if n != nil && n.handle.IsOpen() {
		n.handle.Close()
	}
}

func (n *nsRef) String() string {
	if n.spec == "" {
		return "current namespace"
	}
	return "netns " + n.spec
}

// netlink returns a netlink handle whose socket lives in the namespace.
func (n *nsRef) netlink() (*netlink.Handle, error) {
	var h *netlink.Handle
	var err error
	if n.spec == "" {
		// No setns into our own namespace: it needs CAP_SYS_ADMIN (netnsx.NetlinkHandle).
		h, err = netlink.NewHandle()
	} else {
		h, err = netlink.NewHandleAt(n.handle)
	}
	if err != nil {
		return nil, fmt.Errorf("netlink handle in %s: %w", n, err)
	}
	return h, nil
}

// nft returns an nftables connection in the namespace.
func (n *nsRef) nft() (*nftables.Conn, error) {
	opts := []nftables.ConnOption{nftables.WithNetNSFd(int(n.handle))}
	if n.spec == "" {
		opts = nil // no setns into our own namespace (CAP_SYS_ADMIN)
	}
	c, err := nftables.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("nftables in %s: %w", n, err)
	}
	return c, nil
}

// do runs fn on a dedicated OS thread switched into the namespace, for the
// few things that take their namespace from the calling thread (TUN and UDP
// socket creation, wgctrl, /proc/sys/net). The thread is never unlocked, so
// the Go runtime discards it afterwards instead of reusing a thread whose
// namespace was changed.
func (n *nsRef) do(fn func() error) error {
	if n.spec == "" {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := netns.Set(n.handle); err != nil {
			errc <- fmt.Errorf("enter %s: %w", n, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}
