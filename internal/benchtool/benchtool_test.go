package benchtool

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/testenv"
	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
)

func TestHelloRoundTrip(t *testing.T) {
	h, err := parseHello(hello{Warmup: 1500 * time.Millisecond}.marshal())
	if err != nil || h.Warmup != 1500*time.Millisecond || h.Download {
		t.Fatalf("got %+v, %v", h, err)
	}
	h, err = parseHello(hello{Warmup: time.Second, Download: true, Duration: 12 * time.Second}.marshal())
	if err != nil || !h.Download || h.Duration != 12*time.Second {
		t.Fatalf("download hello: %+v, %v", h, err)
	}
	if _, err := parseHello(hello{Warmup: time.Second, Download: true, Duration: time.Second}.marshal()); err == nil {
		t.Fatal("download no longer than its warm-up accepted")
	}
	for _, bad := range [][]byte{nil, []byte("GET / HTTP/1.1\r\n"), append([]byte(helloMagic), 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0)} {
		if _, err := parseHello(bad); err == nil {
			t.Errorf("accepted hello %q", bad)
		}
	}
}

func TestCounterReferenceMethod(t *testing.T) {
	c := counter{warmup: time.Second}
	c.add(100*time.Millisecond, 1000) // slow start: excluded
	c.add(999*time.Millisecond, 1000)
	c.add(time.Second, 500) // at the warm-up: included
	c.add(2500*time.Millisecond, 1500)
	c.add(3*time.Second, 0)
	s := c.summary(true)
	if s.Bytes != 4000 || s.WindowBytes != 2000 || s.LastNs != int64(2500*time.Millisecond) {
		t.Fatalf("summary %+v", s)
	}
	if len(s.Samples) != 3 || s.Samples[0].Bytes != 2000 || s.Samples[1].Bytes != 500 || s.Samples[2].Bytes != 1500 || s.Samples[2].Seconds != 0.5 {
		t.Fatalf("samples %+v", s.Samples)
	}
	b, _ := json.Marshal(s)
	back, err := ParseSummary(b)
	if err != nil {
		t.Fatal(err)
	}
	var r Result
	fill(&r, back)
	// 2000 bytes over 1.5 s.
	if want := 2000.0 * 8 / 1.5 / 1e6; r.Goodput != want {
		t.Errorf("goodput %v, want %v", r.Goodput, want)
	}
	// The longest stall: nothing between 1.0 s and 2.5 s.
	if r.MaxGap != 1.5 || r.MaxGapEnd != 2.5 {
		t.Errorf("max gap %v s ending at %v s, want 1.5 s ending at 2.5 s", r.MaxGap, r.MaxGapEnd)
	}
}

// TestEqualWindow: the equal window [warm-up, duration) from the
// receiver's per-second counts, through the counter and fill as a trial
// sees it.
func TestEqualWindow(t *testing.T) {
	run := func(warmup, duration time.Duration, adds ...[2]int64) Result {
		t.Helper()
		c := counter{warmup: warmup}
		for _, a := range adds {
			c.add(time.Duration(a[0])*time.Millisecond, int(a[1]))
		}
		s := c.summary(true)
		b, _ := json.Marshal(s)
		back, err := ParseSummary(b)
		if err != nil {
			t.Fatal(err)
		}
		r := Result{Duration: duration.Seconds(), Warmup: warmup.Seconds()}
		fill(&r, back)
		return r
	}
	// A backlog drained after the 4 s of writing: seconds 4-6 count in the
	// last-byte window, not in the equal one; the warm-up second in neither.
	r := run(time.Second, 4*time.Second,
		[2]int64{500, 7000}, [2]int64{1000, 100}, [2]int64{1999, 100}, [2]int64{2500, 200}, [2]int64{3999, 300},
		[2]int64{4000, 50}, [2]int64{5500, 50})
	if r.EqualBytes != 700 || r.WindowBytes != 800 || r.WindowSeconds != 4.5 {
		t.Fatalf("equal %d bytes, window %d bytes over %v s; want 700, 800 over 4.5 s", r.EqualBytes, r.WindowBytes, r.WindowSeconds)
	}
	if want := 700.0 * 8 / 3 / 1e6; r.EqualGoodput != want {
		t.Errorf("equal goodput %v, want %v (over the 3 s from warm-up to duration)", r.EqualGoodput, want)
	}
	// A transfer shorter than the duration, ending in a partial second:
	// the equal window stays 3 s (idle after the last byte), the
	// last-byte one is 1.25 s.
	r = run(time.Second, 4*time.Second, [2]int64{200, 10}, [2]int64{1100, 400}, [2]int64{2250, 600})
	if r.EqualBytes != 1000 || r.WindowSeconds != 1.25 {
		t.Fatalf("short transfer: equal %d bytes, window %v s; want 1000, 1.25 s", r.EqualBytes, r.WindowSeconds)
	}
	if want := 1000.0 * 8 / 3 / 1e6; r.EqualGoodput != want {
		t.Errorf("short transfer: equal goodput %v, want %v", r.EqualGoodput, want)
	}
	// Nothing after the warm-up: no last-byte goodput, an equal one of 0.
	r = run(time.Second, 4*time.Second, [2]int64{300, 10})
	if r.EqualBytes != 0 || r.EqualGoodput != 0 || r.Goodput != 0 {
		t.Errorf("all in the warm-up: %+v", r)
	}
	// Boundaries inside a second count that second pro rata; the last,
	// partial second (0.5 s long, here straddling the end) by its length.
	samples := []Sample{{Start: 0, Seconds: 1, Bytes: 1000}, {Start: 1, Seconds: 1, Bytes: 1000}, {Start: 2, Seconds: 0.5, Bytes: 1000}}
	for _, tc := range []struct {
		from, to float64
		want     uint64
	}{
		{1, 2, 1000},     // whole seconds
		{0.5, 1.5, 1000}, // half of two seconds
		{1.5, 10, 1500},  // half a second and the whole last one
		{2, 2.25, 500},   // half of the last (0.5 s) sample
		{2.5, 10, 0},     // after the last byte
		{0, 0.25, 250},   // inside the first second
		{0, 100, 3000},   // everything
		{2.25, 2.25, 0},  // an empty window
	} {
		if got := EqualWindow(samples, tc.from, tc.to); got != tc.want {
			t.Errorf("EqualWindow [%v, %v) = %d, want %d", tc.from, tc.to, got, tc.want)
		}
	}
	// A last sample of no length (last byte on a whole second) is an
	// instant: in the window when its start is.
	inst := []Sample{{Start: 0, Seconds: 1, Bytes: 10}, {Start: 1, Seconds: 0, Bytes: 5}}
	if got := EqualWindow(inst, 1, 2); got != 5 {
		t.Errorf("instant sample inside: %d, want 5", got)
	}
	if got := EqualWindow(inst, 0, 1); got != 10 {
		t.Errorf("instant sample at the end: %d, want 10", got)
	}
}

func TestParseSummaryRejects(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"version":2}`, "version 2"},
		{`{"version":1,"bytes":10,"window_bytes":11}`, "exceed"},
		{`{"version":1,"bytes":10,"samples":[{"start_s":0,"seconds":1,"bytes":9}]}`, "add up to 9"},
		{`{"version":1,"bytes":0,"samples":[{"start_s":1,"seconds":1},{"start_s":1,"seconds":1}]}`, "not after"},
		{`{"version":1,"bytes":0,"samples":[{"start_s":0,"seconds":2}]}`, "invalid time"},
		{`{"version":1,"bytes":18446744073709551615,"samples":[{"start_s":0,"seconds":1,"bytes":18446744073709551615},{"start_s":1,"seconds":1,"bytes":1}]}`, "overflows"},
		{`{"version":1,"bytes":5,"window_bytes":5,"warmup_ns":10,"last_ns":10,"samples":[{"start_s":0,"seconds":1,"bytes":5}]}`, "last_ns"},
		{`{"version":1,"last_ns":-1}`, "negative"},
		{`[`, "unexpected end"},
	} {
		if _, err := ParseSummary([]byte(tc.in)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want error mentioning %q", tc.in, err, tc.want)
		}
	}
}

// FuzzParseSummary: the summary comes from whatever answers on the port.
func FuzzParseSummary(f *testing.F) {
	c := counter{warmup: time.Second}
	c.add(0, 10)
	c.add(1500*time.Millisecond, 20)
	good, _ := json.Marshal(c.summary(false))
	f.Add(good)
	f.Add([]byte(`{"version":1,"bytes":0,"samples":[]}`))
	f.Add([]byte(`{"version":1,"samples":[{"start_s":1e308,"seconds":1,"mbps":-0}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := ParseSummary(b)
		if err != nil {
			return
		}
		r := Result{Duration: 10, Warmup: 1}
		fill(&r, s)
		if r.WindowBytes > r.Bytes || r.Goodput < 0 || r.WindowSeconds < 0 || !finite(r.Goodput) ||
			r.EqualBytes > r.Bytes || r.EqualGoodput < 0 || !finite(r.EqualGoodput) {
			t.Fatalf("accepted inconsistent summary %s -> %+v", b, r)
		}
	})
}

func FuzzParseHello(f *testing.F) {
	f.Add(hello{Warmup: time.Second}.marshal())
	f.Add([]byte("mpdgp1\n\x00\x00\x00\x03\xe8\x00\x00\x00\x01"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parseHello(b)
		if err == nil && (h.Warmup < 0 || h.Warmup > time.Hour) {
			t.Fatalf("accepted warm-up %v", h.Warmup)
		}
	})
}

// serve starts a receiver for the duration of the test.
func serve(t *testing.T, o ServeOptions) *Server {
	t.Helper()
	s, err := Listen(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return s
}

func checkConsistent(t *testing.T, r *Result) {
	t.Helper()
	if r.Bytes == 0 || r.WindowBytes == 0 || r.Goodput <= 0 {
		t.Fatalf("nothing measured: %+v", r)
	}
	var sum uint64
	for _, s := range r.Samples {
		sum += s.Bytes
	}
	if sum != r.Bytes {
		t.Errorf("samples add up to %d, bytes %d", sum, r.Bytes)
	}
	if r.CongestionControl != "cubic" {
		t.Errorf("congestion control %q, want cubic (set per socket)", r.CongestionControl)
	}
}

func TestLoopbackTCP(t *testing.T) {
	s := serve(t, ServeOptions{Addr: "127.0.0.1:0"})
	r, err := Send(context.Background(), SendOptions{Addr: s.Addr().String(), Duration: 1500 * time.Millisecond, Warmup: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	checkConsistent(t, r)
	if r.MPTCP || r.Fallback || len(r.Subflows) != 1 {
		t.Errorf("plain TCP result %+v", r)
	}
	// The sender's kernel saw every byte the receiver read acknowledged,
	// plus the 16-byte hello and the SYN and FIN sequence numbers.
	if got, read := r.Subflows[0].BytesAcked, r.Bytes+helloSize; got < read || got > read+2 {
		t.Errorf("sender acked %d bytes, receiver read %d", got, read)
	}
	t.Logf("loopback TCP: %.0f Mbit/s", r.Goodput)
}

func TestLoopbackMPTCP(t *testing.T) {
	testenv.MPTCP(t)
	s := serve(t, ServeOptions{Addr: "127.0.0.1:0", MPTCP: true})
	if !s.MPTCP() {
		t.Fatal("listener is not MPTCP")
	}
	r, err := Send(context.Background(), SendOptions{Addr: s.Addr().String(), Duration: 1500 * time.Millisecond, Warmup: 500 * time.Millisecond, MPTCP: true})
	if err != nil {
		t.Fatal(err)
	}
	checkConsistent(t, r)
	if !r.MPTCP || !r.ServerMPTCP || r.Fallback {
		t.Errorf("MPTCP not used end to end: %+v", r)
	}
	if len(r.Subflows) != 1 || r.Subflows[0].Local.Port() == 0 {
		t.Errorf("subflows %+v", r.Subflows)
	}
}

// TestFallbackReported: an MPTCP client talking to a plain TCP server still
// measures, and says it fell back.
func TestFallbackReported(t *testing.T) {
	testenv.MPTCP(t)
	s := serve(t, ServeOptions{Addr: "127.0.0.1:0"})
	r, err := Send(context.Background(), SendOptions{Addr: s.Addr().String(), Duration: 1200 * time.Millisecond, Warmup: 200 * time.Millisecond, MPTCP: true})
	if err != nil {
		t.Fatal(err)
	}
	if r.MPTCP || !r.Fallback || r.ServerMPTCP {
		t.Errorf("fallback not reported: mptcp=%v fallback=%v server=%v", r.MPTCP, r.Fallback, r.ServerMPTCP)
	}
}

func TestBadCongestionControl(t *testing.T) {
	s := serve(t, ServeOptions{Addr: "127.0.0.1:0"})
	_, err := Send(context.Background(), SendOptions{Addr: s.Addr().String(), Duration: 2 * time.Second, CC: "no-such-cc"})
	if err == nil || !strings.Contains(err.Error(), `congestion control "no-such-cc"`) {
		t.Fatalf("error %v", err)
	}
}

func TestCancel(t *testing.T) {
	s := serve(t, ServeOptions{Addr: "127.0.0.1:0"})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	_, err := Send(ctx, SendOptions{Addr: s.Addr().String(), Duration: time.Minute})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error %v, want the context's", err)
	}
	if d := time.Since(t0); d > 10*time.Second {
		t.Errorf("cancel took %v", d)
	}
}

// TestNotABenchClient: garbage on the port is refused without killing the server.
func TestNotABenchClient(t *testing.T) {
	s := serve(t, ServeOptions{Addr: "127.0.0.1:0"})
	c, err := net.Dial("tcp", s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("GET / HTTP/1.1\r\n")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	out, err := io.ReadAll(c)
	c.Close()
	// The receiver hangs up without answering (a reset is fine too).
	if len(out) != 0 || err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("garbage client got %q, %v", out, err)
	}
	if _, err := Send(context.Background(), SendOptions{Addr: s.Addr().String(), Duration: 700 * time.Millisecond, Warmup: 200 * time.Millisecond}); err != nil {
		t.Fatalf("server did not survive a bad client: %v", err)
	}
}

// TestMPTCPTwoSubflows: client and server namespaces joined by two 20 Mbit/s
// paths; the in-kernel path manager adds a second subflow; the per-subflow
// bytes from MPTCP_FULL_INFO must add up to what the receiver counted.
func TestMPTCPTwoSubflows(t *testing.T) {
	testenv.MPTCP(t)
	testenv.Tools(t, "ip")
	c, s := netnstest.New(t, "tdC"), netnstest.New(t, "tdS")
	netnstest.Veth(t, c, "eth0", s, "eth0")
	netnstest.Veth(t, c, "eth1", s, "eth1")
	c.Addr(t, "eth0", "10.78.1.1/24")
	s.Addr(t, "eth0", "10.78.1.2/24")
	c.Addr(t, "eth1", "10.78.2.1/24")
	s.Addr(t, "eth1", "10.78.2.2/24")
	for _, ifc := range []string{"eth0", "eth1"} {
		c.Tbf(t, ifc, 20_000_000, 64<<10)
	}
	for _, args := range [][]string{
		{"-n", s.Name, "mptcp", "limits", "set", "subflow", "2", "add_addr_accepted", "2"},
		{"-n", c.Name, "mptcp", "limits", "set", "subflow", "2", "add_addr_accepted", "2"},
		{"-n", c.Name, "mptcp", "endpoint", "add", "10.78.2.1", "dev", "eth1", "subflow"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v %s", args, err, out)
		}
	}
	srv := serve(t, ServeOptions{Addr: "10.78.1.2:5201", MPTCP: true, Netns: s.Path})
	_ = srv
	r, err := Send(context.Background(), SendOptions{Addr: "10.78.1.2:5201", Duration: 3 * time.Second, MPTCP: true, Netns: c.Path})
	if err != nil {
		t.Fatal(err)
	}
	checkConsistent(t, r)
	if !r.MPTCP || !r.ServerMPTCP {
		t.Fatalf("not MPTCP: %+v", r)
	}
	if len(r.Subflows) != 2 {
		t.Fatalf("got %d subflows, want 2: %+v", len(r.Subflows), r.Subflows)
	}
	var acked, window uint64
	for _, sf := range r.Subflows {
		if sf.BytesAcked == 0 || sf.RTT <= 0 {
			t.Errorf("idle subflow %+v", sf)
		}
		acked += sf.BytesAcked
		window += sf.WindowBytesAcked
		t.Logf("subflow %d %v -> %v: %d bytes (%d in window), rtt %.2f ms", sf.ID, sf.Local, sf.Remote, sf.BytesAcked, sf.WindowBytesAcked, sf.RTT)
	}
	// Subflow-level acks count data reinjected on a second subflow twice,
	// so allow a few percent over; they can never be under what the
	// receiver read.
	if acked < r.Bytes+helloSize || float64(acked) > 1.05*float64(r.Bytes+helloSize)+4 {
		t.Errorf("subflows acked %d bytes, receiver read %d", acked, r.Bytes)
	}
	t.Logf("goodput %.2f Mbit/s over two 20 Mbit/s paths, window acked %d vs read %d", r.Goodput, window, r.WindowBytes)
	// Two equal paths: each subflow must carry a real share, not just exist.
	for _, sf := range r.Subflows {
		if share := float64(sf.BytesAcked) / float64(acked); share < 0.2 {
			t.Errorf("subflow %v carried only %.0f%% of the data", sf.Local, 100*share)
		}
	}
}

// TestConcurrentClients: two flows at once are measured independently (a
// one-at-a-time receiver would leave the second's data in its socket buffer
// and read it in one burst, with no goodput window).
func TestConcurrentClients(t *testing.T) {
	s := serve(t, ServeOptions{Addr: "127.0.0.1:0"})
	var wg sync.WaitGroup
	res := make([]*Result, 2)
	errs := make([]error, 2)
	for i := range res {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i], errs[i] = Send(context.Background(), SendOptions{Addr: s.Addr().String(), Duration: 1500 * time.Millisecond, Warmup: 500 * time.Millisecond})
		}()
	}
	wg.Wait()
	for i, r := range res {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if r.WindowSeconds < 0.5 || r.Goodput <= 0 {
			t.Errorf("client %d: window %.3f s, goodput %.0f Mbit/s", i, r.WindowSeconds, r.Goodput)
		}
	}
}

// TestArrivalTimestamps: data read 300 ms after it arrived is stamped with
// its arrival, for TCP and MPTCP sockets alike.
func TestArrivalTimestamps(t *testing.T) {
	for _, mp := range []bool{false, true} {
		if mp {
			testenv.MPTCP(t)
		}
		var lc net.ListenConfig
		lc.SetMultipathTCP(mp)
		ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		var d net.Dialer
		d.SetMultipathTCP(mp)
		c, err := d.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		sc, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer sc.Close()
		r, err := newStampedReader(sc.(*net.TCPConn))
		if err != nil {
			t.Fatal(err)
		}
		// SO_TIMESTAMPNS turns the kernel's receive stamping on through a
		// static key that a workqueue flips later (net_enable_timestamp):
		// a segment arriving before that carries no stamp and read falls
		// back to the read time. One exchange first, read after the flip
		// has had time to run, so the measured one is stamped.
		if _, err := c.Write([]byte("warm")); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
		if n, _, err := r.read(make([]byte, 16)); err != nil || n != 4 {
			t.Fatalf("warm-up read %d, %v", n, err)
		}
		sent := time.Now()
		if _, err := c.Write([]byte("hello")); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond)
		n, ts, err := r.read(make([]byte, 16))
		if err != nil || n != 5 {
			t.Fatalf("read %d, %v", n, err)
		}
		if arrived := time.Unix(0, ts); arrived.Sub(sent) > 200*time.Millisecond {
			t.Errorf("mptcp=%v: stamped %v after sending, want the arrival time, not the read time", mp, arrived.Sub(sent))
		}
	}
}

// A download: the receiver sends for the duration, the client counts; the
// per-subflow bytes are what each subflow received.
func TestLoopbackDownload(t *testing.T) {
	for _, mp := range []bool{false, true} {
		if mp {
			testenv.MPTCP(t)
		}
		s := serve(t, ServeOptions{Addr: "127.0.0.1:0", MPTCP: mp})
		start := time.Now()
		r, err := Send(context.Background(), SendOptions{Addr: s.Addr().String(), Duration: 1500 * time.Millisecond, Warmup: 500 * time.Millisecond, MPTCP: mp, Download: true})
		if err != nil {
			t.Fatal(err)
		}
		checkConsistent(t, r)
		if !r.Download || r.MPTCP != mp || len(r.Subflows) != 1 {
			t.Fatalf("download result %+v", r)
		}
		if took := time.Since(start); took < 1400*time.Millisecond || took > 10*time.Second {
			t.Errorf("download took %v for a 1.5 s duration", took)
		}
		// Everything the client read arrived on its one subflow (MPTCP may
		// receive some data twice at the subflow level: its own
		// retransmissions, dropped as duplicates by the connection).
		if got := r.Subflows[0].BytesAcked; got < r.Bytes || float64(got) > 1.01*float64(r.Bytes)+1 {
			t.Errorf("mptcp=%v: subflow received %d bytes, client read %d", mp, got, r.Bytes)
		}
		if w := r.Subflows[0].WindowBytesAcked; w == 0 || w > r.Subflows[0].BytesAcked {
			t.Errorf("window bytes %d of %d", w, r.Subflows[0].BytesAcked)
		}
	}
}
