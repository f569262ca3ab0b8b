package proto

import (
	"testing"
	"time"
)

// BenchmarkRelayHandshake is the relay's CPU per initiation (authenticate,
// respond): what bounds how many handshakes a flood can make it do.
func BenchmarkRelayHandshake(b *testing.B) {
	relay, _ := GenerateKey()
	client, _ := GenerateKey()
	in, _ := NewInitiation(client, relay.Public(), 1, time.Now())
	pi, _ := ParseInit(in.Packet)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		acc, err := ConsumeInitiation(relay, pi)
		if err != nil {
			b.Fatal(err)
		}
		if _, _, err := acc.Respond(2); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTransport is one request's decrypt plus one reply's encrypt.
func BenchmarkTransport(b *testing.B) {
	relay, _ := GenerateKey()
	client, _ := GenerateKey()
	in, _ := NewInitiation(client, relay.Public(), 1, time.Now())
	pi, _ := ParseInit(in.Packet)
	acc, _ := ConsumeInitiation(relay, pi)
	resp, rs, _ := acc.Respond(2)
	pr, _ := ParseResponse(resp)
	cs, _ := in.Finish(pr)
	msg := make([]byte, 32)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		pkt, _ := cs.Seal(msg)
		tp, _ := ParseTransport(pkt)
		if _, err := rs.Open(tp); err != nil {
			b.Fatal(err)
		}
		if _, err := rs.Seal(msg); err != nil {
			b.Fatal(err)
		}
	}
}
