package bench

import (
	"os"
	"strings"
	"testing"

	"github.com/mpdetour/mpdetour/internal/bpfclamp"
)

func TestUsesBPF(t *testing.T) {
	for cfg, want := range map[string]bool{
		"socket: /x\n":                                          false,
		"subflow_lowat: 131072\n":                               true,
		"subflow_lowat: 0\n":                                    false,
		"cwnd_clamp:\n  enabled: true\n":                        true,
		"cwnd_clamp:\n  enabled: false\n":                       false,
		"cwnd_clamp:\n  enabled: true\n  cgroup: /sys/x\n":      false, // its own cgroup
		"subflow_lowat: 131072\nbpf_cgroup: /sys/fs/cgroup/x\n": false,
		"subflow_lowat: [\n":                                    false, // the agent says what is wrong
	} {
		if got := usesBPF(cfg); got != want {
			t.Errorf("usesBPF(%q) = %v, want %v", cfg, got, want)
		}
	}
}

// enter moves this process into a cgroup of its own, shared by nested
// users; the last leave moves it back and removes the directory.
func TestLabCgroup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (cgroups)")
	}
	root, err := bpfclamp.Cgroup2Root()
	if err != nil {
		t.Skip(err)
	}
	before, err := bpfclamp.OwnCgroup(root)
	if err != nil {
		t.Fatal(err)
	}
	var c labCgroup
	dir, leave1, err := c.enter()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { leave1() })
	dir2, leave2, err := c.enter()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { leave2() })
	if now, _ := bpfclamp.OwnCgroup(root); now != dir || dir2 != dir || !strings.HasPrefix(dir, root+"/"+cgroupPrefix) {
		t.Fatalf("in %s after enter (dirs %s, %s)", now, dir, dir2)
	}
	if err := leave1(); err != nil {
		t.Fatal(err)
	}
	leave1() // idempotent
	if now, _ := bpfclamp.OwnCgroup(root); now != dir {
		t.Fatalf("in %s with one user left, want %s", now, dir)
	}
	if err := leave2(); err != nil {
		t.Fatal(err)
	}
	if now, _ := bpfclamp.OwnCgroup(root); now != before {
		t.Errorf("in %s after the last leave, want %s", now, before)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s still there after the last leave (%v)", dir, err)
	}
}
