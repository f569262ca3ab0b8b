package relay

import (
	"errors"
	"net"
	"sync"
)

// bothListener accepts from the converter's IPv4 and IPv6 listeners as one
// listener, so that one convert.Server (one max_conns budget, one set of
// running conversions) serves both. The standard library has no listener
// that merges two sockets of different families (a dual-stack socket would
// need an unspecified address, and convert.listen names one).
type bothListener struct {
	lns    []net.Listener
	conns  chan net.Conn
	errs   chan error
	done   chan struct{}
	closer sync.Once
}

func newBothListener(lns ...net.Listener) *bothListener {
	b := &bothListener{lns: lns, conns: make(chan net.Conn), errs: make(chan error, len(lns)), done: make(chan struct{})}
	for _, ln := range lns {
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					var ne net.Error
					if errors.As(err, &ne) && ne.Timeout() {
						continue
					}
					select {
					case b.errs <- err:
					case <-b.done:
					}
					return
				}
				select {
				case b.conns <- c:
				case <-b.done:
					c.Close()
					return
				}
			}
		}()
	}
	return b
}

// Accept returns the next connection of either listener, or the first
// error one of them ended with.
func (b *bothListener) Accept() (net.Conn, error) {
	select {
	case c := <-b.conns:
		return c, nil
	case err := <-b.errs:
		return nil, err
	case <-b.done:
		return nil, net.ErrClosed
	}
}

// Close closes both listeners.
func (b *bothListener) Close() error {
	var errs []error
	b.closer.Do(func() {
		close(b.done)
		for _, ln := range b.lns {
			errs = append(errs, ln.Close())
		}
	})
	return errors.Join(errs...)
}

// Addr is the IPv4 listener's address (relay status shows the first).
func (b *bothListener) Addr() net.Addr { return b.lns[0].Addr() }
