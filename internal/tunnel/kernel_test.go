package tunnel

import (
	"os/exec"
	"testing"

	"github.com/mpdetour/mpdetour/internal/testenv"
)

// TestKernelDetection: Auto picks the backend that matches what iproute2
// can create in a fresh namespace.
func TestKernelDetection(t *testing.T) {
	testenv.Root(t)
	testenv.Tools(t, "ip", "nft")
	tp := newTopo(t)
	cliCan := exec.Command("ip", "-n", tp.relay, "link", "add", "twprobe", "type", "wireguard").Run() == nil
	if cliCan {
		_ = exec.Command("ip", "-n", tp.relay, "link", "del", "twprobe").Run()
	}
	srv := newServer(t, tp, genKey(t))
	want := Embedded
	if cliCan {
		want = Kernel
	}
	if srv.Backend() != want {
		t.Errorf("auto backend = %s, want %s", srv.Backend(), want)
	}
	// One Server per namespace (fixed table name): close before the next.
	srv.Close()
	if _, err := NewServer(ServerConfig{Netns: tp.relay, Iface: "mpdt-k", Subnet: tunSubnet, ListenPort: relayPort + 1,
		PrivateKey: genKey(t), Backend: Kernel}); (err == nil) != cliCan {
		t.Errorf("forced kernel backend: err = %v, kernel available = %v", err, cliCan)
	}
	assertClean(t, tp.relay)
}
