package roster

import (
	"bytes"
	"os"
	"testing"
	"time"
)

// FuzzParseEntry: any bytes either fail to parse with an error or parse to
// an entry that re-encodes to exactly those bytes; verification never
// panics (seeds in testdata/fuzz/FuzzParseEntry, regenerated with
// ROSTER_WRITE_SEEDS=1).
func FuzzParseEntry(f *testing.F) {
	fx := newFixture(f)
	_, e := fx.entry(f, "seed-relay")
	b, err := e.Bytes()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add(b[:40])
	f.Add([]byte{1})
	if os.Getenv("ROSTER_WRITE_SEEDS") != "" {
		writeSeed(f, "valid-entry", b)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		e, err := Parse(in)
		if err != nil {
			if e != nil {
				t.Fatal("entry and error")
			}
			return
		}
		out, err := e.Bytes()
		if err != nil {
			t.Fatalf("parsed entry does not encode: %v", err)
		}
		if !bytes.Equal(out, in) {
			t.Fatalf("re-encoding differs:\n in %x\nout %x", in, out)
		}
		_ = e.Verify(fx.trust, time.Now())
	})
}
