package convert

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"
)

// TestErrorMapping: a dial outcome at the converter becomes an Error TLV
// that the client turns back into the same errno.
func TestErrorMapping(t *testing.T) {
	for _, c := range []struct {
		dialErr error
		code    ErrorCode
		errno   syscall.Errno
	}{
		{&net.OpError{Op: "dial", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}, CodeConnectionReset, syscall.ECONNREFUSED},
		{&net.OpError{Op: "dial", Err: os.NewSyscallError("connect", syscall.EHOSTUNREACH)}, CodeDestinationUnreachable, syscall.EHOSTUNREACH},
		{&net.OpError{Op: "dial", Err: os.NewSyscallError("connect", syscall.ENETUNREACH)}, CodeDestinationUnreachable, syscall.ENETUNREACH},
		{&net.OpError{Op: "dial", Err: os.NewSyscallError("connect", syscall.ETIMEDOUT)}, CodeDestinationUnreachable, syscall.ETIMEDOUT},
		{context.DeadlineExceeded, CodeDestinationUnreachable, syscall.ETIMEDOUT},
		{&net.OpError{Op: "dial", Err: os.NewSyscallError("connect", syscall.EADDRNOTAVAIL)}, CodeNetworkFailure, syscall.ENETDOWN},
	} {
		code, value := dialErrorCode(c.dialErr)
		if code != c.code {
			t.Errorf("%v: code %v, want %v", c.dialErr, code, c.code)
			continue
		}
		// Through the wire and back.
		b := mustMarshal(t, &Message{Error: &ErrorTLV{Code: code, Value: []byte{value}}})
		m, err := Parse(b)
		if err != nil {
			t.Fatal(err)
		}
		re := &RemoteError{Code: m.Error.Code, Value: m.Error.Value}
		if !errors.Is(re, c.errno) {
			t.Errorf("%v: client error %v does not wrap %v", c.dialErr, re, c.errno)
		}
		if re.Timeout() != (c.errno == syscall.ETIMEDOUT) {
			t.Errorf("%v: Timeout() = %v", c.dialErr, re.Timeout())
		}
	}
	for code, want := range map[ErrorCode]syscall.Errno{
		CodeNotAuthorized: syscall.EACCES, CodeResourceExceeded: syscall.EAGAIN,
		CodeMalformedMessage: syscall.EPROTO, CodeUnsupportedVersion: syscall.EPROTO, 200: syscall.EPROTO,
	} {
		if err := (&RemoteError{Code: code, Value: []byte{0}}); !errors.Is(err, want) {
			t.Errorf("%v does not wrap %v", err, want)
		}
	}
}

// TestLoopback runs Dial and Server over loopback in the test's own
// namespace (no root needed): bytes both ways, and a refusal.
func TestLoopback(t *testing.T) {
	ln, tfoErr, err := Listen(t.Context(), "tcp", "127.0.0.1:0", 0)
	if err != nil {
		t.Fatal(err)
	}
	if tfoErr != nil {
		t.Logf("no TFO: %v", tfoErr)
	}
	echo := startEcho(t)
	srv := &Server{
		Authorize: func(ticket []byte, _ netip.AddrPort) (string, any, error) {
			if bytes.Equal(ticket, goodTicket) {
				return "alice", nil, nil
			}
			return "", nil, errors.New("no")
		},
		Allowed: func(netip.AddrPort) error { return nil },
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()
	conv := ln.Addr().(*net.TCPAddr).AddrPort()
	dst := echo.Addr().(*net.TCPAddr).AddrPort()
	c, err := Dial(t.Context(), conv, dst, goodTicket, DialOptions{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, ok := c.(*net.TCPConn); !ok {
		t.Fatalf("Dial returned %T", c)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	c.Write([]byte("hello"))
	buf := make([]byte, 5)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "hello" {
		t.Fatalf("echo %q, %v", buf, err)
	}
	if _, err := Dial(t.Context(), conv, dst, bytes.Repeat([]byte{1}, 16), DialOptions{Timeout: 5 * time.Second}); !errors.Is(err, syscall.EACCES) {
		t.Fatalf("bad ticket: %v, want EACCES", err)
	}
}

// End ends the running conversions whose tag it matches, and only those.
func TestEndConversions(t *testing.T) {
	ln, _, err := Listen(t.Context(), "tcp", "127.0.0.1:0", 0)
	if err != nil {
		t.Fatal(err)
	}
	echo := startEcho(t)
	tickets := map[byte]string{1: "alice", 2: "bob"}
	srv := &Server{
		Authorize: func(ticket []byte, _ netip.AddrPort) (string, any, error) {
			return tickets[ticket[0]], tickets[ticket[0]], nil
		},
		Allowed: func(netip.AddrPort) error { return nil },
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln) }()
	defer func() {
		cancel()
		<-served
	}()
	conv := ln.Addr().(*net.TCPAddr).AddrPort()
	dst := echo.Addr().(*net.TCPAddr).AddrPort()
	open := func(who byte) net.Conn {
		c, err := Dial(t.Context(), conv, dst, bytes.Repeat([]byte{who}, 16), DialOptions{Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	roundTrip := func(c net.Conn) error {
		c.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := c.Write([]byte("hello")); err != nil {
			return err
		}
		buf := make([]byte, 5)
		_, err := io.ReadFull(c, buf)
		return err
	}
	alice, bob := open(1), open(2)
	for _, c := range []net.Conn{alice, bob} {
		if err := roundTrip(c); err != nil {
			t.Fatal(err)
		}
	}
	if n := srv.End(func(tag any) bool { return tag == "alice" }); n != 1 {
		t.Fatalf("End ended %d conversions, want 1", n)
	}
	if err := roundTrip(alice); err == nil {
		t.Fatal("alice's conversion still carries data after End")
	}
	if err := roundTrip(bob); err != nil {
		t.Fatalf("bob's conversion was ended too: %v", err)
	}
}

// startEcho runs a TCP echo server on loopback until the test ends.
func startEcho(t *testing.T) net.Listener {
	t.Helper()
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { echo.Close() })
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	return echo
}
