package agent

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/mpdetour/mpdetour/internal/testenv/netnstest"
)

// A second agent in the same namespace is refused, naming the first one's
// pid, whatever its socket directory; another namespace is another scope;
// after release the next agent starts.
func TestLockOneAgentPerNamespace(t *testing.T) {
	ns, other := netnstest.New(t, "lock-a"), netnstest.New(t, "lock-b")
	cfg := Options{NetNS: ns.Path, Socket: filepath.Join(t.TempDir(), "agent.sock")}
	release, err := Lock(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, second := range []Options{cfg, {NetNS: ns.Path, Socket: filepath.Join(t.TempDir(), "agent.sock")}} {
		_, err = Lock(second)
		if err == nil {
			t.Fatalf("a second agent (socket %s) got the lock while the first held it", second.Socket)
		}
		if !strings.Contains(err.Error(), "another mpdetour agent") || !strings.Contains(err.Error(), "pid "+strconv.Itoa(os.Getpid())) {
			t.Fatalf("error does not say who holds it: %v", err)
		}
	}
	elsewhere, err := Lock(Options{NetNS: other.Path})
	if err != nil {
		t.Fatalf("lock in another namespace: %v", err)
	}
	elsewhere()
	release()
	again, err := Lock(cfg)
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	again()
}
