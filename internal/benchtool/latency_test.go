package benchtool

import (
	"context"
	"testing"
	"time"
)

func TestLatencyProbe(t *testing.T) {
	s, err := ListenLatency("127.0.0.1:0", "", false)
	if err != nil {
		t.Fatal(err)
	}
	ds, err := Latency(context.Background(), s.Addr().String(), 3, time.Millisecond)
	if err != nil || len(ds) != 3 {
		t.Fatalf("%v %v", ds, err)
	}
	for _, d := range ds {
		if d <= 0 || d > 5*time.Second {
			t.Fatalf("implausible setup latency %v", d)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// A closed responder: a clear error, not a hang.
	if _, err := Latency(context.Background(), s.Addr().String(), 1, 0); err == nil {
		t.Fatal("no error from a closed port")
	}
}
