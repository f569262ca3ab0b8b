package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/mpdetour/mpdetour/internal/proto"
	"github.com/mpdetour/mpdetour/internal/testenv"
)

// The authority's whole offline cycle through the binary: init, issue,
// show (verified), revoke, show the list; and the refusals an operator meets.
func TestCollectiveCommands(t *testing.T) {
	testenv.Tools(t, "go")
	bin := mpdetourBin(t)
	dir := t.TempDir()
	run := func(wantOK bool, args ...string) string {
		t.Helper()
		out, err := exec.Command(bin, args...).CombinedOutput()
		if (err == nil) != wantOK {
			t.Fatalf("mpdetour %s: err %v, want ok=%v\n%s", strings.Join(args, " "), err, wantOK, out)
		}
		return string(out)
	}
	run(true, "collective", "init", "--dir", dir)
	if out := run(false, "collective", "init", "--dir", dir); !strings.Contains(out, "not overwriting") {
		t.Fatalf("second init: %s", out)
	}
	if fi, err := os.Stat(filepath.Join(dir, "authority.key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("authority.key: %v %v", fi, err)
	}
	k, _ := proto.GenerateKey()
	auth := filepath.Join(dir, "authority.key")
	cmd := exec.Command(bin, "collective", "issue", "--authority", auth, "--name", "alice", "--key", k.Public().String(), "--roles", "client,relay")
	cert, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	certFile := filepath.Join(dir, "alice.cert")
	os.WriteFile(certFile, cert, 0o644)
	out := run(true, "collective", "show", "--authority-pub", filepath.Join(dir, "authority.pub"), certFile)
	if !strings.Contains(out, "name       alice") || !strings.Contains(out, "client,relay") || !strings.Contains(out, "signature  ok") {
		t.Fatalf("show: %s", out)
	}
	serial := regexp.MustCompile(`serial (\d+)`).FindStringSubmatch(out)[1]
	crl := filepath.Join(dir, "crl")
	run(true, "collective", "revoke", "--authority", auth, "--crl", crl, serial)
	out = run(true, "collective", "revoke", "--authority", auth, "--crl", crl, "7")
	if !strings.Contains(out, "seq 2, 2 serials") {
		t.Fatalf("second revoke: %s", out)
	}
	if out := run(true, "collective", "show", "--authority-pub", filepath.Join(dir, "authority.pub"), crl); !strings.Contains(out, serial) {
		t.Fatalf("show crl: %s", out)
	}
	// Another authority's key does not verify the certificate.
	other := t.TempDir()
	run(true, "collective", "init", "--dir", other)
	if out := run(false, "collective", "show", "--authority-pub", filepath.Join(other, "authority.pub"), certFile); !strings.Contains(out, "does not verify") {
		t.Fatalf("wrong authority: %s", out)
	}
	if out := run(false, "collective", "issue", "--authority", auth, "--name", "x", "--key", "nope"); !strings.Contains(out, "--key") {
		t.Fatalf("bad key: %s", out)
	}
	if out := run(false, "collective", "revoke", "--authority", filepath.Join(other, "authority.key"), "--crl", crl, "1"); !strings.Contains(out, "does not verify") {
		t.Fatalf("revoke with another authority over this list: %s", out)
	}
}
