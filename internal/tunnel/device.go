package tunnel

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/tun"
	"golang.zx2c4.com/wireguard/wgctrl"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Backend selects the WireGuard implementation.
type Backend string

const (
	// Auto uses the kernel module when the kernel has it, else Embedded.
	Auto Backend = ""
	// Kernel is the in-kernel WireGuard link (netlink link type
	// "wireguard"), configured through wgctrl.
	Kernel Backend = "kernel"
	// Embedded is wireguard-go running inside this process on a TUN device
	// with segmentation/aggregation offloads (IFF_VNET_HDR) and UDP GSO/GRO.
	Embedded Backend = "embedded"
)

// DefaultMTU leaves room for WireGuard's 80 bytes of IPv6 + UDP +
// WireGuard overhead on a 1500-byte path.
const DefaultMTU = 1420

// wgDevice is one WireGuard interface, whichever implementation backs it.
// Configuration uses wgctrl's types for both backends so that the Server and
// Client code is the same; the embedded backend translates to UAPI text.
type wgDevice interface {
	Name() string
	Backend() Backend
	Configure(wgtypes.Config) error
	Status() (*wgtypes.Device, error)
	Close() error
}

// newDevice creates link name in ns with the requested backend. With Auto it
// tries the kernel module first: creating a link of an unknown type fails
// with EOPNOTSUPP, which is the detection (no module-list parsing, works
// inside containers whose /sys/module is not the host's).
func newDevice(ns *nsRef, nl *netlink.Handle, name string, mtu int, b Backend, log *slog.Logger) (wgDevice, error) {
	// Typed nil pointers must not escape as non-nil interfaces.
	switch b {
	case Kernel:
		d, err := newKernelDevice(ns, nl, name, mtu)
		if err != nil {
			return nil, err
		}
		return d, nil
	case Embedded:
		d, err := newEmbeddedDevice(ns, name, mtu, log)
		if err != nil {
			return nil, err
		}
		return d, nil
	case Auto:
		d, err := newKernelDevice(ns, nl, name, mtu)
		if err == nil {
			return d, nil
		}
		if !errors.Is(err, errNoKernelWireGuard) {
			return nil, err
		}
		log.Debug("kernel WireGuard unavailable, using embedded wireguard-go", "iface", name)
		e, err := newEmbeddedDevice(ns, name, mtu, log)
		if err != nil {
			return nil, err
		}
		return e, nil
	}
	return nil, fmt.Errorf("unknown tunnel backend %q (want %q or %q)", b, Kernel, Embedded)
}

var errNoKernelWireGuard = errors.New("kernel has no WireGuard (link type wireguard unknown)")

// ---- kernel backend ----

type kernelDevice struct {
	ns   *nsRef
	nl   *netlink.Handle
	name string
}

func newKernelDevice(ns *nsRef, nl *netlink.Handle, name string, mtu int) (*kernelDevice, error) {
	la := netlink.NewLinkAttrs()
	la.Name = name
	la.MTU = mtu
	if err := nl.LinkAdd(&netlink.Wireguard{LinkAttrs: la}); err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) || strings.Contains(err.Error(), "not supported") {
			return nil, errNoKernelWireGuard
		}
		return nil, fmt.Errorf("create wireguard link %s: %w", name, err)
	}
	return &kernelDevice{ns: ns, nl: nl, name: name}, nil
}

func (d *kernelDevice) Name() string     { return d.name }
func (d *kernelDevice) Backend() Backend { return Kernel }

// withClient opens wgctrl inside the namespace: its generic netlink socket
// takes the namespace of the thread that creates it.
func (d *kernelDevice) withClient(fn func(*wgctrl.Client) error) error {
	return d.ns.do(func() error {
		c, err := wgctrl.New()
		if err != nil {
			return fmt.Errorf("wgctrl: %w", err)
		}
		defer c.Close()
		return fn(c)
	})
}

func (d *kernelDevice) Configure(cfg wgtypes.Config) error {
	return d.withClient(func(c *wgctrl.Client) error { return c.ConfigureDevice(d.name, cfg) })
}

func (d *kernelDevice) Status() (dev *wgtypes.Device, err error) {
	err = d.withClient(func(c *wgctrl.Client) error {
		dev, err = c.Device(d.name)
		return err
	})
	return dev, err
}

func (d *kernelDevice) Close() error {
	l, err := d.nl.LinkByName(d.name)
	if err != nil {
		return nil // already gone
	}
	return d.nl.LinkDel(l)
}

// ---- embedded backend ----

type embeddedDevice struct {
	name string
	dev  *device.Device
}

// nsBind opens wireguard-go's UDP sockets inside the namespace whichever
// goroutine asks: wireguard-go reopens its bind from its own event goroutine
// whenever the TUN link goes down and up again.
type nsBind struct {
	conn.Bind
	ns *nsRef
}

func (b *nsBind) Open(port uint16) (fns []conn.ReceiveFunc, actual uint16, err error) {
	err = b.ns.do(func() error {
		var e error
		fns, actual, e = b.Bind.Open(port)
		return e
	})
	return fns, actual, err
}

func newEmbeddedDevice(ns *nsRef, name string, mtu int, log *slog.Logger) (*embeddedDevice, error) {
	wl := log.With("iface", name)
	logger := &device.Logger{
		Verbosef: func(f string, a ...any) { wl.Debug("wireguard: " + fmt.Sprintf(f, a...)) },
		Errorf: func(f string, a ...any) {
			msg := fmt.Sprintf(f, a...)
			// wireguard-go re-reads the MTU by interface name from its event
			// goroutine, which is outside the namespace when one process
			// drives several (tests); the MTU set at creation stays valid.
			if ns.spec != "" && strings.Contains(msg, "MTU") && strings.Contains(msg, "no such device") {
				wl.Debug("wireguard: " + msg)
				return
			}
			wl.Warn("wireguard: " + msg)
		},
	}
	var dev *device.Device
	// The TUN device, wireguard-go's netlink watcher and its first MTU
	// reading take the namespace of the creating thread.
	err := ns.do(func() error {
		td, err := tun.CreateTUN(name, mtu)
		if err != nil {
			return err
		}
		// No UAPI socket: configuration goes through IpcSet, and
		// wireguard-go's socket directory /var/run/wireguard is shared by
		// all namespaces.
		dev = device.NewDevice(td, &nsBind{Bind: conn.NewDefaultBind(), ns: ns}, logger)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("create TUN %s in %s: %w", name, ns, err)
	}
	return &embeddedDevice{name: name, dev: dev}, nil
}

func (d *embeddedDevice) Name() string     { return d.name }
func (d *embeddedDevice) Backend() Backend { return Embedded }

func (d *embeddedDevice) Configure(cfg wgtypes.Config) error {
	if err := d.dev.IpcSet(uapiSet(cfg)); err != nil {
		return fmt.Errorf("configure %s: %w", d.name, err)
	}
	return d.dev.Up()
}

func (d *embeddedDevice) Status() (*wgtypes.Device, error) {
	s, err := d.dev.IpcGet()
	if err != nil {
		return nil, err
	}
	dev, err := parseUAPIGet(s)
	if err != nil {
		return nil, err
	}
	dev.Name = d.name
	dev.Type = wgtypes.Userspace
	return dev, nil
}

// Close stops wireguard-go and closes the TUN, which removes the interface
// together with its addresses and routes.
func (d *embeddedDevice) Close() error {
	d.dev.Close()
	return nil
}
