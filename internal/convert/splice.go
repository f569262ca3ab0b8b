package convert

import (
	"errors"
	"net"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// The converter's copy loop: splice(2) from one socket into a pipe and from
// the pipe into the other socket, so payload never enters user space.
//
// It replaces (*net.TCPConn).ReadFrom, which splices as well but takes its
// pipe before it waits for data: every idle conversion then holds two pipes
// (four descriptors and the kernel's pipe buffer arrays) for as long as it
// lives, so 10,000 idle conversions cost 60,000 descriptors instead of
// 20,000. Here a direction holds a pipe only while data moves: while it
// waits, the pipe (empty) goes back to the Server's pool, and the next
// wait-for-data is a zero-timeout poll(2) on the socket (no byte is read)
// before the netpoller's edge-triggered wait.

// pipeSize is what F_SETPIPE_SZ asks for: Go's splice uses 1 MiB too (the
// default fs.pipe-max-size); the kernel rounds to pages. A bigger pipe lets
// one splice move a whole burst of GRO-merged segments.
const pipeSize = 1 << 20

type pipe struct {
	r, w int
	data int // bytes in the pipe
}

// pipePool keeps a bounded number of empty pipes for reuse; close releases
// them (Serve closes its pool when it returns, so no descriptor stays).
type pipePool struct {
	mu     sync.Mutex
	free   []*pipe
	max    int
	closed bool
	pipe2  func(fds []int, flags int) error // unix.Pipe2 (tests: descriptors exhausted)
}

func newPipePool(max int) *pipePool { return &pipePool{max: max, pipe2: unix.Pipe2} }

func (pp *pipePool) get() (*pipe, error) {
	pp.mu.Lock()
	if n := len(pp.free); n > 0 {
		p := pp.free[n-1]
		pp.free = pp.free[:n-1]
		pp.mu.Unlock()
		return p, nil
	}
	pp.mu.Unlock()
	var fds [2]int
	if err := pp.pipe2(fds[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return nil, os.NewSyscallError("pipe2", err)
	}
	// Best effort: the default (64 KiB) still works, with more syscalls.
	_, _ = unix.FcntlInt(uintptr(fds[1]), unix.F_SETPIPE_SZ, pipeSize)
	return &pipe{r: fds[0], w: fds[1]}, nil
}

// put returns p; a pipe still holding data (an aborted transfer) or one
// beyond the pool's bound is closed.
func (pp *pipePool) put(p *pipe) {
	pp.mu.Lock()
	if p.data == 0 && !pp.closed && len(pp.free) < pp.max {
		pp.free = append(pp.free, p)
		pp.mu.Unlock()
		return
	}
	pp.mu.Unlock()
	p.close()
}

func (pp *pipePool) close() {
	pp.mu.Lock()
	free := pp.free
	pp.free, pp.closed = nil, true
	pp.mu.Unlock()
	for _, p := range free {
		p.close()
	}
}

func (p *pipe) close() {
	unix.Close(p.r)
	unix.Close(p.w)
}

// readable reports whether a read on fd would not block: data, EOF or an
// error waiting (a level-triggered look, nothing is read).
func readable(fd int) bool {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN | unix.POLLRDHUP}}
	for {
		n, err := unix.Poll(fds, 0)
		if err == unix.EINTR {
			continue
		}
		// On a poll error, let splice itself report what is wrong.
		return err != nil || n > 0
	}
}

// spliceCopy moves everything src sends to dst until src's EOF (nil error)
// or an error, and returns the bytes written to dst. src and dst must not
// be used by anyone else meanwhile (closing them from another goroutine
// ends the copy with an error).
func spliceCopy(dst, src *net.TCPConn, pool *pipePool) (written int64, err error) {
	sr, err := src.SyscallConn()
	if err != nil {
		return 0, err
	}
	dr, err := dst.SyscallConn()
	if err != nil {
		return 0, err
	}
	var p *pipe
	defer func() {
		if p != nil {
			pool.put(p)
		}
	}()
	// buf: when no pipe can be had because descriptors ran out (many idle
	// conversions near the limit), a burst is copied through user space
	// instead of resetting a conversion that was fine (Go's ReadFrom
	// fell back the same way).
	var buf []byte
	for {
		var n int
		var serr error
		viaBuf := false
		rerr := sr.Read(func(fd uintptr) bool {
			for {
				if p == nil {
					if !readable(int(fd)) {
						return false // wait for data without a pipe
					}
					var gerr error
					if p, gerr = pool.get(); gerr != nil {
						p = nil
						if !errors.Is(gerr, unix.EMFILE) && !errors.Is(gerr, unix.ENFILE) {
							serr = gerr
							return true
						}
						if buf == nil {
							buf = make([]byte, 64<<10)
						}
						m, err := unix.Read(int(fd), buf)
						switch err {
						case unix.EINTR:
							continue
						case unix.EAGAIN:
							return false
						}
						n, serr, viaBuf = max(m, 0), err, true
						return true
					}
				}
				var m int64
				m, serr = unix.Splice(int(fd), nil, p.w, nil, pipeSize, unix.SPLICE_F_NONBLOCK|unix.SPLICE_F_MOVE)
				n = int(m)
				switch serr {
				case unix.EINTR:
					continue
				case unix.EAGAIN:
					// Nothing to read now: give the (empty) pipe back
					// while waiting.
					pool.put(p)
					p = nil
					return false
				}
				return true
			}
		})
		if rerr != nil {
			return written, opError("read", src, rerr)
		}
		if serr != nil {
			return written, opError("read", src, os.NewSyscallError("splice", serr))
		}
		if n == 0 {
			return written, nil // EOF
		}
		if viaBuf {
			off := 0
			werr := dr.Write(func(fd uintptr) bool {
				for off < n {
					m, err := unix.Write(int(fd), buf[off:n])
					switch {
					case m > 0:
						off += m
						written += int64(m)
					case err == unix.EINTR:
					case err == unix.EAGAIN:
						return false
					case err != nil:
						serr = err
						return true
					}
				}
				return true
			})
			if werr != nil {
				return written, opError("write", dst, werr)
			}
			if serr != nil {
				return written, opError("write", dst, os.NewSyscallError("write", serr))
			}
			continue
		}
		p.data += n
		werr := dr.Write(func(fd uintptr) bool {
			for p.data > 0 {
				m, err := unix.Splice(p.r, nil, int(fd), nil, p.data, unix.SPLICE_F_NONBLOCK|unix.SPLICE_F_MOVE)
				switch {
				case m > 0:
					p.data -= int(m)
					written += m
				case err == unix.EINTR:
				case err == unix.EAGAIN:
					return false // wait until dst can take more
				case err != nil:
					serr = err
					return true
				default: // 0 bytes without an error: cannot happen with data in the pipe
					serr = errors.New("splice wrote nothing")
					return true
				}
			}
			return true
		})
		if werr != nil {
			return written, opError("write", dst, werr)
		}
		if serr != nil {
			return written, opError("write", dst, os.NewSyscallError("splice", serr))
		}
	}
}

func opError(op string, c *net.TCPConn, err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) {
		return err
	}
	return &net.OpError{Op: op, Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}
