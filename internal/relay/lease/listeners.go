package lease

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// listeners tracks the TCP ports the relay's namespace listens on, so that
// a mapping never hides a local service. It caches /proc/net/tcp{,6} for a
// second: grants arrive in bursts.
type listeners struct {
	at    time.Time
	ports map[uint16]bool
	read  func() (map[uint16]bool, error)
}

func (l *listeners) has(port uint16, now time.Time) bool {
	if now.Sub(l.at) > time.Second || l.ports == nil {
		read := l.read
		if read == nil {
			read = listeningPorts
		}
		ports, err := read()
		if err == nil {
			l.ports, l.at = ports, now
		}
	}
	return l.ports[port]
}

// listeningPorts parses the kernel's TCP socket tables for LISTEN sockets.
func listeningPorts() (map[uint16]bool, error) {
	ports := map[uint16]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		fh, err := os.Open(f)
		if err != nil {
			if os.IsNotExist(err) {
				continue
			}
			return nil, err
		}
		err = parseProcNetTCP(bufio.NewScanner(fh), ports)
		fh.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
	}
	return ports, nil
}

// parseProcNetTCP adds the local ports of sockets in state 0A (LISTEN).
func parseProcNetTCP(sc *bufio.Scanner, ports map[uint16]bool) error {
	first := true
	for sc.Scan() {
		if first {
			first = false
			continue
		}
		fields := strings.Fields(sc.Text())
		if len(fields) < 4 || fields[3] != "0A" {
			continue
		}
		_, port, ok := strings.Cut(fields[1], ":")
		if !ok {
			return fmt.Errorf("bad local address %q", fields[1])
		}
		p, err := strconv.ParseUint(port, 16, 16)
		if err != nil {
			return fmt.Errorf("bad port in %q", fields[1])
		}
		ports[uint16(p)] = true
	}
	return sc.Err()
}
