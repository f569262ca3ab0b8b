package relay

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/collective"
)

// A list learned from gossip is written to crl_file unless the file holds
// one at least as new; a file that cannot be written is logged, and the
// list stays applied.
func TestCRLWriteBack(t *testing.T) {
	auth, err := collective.NewAuthority()
	if err != nil {
		t.Fatal(err)
	}
	l1 := auth.Revoke(nil, time.Now(), 1)
	l2 := auth.Revoke(l1, time.Now(), 2)
	l3 := auth.Revoke(l2, time.Now(), 3)
	dir := t.TempDir()
	path := filepath.Join(dir, "crl.txt")
	var logs bytes.Buffer
	newServer := func(file string) *Server {
		set := &Reloadable{PrivateKey: testKey(t), Trust: collective.NewTrust(auth.Public()), CRLFile: file}
		s, _ := newTestServer(t, Static{}, set, nil, slog.New(slog.NewTextHandler(&logs, nil)))
		return s
	}
	read := func() string {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}

	if err := os.WriteFile(path, []byte(l1.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	s := newServer(path)
	if _, err := s.trust.Live.Install(l2); err != nil {
		t.Fatal(err)
	}
	s.writeBackCRL(l2)
	if read() != l2.String() {
		t.Fatal("older file not replaced by the newer list")
	}
	// The relay's own write is not read back as a change.
	if fi, _ := os.Stat(path); !fi.ModTime().Equal(s.trust.CRLMod) {
		t.Fatal("crlMod not the written file's")
	}
	// A newer file (the operator wrote one meanwhile) is kept.
	if err := os.WriteFile(path, []byte(l3.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	s.writeBackCRL(l2)
	if read() != l3.String() {
		t.Fatal("a newer file was overwritten with an older list")
	}
	// An unwritable place: logged, nothing else.
	s2 := newServer(filepath.Join(dir, "missing-dir", "crl.txt"))
	s2.writeBackCRL(l2)
	if !strings.Contains(logs.String(), "not written to crl_file") {
		t.Fatalf("no warning for a crl_file that cannot be written:\n%s", logs.String())
	}
}
