// Package netnsx resolves the network-namespace specs that mpdetour's
// commands and configs take, and runs code inside a namespace. Every
// component accepts the same spec: "" for the caller's own namespace, a name
// under /run/netns (as `ip netns add` creates), or a path to a namespace file.
package netnsx

import (
	"fmt"
	"runtime"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// Open returns a handle on the namespace named by spec; the caller closes it.
func Open(spec string) (netns.NsHandle, error) {
	var (
		h   netns.NsHandle
		err error
	)
	switch {
	case spec == "":
		h, err = netns.Get()
	case strings.ContainsRune(spec, '/'): // names cannot contain '/'
		h, err = netns.GetFromPath(spec)
	default:
		h, err = netns.GetFromName(spec)
	}
	if err != nil {
		return netns.None(), fmt.Errorf("network namespace %q: %w", spec, err)
	}
	return h, nil
}

// NetlinkHandle returns a netlink handle whose sockets live in the namespace
// spec names. For "" the sockets open in the caller's namespace without
// entering it: netlink.NewHandleAt enters the namespace with setns even when
// it is the caller's own, and setns needs CAP_SYS_ADMIN, which the shipped
// systemd units do not grant (deploy/*.service).
func NetlinkHandle(spec string) (*netlink.Handle, error) {
	if spec == "" {
		return netlink.NewHandle()
	}
	ns, err := Open(spec)
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	return netlink.NewHandleAt(ns)
}

// Do runs fn on a dedicated OS thread inside the namespace named by spec
// ("" runs fn directly), for what takes its namespace from the calling
// thread: socket creation, TUN devices, /proc/sys/net. The thread is never
// unlocked, so the Go runtime retires it instead of reusing a thread left in
// another namespace.
func Do(spec string, fn func() error) error {
	if spec == "" {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		h, err := Open(spec)
		if err != nil {
			errc <- err
			return
		}
		defer h.Close()
		if err := netns.Set(h); err != nil {
			errc <- fmt.Errorf("enter network namespace %q: %w", spec, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}
