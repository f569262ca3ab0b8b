package convclient

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// peerHelperEnv makes the test binary act as another local user's
// supervisor (TestPeerHelper) against the socket the variable names.
const peerHelperEnv = "MPDETOUR_CONVCLIENT_PEER_SOCKET"

// TestPeerHelper is not a test: run by TestSocketPeerCredentials as
// another uid, it teaches the Router a false lesson, reports failures and
// asks for the status, and prints what it got as JSON.
func TestPeerHelper(t *testing.T) {
	path := os.Getenv(peerHelperEnv)
	if path == "" {
		t.Skip("helper process of TestSocketPeerCredentials")
	}
	c := NewClient(path, 2*time.Second)
	defer c.Close()
	dst := netip.MustParseAddrPort(os.Getenv(peerHelperEnv + "_DST"))
	out := map[string]string{}
	errs := func(err error) string {
		if err == nil {
			return ""
		}
		return err.Error()
	}
	out["hello"] = errs(c.Hello())
	c.Close()
	out["learn"] = errs(c.Learn(dst, false))
	d, err := c.Route(dst)
	out["route"], out["route_err"] = d.String(), errs(err)
	out["report"] = errs(c.Report(dst, "a", OutcomeConverterFailed, netip.AddrPort{}, "forged"))
	_, err = c.do(request{Op: "status"})
	out["status"] = errs(err)
	json.NewEncoder(os.Stdout).Encode(out)
}

// runAs runs TestPeerHelper as uid against the socket at path.
func runAs(t *testing.T, exe, path string, uid uint32, dst netip.AddrPort) map[string]string {
	t.Helper()
	cmd := exec.Command(exe, "-test.run=^TestPeerHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), peerHelperEnv+"="+path, peerHelperEnv+"_DST="+dst.String())
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
	b, err := cmd.Output()
	if err != nil {
		t.Fatalf("helper as uid %d: %v\n%s", uid, err, b)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	var out map[string]string
	if err := json.Unmarshal([]byte(line), &out); err != nil {
		t.Fatalf("helper as uid %d: %v\n%s", uid, err, b)
	}
	return out
}

// The kernel's SO_PEERCRED, not
// anything the client says, decides who asks. A user not in
// convert.users gets an error and changes nothing; an allowed user's
// lessons and failure reports change only its own decisions; status is
// root's.
func TestSocketPeerCredentials(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (to run a helper as other users)")
	}
	// A directory every user can reach, holding the socket and a copy of
	// the test binary (go test's own build directory may be private).
	dir, err := os.MkdirTemp("", "convpeer")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(dir, "helper.test")
	if err := os.WriteFile(exe, b, 0o755); err != nil {
		t.Fatal(err)
	}

	f := &fake{addr: netip.MustParseAddrPort("192.0.2.1:45674")}
	r := New(Config{Hold: time.Minute}, nil, Converter{Name: "a", Source: f})
	fill(t, r)
	path := filepath.Join(dir, "c.sock")
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	const allowed, stranger = 64123, 64124
	done := make(chan error, 1)
	go func() { done <- r.Serve(l, Users{UIDs: []uint32{allowed}}) }()
	defer func() {
		l.Close()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	dst := netip.MustParseAddrPort("198.51.100.7:443")
	root := NewClient(path, time.Second)
	defer root.Close()

	// A user not allowed: refused, nothing learned.
	out := runAs(t, exe, path, stranger, dst)
	if !strings.Contains(out["hello"], fmt.Sprintf("uid %d may not convert", stranger)) ||
		!strings.Contains(out["learn"], fmt.Sprintf("uid %d may not convert", stranger)) || out["route"] != "direct (no-agent)" {
		t.Fatalf("user not allowed: %v", out)
	}
	if st := r.Status(); st.Counters.Learned != 0 || st.Counters.Refused == 0 {
		t.Fatalf("after a refused user: %+v", st.Counters)
	}
	// An allowed user: its own lesson converts its own connections...
	out = runAs(t, exe, path, allowed, dst)
	if out["hello"] != "" || out["learn"] != "" || !strings.HasPrefix(out["route"], "convert via a") || out["report"] != "" {
		t.Fatalf("allowed user: %v", out)
	}
	if !strings.Contains(out["status"], "root only") {
		t.Fatalf("status for another user: %q", out["status"])
	}
	// ... and nobody else's: root still has to learn dst, and the
	// converter the user reported failed is not held for root.
	if d, err := root.Route(dst); err != nil || d.Convert || !d.Learn {
		t.Fatalf("root after another user's lesson: %+v %v", d, err)
	}
	if err := root.Learn(dst, false); err != nil {
		t.Fatal(err)
	}
	if d, err := root.Route(dst); err != nil || !d.Convert {
		t.Fatalf("root after another user's failure report: %+v %v", d, err)
	}
	st, err := FetchStatus(path)
	if err != nil {
		t.Fatal(err)
	}
	uids := map[uint32]bool{}
	for _, d := range st.NoMPTCP {
		uids[d.UID] = true
	}
	if !uids[allowed] || !uids[Root] || len(st.Converters) != 1 || !st.Converters[0].FailedUntil.IsZero() {
		t.Fatalf("status: lessons by uid %v, converter %+v", uids, st.Converters)
	}
}
