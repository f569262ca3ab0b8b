package tunnel

import (
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

func TestMain(m *testing.M) {
	if os.Getenv("TW_DEBUG") != "" {
		slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})))
	}
	if os.Getenv("TW_HELPER") == "server" {
		os.Exit(serverHelper())
	}
	os.Exit(m.Run())
}

// serverHelper runs a relay-side Server in this process's namespace (the
// test starts it under `ip netns exec`), like `mpdetour relay` would: it
// admits TW_PEERS, prints "alloc <key> <prefix>" per peer and "ready", and
// closes on SIGTERM. SIGKILL simulates a crash.
func serverHelper() int {
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "helper:", err); return 1 }
	key, err := wgtypes.ParseKey(os.Getenv("TW_KEY"))
	if err != nil {
		return fail(err)
	}
	port, _ := strconv.Atoi(os.Getenv("TW_PORT"))
	s, err := NewServer(ServerConfig{
		Subnet: netip.MustParsePrefix(os.Getenv("TW_SUBNET")), ListenPort: port, PrivateKey: key,
		Destinations: testDestinations, StateFile: os.Getenv("TW_STATE"), RestorePeers: os.Getenv("TW_RESTORE") != "",
	})
	if err != nil {
		return fail(err)
	}
	defer s.Close()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	for _, p := range strings.Fields(os.Getenv("TW_PEERS")) {
		k, err := wgtypes.ParseKey(p)
		if err != nil {
			return fail(err)
		}
		a, err := s.AddPeer(k)
		if err != nil {
			return fail(err)
		}
		fmt.Printf("alloc %s %s\n", k, a)
	}
	fmt.Println("ready")
	<-sig
	return 0
}
