package relayd

import (
	"net"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/mpdetour/mpdetour/internal/testenv"
)

// TestSetReceiveBuffer: the size asked is what the socket holds afterwards
// (read back with getsockopt), also above net.core.rmem_max (SO_RCVBUFFORCE,
// as root or with CAP_NET_ADMIN).
func TestSetReceiveBuffer(t *testing.T) {
	testenv.Root(t)
	b, err := os.ReadFile("/proc/sys/net/core/rmem_max")
	if err != nil {
		t.Skip(err)
	}
	rmemMax := strings.TrimSpace(string(b))
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	before := sockRcvbuf(t, conn)
	// Above rmem_max (4 MiB here, 208 KiB by default on most kernels):
	// plain SO_RCVBUF would be capped there.
	size := 32 << 20
	got, err := setReceiveBuffer(conn, size)
	if err != nil {
		t.Fatal(err)
	}
	if got < size || got != sockRcvbuf(t, conn) || got == before {
		t.Fatalf("receive buffer: asked %d, kernel holds %d (getsockopt %d, before %d, rmem_max %s)", size, got, sockRcvbuf(t, conn), before, rmemMax)
	}
}

func sockRcvbuf(t *testing.T, conn *net.UDPConn) int {
	t.Helper()
	rc, err := conn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	var serr error
	if err := rc.Control(func(fd uintptr) { n, serr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF) }); err != nil || serr != nil {
		t.Fatal(err, serr)
	}
	return n
}
