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

// A flow to the sink completes only after every byte was read: its
// subflow acknowledged at least the flow's size.
func TestFlowSink(t *testing.T) {
	s, err := ListenSink("127.0.0.1:0", "", false, "cubic")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, size := range []int64{1, 15000, 3 << 20} {
		r, err := Flow(context.Background(), FlowOptions{Addr: s.Addr().String(), Size: size, CC: "cubic"})
		if err != nil {
			t.Fatal(err)
		}
		if r.FCT <= 0 || len(r.Subflows) != 1 || r.Subflows[0].BytesAcked < uint64(size) {
			t.Fatalf("size %d: %+v", size, r)
		}
		d, err := Flow(context.Background(), FlowOptions{Addr: s.Addr().String(), Size: size, CC: "cubic", Download: true})
		if err != nil {
			t.Fatal(err)
		}
		if d.FCT <= 0 || len(d.Subflows) != 1 || d.Subflows[0].BytesAcked < uint64(size) {
			t.Fatalf("download size %d: %+v", size, d)
		}
	}
	if _, err := Flow(context.Background(), FlowOptions{Addr: s.Addr().String(), Size: 0}); err == nil {
		t.Error("size 0 accepted")
	}
}
