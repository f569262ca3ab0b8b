package delayline

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestSchedulerNeverReorders(t *testing.T) {
	s := scheduler{delay: int64(10 * time.Millisecond)}
	now := int64(1_000_000_000)
	cases := []struct {
		arrival, now, want int64
	}{
		{now, now, now + 10e6},                      // normal
		{now + 1000, now + 2000, now + 10e6 + 1000}, // read 1 µs late: delay counts from arrival
		{now - 500, now + 3000, now + 10e6 + 1000},  // timestamp jitter backwards: clamp to last due
		{now + 50e6, now + 20e6, now + 30e6},        // timestamp from the future: use read time
		{0, now + 21e6, now + 31e6},                 // no timestamp
		{now, now + 40e6, now + 31e6},               // waited longer than the delay: as soon as order allows
	}
	for i, c := range cases {
		if got := s.due(c.arrival, c.now); got != c.want {
			t.Errorf("case %d: due(%d, %d) = %d, want %d", i, c.arrival, c.now, got, c.want)
		}
	}
}

func TestRingWrapsAndBounds(t *testing.T) {
	r := newRing(4, 64)
	if _, n := r.free(); n != 4 {
		t.Fatalf("free %d, want 4", n)
	}
	for round := range 10 {
		tail, n := r.free()
		k := min(n, 3)
		for i := range k {
			r.slot(tail + uint64(i))[0] = byte(round*3 + i)
			r.length[r.idx(tail+uint64(i))] = int32(i + 1)
		}
		r.commit(k)
		head, used := r.used()
		if used != k {
			t.Fatalf("round %d: used %d, want %d", round, used, k)
		}
		for i := range used {
			if got := r.slot(head + uint64(i))[0]; got != byte(round*3+i) {
				t.Fatalf("round %d slot %d holds %d", round, i, got)
			}
		}
		r.release(used)
	}
	tail, _ := r.free()
	r.commit(4)
	if _, n := r.free(); n != 0 {
		t.Fatalf("full ring reports %d free", n)
	}
	_ = tail
	if len(r.buf) != 4*64 {
		t.Fatalf("ring grew to %d bytes", len(r.buf))
	}
}

func TestQueueSlots(t *testing.T) {
	if n := queueSlots(0, 5*time.Millisecond); n != minSlots {
		t.Errorf("5 ms: %d slots, want %d", n, minSlots)
	}
	if n := queueSlots(0, 100*time.Millisecond); n != 10000 {
		t.Errorf("100 ms: %d slots, want 10000", n)
	}
	if n := queueSlots(0, 10*time.Second); n != maxSlots {
		t.Errorf("10 s: %d slots, want %d", n, maxSlots)
	}
	if n := queueSlots(77, time.Second); n != 77 {
		t.Errorf("explicit limit: %d", n)
	}
}

func TestParseConfig(t *testing.T) {
	good := `{"links":[{"name":"L2","netns":"/run/netns/x","a":"a","b":"b","delay_ab":"5ms","delay_ba":"100ms","loss_ab":0.01}],"lab":"ignored"}`
	c, err := ParseConfig([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if l := c.Links[0]; time.Duration(l.DelayAB) != 5*time.Millisecond || time.Duration(l.DelayBA) != 100*time.Millisecond || l.LossAB != 0.01 {
		t.Fatalf("parsed %+v", l)
	}
	// Round trip keeps the readable form.
	b, _ := json.Marshal(c)
	if !strings.Contains(string(b), `"delay_ab":"5ms"`) {
		t.Errorf("marshalled %s", b)
	}
	for _, tc := range []struct{ in, want string }{
		{`{`, "unexpected EOF"},
		{`{"links":[]}`, "no links"},
		{`{"links":[{"netns":"","a":"a","b":"b"}]}`, "netns is empty"},
		{`{"links":[{"netns":"/n","a":"a","b":"a"}]}`, "same interface"},
		{`{"links":[{"netns":"/n","a":"a","b":"b","delay_ab":5}]}`, "must be a string"},
		{`{"links":[{"netns":"/n","a":"a","b":"b","delay_ab":"5 ms"}]}`, "bad duration"},
		{`{"links":[{"netns":"/n","a":"a","b":"b","delay_ba":"-1ms"}]}`, "delay_ba -1ms out of range"},
		{`{"links":[{"netns":"/n","a":"a","b":"b","delay_ab":"1h"}]}`, "out of range"},
		{`{"links":[{"netns":"/n","a":"a","b":"b","loss_ab":1.5}]}`, "loss_ab 1.5 is not a probability"},
		{`{"links":[{"name":"x","netns":"/n","a":"a","b":"b"},{"name":"x","netns":"/m","a":"a","b":"b"}]}`, `"x": duplicate name`},
		{`{"links":[{"netns":"/n","a":"a","b":"b"},{"netns":"/n","a":"c","b":"b"}]}`, `interface "b" in /n is also used`},
		{`{"links":[{"netns":"/n","a":"a","b":"b","queue_limit":-1}]}`, "queue_limit"},
		{`{"links":[{"netns":"/n","a":"abcdefghijklmnopq","b":"b"}]}`, "longer than 15"},
	} {
		_, err := ParseConfig([]byte(tc.in))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want it to mention %q", tc.in, err, tc.want)
		}
	}
}

func TestParseTimestamp(t *testing.T) {
	if ts := parseTimestamp(nil); ts != 0 {
		t.Errorf("empty control: %d", ts)
	}
	// A cmsghdr claiming more bytes than present must not be read.
	bad := make([]byte, 32)
	bad[0] = 200
	if ts := parseTimestamp(bad); ts != 0 {
		t.Errorf("truncated control: %d", ts)
	}
}

// FuzzParseConfig: the state file is written by the lab but read back after
// crashes and by hand-edited runs; no input may crash the parser or pass
// validation with an impossible value.
func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(`{"links":[{"name":"L2","netns":"/run/netns/x","a":"a","b":"b","delay_ab":"5ms","delay_ba":"5ms"}]}`))
	f.Add([]byte(`{"links":[{"netns":"/n","a":"a","b":"b","loss_ab":0.5,"queue_limit":10}]}`))
	f.Add([]byte(`{"links":null}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseConfig(data)
		if err != nil {
			return
		}
		for _, l := range c.Links {
			if l.DelayAB < 0 || l.DelayBA < 0 || time.Duration(l.DelayAB) > MaxDelay || l.LossAB > 1 || l.LossBA < 0 || l.Netns == "" || l.A == l.B {
				t.Fatalf("accepted invalid link %+v", l)
			}
		}
	})
}

func FuzzParseTimestamp(f *testing.F) {
	f.Add(make([]byte, 32))
	f.Fuzz(func(t *testing.T, b []byte) {
		// The kernel fills this buffer, but a bug in the length handling
		// must show up as a zero, not as a crash.
		_ = parseTimestamp(b)
	})
}

func TestArrivalOnMonotonicClock(t *testing.T) {
	const real, mono = int64(1_700_000_000e9), int64(5_000e9)
	for _, c := range []struct{ ts, want int64 }{
		{real - 3e6, mono - 3e6}, // arrived 3 ms before it was read
		{0, mono},                // no stamp
		{real + 1e9, mono},       // wall clock stepped back since: treat as now
	} {
		if got := arrival(c.ts, real, mono); got != c.want {
			t.Errorf("arrival(%d) = %d, want %d", c.ts, got, c.want)
		}
	}
}

func TestMonotonicMatchesKernelClock(t *testing.T) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatal(err)
	}
	// Same clock, read microseconds apart: the timerfd deadlines depend on it.
	if d := monotonic() - ts.Nano(); d < -int64(time.Millisecond) || d > int64(50*time.Millisecond) {
		t.Errorf("monotonic() is %v off CLOCK_MONOTONIC", time.Duration(d))
	}
}
