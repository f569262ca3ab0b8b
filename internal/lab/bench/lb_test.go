package bench

import (
	"errors"
	"testing"
)

// Broken connections are counted by cause: addresses and ports go.
func TestShortReason(t *testing.T) {
	for in, want := range map[string]string{
		"write: write tcp 10.0.1.1:40000->10.0.100.1:5201: connection reset by peer":        "write: connection reset by peer",
		"reading the receiver's summary: read tcp 10.0.1.1:1->10.0.100.1:5201: i/o timeout": "reading the receiver's summary: i/o timeout",
		"plain": "plain",
	} {
		if got := shortReason(errors.New(in)); got != want {
			t.Errorf("shortReason(%q) = %q, want %q", in, got, want)
		}
	}
}
