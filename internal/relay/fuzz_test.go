package relay

import (
	"testing"
)

// Untrusted or external bytes the relay parses (issue 16 #14): its config
// file, the kernel's /proc/net/tcp, nftables element replies. Errors, never
// panics; what is accepted is consistent.

func FuzzRelayParseConfig(f *testing.F) {
	f.Add([]byte("listen: 0.0.0.0:45673\nprivate_key: qEXS+hHDGLa3JUTbhhAoKZfn801wYM7dNt+pqnuC4XA=\nmembers:\n  - {name: a, public_key: mN2TeWHHug6AVNfO1hbb4+4npFJSyQH6lJZp/9ysN3s=}\n"))
	f.Add([]byte("members: []\nlegacy_v1: {enabled: true}\nprivate_key: qEXS+hHDGLa3JUTbhhAoKZfn801wYM7dNt+pqnuC4XA=\nports: 1-2\nlease: 2s\n"))
	f.Add([]byte("tunnel: {subnet: 100.80.0.0/16}\nquota: {per_member: -1}\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := ParseConfig(b)
		if err != nil {
			return
		}
		if s.PortLo == 0 || s.PortLo > s.PortHi || s.Lease <= 0 || (len(s.Members) == 0 && !s.Legacy) {
			t.Fatalf("accepted an inconsistent config: %+v", s)
		}
	})
}
