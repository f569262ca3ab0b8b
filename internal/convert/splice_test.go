package convert

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// tcpPair returns both ends of a loopback TCP connection.
func tcpPair(t *testing.T) (a, b *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ch := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		ch <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s := <-ch
	if s == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c.(*net.TCPConn), s.(*net.TCPConn)
}

// TestSpliceCopy: bytes arrive intact and counted, the copy ends at the
// source's EOF, the pipes go back to the pool empty, and closing the
// pool closes them.
func TestSpliceCopy(t *testing.T) {
	pool := newPipePool(4)
	src, in := tcpPair(t)  // the test writes src, the copy reads in
	out, dst := tcpPair(t) // the copy writes out, the test reads dst
	data := make([]byte, 8<<20+123)
	rand.Read(data)
	type res struct {
		n   int64
		err error
	}
	done := make(chan res, 1)
	go func() {
		n, err := spliceCopy(out, in, pool)
		done <- res{n, err}
	}()
	go func() {
		// In bursts with pauses, so the copy waits (without a pipe)
		// between them.
		for off := 0; off < len(data); off += 1 << 20 {
			src.Write(data[off:min(off+1<<20, len(data))])
			time.Sleep(5 * time.Millisecond)
		}
		src.CloseWrite()
	}()
	h := sha256.New()
	got := make(chan int64, 1)
	go func() {
		n, _ := io.Copy(h, dst)
		got <- n
	}()
	r := <-done
	if r.err != nil || r.n != int64(len(data)) {
		t.Fatalf("spliceCopy: %d bytes, %v; want %d, nil", r.n, r.err, len(data))
	}
	out.CloseWrite()
	if n := <-got; n != int64(len(data)) {
		t.Fatalf("received %d bytes", n)
	}
	want := sha256.Sum256(data)
	if !bytes.Equal(h.Sum(nil), want[:]) {
		t.Fatal("the bytes changed on the way")
	}
	pool.mu.Lock()
	free := len(pool.free)
	pool.mu.Unlock()
	if free != 1 {
		t.Errorf("%d pipes in the pool after one sequential copy, want 1", free)
	}
	pool.close()
	if p, _ := pool.get(); p != nil {
		pool.put(p) // a closed pool closes what it is given
		pool.mu.Lock()
		n := len(pool.free)
		pool.mu.Unlock()
		if n != 0 {
			t.Errorf("a closed pool kept a pipe")
		}
	}
}

// TestSpliceCopyReset: a reset source ends the copy with ECONNRESET.
func TestSpliceCopyReset(t *testing.T) {
	pool := newPipePool(4)
	defer pool.close()
	src, in := tcpPair(t)
	out, _ := tcpPair(t)
	done := make(chan error, 1)
	go func() {
		_, err := spliceCopy(out, in, pool)
		done <- err
	}()
	src.Write([]byte("some bytes"))
	time.Sleep(20 * time.Millisecond)
	src.SetLinger(0)
	src.Close()
	select {
	case err := <-done:
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("copy from a reset source: %v, want ECONNRESET", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the copy did not end after the reset")
	}
}

// TestPipePoolBound: at most max empty pipes are kept; a pipe holding data
// is closed rather than reused.
func TestPipePoolBound(t *testing.T) {
	pool := newPipePool(2)
	defer pool.close()
	var ps []*pipe
	for range 3 {
		p, err := pool.get()
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	ps[0].data = 1 // as after an aborted transfer
	for _, p := range ps {
		pool.put(p)
	}
	pool.mu.Lock()
	defer pool.mu.Unlock()
	if len(pool.free) != 2 {
		t.Fatalf("%d pipes kept, want 2", len(pool.free))
	}
	for _, p := range pool.free {
		if p == ps[0] {
			t.Fatal("a pipe with data in it was kept")
		}
	}
}

// TestSpliceCopyWithoutDescriptors: when no pipe can be had because the
// process ran out of descriptors (EMFILE), the data still arrives intact,
// copied through user space, instead of the conversion being reset; once
// pipes can be had again the copy splices again.
func TestSpliceCopyWithoutDescriptors(t *testing.T) {
	pool := newPipePool(4)
	var refused atomic.Int32
	exhausted := atomic.Bool{}
	exhausted.Store(true)
	pool.pipe2 = func(fds []int, flags int) error {
		if exhausted.Load() {
			refused.Add(1)
			return syscall.EMFILE
		}
		return syscall.Pipe2(fds, flags)
	}
	src, in := tcpPair(t)
	out, dst := tcpPair(t)
	data := make([]byte, 4<<20+77)
	rand.Read(data)
	done := make(chan error, 1)
	var n int64
	go func() {
		var err error
		n, err = spliceCopy(out, in, pool)
		done <- err
	}()
	go func() {
		for off := 0; off < len(data); off += 1 << 20 {
			if off >= 2<<20 {
				exhausted.Store(false) // descriptors free again half way
			}
			src.Write(data[off:min(off+1<<20, len(data))])
			time.Sleep(5 * time.Millisecond)
		}
		src.CloseWrite()
	}()
	h := sha256.New()
	got := make(chan int64, 1)
	go func() {
		m, _ := io.Copy(h, dst)
		got <- m
	}()
	if err := <-done; err != nil || n != int64(len(data)) {
		t.Fatalf("spliceCopy without descriptors: %d bytes, %v; want %d, nil", n, err, len(data))
	}
	out.CloseWrite()
	if m := <-got; m != int64(len(data)) {
		t.Fatalf("received %d bytes", m)
	}
	want := sha256.Sum256(data)
	if !bytes.Equal(h.Sum(nil), want[:]) {
		t.Fatal("the bytes changed on the way")
	}
	if refused.Load() == 0 {
		t.Fatal("the pool was never refused a pipe: the test did not exercise the fallback")
	}
	pool.mu.Lock()
	free := len(pool.free)
	pool.mu.Unlock()
	if free != 1 {
		t.Errorf("%d pipes in the pool after descriptors came back, want 1 (splicing again)", free)
	}
	pool.close()
}
