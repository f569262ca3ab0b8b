package main

import (
	"bytes"
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/cli"
)

func TestBenchUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"bench", "send"},
		{"bench", "send", "a:1", "b:2"},
		{"bench", "send", "127.0.0.1:1", "--duration", "1s", "--warmup", "2s"},
		{"bench", "recv", "--port", "70000"},
		{"bench", "recv", "extra"},
		{"bench", "send", "127.0.0.1:1", "--no-such-flag"},
	} {
		var out, errb bytes.Buffer
		if code := cli.Main(context.Background(), "mpdetour", commands(), args, &out, &errb); code != cli.ExitUsage {
			t.Errorf("%v: exit %d, want %d (%s)", args, code, cli.ExitUsage, errb.String())
		}
	}
}

// TestBenchRecvSend runs the two subcommands against each other on
// loopback, and checks that recv stops cleanly when its context ends
// (Ctrl-C in the real binary).
func TestBenchRecvSend(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		var out, errb bytes.Buffer
		done <- cli.Main(ctx, "mpdetour", commands(), []string{"bench", "recv", "--port", strconv.Itoa(port), "--bind", "127.0.0.1"}, &out, &errb)
	}()
	addr := "127.0.0.1:" + strconv.Itoa(port)
	var code int
	for i := 0; i < 50; i++ {
		var out, errb bytes.Buffer
		code = cli.Main(context.Background(), "mpdetour", commands(), []string{"bench", "send", addr, "--duration", "700ms", "--warmup", "200ms", "--json"}, &out, &errb)
		if code == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond) // recv not listening yet
	}
	if code != 0 {
		t.Errorf("bench send exit %d", code)
	}
	cancel()
	select {
	case c := <-done:
		if c != 0 {
			t.Errorf("bench recv exit %d after cancel", c)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("bench recv did not stop")
	}
}
