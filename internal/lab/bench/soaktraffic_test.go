package bench

import (
	"errors"
	"io"
	"math"
	"net"
	"strings"
	"testing"
	"time"
)

// A loopback echo server, and one that changes a byte or stops early.
func echoServer(t *testing.T, mangle func(c net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	if mangle == nil {
		go soakEcho(ln)
	} else {
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go mangle(c)
			}
		}()
	}
	return ln.Addr().String()
}

func TestSoakConnectionsVerifyEveryByte(t *testing.T) {
	good := echoServer(t, nil)
	flip := echoServer(t, func(c net.Conn) { // echoes, with byte 5000 changed
		defer c.Close()
		b, _ := io.ReadAll(c)
		if len(b) > 5000 {
			b[5000] ^= 1
		}
		c.Write(b)
	})
	short := echoServer(t, func(c net.Conn) { // echoes all but the last byte
		defer c.Close()
		b, _ := io.ReadAll(c)
		c.Write(b[:len(b)-1])
	})
	dial := func(addr string) net.Conn {
		c, err := net.Dial("tcp4", addr)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	var tl soakTally
	dl := time.Now().Add(10 * time.Second)
	if why := tl.shortConn(dial(good), 100<<10, dl); why != "" {
		t.Fatalf("good echo: %s", why)
	}
	if tl.bytes.Load() != 100<<10 {
		t.Fatalf("bytes verified %d, want %d", tl.bytes.Load(), 100<<10)
	}
	if why := tl.shortConn(dial(flip), 32<<10, dl); why != "echo differs" {
		t.Fatalf("changed byte: %q", why)
	}
	if why := tl.shortConn(dial(short), 32<<10, dl); why != "echo short" {
		t.Fatalf("short echo: %q", why)
	}
	stop := make(chan struct{})
	time.AfterFunc(300*time.Millisecond, func() { close(stop) })
	before := tl.bytes.Load()
	if why := tl.longConn(dial(good), 4<<10, 20*time.Millisecond, stop); why != "" {
		t.Fatalf("long, good echo: %s", why)
	}
	if got := tl.bytes.Load() - before; got < 8<<10 || got%(4<<10) != 0 {
		t.Fatalf("long connection verified %d bytes, want whole chunks of 4 KiB over 300 ms", got)
	}
	stop2 := make(chan struct{})
	time.AfterFunc(300*time.Millisecond, func() { close(stop2) })
	if why := tl.longConn(dial(flip), 4<<10, 20*time.Millisecond, stop2); why != "echo differs" {
		t.Fatalf("long, changed byte: %q", why)
	}
	// Different connections get different streams.
	a, b := make([]byte, 64), make([]byte, 64)
	io.ReadFull(soakStream(1), a)
	io.ReadFull(soakStream(2), b)
	if string(a) == string(b) {
		t.Fatal("streams of two connections are equal")
	}
	if _, err := verifyEcho(strings.NewReader(string(a)), soakStream(2)); !errors.Is(err, errMismatch) {
		t.Fatalf("verifyEcho of another stream: %v", err)
	}
}

func TestTrend(t *testing.T) {
	var x, y []float64
	for i := 0; i < 300; i++ { // an hour, 10 MB/h with a GC sawtooth of 3 MB
		h := float64(i) / 300
		x, y = append(x, h), append(y, 52+10*h+3*float64(i%7)/7)
	}
	s, lo, hi := trend(x, y)
	if math.Abs(s-10) > 0.5 || lo > s || hi < s || lo < 8 {
		t.Fatalf("trend %.2f (%.2f..%.2f), want ~10 with a tight interval", s, lo, hi)
	}
	flat := make([]float64, len(x))
	for i := range flat {
		flat[i] = 50 + 3*float64(i%7)/7
	}
	if s, lo, hi := trend(x, flat); math.Abs(s) > 0.5 || lo > 0 || hi < 0 {
		t.Fatalf("flat: %.2f (%.2f..%.2f)", s, lo, hi)
	}
}

// The soak's verdicts on memory and connections fail on the numbers they
// are meant to catch.
func TestSoakVerdicts(t *testing.T) {
	samples := func(dur time.Duration, rss func(h float64) float64) []SoakSample {
		var ss []SoakSample
		for ts := 10.0; ts <= dur.Seconds(); ts += 10 {
			ss = append(ss, SoakSample{T: ts, Agent: ProcStats{RSSBytes: 1e6 * rss(ts/3600)}})
		}
		return ss
	}
	hour := SoakOptions{Duration: time.Hour}
	rising := &SoakReport{Samples: samples(time.Hour, func(h float64) float64 { return 52 + 10*h })}
	if c := agentTrendCheck(rising, hour); c.OK {
		t.Errorf("52 -> 62 MB over an hour passed: %s", c.Detail)
	}
	level := &SoakReport{Samples: samples(time.Hour, func(h float64) float64 { return 52 + 0.5*math.Sin(40*h) })}
	if c := agentTrendCheck(level, hour); !c.OK {
		t.Errorf("level memory failed: %s", c.Detail)
	}
	// Under 15 minutes after the warm-up, a trend is reported, not judged.
	five := SoakOptions{Duration: 5 * time.Minute}
	leak := &SoakReport{Samples: samples(5*time.Minute, func(h float64) float64 { return 40 + 120*h })}
	if c := agentTrendCheck(leak, five); !c.OK || !strings.Contains(c.Detail, "not judged") || leak.AgentRSSTrend.Slope < 100 {
		t.Errorf("five minutes: %s (slope %.1f)", c.Detail, leak.AgentRSSTrend.Slope)
	}
	// Twenty minutes: a steady climb of 30 MB/h fails (allowed 2 MB/h + 4 MB over 16 minutes).
	twenty := SoakOptions{Duration: 20 * time.Minute}
	climb := &SoakReport{Samples: samples(20*time.Minute, func(h float64) float64 { return 52 + 30*h })}
	if c := agentTrendCheck(climb, twenty); c.OK {
		t.Errorf("30 MB/h over 20 minutes passed: %s", c.Detail)
	}

	ok := &SoakReport{ExpectedShort: 1500, StartedShort: 1500, Samples: []SoakSample{{Opened: 1504, Verified: 1504, Bytes: 50e6}}}
	for _, c := range connectionChecks(ok) {
		if !c.OK {
			t.Errorf("all verified: %s: %s", c.Name, c.Detail)
		}
	}
	for name, r := range map[string]*SoakReport{
		"not started":  {ExpectedShort: 1500, StartedShort: 1234, Samples: ok.Samples},
		"one failed":   {ExpectedShort: 1500, StartedShort: 1500, Failures: map[string]int64{"echo differs": 1}, Samples: []SoakSample{{Opened: 1504, Verified: 1503, Failed: 1, Bytes: 50e6}}},
		"unaccounted":  {ExpectedShort: 1500, StartedShort: 1500, Samples: []SoakSample{{Opened: 1504, Verified: 1490, Bytes: 50e6}}},
		"nothing sent": {ExpectedShort: 1500, StartedShort: 1500, Samples: []SoakSample{{Opened: 1504, Verified: 1504}}},
	} {
		failed := false
		for _, c := range connectionChecks(r) {
			failed = failed || !c.OK
		}
		if !failed {
			t.Errorf("%s: passed", name)
		}
	}
}

// The soak turns the kernel's blackhole detection off in the client, so a
// connection that detection made plain TCP (or a sample showing MPTCP
// disabled) fails it:
// such a soak would have passed without testing detours.
func TestSoakBlackholeJudged(t *testing.T) {
	agent := func(disabled, fallbacks float64) SoakSample {
		return SoakSample{Agent: ProcStats{MPTCPDisabled: disabled, MPTCPFallbacks: fallbacks}}
	}
	for name, c := range map[string]struct {
		samples []SoakSample
		ok      bool
	}{
		"clean":                    {[]SoakSample{agent(0, 7), agent(0, 7), agent(0, 7)}, true},
		"connections fell back":    {[]SoakSample{agent(0, 7), agent(0, 9), agent(0, 12)}, false},
		"disabled in a sample":     {[]SoakSample{agent(0, 0), agent(1, 0), agent(0, 0)}, false},
		"disabled, none counted":   {[]SoakSample{agent(1, 0), agent(1, 0)}, false},
		"fallback in the last one": {[]SoakSample{agent(0, 0), agent(0, 1)}, false},
	} {
		got := blackholeCheck(&SoakReport{Samples: c.samples})
		if got.OK != c.ok {
			t.Errorf("%s: ok=%v, want %v (%s)", name, got.OK, c.ok, got.Detail)
		}
	}
}
