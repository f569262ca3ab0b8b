package mptcppm

import (
	"encoding/binary"
	"testing"
	"time"
)

// decodeTCPInfo reads each field from its uapi struct tcp_info offset; a
// short struct (older kernel) leaves the tail zero.
func TestDecodeTCPInfoOffsets(t *testing.T) {
	b := make([]byte, 232)
	ne := binary.NativeEndian
	b[2], b[7] = 3, 1              // retransmits, delivery_rate_app_limited
	ne.PutUint32(b[16:], 1448)     // snd_mss
	ne.PutUint32(b[24:], 17)       // unacked
	ne.PutUint32(b[68:], 40000)    // rtt us
	ne.PutUint32(b[80:], 52)       // snd_cwnd
	ne.PutUint64(b[104:], 1250000) // pacing_rate
	ne.PutUint32(b[144:], 65536)   // notsent_bytes
	ne.PutUint32(b[148:], 30000)   // min_rtt us
	ne.PutUint64(b[160:], 1200000) // delivery_rate
	ne.PutUint64(b[168:], 9000000) // busy_time
	ne.PutUint64(b[176:], 1000)    // rwnd_limited
	ne.PutUint64(b[184:], 2000)    // sndbuf_limited
	var sf Subflow
	decodeTCPInfo(b, &sf)
	if sf.Retransmits != 3 || !sf.AppLimited || sf.SndMSS != 1448 || sf.Unacked != 17 || sf.RTT != 40*time.Millisecond ||
		sf.SndCwnd != 52 || sf.PacingRate != 1250000 || sf.NotsentBytes != 65536 || sf.MinRTT != 30*time.Millisecond ||
		sf.DeliveryRate != 1200000 || sf.BusyTime != 9000000 || sf.RwndLimited != 1000 || sf.SndbufLimited != 2000 {
		t.Fatalf("decoded %+v", sf)
	}
	var short Subflow
	decodeTCPInfo(b[:104], &short)
	if short.SndCwnd != 0 || short.BusyTime != 0 || short.RTT != 40*time.Millisecond {
		t.Fatalf("104-byte tcp_info decoded %+v", short)
	}
}
