package roster

import (
	"net"
	"testing"
)

// testSecret is the gossip secret of the tests' clusters.
var testSecret = []byte("roster-test-gossip-secret-32byte")

// freePort finds a port free for both UDP and TCP on 127.0.0.1.
func freePort(t testing.TB) uint16 {
	t.Helper()
	for i := 0; i < 50; i++ {
		l, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		u, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port})
		l.Close()
		if err == nil {
			u.Close()
			return uint16(port)
		}
	}
	t.Fatal("no free port")
	return 0
}
