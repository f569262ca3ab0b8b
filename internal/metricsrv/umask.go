package metricsrv

import (
	"net"
	"sync"
	"syscall"
)

// umaskMu serialises the process-wide umask change of listenPrivate.
var umaskMu sync.Mutex

// listenPrivate creates the unix socket at path under umask 0177, so that
// it is born mode 0600.
func listenPrivate(path string) (net.Listener, error) {
	umaskMu.Lock()
	old := syscall.Umask(0o177)
	l, err := net.Listen("unix", path)
	syscall.Umask(old)
	umaskMu.Unlock()
	return l, err
}
