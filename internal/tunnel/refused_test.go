package tunnel

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// The refusal log is bounded: one line per period with the packets refused
// since the last, none when nothing moved, and a reinstalled table (its
// counters back to 0) is a new base, not a huge delta.
func TestWatchRefused(t *testing.T) {
	var mu sync.Mutex
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return buf.Write(p)
	}), nil))
	readings := []uint64{0, 0, 7, 7, 2, 3}
	i := 0
	done := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	read := func() (uint64, error) {
		if i >= len(readings) {
			// The ticker may fire again before the watcher sees the
			// cancel: the counter stays where it was.
			return readings[len(readings)-1], nil
		}
		n := readings[i]
		if i++; i == len(readings) {
			close(done)
			cancel()
		}
		return n, nil
	}
	watchRefused(ctx, read, time.Millisecond, log)
	<-done
	mu.Lock()
	out := buf.String()
	mu.Unlock()
	lines := strings.Count(out, "policy refuses")
	if lines != 2 || !strings.Contains(out, "packets=7") || !strings.Contains(out, "packets=1") {
		t.Fatalf("want two lines (7, then 1 after the reset to 2):\n%s", out)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
