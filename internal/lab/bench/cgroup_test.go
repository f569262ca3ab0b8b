package bench

import (
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/agentd"
	"github.com/mpdetour/mpdetour/internal/bpfclamp"
	"github.com/mpdetour/mpdetour/internal/collective"
	"github.com/mpdetour/mpdetour/internal/proto"
)

// Configurations that attach no BPF program (subflow_lowat: 0, on by
// default, and no cwnd_clamp), or name their cgroup, or that the agent
// refuses, stay as they are, and nothing is entered.
func TestWithLabCgroupLeavesOthers(t *testing.T) {
	for _, cfg := range []string{
		"socket: /x\nsubflow_lowat: 0\n",
		"subflow_lowat: 0\n",
		"subflow_lowat: 0\ncwnd_clamp:\n  enabled: false\n",
		"bpf_cgroup: /sys/fs/cgroup/x\n",                   // the default limit, its own cgroup
		"cwnd_clamp:\n  enabled: true\n  cgroup: /sys/x\n", // its own cgroup
		"subflow_lowat: 131072\nbpf_cgroup: /sys/fs/cgroup/x\n",
		"subflow_lowat: [\n",                         // the agent says what is wrong
		"subflow_lowat: 131072\nsubflow_lowatt: 1\n", // strict: unknown key
	} {
		got, leave, err := withLabCgroup(cfg)
		if err != nil || got != cfg || leave() != nil {
			t.Errorf("withLabCgroup(%q) = %q, %v", cfg, got, err)
		}
	}
	if runnerCgroup.users != 0 {
		t.Errorf("%d users of the lab cgroup, want none", runnerCgroup.users)
	}
}

// An agent configuration with a BPF mechanism gains bpf_cgroup (this
// runner's cgroup, on a line of its own even after text without a final
// newline), in both start paths: the bench's agent and a collective
// client's, whose AgentConfig the scenario appends.
func TestWithLabCgroup(t *testing.T) {
	root := cgroupRoot(t)
	before, err := bpfclamp.OwnCgroup(root)
	if err != nil {
		t.Fatal(err)
	}
	k, err := proto.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	rk, err := proto.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	auth, err := collective.NewAuthority()
	if err != nil {
		t.Fatal(err)
	}
	s := &collSession{max: 3, relays: []*collRelay{{node: "r1", addr: netip.MustParseAddr("10.0.3.2"), key: rk}}}
	c := &collClient{node: "c1", key: k, sock: "/run/x.sock"}
	// The agent's parser reads the certificate: a real one, as
	// setupCollective issues before the configuration is made.
	cert, err := auth.Issue(k.Public(), "c1", collective.RoleClient, time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	certFile := filepath.Join(t.TempDir(), "c1.cert")
	if err := os.WriteFile(certFile, []byte(cert.String()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	coll := s.clientConfig(c, "info", netip.MustParseAddr("10.0.2.2"), certFile, auth.Public())
	for _, cfg := range []string{
		"socket: /x\n", // subflow_lowat on by default
		"socket: /x\nsubflow_lowat: 65536\n",
		"socket: /x\nsubflow_lowat: 131072", // no final newline
		"socket: /x\ncwnd_clamp:\n  enabled: true\n",
		coll + "subflow_lowat: 131072\n",
		coll, // the default limit
	} {
		got, leave, err := withLabCgroup(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { leave() })
		now, _ := bpfclamp.OwnCgroup(root)
		parsed, err := agentd.ParseConfig([]byte(got))
		if err != nil || parsed.BPFCgroup != now || !strings.HasPrefix(now, root+"/"+cgroupPrefix) {
			t.Errorf("withLabCgroup(%q) = %q (%v): want bpf_cgroup %s, the cgroup this process is in", cfg, got, err, now)
		}
		if err := leave(); err != nil {
			t.Fatal(err)
		}
		if now, _ := bpfclamp.OwnCgroup(root); now != before {
			t.Fatalf("in %s after leave, want %s", now, before)
		}
	}
}

// enter moves this process into a cgroup of its own, shared by nested
// users; the last leave moves it back and removes the directory.
func TestLabCgroup(t *testing.T) {
	root := cgroupRoot(t)
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

// scripts/leakcheck.sh (make test runs the unit tests under it) reports a
// lab cgroup directory a command left behind.
func TestLeakcheckSeesLabCgroups(t *testing.T) {
	root := cgroupRoot(t)
	dir := filepath.Join(root, cgroupPrefix+"leakprobe-"+strconv.Itoa(os.Getpid()))
	t.Cleanup(func() { os.Remove(dir) })
	cmd := exec.Command("bash", "../../../scripts/leakcheck.sh", "mkdir", dir)
	cmd.Env = append(os.Environ(), "LEAKCHECK_TRIES=1")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "cgroup "+dir) {
		t.Errorf("leakcheck after mkdir %s: %v, output %q: want a failure naming it", dir, err, out)
	}
}

// cgroupRoot is the cgroup v2 mount; the test is skipped when it is not
// root or there is none.
func cgroupRoot(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (cgroups)")
	}
	root, err := bpfclamp.Cgroup2Root()
	if err != nil {
		t.Skip(err)
	}
	return root
}
