package agent

import (
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// Test connections of `mpdetour doctor` are not the agent's (otherwise
// the agent adopts them, adds detours and counts their failed commands
// when doctor closes them). Before its connect(), doctor binds
// the socket and creates ProbeDir/<local port>; the agent leaves alone
// every connection whose local port has such a file, and doctor removes
// it when the probe is done. The directory is root's (mode 0755): another
// user cannot hide connections from the agent. One stat per new
// connection; nothing when the directory does not exist.

// ProbeDir holds the markers of doctor's test connections.
const ProbeDir = DefaultStateDir + "/probes"

// IsProbe says whether the connection from local is a marked test
// connection (cfg.Probes; "" disables the check).
func IsProbe(dir string, local netip.AddrPort) bool {
	if dir == "" {
		return false
	}
	fi, err := os.Stat(filepath.Join(dir, strconv.Itoa(int(local.Port()))))
	if err != nil {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && st.Uid == 0
}

// MarkProbe is a net.Dialer Control function for a test connection: it
// binds the socket to a free port of its address family and marks that
// port in dir; the returned unmark removes the marker (call it after the
// connection is closed).
func MarkProbe(dir string) (control func(network, address string, c syscall.RawConn) error, unmark func()) {
	var marker string
	control = func(network, address string, c syscall.RawConn) error {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil // not root: the probe goes unmarked
		}
		var serr error
		err := c.Control(func(fd uintptr) {
			var sa syscall.Sockaddr = &syscall.SockaddrInet4{}
			if network == "tcp6" {
				sa = &syscall.SockaddrInet6{}
			}
			if serr = syscall.Bind(int(fd), sa); serr != nil {
				return
			}
			var got syscall.Sockaddr
			if got, serr = syscall.Getsockname(int(fd)); serr != nil {
				return
			}
			port := 0
			switch a := got.(type) {
			case *syscall.SockaddrInet4:
				port = a.Port
			case *syscall.SockaddrInet6:
				port = a.Port
			}
			if os.WriteFile(filepath.Join(dir, strconv.Itoa(port)), nil, 0o644) == nil {
				marker = filepath.Join(dir, strconv.Itoa(port))
			}
		})
		if err != nil {
			return err
		}
		return serr
	}
	return control, func() {
		if marker != "" {
			_ = os.Remove(marker)
		}
	}
}
